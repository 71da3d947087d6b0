"""An operator recovers a dead letter, in a browser (specs/notifications.md N25-N29; docs/console.md,
"Operator actions").

Two alerts of one obligation failed on a broken webhook: the first exhausted its cycle and its follower,
elected successor, holds the obligation. The operator signs in, finds the dead letter from the overview,
reads on its page why replay is blocked (the pending successor) and is refused when trying anyway; follows
the lineage to the successor, which has failed too by then, and resolves it with a reason; comes back and
replays the original; then, the webhook fixed, watches the overview count it delivered without reloading.
"""

from __future__ import annotations

import pytest

from statebook.outbox.notifications import get_notification

from .scenes import Switch, dead_letter_with_a_pending_successor, deliver, until_failed

pytestmark = pytest.mark.browser



def figure(b, name: str) -> str | None:
    """A figure of the overview's live region (a hidden one too: the table behind the chart)."""
    found = b.all(f"#figures [data-figure='{name}']")
    return found[0].get_attribute("textContent").strip() if found else None


def test_an_operator_resolves_the_successor_replays_the_dead_letter_and_watches_it_delivered(console):
    switch = Switch()
    owner, successor = console.run(dead_letter_with_a_pending_successor(console.book, console.clock, switch))
    console.start()
    console.sign_in("ana")
    b = console.browser

    b.open("/")
    b.wait_text("Dead letters waiting", "need an operator", css="#dead-letters")
    assert figure(b, "dead-letters") == "1"
    b.follow("notification", within="#dead-letters")  # the failed notifications
    b.follow(owner)
    b.wait_text(f"blocked: successor_pending by {successor}")
    b.fill("reason", "the webhook is fixed", within="form#act-replay")
    b.press("Replay", within="form#act-replay")
    b.wait_text("cannot be replayed: successor_pending", css="#action-result")
    assert console.run(get_notification(console.book, owner)).status == "failed"

    console.run(until_failed(console.book, console.clock, switch, successor))  # meanwhile the successor fails too
    b.open(f"/e/notification/{owner}")
    b.follow(successor)  # the lineage
    b.wait_text("failed", "a replay would be accepted now", css="main")
    b.fill("reason", "same alert as the original, which is replayed instead", within="form#act-resolve")
    b.press("Resolve", within="form#act-resolve")
    b.wait_text("resolved", css="#action-result")
    resolved = console.run(get_notification(console.book, successor))
    assert (resolved.resolved_by, resolved.dead_letter) == ("operator:ana", False), resolved

    b.open(f"/e/notification/{owner}")
    b.wait_text("a replay would be accepted now")
    b.fill("reason", "the webhook is fixed", within="form#act-replay")
    b.press("Replay", within="form#act-replay")
    b.wait_text("cycle 2", css="#action-result")

    b.open("/")
    b.wait_text("none", css="#dead-letters")
    assert figure(b, "due-notification") == "1"
    b.driver.execute_script("window.stillTheSamePage = true")
    switch.ok = True
    console.run(deliver(console.book, switch))  # the daemon's next pass, while the overview stays open
    b.wait(lambda: (figure(b, "due-notification"), figure(b, "delivered-notification-delivered")) == ("0", "1"),
           "the overview to count the notification delivered and none due, live")
    assert b.driver.execute_script("return window.stillTheSamePage === true"), "the overview reloaded"
    console.screenshot("overview")

    b.open(f"/e/notification/{owner}")
    b.wait_text("delivered", css="h1")
    b.wait_text("Cycle 1", "Cycle 2", "notification.pending.replayed")
    console.screenshot("entity", start="h2:has(+ table.lineage)", tallest=2400)  # its lineage, cycles and history
