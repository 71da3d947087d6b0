"""O22: bad input to the outbox's public functions is refused with a StatebookError and writes nothing.

Each case runs on both backends (tests/conformance): the same input is refused the same way, with
an error naming the public argument, before any statement, and the row and fact counts stay put.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiles import examples
from statebook.lifecycle import Actor, Book, Reason, StatebookError, TransitionRejected, create, verify
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import facts_table
from statebook.outbox import (
    ArgvTransport,
    CallableTransport,
    DeliveryWorker,
    DispatchInvalid,
    Retention,
    ack_dispatch,
    apply_retention,
    deliver_due_dispatches,
    dispatch_outbox,
    enqueue_dispatch,
    enqueue_dispatches,
    enqueue_revival_heartbeat,
    get_dispatch,
    list_dispatches,
    purge_dispatch,
    purge_dispatches,
    retry_dispatch,
)
from statebook.outbox.dispatch.bounds import ARG_STRLEN, ARGV_PAYLOAD_BYTES, dispatch_limits
from statebook.outbox.dispatch.checks import MAX_ATTEMPTS
from statebook.outbox.dispatch.enqueue import ENQUEUE_ACTOR, _new_row

from .support import Recorder, row

DEEP: Any = {}
_node = DEEP
for _ in range(3_000):
    _node["x"] = {}
    _node = _node["x"]

SEND = Recorder().transport
ARGV_TEMPLATE = [sys.executable, "-c", "import sys; open(sys.argv[2], 'w').write(str(len(sys.argv[1])))",
                 "{payload}", "{deliver_to}"]


async def counts(book: Book) -> tuple[int, int]:
    """(dispatch rows, facts): what a refusal must leave as it was."""
    async with book.read() as conn:
        rows = (await conn.execute(sa.select(sa.func.count()).select_from(dispatch_outbox))).scalar_one()
        found = (await conn.execute(sa.select(sa.func.count()).select_from(facts_table))).scalar_one()
    return rows, found


async def seeded(book: Book, clock) -> dict[str, str]:
    """A delivered, a dead-lettered and a pending ack-required dispatch, settled an hour ago."""
    ok = await enqueue_dispatch(book, kind="k", deliver_to="ok")
    dead = await enqueue_dispatch(book, kind="k", deliver_to="dead", max_attempts=1)
    await deliver_due_dispatches(book, transport=Recorder(outcome=lambda to, _n: to == "ok").transport)
    acked = await enqueue_dispatch(book, kind="k", deliver_to="ack", ack_required=True)
    clock.advance(3600)
    return {"ok": ok, "dead": dead, "ack": acked}


async def refused(book: Book, call: Callable[[], Any], argument: str) -> InvalidArgument:
    """Run ``call`` (sync or async); it must raise an InvalidArgument naming ``argument`` and write nothing."""
    before = await counts(book)
    with pytest.raises(StatebookError) as caught:
        result = call()
        if inspect.isawaitable(result):
            await result
    exc = caught.value
    assert isinstance(exc, InvalidArgument), f"{type(exc).__name__}: {exc}"
    assert exc.argument == argument and str(exc).startswith(argument), str(exc)
    assert await counts(book) == before
    return exc


# (case id, argument named, call) — every time, duration, count and limit argument (O22 rule 1).
NUMBERS: list[tuple[str, str, Callable[[Book], Any]]] = [
    ("purge-before-nan", "before", lambda b: purge_dispatches(b, before=float("nan"), dry_run=True)),
    ("purge-before-inf", "before", lambda b: purge_dispatches(b, before=float("inf"))),
    ("purge-before-negative", "before", lambda b: purge_dispatches(b, before=-1.0)),
    ("purge-before-year-10000", "before", lambda b: purge_dispatches(b, before=1e12)),
    ("purge-before-text", "before", lambda b: purge_dispatches(b, before="yesterday")),
    ("retention-now-nan", "now", lambda b: apply_retention(b, now=float("nan"))),
    ("retention-delivered-0", "delivered_days", lambda b: apply_retention(b, now=1e9, delivered_days=0)),
    ("retention-failed-inf", "failed_days", lambda b: apply_retention(b, now=1e9, failed_days=float("inf"))),
    ("retention-failed-nan", "failed_days", lambda b: apply_retention(b, now=1e9, failed_days=float("nan"))),
    ("Retention-nan", "delivered_days", lambda b: Retention(delivered_days=float("nan"))),
    ("Retention-every-0", "every_seconds", lambda b: Retention(every_seconds=0)),
    ("list-limit-0", "limit", lambda b: list_dispatches(b, limit=0)),
    ("list-limit-2**63", "limit", lambda b: list_dispatches(b, limit=2**63)),
    ("list-limit-true", "limit", lambda b: list_dispatches(b, limit=True)),
    ("deliver-now-nan", "now", lambda b: deliver_due_dispatches(b, transport=SEND, now=float("nan"))),
    ("deliver-batch-2**31", "batch_size", lambda b: deliver_due_dispatches(b, transport=SEND, batch_size=2**31)),
    ("deliver-concurrency-0", "concurrency", lambda b: deliver_due_dispatches(b, transport=SEND, concurrency=0)),
    ("worker-tick-nan", "tick_seconds", lambda b: DeliveryWorker(b, SEND, tick_seconds=float("nan"))),
    ("worker-tick-inf", "tick_seconds", lambda b: DeliveryWorker(b, SEND, tick_seconds=float("inf"))),
    ("worker-batch-0", "batch_size", lambda b: DeliveryWorker(b, SEND, batch_size=0)),
    ("enqueue-expires-nan", "expires_at", lambda b: enqueue_dispatch(b, kind="k", deliver_to="r",
                                                                     expires_at=float("nan"))),
    ("enqueue-expires-1e20", "expires_at", lambda b: enqueue_dispatch(b, kind="k", deliver_to="r", expires_at=1e20)),
    ("heartbeat-ttl-nan", "ttl_seconds", lambda b: enqueue_revival_heartbeat(b, ["s"], reset_epoch=1e9,
                                                                             ttl_seconds=float("nan"))),
    ("heartbeat-epoch-inf", "reset_epoch", lambda b: enqueue_revival_heartbeat(b, ["s"], reset_epoch=float("inf"))),
    ("heartbeat-past-9999", "reset_epoch + ttl_seconds",
     lambda b: enqueue_revival_heartbeat(b, ["s"], reset_epoch=253402300000.0, ttl_seconds=10_000)),
    ("argv-timeout-nan", "timeout", lambda b: ArgvTransport(["true", "{deliver_to}"], timeout=float("nan"))),
    ("callable-timeout-negative", "timeout", lambda b: CallableTransport(Recorder(), timeout=-1)),
]

# (case id, argument named, call) — text, ids, flags and shapes of the other public functions.
SHAPES: list[tuple[str, str, Callable[[Book, dict[str, str]], Any]]] = [
    ("get-surrogate-id", "dispatch_id", lambda b, s: get_dispatch(b, "\ud800")),
    ("get-nul-id", "dispatch_id", lambda b, s: get_dispatch(b, "a\x00b")),
    ("get-int-id", "dispatch_id", lambda b, s: get_dispatch(b, 7)),
    ("ack-surrogate-id", "dispatch_id", lambda b, s: ack_dispatch(b, "\udfff", "t")),
    ("ack-nul-token", "ack_token", lambda b, s: ack_dispatch(b, s["ack"], "x\x00")),
    ("ack-surrogate-token", "ack_token", lambda b, s: ack_dispatch(b, s["ack"], "\ud800")),
    ("ack-none-token", "ack_token", lambda b, s: ack_dispatch(b, s["ack"], None)),
    ("retry-surrogate-id", "dispatch_id", lambda b, s: retry_dispatch(b, "\ud800")),
    ("retry-actor-text", "actor", lambda b, s: retry_dispatch(b, s["dead"], actor="operator:alice")),
    ("purge-one-nul-id", "dispatch_id", lambda b, s: purge_dispatch(b, "\x00")),
    ("purge-one-force-text", "force", lambda b, s: purge_dispatch(b, s["ok"], force="no")),
    ("purge-statuses-one-string", "statuses", lambda b, s: purge_dispatches(b, before=1e10, statuses="delivered")),
    ("purge-status-surrogate", "statuses[0]", lambda b, s: purge_dispatches(b, before=1e10, statuses=["\ud800"])),
    ("purge-dry-run-text", "dry_run", lambda b, s: purge_dispatches(b, before=1e10, dry_run="yes")),
    ("purge-progress-not-callable", "progress", lambda b, s: purge_dispatches(b, before=1e10, progress=5)),
    ("list-status-surrogate", "status", lambda b, s: list_dispatches(b, status="\ud800")),
    ("list-status-int", "status", lambda b, s: list_dispatches(b, status=3)),
    ("deliver-transport-int", "transport", lambda b, s: deliver_due_dispatches(b, transport=3)),
    ("deliver-template-nul", "notify_template[1]",
     lambda b, s: deliver_due_dispatches(b, notify_template=["notify", "a\x00", "{deliver_to}"])),
    ("worker-retention-dict", "retention", lambda b, s: DeliveryWorker(b, SEND, retention={"days": 1})),
    ("worker-not-a-book", "book", lambda b, s: DeliveryWorker("sqlite://", SEND)),
    ("heartbeat-seats-string", "seats", lambda b, s: enqueue_revival_heartbeat(b, "seat-1", reset_epoch=0)),
    ("heartbeat-seat-nul", "seats[1]", lambda b, s: enqueue_revival_heartbeat(b, ["a", "b\x00"], reset_epoch=0)),
    ("batch-not-a-list", "items", lambda b, s: enqueue_dispatches(b, None)),
    ("batch-int-key", "items[0]", lambda b, s: enqueue_dispatches(b, [{"kind": "k", "deliver_to": "r", 1: 2}])),
]


# Fuzzing: text and numbers the boundary must sort out (surrogates, NUL, dashes, huge, blank, nan, 2**63).
ODD_TEXT = st.one_of(st.text(max_size=12), st.sampled_from(
    ["", "   ", "\ud800", "a\x00b", "-opt", "--version", "x" * 300, "é\udfff", "0" * 32]))
NUMBER = st.one_of(st.integers(), st.floats(), st.sampled_from(
    [0, 1, 10_000, 10_001, 2**31, 2**63, -(2**63) - 1, 1e400, 253402300800.0, True]))
BODY = st.one_of(
    st.none(), st.just(DEEP), st.just(["a", "list"]), st.just({"big": "x" * 2_000_000}),
    st.recursive(st.one_of(st.none(), st.booleans(), NUMBER, ODD_TEXT),
                 lambda kids: st.lists(kids, max_size=3) | st.dictionaries(ODD_TEXT | st.integers(), kids, max_size=3),
                 max_leaves=8),
)
ENQUEUE_FIELDS = {
    "kind": ODD_TEXT, "deliver_to": ODD_TEXT, "body": BODY, "dedup_key": st.none() | ODD_TEXT,
    "ack_required": st.sampled_from([True, False, 1, "yes"]), "max_attempts": NUMBER,
    "expires_at": st.none() | NUMBER, "session_id": st.none() | ODD_TEXT,
}
FUZZ = settings(max_examples=examples(150), derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.differing_executors])
"""Derandomized, so both backends run the same inputs; one test per backend (hence the executors)."""


async def outcome(book: Book, call: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or ("refused", error); the refusal must be an InvalidArgument (decided before
    any statement, so by the input alone: both backends decide alike) and must write nothing."""
    before = await counts(book)
    try:
        return "ok", await call()
    except StatebookError as exc:
        assert await counts(book) == before, f"{type(exc).__name__} after a write: {exc}"
        return "refused", exc


class OutboxInputCases:
    """Conformance cases: each bad input the same refusal on every backend."""

    @pytest.mark.parametrize(("argument", "call"), [c[1:] for c in NUMBERS], ids=[c[0] for c in NUMBERS])
    async def test_a_time_duration_or_count_out_of_range_is_refused_before_any_query(
        self, book, clock, argument, call
    ):
        """O22 (issue 10: ``purge_dispatches(before=nan, dry_run=True)`` listed every finished dispatch
        on PostgreSQL): every time, duration, count and limit is finite and in range, or refused with
        an InvalidArgument naming it; nothing is written or purged."""
        await seeded(book, clock)
        await refused(book, lambda: call(book), argument)
        assert len(await purge_dispatches(book, before=clock.now(), dry_run=True)) == 2

    @pytest.mark.parametrize(("argument", "call"), [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
    async def test_every_public_function_refuses_a_bad_argument_with_a_statebook_error(
        self, book, clock, argument, call
    ):
        """O22: ids, tokens, statuses, flags, actors, callbacks and shapes that no backend can take the
        same way (a lone surrogate, NUL, a wrong type) are refused naming the argument; nothing changes."""
        ids = await seeded(book, clock)
        await refused(book, lambda: call(book, ids), argument)

    @pytest.mark.parametrize(("field", "value"), [
        pytest.param("deliver_to", "seat-\ud800", id="route"),
        pytest.param("kind", "\udc00", id="kind"),
        pytest.param("body", {"text": "a\ud800b"}, id="body-value"),
        pytest.param("body", {"\ud800": 1}, id="body-key"),
        pytest.param("dedup_key", "k\ud800", id="dedup-key"),
    ])
    async def test_a_lone_surrogate_is_an_invalid_argument_not_a_unicode_error(self, book, field, value):
        """O22 (issue 10: a lone surrogate in a route, kind or body raised UnicodeEncodeError)."""
        args = {"kind": "k", "deliver_to": "r", field: value}
        exc = await refused(book, lambda: enqueue_dispatch(book, **args), field)
        assert exc.rule == "utf8" and isinstance(exc, DispatchInvalid)
        exc = await refused(book, lambda: enqueue_dispatches(book, [{"kind": "k", "deliver_to": "r"}, args]),
                            f"items[1].{field}")
        assert exc.rule == "utf8"

    async def test_a_deep_body_is_refused_by_the_books_depth_limit(self, book):
        """O22 (issue 10: a body nested 3,000 levels raised RecursionError): the body's depth and size
        are bounded by ``book.limits`` (json_depth, json_bytes), walked without recursion."""
        exc = await refused(book, lambda: enqueue_dispatch(book, kind="k", deliver_to="r", body=DEEP), "body")
        assert exc.rule == "depth" and "32 levels" in str(exc)
        shallow = dataclasses.replace(book, limits=dataclasses.replace(book.limits, json_depth=2))
        body = {"a": {"b": {"c": 1}}}
        exc = await refused(book, lambda: enqueue_dispatch(shallow, kind="k", deliver_to="r", body=body), "body")
        assert "2 levels" in str(exc)
        assert await enqueue_dispatch(book, kind="k", deliver_to="r", body=body)

    async def test_a_batch_item_that_is_not_a_mapping_is_refused(self, book):
        """O22 (issue 10: ``enqueue_dispatches([None])`` raised TypeError)."""
        for items, argument in (([None], "items[0]"), ([{"kind": "k", "deliver_to": "r"}, "kind=k"], "items[1]"),
                                ([["kind", "k"]], "items[0]")):
            exc = await refused(book, lambda items=items: enqueue_dispatches(book, items), argument)
            assert exc.rule == "type" and "expected a mapping" in str(exc)
        await refused(book, lambda: enqueue_dispatches(book, 7), "items")

    @pytest.mark.parametrize("max_attempts", [0, MAX_ATTEMPTS + 1, 2**31, 2**63, 2**100, 3.0, True])
    async def test_max_attempts_outside_1_to_10000_is_refused_on_every_backend(self, book, max_attempts):
        """O22 (issue 10: 2**31 was accepted on SQLite and a database error on PostgreSQL, 2**63 an
        OverflowError on SQLite): max_attempts is an integer from 1 to 10,000, on both backends."""
        exc = await refused(book, lambda: enqueue_dispatch(book, kind="k", deliver_to="r", max_attempts=max_attempts),
                            "max_attempts")
        assert "10000" in str(exc) or exc.rule == "type"
        items = [{"kind": "k", "deliver_to": "r", "max_attempts": max_attempts}]
        await refused(book, lambda: enqueue_dispatches(book, items), "items[0].max_attempts")
        await refused(book, lambda: enqueue_revival_heartbeat(book, ["s"], reset_epoch=0, max_attempts=max_attempts),
                      "max_attempts")
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", max_attempts=MAX_ATTEMPTS)
        assert (await row(book, did)).max_attempts == MAX_ATTEMPTS

    async def test_a_template_element_or_route_with_nul_is_refused_not_a_value_error(self, book):
        """O22 (issue 10: ``ArgvTransport.send`` with a NUL in the route or a template element raised
        ValueError): a template element with NUL, a lone surrogate or not text is refused when the
        transport is built; a route or payload no command line can carry is refused by ``send``."""
        for template, argument in ((["notify", "a\x00b", "{deliver_to}"], "template[1]"),
                                   (["notify", "\ud800", "{deliver_to}"], "template[1]"),
                                   (["notify", 7, "{deliver_to}"], "template[1]"),
                                   ([None, "{deliver_to}"], "template[0]")):
            await refused(book, lambda template=template: ArgvTransport(template), argument)
        transport = ArgvTransport(["true", "{deliver_to}"])
        await refused(book, lambda: transport.send("seat\x00", "{}"), "deliver_to")
        await refused(book, lambda: transport.send("seat", '{"a":"\ud800"}'), "payload")
        stdin = ArgvTransport(["true", "{deliver_to}"])
        await refused(book, lambda: stdin.send("seat", "\ud800"), "payload")

    async def test_a_dash_route_that_reaches_send_is_a_recorded_failure_and_never_runs(self, book, clock, tmp_path):
        """O22: a row whose route starts with '-' (enqueued under other limits, here written with the
        engine's own create) is refused by ``ArgvTransport.send`` when its template has no '--': the
        attempt fails with the reason and the command never runs."""
        values = _new_row({"kind": "k", "deliver_to": "--version", "body": {}, "dedup_key": None,
                           "ack_required": False, "max_attempts": 3, "expires_at": None, "session_id": None,
                           "schedule_run_id": None}, clock.now())
        await create(book, "dispatch", values=values, status="pending",
                     reason=Reason("dispatch.pending.enqueued", "enqueued kind=k"), actor=ENQUEUE_ACTOR)
        marker = tmp_path / "ran"
        transport = ArgvTransport([sys.executable, "-c", f"open({str(marker)!r}, 'w')", "{deliver_to}"])
        assert (await deliver_due_dispatches(book, transport=transport))["retried"] == 1
        failed = await row(book, values["id"])
        assert failed.status == "pending" and "starts with '-'" in failed.last_error
        assert not marker.exists()
        assert (await verify(book, "dispatch")).ok

    async def test_a_payload_argv_cannot_carry_is_refused_at_enqueue(self, book, tmp_path):
        """O22 (issue 10: a 10 MB body with {payload} as an argv element failed every attempt with
        "Argument list too long"): with ``book.limits`` from the template, a payload beyond what one
        argv element carries is refused at enqueue, naming the bound and why; one at the bound is
        delivered; without {payload} (stdin) the bound is json_bytes."""
        argv_book = dataclasses.replace(book, limits=ArgvTransport(ARGV_TEMPLATE).limits(book.limits))
        assert argv_book.limits.payload_bytes == ARGV_PAYLOAD_BYTES
        huge = {"blob": "x" * 10_000_000}
        exc = await refused(book, lambda: enqueue_dispatch(argv_book, kind="k", deliver_to="r", body=huge), "body")
        assert exc.rule == "size"  # 10 MB is past json_bytes before the envelope is counted
        over = {"blob": "x" * ARGV_PAYLOAD_BYTES}
        exc = await refused(book, lambda: enqueue_dispatch(argv_book, kind="k", deliver_to="r", body=over), "body")
        assert exc.rule == "payload" and str(ARGV_PAYLOAD_BYTES) in str(exc) and str(ARG_STRLEN) in str(exc)
        route = str(tmp_path / "len")
        fits = await _largest_accepted(argv_book, route)
        stored = len(json.dumps((await row(book, fits)).payload, sort_keys=True, separators=(",", ":"),
                                ensure_ascii=False).encode())
        assert ARGV_PAYLOAD_BYTES - 64 < stored <= ARGV_PAYLOAD_BYTES
        assert (await deliver_due_dispatches(book, transport=ArgvTransport(ARGV_TEMPLATE)))["delivered"] == 1
        assert int((tmp_path / "len").read_text()) == stored and (await row(book, fits)).status == "delivered"
        stdin_book = dataclasses.replace(book, limits=dispatch_limits(["cat", "{deliver_to}"], book.limits))
        assert await enqueue_dispatch(stdin_book, kind="k", deliver_to="r", body=over)
        small = dispatch_limits(["cat", "{deliver_to}"], book.limits, payload_bytes=1_000)
        exc = await refused(book, lambda: enqueue_dispatch(dataclasses.replace(book, limits=small), kind="k",
                                                           deliver_to="r", body={"x": "y" * 1_000}), "body")
        assert "1000" in str(exc) and "payload_bytes" in str(exc)

    async def test_a_route_starting_with_a_dash_is_refused_unless_the_template_ends_options(self, book):
        """O22 (issue 10: a route ``--version`` reached ``/bin/ls`` as an option): a route starting
        with '-' is refused at enqueue unless ``book.limits`` says the template puts '--' before
        {deliver_to}."""
        for route in ("--version", "-rf"):
            exc = await refused(book, lambda route=route: enqueue_dispatch(book, kind="k", deliver_to=route),
                                "deliver_to")
            assert exc.rule == "dash" and "'--'" in str(exc)
            await refused(book, lambda route=route: enqueue_dispatches(book, [{"kind": "k", "deliver_to": route}]),
                          "items[0].deliver_to")
        plain = dataclasses.replace(book, limits=dispatch_limits(["/bin/ls", "{deliver_to}"], book.limits))
        await refused(book, lambda: enqueue_dispatch(plain, kind="k", deliver_to="--version"), "deliver_to")
        ended = dataclasses.replace(book, limits=dispatch_limits(["/bin/ls", "--", "{deliver_to}"], book.limits))
        did = await enqueue_dispatch(ended, kind="k", deliver_to="--version")
        assert (await row(book, did)).deliver_to == "--version"

    async def test_retry_in_a_wrong_state_is_refused_not_false(self, book, clock):
        """O22, O15 (issue 10: ``dispatch retry`` in a wrong state exited 1, unlike every other refusal):
        retry of a pending, delivered or acked row raises TransitionRejected and writes nothing."""
        ids = await seeded(book, clock)
        for did in (ids["ok"], ids["ack"]):
            before = await counts(book)
            with pytest.raises(TransitionRejected, match="only dead_letter or expired") as caught:
                await retry_dispatch(book, did, actor=Actor("operator", "dana"))
            assert caught.value.rule == "status" and await counts(book) == before


    @FUZZ
    @given(data=st.data())
    async def test_fuzzed_enqueues_succeed_or_are_refused_before_any_write(self, book, data):
        """O22 fuzz: enqueue_dispatch and enqueue_dispatches with odd text, numbers and bodies either
        succeed (one row and one fact per new dispatch) or raise an InvalidArgument and write nothing;
        nothing else escapes, and the history verifies."""
        args = {"kind": "k", "deliver_to": "r"}
        for field, strategy in ENQUEUE_FIELDS.items():
            if data.draw(st.booleans(), label=f"set {field}"):
                args[field] = data.draw(strategy, label=field)
        batch = data.draw(st.booleans(), label="as a batch")
        before = await counts(book)
        call = (lambda: enqueue_dispatches(book, [args])) if batch else (lambda: enqueue_dispatch(book, **args))
        kind, result = await outcome(book, call)
        if kind == "ok":
            assert await counts(book) in (before, (before[0] + 1, before[1] + 1))
        else:
            assert isinstance(result, InvalidArgument), f"{type(result).__name__}: {result}"
            named = result.argument.removeprefix("items[0].")
            assert named in ENQUEUE_FIELDS or named == "body", result.argument
        assert (await verify(book, "dispatch")).ok

    @FUZZ
    @given(data=st.data())
    async def test_fuzzed_operator_calls_succeed_or_are_refused_with_a_statebook_error(self, book, clock, data):
        """O22 fuzz: get, list, ack, retry and purge with odd ids, tokens, statuses, times and limits
        return or raise a StatebookError; a refusal writes nothing."""
        did = await enqueue_dispatch(book, kind="k", deliver_to="r", ack_required=True)
        text, number = ODD_TEXT | st.just(did), NUMBER | ODD_TEXT
        calls = {
            "get": lambda: get_dispatch(book, data.draw(text)),
            "list": lambda: list_dispatches(book, status=data.draw(st.none() | ODD_TEXT), limit=data.draw(number)),
            "ack": lambda: ack_dispatch(book, data.draw(text), data.draw(ODD_TEXT | st.integers())),
            "retry": lambda: retry_dispatch(book, data.draw(text)),
            "purge": lambda: purge_dispatch(book, data.draw(text), force=data.draw(st.sampled_from([False, "x"]))),
            "bulk": lambda: purge_dispatches(book, before=data.draw(number), dry_run=True,
                                             statuses=data.draw(st.none() | st.lists(ODD_TEXT, max_size=2))),
            "retention": lambda: apply_retention(book, now=data.draw(number), delivered_days=data.draw(number)),
        }
        name = data.draw(st.sampled_from(sorted(calls)), label="call")
        await outcome(book, calls[name])
        assert (await verify(book, "dispatch")).ok

class _Rollback(Exception):
    pass


async def _largest_accepted(book: Book, route: str) -> str:
    """Enqueue the largest ``{"blob": "x"*n}`` the book's payload bound admits (a binary search whose
    probes are rolled back)."""
    low, high = 1, ARGV_PAYLOAD_BYTES
    while low < high:
        mid = (low + high + 1) // 2
        try:
            async with book.begin() as tx:
                await enqueue_dispatch(tx, kind="k", deliver_to=route, body={"blob": "x" * mid})
                raise _Rollback
        except DispatchInvalid:
            high = mid - 1
        except _Rollback:
            low = mid
    return await enqueue_dispatch(book, kind="k", deliver_to=route, body={"blob": "x" * low})
