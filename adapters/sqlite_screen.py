"""verify's reader of a SQLite file on a connection of its own (read-only, ``sqlite3``).

:func:`screen_file` screens one range of entity ids: in a thread of the verifying process
(``SQLiteStore.file_screen``) and in worker processes, which import this module by itself — the
standard library and ``lifecycle/screen.py`` only, so a worker starts in milliseconds, without
SQLAlchemy or the rest of statebook.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

if __package__ or TYPE_CHECKING:
    from statebook.lifecycle.screen import BATCH, Merge, Screen, Suspect, byte_key
else:  # imported by a worker process (lifecycle/screen.py run as a script), from this directory
    from screen import BATCH, Merge, Screen, Suspect, byte_key

WORKER = "sqlite_screen:screen_file"
"""What a worker process imports, from this module's directory, and calls with each range."""

Query = tuple[str, Sequence[Any]]
"""SQL for SQLite and its positional parameters."""


def screen_file(path: str, spec: tuple[Any, ...], facts: Query, rows: Query) -> tuple[int, int, list[Suspect]]:
    """Screen one range of a SQLite file in one read transaction: (entities, facts, suspects).

    ``spec`` is a :attr:`Screen.spec`; ``facts`` and ``rows`` read the range in id order.
    """
    screen = Screen(*spec)
    try:
        return _screen_file(path, screen, facts, rows, None)
    except sqlite3.OperationalError as exc:
        if not undecodable(exc):
            raise
        return _screen_file(path, screen, facts, rows, lenient_text)


def undecodable(exc: BaseException) -> bool:
    """Whether a SQLite read failed on text that is not UTF-8 (sqlite3's own message says so)."""
    return isinstance(exc, sqlite3.OperationalError) and "decode" in str(exc)


class LenientText(str):
    """Text read leniently, with the bytes SQLite stored (``raw``): SQLite orders text by those bytes."""

    raw: bytes


def lenient_text(data: bytes) -> str:
    """SQLite text that is not UTF-8 — only damage writes it (L12b) — with U+FFFD for the bad bytes, so
    it reads as a value no fact was written with. Used only to re-read a range that failed to decode."""
    text = LenientText(data.decode("utf-8", "replace"))
    text.raw = data
    return text


def _screen_file(path: str, screen: Screen, facts: Query, rows: Query,
                 text: Any) -> tuple[int, int, list[Suspect]]:
    conn = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=5, isolation_level=None)
    if text is not None:
        conn.text_factory = text
    try:
        conn.execute("BEGIN")
        row_cursor = conn.execute(*rows)
        fact_cursor = conn.execute(*facts)
        # Read leniently, ids keep SQLite's byte order only as bytes (a U+FFFD sorts after what its bytes preceded).
        merge = Merge(screen, byte_key if text is not None else None)
        entity_at = screen.entity_at
        while batch := fact_cursor.fetchmany(BATCH):
            while merge.wants_rows(batch[-1][entity_at]):
                merge.add_rows(row_cursor.fetchmany(BATCH))
            merge.add_facts(batch)
        merge.end_facts()
        while batch := row_cursor.fetchmany(BATCH):
            merge.add_rows(batch)
        conn.execute("COMMIT")
        return merge.entities, merge.facts, merge.suspects
    finally:
        conn.close()
