"""How a channel shows a delivery's response links (``Delivery.links``: action -> URL, made by
``statebook.adapters.web.links`` when ``[web] public_url`` is set).

Each link is a bearer credential for its recipient and action: a channel puts it in the message to that
recipient and nowhere else — not in a log line, an exception's text or an observation's detail.

>>> lines({"acked": "https://book.example/r/T1", "dismissed": "https://book.example/r/T2"})
['Acknowledge: https://book.example/r/T1', 'Dismiss: https://book.example/r/T2']
"""

from __future__ import annotations

from collections.abc import Mapping

LABELS = {"acked": "Acknowledge", "dismissed": "Dismiss"}
"""The words a responder reads for each action, in the order the links are shown."""
BUTTON_IDS = {"acked": "ack", "dismissed": "dismiss"}
"""Slack's ``action_id`` of each action's button (what ``POST /hooks/slack`` answers)."""


def ordered(links: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(action, url)`` of the known actions present in ``links``, acknowledge first."""
    return [(action, links[action]) for action in LABELS if links.get(action)]


def lines(links: Mapping[str, str]) -> list[str]:
    """One ``"<Label>: <url>"`` line per link, for plain-text messages."""
    return [f"{LABELS[action]}: {url}" for action, url in ordered(links)]


def with_lines(text: str, links: Mapping[str, str]) -> str:
    """``text`` followed by a blank line and the link lines (``text`` alone when there are none)."""
    shown = lines(links)
    return f"{text}\n\n" + "\n".join(shown) if shown else text


def token_of(url: str) -> str:
    """The link's token: the last segment of its path (``<public_url>/r/<token>``)."""
    return url.rstrip("/").rsplit("/", 1)[-1]
