"""A responder answers from the email, in a browser (docs/console.md, "Responders"; specs/console.md).

The alert reaches the on-call team's shared mailbox through the email channel and the SMTP test server. The
first reader opens the message's acknowledge link, sees what the alert says, presses the button and is
thanked; reopening the link shows that answer again. The second reader opens the dismiss link of the same
message and sees the conflict: who answered first, and that the first answer stands.
"""

from __future__ import annotations

import pytest

from channels.smtp_server import smtp_server
from statebook.outbox.notifications import get_response

from .scenes import ALERT, emailed_alert, links_in

pytestmark = pytest.mark.browser


def email_settings(port: int) -> str:
    return (f'[notifications.email]\nhost = "127.0.0.1"\nport = {port}\nstarttls = false\n'
            'sender = "statebook@example.org"\nto = { oncall = "oncall@example.org" }\n')


def test_a_responder_acknowledges_from_the_email_and_a_second_reader_sees_the_conflict(console):
    smtp = console.enter(smtp_server("accept"))
    console.start(email_settings(smtp.port))
    notification = console.run(emailed_alert(console.book, console.settings))
    [message] = smtp.messages
    links = links_in(message)
    assert set(links) == {"Acknowledge", "Dismiss"}, links
    assert all(url.startswith(console.url + "/r/") for url in links.values()), links
    b = console.browser

    b.open(links["Acknowledge"])  # opening the link records nothing: a mail scanner may open it too
    b.wait_text(ALERT["title"], ALERT["body"], "Waiting for an answer")
    console.screenshot("respond")
    assert console.run(get_response(console.book, notification)).status == "pending"
    b.press("Acknowledge")
    b.wait_text("Thank you: you acknowledged this notification")
    answer = console.run(get_response(console.book, notification))
    assert (answer.status, answer.responder) == ("acked", "recipient:oncall"), answer

    b.open(links["Acknowledge"])  # the same reader again: the answer they gave, and nothing to press
    b.wait_text("You acknowledged this notification")
    assert not b.all("form.answer")

    b.reset()  # the second reader, in a browser of their own
    b.open(links["Dismiss"])
    conflict = b.wait_text("already acknowledged by", "the first answer stands")
    assert "oncall" in conflict
    assert not b.all("form.answer")
    assert console.run(get_response(console.book, notification)).status == "acked"
