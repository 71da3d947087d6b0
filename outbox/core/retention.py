"""What every part's retention shares: who purges, how many rows a purge transaction takes, and the
progress callback a bulk purge reports to (dispatch retention in :mod:`statebook.outbox.dispatch.admin`,
notification retention in :mod:`statebook.outbox.notifications.retention`)."""

from __future__ import annotations

from collections.abc import Callable

from statebook.lifecycle import Actor

RETENTION_ACTOR = Actor("system", "retention")

PURGE_BATCH = 500
"""Rows per purge transaction: a bulk purge is set-based, a bounded transaction at a time."""

Progress = Callable[[int, int], None]
"""Called with (rows done, rows in all) after each batch of a bulk purge."""
