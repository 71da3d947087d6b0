"""Logging for the daemon and the CLI: ``configure(format, level)``.

``text`` is one readable line per record; ``json`` is one object per line with ``ts`` (ISO-8601 UTC),
``level``, ``logger``, ``message`` and every extra field the record carries (``extra={...}``). Both pass
the message through the secret mask (:mod:`.masking`: URL passwords, ``token=`` values). The level applies to
statebook's own loggers (``statebook.*``); the libraries under them — aiosqlite, asyncio, httpx,
websockets — stay at WARNING whatever is asked, so ``--log-level DEBUG`` shows statebook, not its drivers.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TextIO

from .masking import mask as _mask

__all__ = ["FORMATS", "LEVELS", "QUIET", "JsonFormatter", "TextFormatter", "configure", "configured"]

FORMATS = ("text", "json")
LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
QUIET = ("aiosqlite", "asyncio", "httpx", "httpcore", "websockets", "asyncpg", "sqlalchemy")
"""Loggers held at WARNING: their DEBUG output is the drivers', not statebook's."""

_STANDARD = frozenset(vars(logging.makeLogRecord({})).keys()) | {"message", "asctime", "taskName"}
_HANDLER_NAME = "statebook"


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _ts(record: logging.LogRecord) -> str:
    return datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the extra fields (and exc on an error)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        out: dict[str, Any] = {"ts": _ts(record), "level": record.levelname, "logger": record.name,
                               "message": _mask(record.getMessage())}
        for key, value in _extras(record).items():
            out[key] = _mask(value) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = _mask(self.formatException(record.exc_info))
        return json.dumps(out, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """``ts level logger: message key=value ...`` on one line (the traceback below it on an error)."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one readable line."""
        extras = " ".join(f"{k}={v}" for k, v in _extras(record).items())
        line = f"{_ts(record)} {record.levelname:<7} {record.name}: {record.getMessage()}" + (f"  {extras}" if extras else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return _mask(line)


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is when a record comes (a test runner swaps it, then closes the old one)."""

    @property
    def stream(self) -> TextIO:
        """The current ``sys.stderr``."""
        return sys.stderr

    @stream.setter
    def stream(self, _value: TextIO) -> None:
        pass


def configure(format: str = "text", level: str = "INFO", *, stream: TextIO | None = None) -> logging.Handler:
    """Send statebook's records at ``level`` and up to ``stream`` (stderr) as ``format``; the handler.

    Called again, it replaces the handler it installed before (tests configure more than once).
    """
    if format not in FORMATS:
        raise ValueError(f"log format {format!r}: use {' or '.join(FORMATS)}")
    if level.upper() not in LEVELS:
        raise ValueError(f"log level {level!r}: use {', '.join(LEVELS)}")
    handler = logging.StreamHandler(stream) if stream is not None else _Stderr()
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(JsonFormatter() if format == "json" else TextFormatter())
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("statebook").setLevel(level.upper())
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
    return handler


@contextmanager
def configured(format: str = "text", level: str = "INFO") -> Iterator[logging.Handler]:
    """:func:`configure` for the length of a command; the loggers are put back as they were afterwards
    (a command run in-process, as tests do, leaves no handler behind)."""
    names = ["statebook", *QUIET]
    root = logging.getLogger()
    before = (root.level, {n: logging.getLogger(n).level for n in names})
    handler = configure(format, level)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(before[0])
        for name, lvl in before[1].items():
            logging.getLogger(name).setLevel(lvl)
