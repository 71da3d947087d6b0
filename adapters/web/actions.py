"""What an operator can do in the console: the action table and its execution (no starlette here).

Each action is the public call the CLI makes for it (``adapters/cli/dispatch.py``, ``notify.py``,
``schedule.py``), with ``Actor("operator", <signed-in name>)`` and the reason the operator typed kept in
the fact's summary; whatever that call refuses is refused here with its one-line message. An action is
offered for a row only when the call accepts the row's status AND the row's lifecycle has the edge the
call takes (for a purge: the status is purgeable), so an application's own lifecycle offers none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle import Actor, Book, Lifecycle
from statebook.lifecycle.errors import InvalidArgument, StatebookError
from statebook.lifecycle.inputs import text
from statebook.outbox import ack_dispatch, expedite_dispatch, get_dispatch, purge_dispatch, retry_dispatch
from statebook.outbox.notifications import replay_notification, resolve_notification
from statebook.scheduler import disable_schedule, enable_schedule, get_schedule

OPERATOR = "operator"
REASON_CHARS = 500
"""The longest reason an operator may type (the API keeps it in the fact's summary)."""
BULK_MAX = 1_000
"""At most this many entities one bulk request acts on (the confirmation page says so)."""


class ActionRefused(StatebookError):
    """The console refuses an action before any call (an unknown action, a bad reason, a missing field)."""


@dataclass(frozen=True)
class Act:
    """One call's inputs: who, why, and the extra fields the action's form asked for."""

    book: Book
    actor: Actor
    reason: str
    fields: Mapping[str, str]
    settings: Any = None


Call = Callable[[Act, str], Awaitable[str]]
"""``call(act, entity_id) -> message``: the API call; it raises on a refusal."""


@dataclass(frozen=True)
class Action:
    """One operator action on one entity type.

    ``to`` is the status the call moves the row to; ``None`` with ``purges`` is a purge, ``None``
    without it a same-status move (a manual fire). ``statuses`` are those the call accepts; what the
    console offers is their subset the lifecycle allows an operator (:meth:`sources`).
    """

    entity_type: str
    name: str
    label: str
    to: str | None
    statuses: tuple[str, ...]
    call: Call = field(repr=False)
    api: str = ""
    cli: str = ""
    fields: tuple[str, ...] = ()
    applies: Callable[[Mapping[str, Any]], bool] | None = field(default=None, repr=False)
    where: Callable[[sa.Table], Any] | None = field(default=None, repr=False)
    """``applies`` as a SQL condition on the lifecycle's table (what a bulk selection adds)."""
    purges: bool = False
    bulk: bool = True

    def sources(self, policy: Lifecycle) -> tuple[str, ...]:
        """The statuses this action is offered from under ``policy``."""
        if self.purges:
            return tuple(s for s in self.statuses if s in policy.purgeable)
        found = []
        for status in self.statuses:
            edge = policy.edge(status, self.to or status)
            if edge is not None and (not edge.actors or OPERATOR in edge.actors):
                found.append(status)
        return tuple(found)

    def offered(self, policy: Lifecycle, row: Mapping[str, Any]) -> bool:
        """True when ``row`` (a mapping or a model) is in a status this action is offered from."""
        values = _mapping(row)
        return values.get("status") in self.sources(policy) and (self.applies is None or self.applies(values))


@dataclass(frozen=True)
class Result:
    """What one entity's call did: ``done``, or refused with the API's one-line message."""

    entity_id: str
    done: bool
    message: str


def _mapping(row: Any) -> Mapping[str, Any]:
    if isinstance(row, Mapping):
        return row
    if hasattr(row, "_mapping"):
        return row._mapping  # type: ignore[no-any-return]
    if hasattr(row, "model_dump"):
        return row.model_dump()  # type: ignore[no-any-return]
    fields: dict[str, Any] = vars(row)
    return fields


# -- the calls: the CLI's, with the operator and the reason --------------------------------------------
async def _retry(act: Act, dispatch_id: str) -> str:
    if not await retry_dispatch(act.book, dispatch_id, actor=act.actor, note=act.reason):
        row = await get_dispatch(act.book, dispatch_id)
        raise ActionRefused(f"dispatch {dispatch_id} changed while it was retried (it is "
                            f"{row.status if row else 'gone'} now); try again if it still needs a retry")
    return f"retried {dispatch_id}"


async def _expedite(act: Act, dispatch_id: str) -> str:
    if not await expedite_dispatch(act.book, dispatch_id, actor=act.actor, note=act.reason):
        raise ActionRefused(f"dispatch {dispatch_id} changed while it was expedited; try again if it still waits")
    return f"expedited {dispatch_id}: due now"


async def _purge(act: Act, dispatch_id: str) -> str:
    if not await purge_dispatch(act.book, dispatch_id, actor=act.actor, note=act.reason):
        raise ActionRefused(f"dispatch {dispatch_id} does not exist")
    return f"purged {dispatch_id}"


async def _ack(act: Act, dispatch_id: str) -> str:
    if not await ack_dispatch(act.book, dispatch_id, act.fields.get("token", ""), actor=act.actor, note=act.reason):
        raise ActionRefused(f"dispatch {dispatch_id} changed concurrently and was not acknowledged; try again")
    return f"acked {dispatch_id}"


async def _replay(act: Act, notification_id: str) -> str:
    done = await replay_notification(act.book, notification_id, actor=act.actor, note=act.reason)
    covered = f"; took over {', '.join(done.covered)}" if done.covered else ""
    return f"replayed {done.id} (cycle {done.cycle}){covered}"


async def _resolve(act: Act, notification_id: str) -> str:
    row = await resolve_notification(act.book, notification_id, reason=act.reason, actor=act.actor)
    return f"resolved {row.id} by {row.resolved_by}"


def _toggle(target: str) -> Call:
    change = enable_schedule if target == "active" else disable_schedule

    async def call(act: Act, schedule_id: str) -> str:
        before = await get_schedule(act.book, schedule_id)
        if before.status == target:  # the API returns it as it is: say that nothing was written
            raise ActionRefused(f"schedule {before.name} is already {target}; nothing was written")
        row = await change(act.book, schedule_id, actor=act.actor, note=act.reason)
        return f"schedule {row.name} is {row.status}"

    return call


_running: dict[asyncio.Task[Any], Book] = {}
"""Manual fires still running in this process, each with its book (a reference keeps a task alive)."""


async def _fire(act: Act, schedule_id: str) -> str:
    # `statebook schedule fire` builds an engine in its own process, fires and waits; a request cannot
    # wait for a run, so the engine lives on in a task until the run and its follow-ups end.
    from statebook.adapters.daemon import resolve_settings
    from statebook.adapters.settings import Settings
    from statebook.scheduler.engine import SchedulerEngine

    settings = resolve_settings(act.settings if act.settings is not None else Settings(), None)
    engine = SchedulerEngine(act.book, settings)
    try:
        run_id = await engine.fire_now(schedule_id, actor=act.actor, note=act.reason)
    except BaseException:
        await engine.stop()
        raise

    async def finish() -> None:
        try:
            await engine.wait_idle()
        finally:
            await engine.stop()  # also when cancelled: the run's process group is terminated

    task = asyncio.create_task(finish(), name=f"console-fire-{run_id}")
    _running[task] = act.book
    task.add_done_callback(lambda done: _running.pop(done, None))
    return f"fired {schedule_id}: run {run_id}"


async def wait_for_fires() -> None:
    """Wait until every manual fire started in this process has ended (tests)."""
    while _running:
        await asyncio.gather(*list(_running), return_exceptions=True)


async def shutdown(console: Any) -> None:
    """When the app stops: the manual fires it started stop too (their runs end as a daemon's do)."""
    mine = [task for task, book in list(_running.items()) if book is console.book]
    for task in mine:
        task.cancel()
    await asyncio.gather(*mine, return_exceptions=True)


# -- the table -------------------------------------------------------------------------------------------
def _acks(row: Mapping[str, Any]) -> bool:
    return bool(row.get("ack_required"))


def _unresolved_dead_letter(row: Mapping[str, Any]) -> bool:
    return bool(row.get("dead_letter")) and row.get("resolved_at") is None


def _unresolved_dead_letters(t: sa.Table) -> Any:
    return sa.and_(t.c.dead_letter == 1, t.c.resolved_at.is_(None))


TABLE: tuple[Action, ...] = (
    Action("dispatch", "retry", "Retry", "pending", ("dead_letter", "expired"), _retry,
           api="retry_dispatch", cli="statebook dispatch retry ID"),
    Action("dispatch", "expedite", "Deliver now", "pending", ("pending",), _expedite,
           api="expedite_dispatch", cli="statebook dispatch expedite ID"),
    Action("dispatch", "ack", "Acknowledge", "acked", ("pending", "delivering"), _ack, fields=("token",),
           applies=_acks, bulk=False, api="ack_dispatch", cli="statebook dispatch ack ID TOKEN"),
    Action("dispatch", "purge", "Purge", None, ("delivered", "acked", "dead_letter", "expired"), _purge,
           purges=True, api="purge_dispatch", cli="statebook dispatch purge ID"),
    Action("notification", "replay", "Replay", "pending", ("failed",), _replay,
           api="replay_notification", cli="statebook notify replay ID --note REASON"),
    Action("notification", "resolve", "Resolve", "failed", ("failed",), _resolve, applies=_unresolved_dead_letter,
           where=_unresolved_dead_letters,
           api="resolve_notification", cli="statebook notify resolve ID --reason REASON"),
    Action("schedule", "enable", "Enable", "active", ("paused", "exhausted"), _toggle("active"),
           api="enable_schedule", cli="statebook schedule enable ID"),
    Action("schedule", "disable", "Disable", "paused", ("active",), _toggle("paused"),
           api="disable_schedule", cli="statebook schedule disable ID"),
    Action("schedule", "fire", "Fire now", None, ("active", "paused"), _fire, bulk=False,
           api="SchedulerEngine.fire_now", cli="statebook schedule fire ID"),
)


def actions_of(entity_type: str) -> tuple[Action, ...]:
    """Every action of ``entity_type`` in table order (none for an application's lifecycle)."""
    return tuple(a for a in TABLE if a.entity_type == entity_type)


def find(entity_type: str, name: str) -> Action:
    """The action ``name`` of ``entity_type``; :class:`ActionRefused` when there is none."""
    for action in actions_of(entity_type):
        if action.name == name:
            return action
    names = ", ".join(a.name for a in actions_of(entity_type)) or "none"
    raise ActionRefused(f"{entity_type} has no action {name[:60]!r}; its actions: {names}")


def available(entity_type: str, row: Any, *, policy: Lifecycle) -> list[Action]:
    """The actions an operator may take on ``row`` (a mapping or a model) of ``entity_type``, whose
    lifecycle is ``policy`` (the book's: an application may extend a built-in one)."""
    return [a for a in actions_of(entity_type) if a.offered(policy, row)]


def check_reason(reason: Any) -> str:
    """The reason an operator typed, without surrounding blanks: 1 to :data:`REASON_CHARS` characters."""
    try:
        value = text("reason", reason, max_chars=REASON_CHARS * 2).strip()
    except InvalidArgument as exc:
        raise ActionRefused(str(exc)) from None
    if not value:
        raise ActionRefused("reason: say why (1 to 500 characters); it is kept in the history")
    if len(value) > REASON_CHARS:
        raise ActionRefused(f"reason: is {len(value)} characters long; at most {REASON_CHARS} are allowed")
    return value


def one_line(exc: BaseException) -> str:
    """An error's message as the CLI prints it: its first line."""
    return (str(exc).splitlines() or [type(exc).__name__])[0]


async def perform(book: Book, entity_type: str, action: str | Action, entity_ids: Iterable[str], actor: Actor,
                  reason: str, *, fields: Mapping[str, str] | None = None, settings: Any = None) -> list[Result]:
    """Take ``action`` on each of ``entity_ids`` (one call each, in order) as ``actor`` (an operator)
    with ``reason``; one :class:`Result` per id. Raises :class:`ActionRefused` before any call for an
    unknown action, an actor that is not an operator, a bad reason or a missing field."""
    chosen = action if isinstance(action, Action) else find(entity_type, action)
    if chosen.entity_type != entity_type:
        raise ActionRefused(f"{chosen.name} is an action on {chosen.entity_type}, not on {entity_type}")
    if not isinstance(actor, Actor) or actor.type != OPERATOR or not actor.id:
        raise ActionRefused("console actions are an operator's: expected Actor('operator', <name>)")
    given = dict(fields or {})
    for name in chosen.fields:
        if not given.get(name):
            raise ActionRefused(f"{name}: {chosen.label.lower()} needs the {name}")
    act = Act(book, actor, check_reason(reason), given, settings)
    results = []
    for entity_id in entity_ids:
        try:
            results.append(Result(entity_id, True, await chosen.call(act, entity_id)))
        except StatebookError as exc:
            results.append(Result(entity_id, False, one_line(exc)))
    return results



def __getattr__(name: str) -> Any:
    # The app loads this part's ``routes``; they live in action_routes.py so that the table above needs no
    # starlette (the CLI's tests and other callers import it without the web extra's server side).
    if name == "routes":
        from .action_routes import routes

        return routes
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
