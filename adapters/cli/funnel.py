"""Every error of a command becomes one line on standard error and an exit code (specs/cli.md C4-C7).

The table (README.md, "Exit codes"): 0 done; 1 a finding (verify, damaged history), a run or delivery
that failed, or a bug; 2 refused input or unusable configuration; 130 interrupted.
"""

from __future__ import annotations

from typing import Any


__all__ = ["DONE", "FAILED", "INTERRUPTED", "REFUSED", "classify", "first_line"]

DONE, FAILED, REFUSED, INTERRUPTED = 0, 1, 2, 130


def first_line(text: str) -> str:
    """The first non-blank line of ``text``, stripped (``""`` when there is none)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if lines else ""


def _is_database_error(exc: BaseException) -> bool:
    import sqlalchemy.exc

    return isinstance(exc, (sqlalchemy.exc.DBAPIError, ConnectionError, TimeoutError)) or type(exc).__module__.startswith(
        ("asyncpg", "socket", "sqlite3", "aiosqlite"))


def _is_bad_input(exc: BaseException) -> bool:
    """Libraries' own refusals of input the CLI passed on (until the API wraps them)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        return True
    return type(exc).__module__.split(".")[0] == "croniter"


def _validation_line(exc: Any) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or exc.title
    return f"invalid {where}: {first['msg'].removeprefix('Value error, ')}"


def classify(exc: BaseException, *, hint: str = "") -> tuple[int, str]:
    """The exit code and the one line (without ``error:``) for an exception a command raised."""
    from statebook.adapters.errors import DamagedHistory
    from statebook.lifecycle import StatebookError
    from statebook.lifecycle.errors import StorageError, UnknownEntityType

    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "interrupted"
    if isinstance(exc, DamagedHistory):
        return FAILED, str(exc)
    if isinstance(exc, UnknownEntityType):
        return REFUSED, str(exc) + hint
    if isinstance(exc, StorageError):
        return REFUSED, f"database error: {first_line(str(exc))}"
    if isinstance(exc, StatebookError):
        return REFUSED, first_line(str(exc))
    if _is_database_error(exc):
        detail = getattr(exc, "orig", None) or exc
        return REFUSED, f"database error: {first_line(str(detail)) or type(detail).__name__}"
    if _is_bad_input(exc):
        if hasattr(exc, "errors"):
            return REFUSED, _validation_line(exc)
        return REFUSED, f"the cron expression is refused: {first_line(str(exc)) or type(exc).__name__}"
    if isinstance(exc, OSError):
        return REFUSED, first_line(str(exc)) or type(exc).__name__
    return FAILED, (f"internal error: {type(exc).__name__}: {first_line(str(exc))} "
                    "(run with --debug for the traceback)")
