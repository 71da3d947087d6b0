"""Every public function of lifecycle, outbox and scheduler under bad input, on SQLite and PostgreSQL.

One test per surface; each example runs the same call on both backends (support.Pair.check): it
succeeds or raises a StatebookError, writes nothing when it fails, leaves ``verify`` clean, and ends
the same way on both. The number of examples per surface is the ``EXAMPLES`` entry named after it.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from statebook.lifecycle import (
    Actor, Command, NewEntity, Reason, apply_many, as_of, create, create_many, history, purge, replay, transition,
    verify,
)
from statebook.outbox import (
    ArgvTransport, CallableTransport, DeliveryWorker, Retention, ack_dispatch, apply_retention,
    deliver_due_dispatches, enqueue_dispatch, enqueue_dispatches, enqueue_revival_heartbeat, expedite_dispatch,
    get_dispatch, list_dispatches, purge_dispatch, purge_dispatches, retry_dispatch,
)
from statebook.scheduler import (
    CreateScheduleRequest, cancel_run, create_schedule, delete_schedule, disable_schedule, enable_schedule,
    find_schedule, get_run, get_schedule, list_runs, list_schedules,
)

from statebook.outbox.notifications import (
    ensure_bucket, get_notification, list_dead_letters, list_notifications, notification_attempts,
    ack_notification, dismiss_notification, get_response, replay_notification, resolve_notification,
    send_notification,
)
from statebook.outbox.notifications.buckets import draw
from statebook.outbox.notifications.responses import expire_responses

from .strategies import Deep, Seed, bodies, ids, integers, json_values, numbers, texts, times, wrong_types
from .support import START, examples, open_pair

pytestmark = pytest.mark.postgres

EXAMPLES = {
    "create": 30, "create_many": 15, "transition": 30, "apply_many": 15, "purge": 15, "read": 20, "verify": 10,
    "enqueue_dispatch": 40, "enqueue_dispatches": 15, "ack_dispatch": 20, "dispatch_by_id": 20,
    "list_dispatches": 15, "purge_dispatches": 25, "apply_retention": 20, "deliver_due_dispatches": 20,
    "argv_transport": 40, "revival_heartbeat": 15, "worker_settings": 15,
    "create_schedule": 40, "schedule_by_ref": 20, "runs": 20,
    "send_notification": 40, "notification_reads": 20, "rate_buckets": 20, "notification_recovery": 20,
    "notification_responses": 20,
}
"""Examples per surface (HYPOTHESIS_PROFILE=deep runs ten times as many)."""

BOOLS = st.one_of(st.booleans(), wrong_types())


@pytest.fixture(scope="module")
def pair(pg_url, tmp_path_factory):
    yield from open_pair(tmp_path_factory.mktemp("fuzz") / "api.db", pg_url)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


# -- shared pieces ------------------------------------------------------------------------------
reasons = st.builds(
    lambda code, summary, evidence: (code, summary, evidence),
    texts("dispatch.pending.enqueued", "dispatch.delivering.attempt", "dispatch.purged.operator"),
    texts(""), st.lists(texts("ticket:1"), max_size=2).map(tuple),
)
actors = st.builds(lambda kind, name: (kind, name), texts("system", "operator"), texts("fuzz", ""))


def reason(drawn: tuple[Any, Any, Any]) -> Reason:
    return Reason(*drawn)


def actor(drawn: tuple[Any, Any]) -> Actor:
    return Actor(*drawn)


dispatch_values = st.fixed_dictionaries(
    {"kind": texts("note"), "deliver_to": texts("ops"), "payload": bodies(), "next_attempt_at": times(),
     "created_at": times()},
    optional={"max_attempts": integers(8), "attempt": integers(0), "dedup_key": maybe(texts("k1")),
              "expires_at": maybe(times()), "last_error": texts(), "nope": texts()},
)
entity_types = texts("dispatch", "schedule", "schedule_run")
metadata = maybe(bodies())


def new_entity(values, status, why, who, meta) -> NewEntity:
    return NewEntity(values, status, reason(why), actor(who), meta)


# -- statebook.lifecycle ------------------------------------------------------------------------
@examples(EXAMPLES["create"])
@given(entity_types, dispatch_values, texts("pending"), reasons, actors, metadata, maybe(ids("pending")),
       BOOLS, BOOLS)
def test_create(pair, entity_type, values, status, why, who, meta, entity_id, if_absent, fresh_id):
    async def call(book, r):
        await create(book, entity_type, values=r(values), status=status, reason=reason(why), actor=actor(who),
                     metadata=r(meta), entity_id=r(entity_id), if_absent=if_absent, fresh_id=fresh_id)

    pair.check(call)


@examples(EXAMPLES["create_many"])
@given(entity_types, st.lists(st.one_of(st.tuples(dispatch_values, texts("pending"), reasons, actors, metadata),
                                        wrong_types()), max_size=3), BOOLS)
def test_create_many(pair, entity_type, items, if_absent):
    async def call(book, r):
        made = [new_entity(*r(item)) if isinstance(item, tuple) else item for item in items]
        await create_many(book, entity_type, made, if_absent=if_absent)

    pair.check(call)


patches = st.fixed_dictionaries({}, optional={
    "attempt": integers(1), "last_error": texts(), "next_attempt_at": times(), "claim_id": texts("c1"),
    "kind": texts("other"), "nope": json_values()})
guards = maybe(st.fixed_dictionaries({}, optional={"attempt": integers(0), "status": texts("pending")}))
expected_statuses = st.one_of(texts("pending"), st.lists(texts("pending", "dead_letter"), max_size=3), wrong_types())
transition_args = st.tuples(entity_types, ids("pending", "dead_letter", "delivered", "schedule"),
                            texts("delivering", "pending"), reasons, actors, expected_statuses, guards, maybe(patches),
                            maybe(texts("idem-1")), metadata)


@examples(EXAMPLES["transition"])
@given(transition_args)
def test_transition(pair, args):
    entity_type, entity_id, target, why, who, expected, guard, patch, key, meta = args

    async def call(book, r):
        await transition(book, entity_type, r(entity_id), target, reason=reason(why), actor=actor(who),
                         expected=expected, guards=guard, patch=r(patch), idempotency_key=key, metadata=r(meta))

    pair.check(call)


@examples(EXAMPLES["apply_many"])
@given(st.lists(st.one_of(transition_args, wrong_types()), max_size=3), texts("wait", "skip_locked"),
       maybe(st.dictionaries(texts("x"), st.one_of(bodies(), wrong_types()), max_size=2)))
def test_apply_many(pair, commands, lock, seen):
    async def call(book, r):
        built = []
        for item in commands:
            if not isinstance(item, tuple):
                built.append(item)
                continue
            et, eid, target, why, who, expected, guard, patch, key, meta = item
            built.append(Command(et, r(eid), target, reason(why), actor(who),
                                 tuple(expected) if isinstance(expected, list) else expected,
                                 guard or {}, r(patch) or {}, key, r(meta) or {}))
        await apply_many(book, built, lock=lock, seen=r(seen))

    pair.check(call)


@examples(EXAMPLES["purge"])
@given(entity_types, ids("pending", "dead_letter", "delivered"), reasons, actors, maybe(expected_statuses), BOOLS)
def test_purge(pair, entity_type, entity_id, why, who, expected, force):
    async def call(book, r):
        await purge(book, entity_type, r(entity_id), reason=reason(why), actor=actor(who), expected=expected,
                    force=force)

    pair.check(call)


@examples(EXAMPLES["read"])
@given(st.sampled_from(["history", "replay", "as_of"]), entity_types, ids("pending", "delivered", "schedule"), times())
def test_history_replay_as_of(pair, which, entity_type, entity_id, when):
    async def call(book, r):
        if which == "history":
            await history(book, entity_type, r(entity_id))
        elif which == "replay":
            await replay(book, entity_type, r(entity_id))
        else:
            await as_of(book, entity_type, r(entity_id), when)

    pair.check(call)


@examples(EXAMPLES["verify"])
@given(maybe(entity_types), st.one_of(st.none(), st.sampled_from([1, 0, -1, 2**80, 1.5, float("nan"), "2"])))
def test_verify(pair, entity_type, processes):
    async def call(book, r):
        await verify(book, entity_type, processes=processes)

    pair.check(call)


# -- statebook.outbox ---------------------------------------------------------------------------
enqueue_kwargs = st.fixed_dictionaries(
    {"kind": texts("note"), "deliver_to": texts("ops", "#ops")},
    optional={"body": maybe(bodies()), "dedup_key": maybe(texts("k1")), "ack_required": BOOLS,
              "max_attempts": integers(8, 1), "expires_at": maybe(times()), "session_id": maybe(texts("s1")),
              "schedule_run_id": maybe(ids("pending"))},
)


@examples(EXAMPLES["enqueue_dispatch"])
@example({"kind": "note", "deliver_to": "\ud800"})
@example({"kind": "\ud800", "deliver_to": "ops"})
@example({"kind": "note", "deliver_to": "ops", "body": {"text": "\ud800"}})
@example({"kind": "note", "deliver_to": "ops", "body": {"deep": Deep(3000)}})
@example({"kind": "note", "deliver_to": "ops", "max_attempts": 2**31})
@example({"kind": "note", "deliver_to": "ops", "max_attempts": 2**63})
@example({"kind": "note", "deliver_to": "ops", "expires_at": float("nan")})
@given(enqueue_kwargs)
def test_enqueue_dispatch(pair, kwargs):
    async def call(book, r):
        await enqueue_dispatch(book, **r(kwargs))

    pair.check(call)


@examples(EXAMPLES["enqueue_dispatches"])
@example([None])
@given(st.one_of(st.lists(st.one_of(enqueue_kwargs, wrong_types()), max_size=3), wrong_types()))
def test_enqueue_dispatches(pair, items):
    async def call(book, r):
        await enqueue_dispatches(book, r(items))

    pair.check(call)


@examples(EXAMPLES["ack_dispatch"])
@given(ids("pending", "delivered", "dead_letter"), st.one_of(st.just(Seed("ack_token")), texts()), actors)
def test_ack_dispatch(pair, dispatch_id, token, who):
    async def call(book, r):
        await ack_dispatch(book, r(dispatch_id), r(token), actor=actor(who))

    pair.check(call)


@examples(EXAMPLES["dispatch_by_id"])
@given(st.sampled_from(["get", "purge", "retry", "expedite"]), ids("pending", "delivered", "dead_letter"), actors,
       BOOLS)
def test_get_purge_retry_dispatch(pair, which, dispatch_id, who, force):
    async def call(book, r):
        if which == "get":
            await get_dispatch(book, r(dispatch_id))
        elif which == "purge":
            await purge_dispatch(book, r(dispatch_id), actor=actor(who), force=force)
        elif which == "retry":
            await retry_dispatch(book, r(dispatch_id), actor=actor(who))
        else:
            await expedite_dispatch(book, r(dispatch_id), actor=actor(who))

    pair.check(call)


@examples(EXAMPLES["list_dispatches"])
@given(maybe(texts("pending", "delivered")), integers(50, 1))
def test_list_dispatches(pair, status, limit):
    async def call(book, r):
        await list_dispatches(book, status=status, limit=limit)

    pair.check(call)


@examples(EXAMPLES["purge_dispatches"])
@example(float("nan"), None, True, False, ("operator", "api"))
@example(float("nan"), None, False, False, ("operator", "api"))
@example(float("inf"), ["pending"], False, True, ("operator", "api"))
@given(times(), maybe(st.one_of(st.lists(texts("delivered", "dead_letter", "pending"), max_size=3), wrong_types())),
       BOOLS, BOOLS, actors)
def test_purge_dispatches(pair, before, statuses, dry_run, force, who):
    async def call(book, r):
        await purge_dispatches(book, before=before, statuses=statuses, dry_run=dry_run, force=force,
                               actor=actor(who))

    pair.check(call)


@examples(EXAMPLES["apply_retention"])
@given(times(), numbers(7), numbers(30), actors)
def test_apply_retention(pair, now, delivered_days, failed_days, who):
    async def call(book, r):
        await apply_retention(book, now=now, delivered_days=delivered_days, failed_days=failed_days,
                              actor=actor(who))

    pair.check(call)


SAFE_EXECUTABLES = ("/bin/true", "/bin/echo", "", "\x00", "/bin/ec\x00ho", "/nonexistent/x", "\ud800", "-x")
"""Templates are fuzzed in their arguments only: a drawn executable could be anything on this machine."""
templates = st.one_of(
    st.none(), wrong_types(),
    st.builds(lambda exe, rest: [exe, *rest], st.sampled_from(SAFE_EXECUTABLES),
              st.lists(texts("{deliver_to}", "{payload}", "--"), max_size=3)),
)


async def _ok(deliver_to: str, payload: str) -> bool:
    return True


@examples(EXAMPLES["deliver_due_dispatches"])
@given(maybe(times()), st.sampled_from(["callable", "none"]), maybe(templates), integers(100, 1), integers(8, 1),
       actors)
def test_deliver_due_dispatches(pair, now, transport, template, batch_size, concurrency, who):
    async def call(book, r):
        await deliver_due_dispatches(book, now=now, transport=CallableTransport(_ok) if transport == "callable" else None,
                                     notify_template=template, batch_size=batch_size, concurrency=concurrency,
                                     actor=actor(who))

    pair.check(call)


@examples(EXAMPLES["argv_transport"])
@example(["/bin/echo", "{deliver_to}"], 1.0, "a\x00b", "{}")
@example(["/bin/echo", "a\x00", "{payload}"], 1.0, "ops", "{}")
@given(templates, numbers(1.0, 0.5), texts("ops", "-n", "--version"), st.one_of(texts('{"a":1}'), wrong_types()))
def test_argv_transport(template, timeout, deliver_to, payload):
    """No database: construction refuses with a StatebookError or builds; send returns a result or refuses."""
    import asyncio

    from statebook.lifecycle import StatebookError
    from statebook.outbox import TransportResult

    try:
        transport = ArgvTransport(template, timeout=timeout)
    except StatebookError:
        return
    try:
        result = asyncio.run(transport.send(deliver_to, payload))
    except StatebookError:
        return
    assert isinstance(result, TransportResult)


@examples(EXAMPLES["revival_heartbeat"])
@given(st.one_of(st.lists(texts("seat-1"), max_size=3), wrong_types()), times(), numbers(3600.0), integers(8, 1))
def test_enqueue_revival_heartbeat(pair, seats, reset_epoch, ttl, max_attempts):
    async def call(book, r):
        await enqueue_revival_heartbeat(book, seats, reset_epoch=reset_epoch, ttl_seconds=ttl,
                                        max_attempts=max_attempts)

    pair.check(call)


@examples(EXAMPLES["worker_settings"])
@given(numbers(7), numbers(30), numbers(3600), integers(100, 1), integers(8, 1), numbers(30.0))
def test_retention_and_worker_settings(pair, delivered, failed, every, batch_size, concurrency, tick):
    async def call(book, r):
        retention = Retention(delivered, failed, every)
        DeliveryWorker(book, CallableTransport(_ok), batch_size=batch_size, concurrency=concurrency,
                       tick_seconds=tick, retention=retention)

    pair.check(call)


# -- statebook.scheduler ------------------------------------------------------------------------
CRONS = ("0 9 * * *", "* * * * *", "0 0 31 2 *", "61 * * * *", "* * * *", "@daily", "@reboot", "0 0 30 2 *")
ZONES = ("UTC", "Europe/Paris", "Mars/Olympus", "../../etc/passwd", "", "utc")
schedule_specs = st.fixed_dictionaries(
    {"name": texts("nightly", "weekly"), "trigger_type": texts("interval", "cron", "at"),
     "action_kind": texts("command", "agent")},
    optional={
        "cron_expr": maybe(st.one_of(st.sampled_from(CRONS), texts())), "timezone": maybe(st.one_of(
            st.sampled_from(ZONES), texts())), "interval_sec": maybe(integers(60, 3600, 99999999999)),
        "at_time": maybe(times()), "action_command": maybe(texts("/bin/true")),
        "action_command_args": maybe(st.lists(texts("-n"), max_size=2)), "action_prompt": maybe(texts("hi")),
        "action_cwd": maybe(texts("/tmp")), "max_runs": maybe(integers(3)), "budget_usd": maybe(numbers(1.5)),
        "budget_tokens": maybe(integers(1000)), "notify": maybe(st.one_of(
            st.fixed_dictionaries({"kind": texts("note"), "deliver_to": texts("ops")}), bodies())),
        "on_success": maybe(bodies()), "missed_fire_policy": texts("skip", "run_once"),
        "overlap_policy": texts("skip", "allow"), "enabled": BOOLS, "threshold_config": maybe(bodies()),
        "poll_interval_sec": maybe(integers(60)),
    },
)


@examples(EXAMPLES["create_schedule"])
@example({"name": "x", "trigger_type": "cron", "cron_expr": "0 0 31 2 *", "action_kind": "command",
          "action_command": "/bin/true"}, False, None, ("operator", "cli"))
@example({"name": "x", "trigger_type": "interval", "interval_sec": 99999999999, "action_kind": "command",
          "action_command": "/bin/true"}, False, None, ("operator", "cli"))
@example({"name": "x", "trigger_type": "cron", "cron_expr": "0 9 * * *", "timezone": "Mars/Olympus",
          "action_kind": "command", "action_command": "/bin/true"}, False, None, ("operator", "cli"))
@example({"name": "x", "trigger_type": "at", "at_time": float("nan"), "action_kind": "command",
          "action_command": "/bin/true"}, False, None, ("operator", "cli"))
@given(schedule_specs, st.booleans(), maybe(st.one_of(st.sampled_from(ZONES), texts())), actors)
def test_create_schedule(pair, spec, as_model, default_zone, who):
    async def call(book, r):
        request = CreateScheduleRequest.model_validate(r(spec)) if as_model else r(spec)
        await create_schedule(book, request, default_zone=default_zone, actor=actor(who))

    pair.check(call)


@examples(EXAMPLES["schedule_by_ref"])
@given(st.sampled_from(["enable", "disable", "delete", "find", "get"]), ids("schedule", "schedule_name", "pending"),
       maybe(st.one_of(st.sampled_from(ZONES), texts())), actors)
def test_schedule_by_ref(pair, which, ref, default_zone, who):
    async def call(book, r):
        ref_ = r(ref)
        if which == "enable":
            await enable_schedule(book, ref_, default_zone=default_zone, actor=actor(who))
        elif which == "disable":
            await disable_schedule(book, ref_, actor=actor(who))
        elif which == "delete":
            await delete_schedule(book, ref_, actor=actor(who))
        elif which == "find":
            await find_schedule(book, ref_)
        else:
            await get_schedule(book, ref_)

    pair.check(call)


@examples(EXAMPLES["runs"])
@given(st.sampled_from(["list_runs", "get_run", "cancel_run", "list_schedules"]), maybe(ids("schedule", "pending")),
       integers(50, 1), maybe(texts("running", "succeeded")), BOOLS, actors)
def test_runs(pair, which, ref, limit, status, include_deleted, who):
    async def call(book, r):
        if which == "list_runs":
            await list_runs(book, r(ref), limit=limit, status=status)
        elif which == "get_run":
            await get_run(book, r(ref))
        elif which == "cancel_run":
            await cancel_run(book, r(ref), actor=actor(who))
        else:
            await list_schedules(book, include_deleted=include_deleted)

    pair.check(call)



# -- statebook.outbox.notifications ---------------------------------------------------------------
notification_kwargs = st.fixed_dictionaries(
    {"recipient": texts("ops"), "content": st.one_of(bodies(), wrong_types()),
     "mode": st.one_of(texts("guaranteed", "best_effort", "GUARANTEED", "sometimes"), wrong_types()),
     "channels": st.one_of(st.lists(st.one_of(texts("slack", "email", "pagerduty", "websocket", "fax"),
                                              wrong_types()), max_size=5), wrong_types())},
    optional={"principal": st.one_of(texts("svc", ""), wrong_types()), "source": st.one_of(texts("alerts"), wrong_types()),
              "idempotency_key": maybe(st.one_of(texts("k1", "k2"), wrong_types())),
              "obligation_key": maybe(st.one_of(texts("disk"), wrong_types())),
              "obligation_window": maybe(numbers(0, 60, 300)), "response_timeout": maybe(numbers(1, 60)),
              "timeout_callback": maybe(st.one_of(texts("page"), wrong_types()))},
)


@examples(EXAMPLES["send_notification"])
@example({"recipient": "ops", "content": {}, "mode": "guaranteed", "channels": ["websocket"]})
@example({"recipient": "ops", "content": {"t": "\ud800"}, "mode": "best_effort", "channels": ["websocket"]})
@example({"recipient": "\x00", "content": {}, "mode": "guaranteed", "channels": ["email"]})
@example({"recipient": "ops", "content": {"deep": Deep(3000)}, "mode": "guaranteed", "channels": ["email"]})
@given(notification_kwargs)
def test_send_notification(pair, kwargs):
    async def call(book, r):
        await send_notification(book, **r(kwargs))

    pair.check(call)


@examples(EXAMPLES["notification_reads"])
@given(st.sampled_from(["get", "attempts", "list"]), st.one_of(texts("0" * 32), wrong_types()),
       maybe(st.one_of(texts("pending", "failed", "lost"), wrong_types())), maybe(BOOLS), integers(50, 1))
def test_notification_reads(pair, which, notification_id, status, dead_letter, limit):
    async def call(book, r):
        if which == "get":
            await get_notification(book, r(notification_id))
        elif which == "attempts":
            await notification_attempts(book, r(notification_id))
        else:
            await list_notifications(book, status=status, dead_letter=dead_letter, limit=limit)

    pair.check(call)


@examples(EXAMPLES["rate_buckets"])
@given(st.one_of(texts("email", "slack", "fax"), wrong_types()), st.one_of(texts("all"), wrong_types()),
       numbers(), numbers(), times())
def test_rate_buckets(pair, channel, scope, capacity, refill, now):
    async def call(book, r):
        await ensure_bucket(book, channel, scope, capacity=capacity, refill_per_second=refill)
        async with book.begin() as tx:
            await draw(tx, channel, scope, now=now)

    pair.check(call)


@examples(EXAMPLES["notification_recovery"])
@given(st.sampled_from(["replay", "resolve", "dead_letters"]), st.one_of(texts("0" * 32), wrong_types()), actors,
       maybe(st.one_of(texts("fixed", ""), wrong_types())), integers(100, 1))
def test_notification_recovery(pair, which, notification_id, who, words, limit):
    async def call(book, r):
        if which == "replay":
            await replay_notification(book, r(notification_id), actor=actor(who), note=words)
        elif which == "resolve":
            await resolve_notification(book, r(notification_id), reason=words, actor=actor(who))
        else:
            await list_dead_letters(book, limit=limit)

    pair.check(call)


@examples(EXAMPLES["notification_responses"])
@given(st.sampled_from(["ack", "dismiss", "get", "expire"]), st.one_of(texts("0" * 32), wrong_types()), actors,
       maybe(st.one_of(texts("on it", ""), wrong_types())), integers(100, 1))
def test_notification_responses(pair, which, notification_id, who, note, limit):
    async def call(book, r):
        if which == "ack":
            await ack_notification(book, r(notification_id), actor=actor(who), note=note)
        elif which == "dismiss":
            await dismiss_notification(book, r(notification_id), actor=actor(who), note=note)
        elif which == "get":
            await get_response(book, r(notification_id))
        else:
            await expire_responses(book, limit=limit)

    pair.check(call)


# -- integers too long to print (issue 25) -----------------------------------------------------------
HUGE = 10**5000
"""Past the 64-bit rule, and past Python's 4,300-digit limit on writing an integer as text."""


def _spec(**extra: Any) -> dict[str, Any]:
    return {"name": "huge", "trigger_type": "interval", "interval_sec": 60, "action_kind": "command",
            "action_command": "/bin/true", **extra}


HUGE_CALLS: dict[str, tuple[str, Any]] = {
    "dispatch body": ("DispatchInvalid", lambda b, r: enqueue_dispatch(b, kind="k", deliver_to="x", body={"n": HUGE})),
    "dispatch body, negative, nested": ("DispatchInvalid", lambda b, r: enqueue_dispatch(
        b, kind="k", deliver_to="x", body={"n": [{"m": -HUGE}]})),
    "dispatch batch body": ("DispatchInvalid", lambda b, r: enqueue_dispatches(
        b, [{"kind": "k", "deliver_to": "x", "body": {"n": HUGE}}])),
    "dispatch max_attempts": ("DispatchInvalid", lambda b, r: enqueue_dispatch(b, kind="k", deliver_to="x",
                                                                              max_attempts=HUGE)),
    "dispatch expires_at": ("DispatchInvalid", lambda b, r: enqueue_dispatch(b, kind="k", deliver_to="x",
                                                                            expires_at=HUGE)),
    "dispatch list limit": ("DispatchInvalid", lambda b, r: list_dispatches(b, limit=HUGE)),
    "dispatch purge before": ("DispatchInvalid", lambda b, r: purge_dispatches(b, before=HUGE)),
    "dispatch retention days": ("DispatchInvalid", lambda b, r: apply_retention(b, now=START, delivered_days=HUGE)),
    "dispatch pass batch_size": ("DispatchInvalid", lambda b, r: deliver_due_dispatches(
        b, transport=CallableTransport(_ok), batch_size=HUGE)),
    "notification content": ("NotificationInvalid", lambda b, r: send_notification(
        b, recipient="ops", content={"n": HUGE}, mode="guaranteed", channels=["email"])),
    "notification response_timeout": ("NotificationInvalid", lambda b, r: send_notification(
        b, recipient="ops", content={}, mode="guaranteed", channels=["email"], response_timeout=HUGE)),
    "notification obligation_window": ("NotificationInvalid", lambda b, r: send_notification(
        b, recipient="ops", content={}, mode="guaranteed", channels=["email"], obligation_key="d", obligation_window=HUGE)),
    "notification list limit": ("NotificationInvalid", lambda b, r: list_notifications(b, limit=HUGE)),
    "rate bucket capacity": ("NotificationInvalid", lambda b, r: ensure_bucket(b, "email", "all", capacity=HUGE,
                                                                               refill_per_second=1.0)),
    "rate bucket refill": ("NotificationInvalid", lambda b, r: ensure_bucket(b, "email", "all", capacity=1,
                                                                             refill_per_second=HUGE)),
    "schedule interval_sec": ("InvalidSchedule", lambda b, r: create_schedule(b, _spec(interval_sec=HUGE))),
    "schedule max_runs": ("InvalidSchedule", lambda b, r: create_schedule(b, _spec(max_runs=HUGE))),
    "schedule budget_usd": ("InvalidSchedule", lambda b, r: create_schedule(b, _spec(budget_usd=HUGE))),
    "schedule budget_tokens": ("InvalidSchedule", lambda b, r: create_schedule(b, _spec(budget_tokens=HUGE))),
    "schedule on_success": ("InvalidSchedule", lambda b, r: create_schedule(b, _spec(on_success={"n": HUGE}))),
    "schedule threshold_config": ("InvalidSchedule", lambda b, r: create_schedule(
        b, _spec(threshold_config={"n": HUGE}))),
    "schedule runs limit": ("InvalidArgument", lambda b, r: list_runs(b, r(Seed("schedule")), limit=HUGE)),
    "transition metadata": ("InvalidArgument", lambda b, r: transition(
        b, "dispatch", r(Seed("pending")), "delivering", expected="pending", guards={"attempt": 0},
        patch={"attempt": 1}, reason=Reason("dispatch.delivering.attempt"), actor=Actor("system", "fuzz"),
        metadata={"n": HUGE})),
    "transition guard": ("InvalidArgument", lambda b, r: transition(
        b, "dispatch", r(Seed("pending")), "delivering", expected="pending", guards={"attempt": HUGE},
        patch={"attempt": 1}, reason=Reason("dispatch.delivering.attempt"), actor=Actor("system", "fuzz"))),
    "transition patch": ("InvalidArgument", lambda b, r: transition(
        b, "dispatch", r(Seed("pending")), "delivering", expected="pending", guards={"attempt": 0},
        patch={"attempt": -HUGE}, reason=Reason("dispatch.delivering.attempt"), actor=Actor("system", "fuzz"))),
    "create column": ("InvalidArgument", lambda b, r: create(
        b, "dispatch", values={"kind": "k", "deliver_to": "x", "payload": {}, "next_attempt_at": START,
                               "created_at": START, "max_attempts": HUGE},
        status="pending", reason=Reason("dispatch.pending.enqueued"), actor=Actor("system", "fuzz"))),
    "as_of time": ("InvalidArgument", lambda b, r: as_of(b, "dispatch", r(Seed("pending")), HUGE)),
}


@pytest.mark.parametrize("case", sorted(HUGE_CALLS))
def test_an_integer_too_long_to_print_is_each_parts_own_refusal(pair, case):
    """L21 (issue 25): an integer of 5,000 digits — in a JSON body, content, metadata or patch, or as a count,
    time or limit — is refused by the 64-bit (or the argument's own) rule with the part's own error, never
    Python's ``ValueError: Exceeds the limit (4300 digits)``, and writes nothing; the same on both backends."""
    expected, fn = HUGE_CALLS[case]

    async def call(book, r):
        await fn(book, r)

    outcomes = pair.check(call)
    assert [o.kind for o in outcomes] == [expected, expected]


def test_json_text_from_outside_is_read_by_the_same_rules(tmp_path):
    """L20 (issue 25): JSON text statebook reads from outside — a setting's JSON in the environment, a run's
    report file written by its child — goes through ``codec.loads_checked``: an integer past 64 bits (5,000
    digits or 20), a number too large for a float, NaN or Infinity is refused by that rule (a setting: one
    ConfigError naming the variable; a child's report: ignored as no report), never an OverflowError or
    Python's digit-limit ValueError."""
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.settings import load_settings
    from statebook.lifecycle.codec import loads_checked
    from statebook.scheduler.launcher import _read_report

    for text, rule in (("[1" + "0" * 5000 + "]", "5001 digits"), ("[9223372036854775808]", "64-bit"),
                       ("[-9223372036854775809]", "64-bit"), ("[1e400]", "finite"), ("[NaN]", "NaN"),
                       ('{"a": [Infinity]}', "Infinity")):
        with pytest.raises(ValueError, match=rule):
            loads_checked(text)
    assert loads_checked('{"n": [-9223372036854775808, 9223372036854775807, 1.5]}') == {
        "n": [-(2**63), 2**63 - 1, 1.5]}
    huge = '[{"name": "x", "trigger_type": "interval", "interval_sec": 1' + "0" * 5000 + "}]"
    with pytest.raises(ConfigError, match="STATEBOOK_SCHEDULER__SCHEDULES takes JSON.*5001 digits"):
        load_settings(None, environ={"STATEBOOK_SCHEDULER__SCHEDULES": huge})
    for body in ('{"cost_usd": 1' + "0" * 400 + ', "tokens": 5}', '{"tokens": 1' + "0" * 30 + "}",
                 '{"cost_usd": 1e400}'):
        report = tmp_path / "report.json"
        report.write_text(body)
        assert _read_report(str(report)) == {}
    report.write_text('{"cost_usd": 0.5, "tokens": 7}')
    assert _read_report(str(report)) == {"cost_usd": 0.5, "tokens": 7}
