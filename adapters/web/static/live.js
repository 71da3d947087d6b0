// statebook console: live figures. A region marked data-live="<events URL>" data-fragment="<fragment URL>"
// listens to the server's events and, on each "refresh", fetches its fragment and swaps it in. An element with
// data-live and no data-fragment is a notice, shown on the first "refresh" (a page holding forms is not
// swapped under the reader's hands). Without this script the page still works: reloading it refreshes it.
(function () {
  "use strict";
  if (!window.EventSource || !window.fetch) { return; }

  function watch(region) {
    var status = document.querySelector("[data-live-status]");
    var source = new EventSource(region.getAttribute("data-live"));
    var busy = false;
    var again = false;

    function refresh() {
      if (busy) { again = true; return; }
      busy = true;
      fetch(region.getAttribute("data-fragment"), { credentials: "same-origin", cache: "no-store" })
        .then(function (answer) {
          if (answer.redirected || !answer.ok) { throw new Error("status " + answer.status); }
          return answer.text();
        })
        .then(function (html) {
          region.innerHTML = html;  // the server's template, escaped there; the CSP forbids inline script
          region.setAttribute("data-refreshed", new Date().toISOString());
          if (status) {
            var now = new Date().toISOString();
            status.textContent = "Live: figures refreshed at " + now.slice(0, 10) + " " + now.slice(11, 19) + " UTC.";
          }
        })
        .catch(function () { source.close(); region.setAttribute("data-live-state", "stopped"); })
        .then(function () {
          busy = false;
          if (again) { again = false; refresh(); }
        });
    }

    source.addEventListener("open", function () { region.setAttribute("data-live-state", "open"); });
    source.addEventListener("error", function () { region.setAttribute("data-live-state", "reconnecting"); });
    window.addEventListener("pagehide", function () { source.close(); });
    if (region.hasAttribute("data-fragment")) {
      source.addEventListener("refresh", refresh);
    } else {
      source.addEventListener("refresh", function () { region.hidden = false; source.close(); });
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    Array.prototype.forEach.call(document.querySelectorAll("[data-live]"), watch);
  });
})();
