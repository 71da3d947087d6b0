"""A viewer may read everything and change nothing (specs/console.md W3): the entity page offers them no
action, the bulk action's page is refused, and the action itself, posted with their own valid CSRF token, is
refused with nothing written."""

from __future__ import annotations

import pytest

from statebook.lifecycle import history
from statebook.outbox import enqueue_dispatch

pytestmark = pytest.mark.browser

REFUSED = "this needs the operator role; vic is a viewer"
POST_THE_ACTION = """
const form = document.createElement('form');
form.method = 'post';
form.action = arguments[0];
for (const [name, value] of [['csrf_token', document.querySelector('meta[name=csrf-token]').content],
                             ['reason', 'a viewer tries']]) {
  const field = document.createElement('input');
  field.name = name; field.value = value; form.appendChild(field);
}
document.body.appendChild(form);
form.submit();
"""


def test_a_viewer_sees_no_action_and_is_refused_when_trying_one(console):
    dispatch = console.run(enqueue_dispatch(console.book, kind="notify", deliver_to="ops", body={"text": "hello"}))
    console.start()
    b = console.browser
    page = f"/e/dispatch/{dispatch}"
    console.sign_in("ana")  # what an operator is offered on this page...
    b.open(page)
    b.wait_text(dispatch, "pending")
    assert b.all("form#act-expedite"), "the operator is not offered 'Deliver now'"

    console.sign_in("vic")  # ...and the viewer is not
    b.open(page)
    b.wait_text(dispatch, "pending", "vic · viewer")
    assert not b.all("form.action"), "a viewer is offered an action form"

    b.open("/lifecycles/dispatch/bulk/expedite")  # the bulk action's confirmation page
    b.wait_text(REFUSED, "HTTP 403")
    assert not b.all("form[method=post] input[name=reason]")

    b.open(page)  # as if from a page an operator shared: the form posted with the viewer's own session
    b.driver.execute_script(POST_THE_ACTION, f"{console.url}{page}/act/expedite")
    b.wait_text(REFUSED, "HTTP 403")
    assert b.path == f"{page}/act/expedite"
    facts = console.run(history(console.book, "dispatch", dispatch))
    assert len(facts) == 1, facts  # only its creation: the refused action wrote nothing
