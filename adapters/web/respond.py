"""The responder's page: ``GET /r/{token}`` shows the notification and its answer, ``POST /r/{token}``
answers it (docs/console.md, "Responders").

The token in the path is the only credential (a signed link, :mod:`.links`): no session, no cookie, no
form field authorises anything here, and no CSRF token is asked for — a forged cross-site POST would
need the token, which is the credential itself. A GET never writes (mail scanners and link previews open
links). The answer is :func:`~statebook.outbox.notifications.ack_notification` or
:func:`~statebook.outbox.notifications.dismiss_notification` with ``Actor("recipient", <the link's
recipient>)``, so the response lifecycle's rules hold and are said in words: the same recipient answering
again sees the original answer, anyone else or the other answer sees who answered first, and a late
answer sees that the response timed out. A link that is tampered with, expired, or foreign (signed for a
notification this book does not hold, or for a recipient it was not sent to) is a 403 page saying which,
and nothing is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from statebook.lifecycle import Actor, Book
from statebook.outbox.notifications import (
    Notification, NotificationResponse, ResponseConflict, ack_notification, dismiss_notification, get_notification,
    get_response,
)

from .links import Link, LinkRefused
from .pages import render
from .state import console

VERBS = {"acked": "acknowledge", "dismissed": "dismiss"}
PAST = {"acked": "acknowledged", "dismissed": "dismissed", "timed_out": "timed out"}
REFUSALS = {
    "tampered": "This link is not valid: it was altered, or it was not made by this statebook.",
    "expired": "This link has expired.",
    "foreign": "This link does not belong to a notification of this statebook for its recipient.",
    "disabled": "Response links are not enabled on this console.",
}


@dataclass(frozen=True)
class Outcome:
    """What an answer came to: ``kind`` is ``recorded`` (written now), ``repeated`` (the same recipient's
    same answer again: the original stands), ``conflict`` (someone or something answered first),
    ``timed_out`` (past the deadline) or ``not_waiting`` (the notification waits for no answer, or not yet)."""

    kind: str
    response: NotificationResponse | None


def who(responder: str | None) -> str:
    """A responder (``recipient:alice``) as words: ``alice (recipient)``."""
    if not responder:
        return "nobody"
    actor = Actor.parse(responder)
    return f"{actor.id} ({actor.type})" if actor.id else actor.type


async def linked(book: Book, link: Link) -> Notification | None:
    """The notification ``link`` answers, or None when the link is foreign to this book (no such
    notification, or one sent to another recipient)."""
    found = await get_notification(book, link.notification_id)
    return found if found is not None and found.recipient == link.recipient else None


async def answer(book: Book, notification_id: str, recipient: str, action: str, *, note: str | None = None
                 ) -> Outcome:
    """Record ``action`` (``acked`` or ``dismissed``) as ``Actor("recipient", recipient)``; the caller has
    checked that the recipient may answer this notification (a link and :func:`linked`, or a provider)."""
    actor = Actor("recipient", recipient)
    before = await get_response(book, notification_id)
    respond = ack_notification if action == "acked" else dismiss_notification
    try:
        after = await respond(book, notification_id, actor=actor, note=note)
    except ResponseConflict as exc:
        return Outcome(_refusal(exc.recorded, book.clock.now()), exc.recorded)
    repeated = before is not None and before.status == after.status and before.responder == after.responder
    return Outcome("repeated" if repeated else "recorded", after)


def _refusal(recorded: NotificationResponse | None, now: float) -> str:
    if recorded is None:
        return "not_waiting"
    if recorded.status == "timed_out" or (recorded.status == "pending" and now >= recorded.due_at.timestamp()):
        return "timed_out"
    return "conflict"


def state(response: NotificationResponse | None, link: Link, now: float) -> str:
    """Where the response stands for the link's holder (the page's words key off it): ``waiting``,
    ``answered`` (by this recipient, this answer), ``conflict``, ``timed_out`` or ``not_waiting``."""
    if response is None:
        return "not_waiting"
    if response.status == "pending":
        return "timed_out" if now >= response.due_at.timestamp() else "waiting"
    if response.status == "timed_out":
        return "timed_out"
    mine = response.responder == str(Actor("recipient", link.recipient))
    return "answered" if mine and response.status == link.action else "conflict"


def refused(request: Request, reason: str, link: Link | None = None, response: NotificationResponse | None = None
            ) -> Response:
    """The 403 page for a link that cannot be used; says which, and writes nothing."""
    return render(request, "respond/refused.html", {"reason": reason, "said": REFUSALS[reason], "link": link,
                                                    "response": response, "past": PAST, "who": who}, status=403)


async def _checked(request: Request) -> tuple[Link, Notification] | Response:
    """The link in the path and its notification, or the refusal page."""
    c = console(request)
    if c.links is None:
        return refused(request, "disabled")
    try:
        link = c.links.check(request.path_params["token"])
    except LinkRefused as exc:
        if exc.reason == "expired" and exc.link is not None and await linked(c.book, exc.link) is not None:
            # authentic but late: say how the notification ended, nothing more
            return refused(request, "expired", exc.link, await get_response(c.book, exc.link.notification_id))
        return refused(request, exc.reason)
    notification = await linked(c.book, link)
    if notification is None:
        return refused(request, "foreign")
    return link, notification


def _page(request: Request, link: Link, notification: Notification, response: NotificationResponse | None,
          outcome: Outcome | None = None, status: int = 200) -> Response:
    content = notification.content if isinstance(notification.content, dict) else {"content": notification.content}
    heading = content.get("title") or content.get("subject") or "Notification"
    text = content.get("body", content.get("text"))
    rest = {k: v for k, v in content.items() if k not in ("title", "subject", "body", "text")}
    now = console(request).book.clock.now()
    return render(request, "respond/page.html", {
        "link": link, "notification": notification, "response": response, "outcome": outcome,
        "state": state(response, link, now), "verb": VERBS[link.action], "past": PAST, "who": who,
        "heading": str(heading), "text": None if text is None else _shown(text),
        "fields": [(str(k), _shown(v)) for k, v in rest.items()]}, status=status)


def _shown(value: Any) -> str:
    if isinstance(value, str):
        return value
    from statebook.lifecycle.codec import dumps

    return dumps(value)


async def show(request: Request) -> Response:
    """``GET /r/{token}``: the notification, its state, who answered, and the button (never writes)."""
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    link, notification = checked
    response = await get_response(console(request).book, link.notification_id)
    return _page(request, link, notification, response)


async def post(request: Request) -> Response:
    """``POST /r/{token}``: record the link's answer as its recipient; the page says what it came to."""
    checked = await _checked(request)
    if isinstance(checked, Response):
        return checked
    link, notification = checked
    outcome = await answer(console(request).book, link.notification_id, link.recipient, link.action)
    status = 200 if outcome.kind in ("recorded", "repeated") else 409
    return _page(request, link, notification, outcome.response, outcome, status)


routes: list[BaseRoute] = [
    Route("/r/{token}", show, methods=["GET"], name="respond"),
    Route("/r/{token}", post, methods=["POST"], name="respond_post"),
]
