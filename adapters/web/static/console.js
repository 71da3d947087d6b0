// statebook console: progressive enhancement only; every action works without this file.
// htmx requests carry the session's CSRF token as a header (the page's <meta name="csrf-token">).
document.addEventListener("htmx:configRequest", function (event) {
  var meta = document.querySelector('meta[name="csrf-token"]');
  if (meta) { event.detail.headers["X-CSRF-Token"] = meta.getAttribute("content"); }
});
// A form with data-confirm asks before it is sent (bulk actions state their count in the text).
document.addEventListener("submit", function (event) {
  var form = event.target;
  var text = form && form.getAttribute && form.getAttribute("data-confirm");
  if (text && !window.confirm(text)) { event.preventDefault(); }
}, true);
