"""O5, O6, O7: ``--log-format json`` lines parse and carry their fields, secrets masked; ``DEBUG`` is
statebook's only; one line per delivery outcome, dispatches and notifications."""

from __future__ import annotations

import io
import json
import logging

import pytest

from statebook.adapters.logs import QUIET, configure
from statebook.lifecycle import Book
from statebook.outbox import TransportResult, enqueue_dispatch, get_dispatch
from statebook.outbox.dispatch.delivery import deliver_due_dispatches
from statebook.outbox.notifications import get_notification, send_notification
from statebook.outbox.notifications.delivery import deliver_due_notifications
from statebook.outbox.notifications.scripted import ScriptedChannel

from conformance.outbox.support import Recorder


@pytest.fixture
def logged():
    """Configure logging into a buffer; afterwards, put the loggers back as they were."""
    names = ["statebook", *QUIET]
    levels = {n: logging.getLogger(n).level for n in names}
    root = logging.getLogger()
    root_level = root.level
    buffer = io.StringIO()
    handlers: list[logging.Handler] = []

    def start(fmt: str = "json", level: str = "INFO") -> io.StringIO:
        handlers.append(configure(fmt, level, stream=buffer))
        return buffer

    yield start
    for h in handlers:
        root.removeHandler(h)
    root.setLevel(root_level)
    for n, lvl in levels.items():
        logging.getLogger(n).setLevel(lvl)


def lines(buffer: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in buffer.getvalue().splitlines() if line.strip()]


def test_json_lines_carry_ts_level_logger_message_and_extras(logged):
    """O5: one object per line with ts, level, logger, message and the record's extra fields; no secret."""
    buffer = logged("json", "INFO")
    log = logging.getLogger("statebook.test")
    log.info("cannot reach postgresql://ann:s3cret@db/x", extra={"dispatch_id": "d1", "attempt": 2})
    log.debug("not shown at INFO")
    [line] = lines(buffer)
    assert set(line) >= {"ts", "level", "logger", "message", "dispatch_id", "attempt"}
    assert line["level"] == "INFO" and line["logger"] == "statebook.test"
    assert line["dispatch_id"] == "d1" and line["attempt"] == 2
    assert "s3cret" not in buffer.getvalue() and "ann:***@db" in line["message"]
    assert line["ts"].endswith("Z")


def test_text_lines_are_one_line_each(logged):
    """O5: text is one readable line per record, extras as key=value, secrets masked."""
    buffer = logged("text", "INFO")
    logging.getLogger("statebook.test").warning("token=abc123 refused", extra={"outcome": "retried"})
    [line] = buffer.getvalue().splitlines()
    assert "WARNING" in line and "statebook.test" in line and "outcome=retried" in line and "abc123" not in line


async def test_debug_is_for_statebooks_loggers_only(logged, book: Book):
    """O6: --log-level DEBUG shows statebook's debug records, never aiosqlite's or asyncio's."""
    buffer = logged("json", "DEBUG")
    assert logging.getLogger("statebook.outbox").isEnabledFor(logging.DEBUG)
    for name in ("aiosqlite", "asyncio", "httpx", "websockets"):
        assert not logging.getLogger(name).isEnabledFor(logging.DEBUG), name
    logging.getLogger("statebook.test").debug("a statebook debug line")
    await enqueue_dispatch(book, kind="k", deliver_to="x")  # the driver's work, logged by it at DEBUG
    found = lines(buffer)
    assert any(f["message"] == "a statebook debug line" for f in found)
    assert all(f["logger"].startswith("statebook") for f in found), {f["logger"] for f in found}


def test_a_bad_format_or_level_is_refused(logged):
    """O5: configure refuses what it does not know, naming what it takes."""
    with pytest.raises(ValueError, match="text or json"):
        configure("yaml", "INFO")
    with pytest.raises(ValueError, match="DEBUG"):
        configure("json", "LOUD")


async def test_one_line_per_dispatch_delivery_outcome(logged, book: Book):
    """O7: each attempt that ends writes exactly one line naming the dispatch and its outcome."""
    buffer = logged("json", "INFO")
    ids = {to: await enqueue_dispatch(book, kind="k", deliver_to=to, max_attempts=m)
           for to, m in (("ok", 3), ("bad", 1), ("flaky", 3))}
    rec = Recorder(outcome=lambda to, _n: TransportResult(to == "ok", None if to == "ok" else "refused"))
    await deliver_due_dispatches(book, transport=rec.transport)
    outcomes = {f["dispatch_id"]: f["outcome"] for f in lines(buffer) if f["logger"] == "statebook.outbox"}
    per_id = [f["dispatch_id"] for f in lines(buffer) if "dispatch_id" in f]
    assert sorted(per_id) == sorted(ids.values())  # one line each
    assert outcomes == {ids["ok"]: "delivered", ids["bad"]: "dead_letter", ids["flaky"]: "retried"}
    assert (await get_dispatch(book, ids["bad"])).status == "dead_letter"


async def test_one_line_per_notification_delivery_outcome(logged, book: Book):
    """O7: each notification attempt that ends writes one line with its outcome (and the channel that delivered)."""
    buffer = logged("json", "INFO")
    good = (await send_notification(book, recipient="a", content={"t": 1}, mode="guaranteed", channels=["email"])).id
    meh = (await send_notification(book, recipient="b", content={"t": 2}, mode="best_effort", channels=["slack"])).id
    channels = {"email": ScriptedChannel("email", ["success"]), "slack": ScriptedChannel("slack", ["reject"])}
    await deliver_due_notifications(book, channels, deadline=5)
    found = [f for f in lines(buffer) if "notification_id" in f and "outcome" in f]
    assert sorted(f["notification_id"] for f in found) == sorted([good, meh])
    by_id = {f["notification_id"]: f for f in found}
    assert by_id[good]["outcome"] == (await get_notification(book, good)).status == "delivered"
    assert by_id[good]["channel"] == "email"
    assert by_id[meh]["outcome"] == (await get_notification(book, meh)).status == "failed"
