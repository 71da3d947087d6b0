"""``statebook run``: settings → book → leadership → SchedulerEngine + dispatch delivery, until a signal.

Leadership (``adapters/leader.py``) is a lease shared by every daemon on the database, beside each
daemon's liveness signal (``adapters/liveness.py``); this daemon's id is its holder name and the owner
of the runs it fires. A standby's leader watches the holder's signal and wakes the engine when it ends.

Delivery runs in its own task beside the engine (a slow transport never delays a fire), woken by
committed dispatches in this process and otherwise by the tick. Schedules listed in the settings
(``[[scheduler.schedules]]``) are created at start unless a schedule of that name exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from statebook.lifecycle import Book, Registry
from statebook.lifecycle.errors import InvalidArgument
from statebook.outbox import ArgvTransport, DeliveryWorker, Retention, RoutingTransport, Transport
from statebook.outbox.notifications import (
    CallbackTransport, Channel, LinkHook, NotificationInvalid, NotificationWorker, ResponseTimeoutWorker,
    ensure_bucket, register_timeout_callback,
)
from statebook.outbox.notifications.attempts import DEFAULT_SCOPE
from statebook.outbox.notifications.responses import CALLBACK_PREFIX
from statebook.outbox.notifications.policy import NOTIFY_CHANNEL as NOTIFICATION_CHANNEL
from statebook.outbox.notifications.worker import check_adapters
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.recovery import new_daemon_id
from statebook.scheduler.store import create_schedule, find_schedule

from .channels.configure import Built, build_channels
from .channels.secrets import SecretError
from .db import open_book
from .errors import ConfigError
from .github import GitHubPoller
from .leader import LeaseLeader, leadership_for
from .pgnotify import listen
from .registry import require_builtins, resolve_registry
from .settings import Settings
from .stats import REFRESH_SECONDS, VERIFY_SECONDS
from .story import run_summary, summary
from .web.links import link_hook  # no web framework: links are made wherever notifications are delivered

if TYPE_CHECKING:
    from .metrics import Metrics  # imported for --metrics-port only: prometheus_client is the metrics extra

log = logging.getLogger("statebook.daemon")

FOR_GRACE_SECONDS = 10.0
"""How long ``--for`` lets the runs in flight when it runs out finish before they are cancelled (a signal
cancels them at once)."""


def expand(value: Any, config_dir: Path) -> Any:
    """``{python}`` → this interpreter, ``{config_dir}`` → the settings file's directory (strings in lists too)."""
    if isinstance(value, str):
        return value.replace("{python}", sys.executable).replace("{config_dir}", str(config_dir))
    if isinstance(value, list):
        return [expand(v, config_dir) for v in value]
    if isinstance(value, dict):
        return {k: expand(v, config_dir) for k, v in value.items()}
    return value


def resolve_settings(settings: Settings, config_path: str | None) -> Settings:
    """Expand placeholders and make the launcher cwd absolute relative to the settings file."""
    base = Path(config_path).resolve().parent if config_path else Path.cwd()
    data = settings.model_dump()
    data["dispatch"]["notify_template"] = expand(data["dispatch"]["notify_template"], base)
    data["launcher"]["executable"] = expand(data["launcher"]["executable"], base)
    cwd = data["launcher"]["cwd"]
    if cwd:
        data["launcher"]["cwd"] = str((base / expand(cwd, base)).resolve())
    data["scheduler"]["schedules"] = expand(data["scheduler"]["schedules"], base)
    return Settings.model_validate(data)


async def seed_schedules(book: Book, settings: Settings) -> list[str]:
    """Create each ``[scheduler] schedules`` entry that has no schedule of its name yet; return the ids created."""
    created = []
    for index, spec in enumerate(settings.scheduler.schedules):
        name = spec.get("name")
        if not isinstance(name, str) or not name:
            raise ConfigError(f"scheduler.schedules entry {index}: needs a name (a non-empty string)")
        try:
            if await find_schedule(book, name) is not None:
                continue
            row = await create_schedule(book, spec, default_zone=settings.scheduler.timezone)
        except InvalidArgument as exc:
            raise ConfigError(f"scheduler.schedules entry {name!r}: {exc}") from None
        log.info("created schedule %s (%s) from the settings", row.name, row.id)
        created.append(row.id)
    return created


class _InTask:
    """A worker (a :class:`~statebook.outbox.core.passes.PassWorker`) in a task of its own. A task that ends with
    an error (a pass's own errors are logged and retried by the worker) is logged at once and kept in ``failure``.
    """

    worker: Any
    task_name = "statebook-worker"
    _task: asyncio.Task[Any] | None = None
    failure: BaseException | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self.worker.run_until_stopped(), name=self.task_name)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        self.failure = task.exception()
        log.error("%s stopped with an error; it runs no more passes in this process", self.task_name,
                  exc_info=self.failure)

    async def stop(self) -> None:
        """Stop the delivery worker and wait for its loop to end."""
        self.worker.stop()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)


class Checkpoints(_InTask):
    """The fact log's checkpoints, taken by themselves (``[audit] log_key``, specs/audit.md A7)."""

    task_name = "statebook-checkpoints"

    def __init__(self, book: Book, settings: Settings) -> None:
        from .checkpoints import Checkpointer, CommandSink, DirectorySink

        a = settings.audit
        assert a.checkpoint_dir is not None  # the settings require it with log_key
        more = [CommandSink(tuple(a.checkpoint_command))] if a.checkpoint_command else []
        self.worker = Checkpointer(book, a.log_signer(), DirectorySink(a.checkpoint_dir), more,
                                   every_seconds=a.checkpoint_every_seconds, every_facts=a.checkpoint_every_facts,
                                   tick_seconds=settings.scheduler.tick_seconds)


class Delivery(_InTask):
    """The outbox's :class:`DeliveryWorker` in a task of its own, with PostgreSQL NOTIFY wake-ups."""

    task_name = "statebook-delivery"

    def __init__(self, book: Book, settings: Settings, routes: dict[str, Any] | None = None) -> None:
        d, r = settings.dispatch, settings.retention
        wakeups = listen(book) if book.dialect == "postgresql" else None
        retention = Retention(r.delivered_days, r.failed_days) if r.enabled else None
        # Timeout callbacks (routes callback:<name>) and provider follow-ups (follow:<channel>) run in
        # process; every other route runs the argv template.
        argv = ArgvTransport(d.notify_template, d.transport_timeout_seconds)
        if argv.problem is not None:  # the daemon may serve only in-process routes; say what the others will do
            log.warning("%s: a dispatch routed to the argv transport fails each attempt", argv.problem)
        transport = RoutingTransport({CALLBACK_PREFIX: CallbackTransport(), **(routes or {})}, argv)
        self.worker = DeliveryWorker(
            book, transport, batch_size=d.batch_size,
            concurrency=d.concurrency, tick_seconds=settings.scheduler.tick_seconds, retention=retention,
            extra_wakeups=wakeups,
        )

    async def stop(self) -> None:
        """Stop the loop, then deliver once more: notifications of runs that ended while shutting down."""
        await super().stop()
        with contextlib.suppress(Exception):
            await self.worker.run_once()  # notifications of runs that ended during shutdown


def _resolve(section: str, name: str, spec: str) -> Any:
    """The object ``spec`` (``module:attr``, attr possibly dotted) names; ConfigError in one line."""
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as exc:
        raise ConfigError(f"notifications.{section}.{name}: cannot load {spec!r}: {type(exc).__name__}: {exc}") from None
    return target


def load_channels(specs: dict[str, str]) -> dict[str, Channel]:
    """The adapters ``[notifications] channels`` names (``module:attr``: a Channel or a callable
    returning one); ConfigError, in one line, when one cannot be loaded."""
    found: dict[str, Channel] = {}
    for name, spec in specs.items():
        target = _resolve("channels", name, spec)
        if callable(target) and not isinstance(target, Channel):
            try:
                target = target()
            except Exception as exc:
                raise ConfigError(f"notifications.channels.{name}: cannot load {spec!r}: {type(exc).__name__}: "
                                  f"{exc}") from None
        found[name] = target
    try:
        return check_adapters(found)
    except NotificationInvalid as exc:
        raise ConfigError(f"notifications.channels: {exc}") from None


def load_callbacks(specs: dict[str, str]) -> None:
    """Register the host callbacks ``[notifications] callbacks`` names (``module:attr``, an async def);
    ConfigError, in one line, when one cannot be loaded or is not an async def."""
    for name, spec in specs.items():
        target = _resolve("callbacks", name, spec)
        try:
            register_timeout_callback(name, target)
        except NotificationInvalid as exc:
            raise ConfigError(f"notifications.callbacks.{name}: cannot load {spec!r}: {exc}") from None


class ResponseTimeouts(_InTask):
    """The response timeout pass in a task of its own, beside notification delivery."""

    task_name = "statebook-response-timeouts"

    def __init__(self, book: Book, settings: Settings) -> None:
        self.worker = ResponseTimeoutWorker(book, batch_size=settings.notifications.batch_size,
                                            tick_seconds=settings.scheduler.tick_seconds)


def response_links(settings: Settings, book: Book) -> LinkHook | None:
    """The link hook ``[web]`` calls for (``public_url`` and ``link_key`` set), else None: every delivery
    then carries signed links to acknowledge and to dismiss (:mod:`statebook.adapters.web.links`)."""
    try:
        return link_hook(settings.web, book.clock)
    except (SecretError, ValueError) as exc:
        raise ConfigError(f"[web] link_key: {exc}") from None


class NotificationDelivery(_InTask):
    """The notifications' worker in a task of its own (PostgreSQL: LISTEN wake-ups), when channels are named."""

    task_name = "statebook-notifications"

    def __init__(self, book: Book, settings: Settings, built: Built) -> None:
        n = settings.notifications
        wakeups = listen(book, NOTIFICATION_CHANNEL) if book.dialect == "postgresql" else None
        self.built = built
        self.limits = n.rate_limits
        self.worker = NotificationWorker(
            book, {**built.channels, **load_channels(n.channels)}, batch_size=n.batch_size,
            concurrency=n.concurrency, lease_seconds=n.lease_seconds, deadline=n.deadline_seconds,
            tick_seconds=settings.scheduler.tick_seconds, extra_wakeups=wakeups, order=n.fallback_order,
            links=response_links(settings, book),
        )

    async def begin(self) -> None:
        """Size the configured buckets and start the services (the WebSocket endpoint) before delivery."""
        for name, limit in self.limits.items():
            await ensure_bucket(self.worker.book, name, DEFAULT_SCOPE, capacity=limit.capacity,
                                refill_per_second=limit.refill_per_second)
        for service in self.built.services:
            await service.start()
            log.info("serving %s", getattr(service, "url", service))

    async def stop(self) -> None:
        """Stop the loop, then the channels' own services (the WebSocket hub)."""
        await super().stop()
        for service in self.built.services:
            with contextlib.suppress(Exception):
                await service.stop()


def status_line(engine: SchedulerEngine) -> str:
    """The one-line live status a terminal shows: ticks, slots in use, fired, next fire."""
    nxt = engine.next_due
    wait = f"{max(0.0, nxt - engine.book.clock.now()):.1f}s" if nxt is not None else "-"
    st = engine.stats
    return (f"tick {st['ticks']} | running {engine.slots.used}/{engine.slots.limit} | fired {st['fired']} | "
            f"skipped {st['skipped']} | deferred {st['deferred']} | next fire in {wait}")


class Daemon:
    """What ``statebook run`` runs, in this process: scheduler leadership and the engine, dispatch delivery,
    and notification delivery with response timeouts when channels are configured. :func:`run_daemon` runs one;
    an application runs one inside its own process (:mod:`.asgi`).

    ``scheduler=False`` leaves leadership and the engine out (delivery is safe in any number of processes: its
    claims are leased); ``delivery=False`` leaves the workers out. ``transports`` (route prefix -> transport) are
    tried before the argv transport. :meth:`prepare` builds the parts, :meth:`start` starts them, :meth:`stop`
    stops them, :meth:`close` releases the lease and the channels' clients (after a failed prepare too).
    """

    def __init__(self, book: Book, settings: Settings, *, scheduler: bool = True, delivery: bool = True,
                 transports: Mapping[str, Transport] | None = None, daemon_id: str | None = None) -> None:
        self.book = book
        self.settings = settings
        self.daemon_id = daemon_id or new_daemon_id()
        self.leader: LeaseLeader | None = None
        self.engine: SchedulerEngine | None = None
        self.delivery: Delivery | None = None
        self.notifying: list[_InTask] = []
        self.checkpoints: Checkpoints | None = None
        self.built = Built()
        self._scheduler, self._delivery, self._transports = scheduler, delivery, dict(transports or {})

    async def prepare(self) -> None:
        """Take the liveness signal, create the settings' schedules, load callbacks and channels, build the
        parts; nothing runs yet. ConfigError (one line) on what the settings or the registry lack."""
        book, settings = self.book, self.settings
        if self._scheduler:
            self.leader = leadership_for(book, self.daemon_id, lease_seconds=settings.scheduler.lease_seconds)
            await seed_schedules(book, settings)
        if self._delivery:
            load_callbacks(settings.notifications.callbacks)
            self.built = build_channels(settings.notifications, clock=book.clock)
            self.delivery = Delivery(book, settings, {**self.built.transports, **self._transports})
            if settings.notifications.channels or self.built.channels:
                missing = [t for t in ("notification", "channel_attempt", "rate_bucket", "notification_response")
                           if t not in book.registry]
                if missing:
                    raise ConfigError(f"notification channels are configured, but the registry lacks "
                                      f"{', '.join(missing)}; start it from builtin_registry(seal=False)")
                notifier = NotificationDelivery(book, settings, self.built)
                await notifier.begin()
                self.notifying = [notifier, ResponseTimeouts(book, settings)]
        if settings.audit.log_key is not None:
            self.checkpoints = Checkpoints(book, settings)
        if self._scheduler:
            self.engine = SchedulerEngine(book, settings, leader=self.leader, daemon_id=self.daemon_id,
                                          poller=GitHubPoller.from_settings(settings.scheduler))

    async def start(self) -> None:
        """Start the engine (recovery and missed fires first) and the workers, each in a task of its own."""
        if self.engine is not None:
            await self.engine.start()
            assert self.leader is not None
            self.leader.watch(self.engine.wake)  # a standby wakes the moment the leader's liveness ends
        for part in self._workers():
            part.start()

    async def stop(self) -> None:
        """Stop the engine (its runs in flight are cancelled), then the workers; the dispatch worker last, after
        one more pass, so what the others enqueued on the way out is sent."""
        if self.engine is not None:
            await self.engine.stop()
        for part in self.notifying:
            await part.stop()
        if self.checkpoints is not None:
            await self.checkpoints.stop()  # its last checkpoint anchors the facts written on the way out
        if self.delivery is not None:
            await self.delivery.stop()

    async def close(self) -> None:
        """Close the channels' clients and give the scheduler lease and the liveness signal up."""
        await self.built.aclose()
        if self.leader is not None:
            await self.leader.release()

    @property
    def failure(self) -> BaseException | None:
        """The error a worker's task ended with (already logged), or None."""
        return next((part.failure for part in self._workers() if part.failure is not None), None)

    def _workers(self) -> list[_InTask]:
        return [*([self.delivery] if self.delivery is not None else []), *self.notifying,
                *([self.checkpoints] if self.checkpoints is not None else [])]

    def counters(self) -> dict[str, Any]:
        """The in-process counters ``/metrics`` shows beside the snapshot (read from memory only)."""
        deliveries = {"dispatch": dict(self.delivery.worker.totals)} if self.delivery is not None else {}
        for part in self.notifying:
            if isinstance(part, NotificationDelivery):
                deliveries["notification"] = dict(part.worker.totals)
        engine = dict(self.engine.stats) if self.engine is not None else {}
        counts = {"scheduler": engine, "deliveries": deliveries,
                  "leader": getattr(self.leader, "epoch", None) is not None}
        if self.checkpoints is not None:
            counts["checkpoints"] = self.checkpoints.worker.counters()
        return counts


async def run_daemon(settings: Settings, *, config_path: str | None = None, run_for: float | None = None,
                     tty: bool = False, registry: Registry | None = None, metrics_port: int | None = None,
                     metrics_host: str = "127.0.0.1", metrics_every: float = REFRESH_SECONDS,
                     verify_every: float = VERIFY_SECONDS, web_port: int | None = None) -> dict[str, Any]:
    """Run until SIGINT/SIGTERM (or ``run_for`` seconds); returns a summary of the database and,
    under ``run``, of what this run did (:func:`run_summary`).

    The book runs ``registry``, else the one ``settings.app`` names (``--app``), else the built-in one.
    With ``metrics_port`` (0: any free port, logged) ``/metrics`` is served on ``metrics_host`` while the
    daemon runs; its snapshot is refreshed every ``metrics_every`` seconds in a task of its own, and ``verify``
    runs at start and every ``verify_every`` seconds in another (0: never; no verify metrics then).
    With ``web_port`` (0: any free port, logged) the web console is served on ``[web] host`` too.
    """
    settings = resolve_settings(settings, config_path)
    registry = resolve_registry(settings.app) if registry is None else registry
    require_builtins(registry, "the daemon")
    if metrics_port is not None:
        from .metrics import Metrics  # the metrics extra, checked before anything starts (one line when missing)
    if settings.tracing.enabled:
        from .otel import enable_tracing  # the otel extra, checked before anything starts

        enable_tracing()
    if web_port is not None:
        from .extras import require

        require("starlette", extra="web", feature="statebook run --web-port")
        from .web.serve import check_bind, serving

        check_bind(settings.web.host, settings)
    web = contextlib.AsyncExitStack()
    # A transaction left idle longer than the lease is a frozen daemon's: the server ends it, so the daemon that
    # took the lease over does not wait behind its row locks (specs/scheduler.md S16).
    book = await open_book(settings.db, registry=registry, limits=settings.book_limits(),
                           chain_key=settings.audit.key(), app=settings.app or "",
                           idle_transaction_seconds=settings.scheduler.lease_seconds)
    daemon = Daemon(book, settings)
    metrics: Metrics | None = None
    refresher: asyncio.Task[None] | None = None
    verifier: asyncio.Task[None] | None = None
    try:
        await daemon.prepare()
        engine = daemon.engine
        assert engine is not None
        if tty:
            engine.on_tick = lambda e: print("\r" + status_line(e).ljust(100), end="", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        log.info("daemon %s started on %s (tick %gs, %d slots)", engine.daemon_id, book.engine.url.render_as_string(),
                 settings.scheduler.tick_seconds, settings.scheduler.max_concurrent)
        if metrics_port is not None:
            metrics = Metrics(book, daemon.counters)
            await metrics.refresh()  # the first scrape already has figures
            metrics.serve(metrics_host, metrics_port)
            refresher = asyncio.create_task(metrics.refresh_every(metrics_every), name="statebook-metrics")
            if verify_every > 0:
                verifier = asyncio.create_task(metrics.verify_every(verify_every), name="statebook-metrics-verify")
        if web_port is not None:
            url = await web.enter_async_context(serving(book, settings, settings.web.host, web_port))
            print(f"web console on {url}/", flush=True)
        started_at = book.clock.now()
        await daemon.start()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), run_for)
            if not stop.is_set():  # --for ran out, no signal: the runs it fired may end (O8), a bounded wait
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(engine.wait_idle(), FOR_GRACE_SECONDS)
        finally:
            log.info("stopping: cancelling in-flight runs and delivery")
            await web.aclose()
            for task in (refresher, verifier):
                if task is not None:
                    task.cancel()
                    await asyncio.gather(task, return_exceptions=True)
            if metrics is not None:
                await asyncio.to_thread(metrics.close)  # shutdown waits for the server's poll: not on the loop
            await daemon.stop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
            if tty:
                print()
        counts = daemon.counters()
        daemon_id = daemon.daemon_id
        this_run = await run_summary(book, daemon_id, started_at=started_at, scheduler=counts["scheduler"],
                                     deliveries=counts["deliveries"])
        log.info("run of daemon %s ended: fired %d, skipped %d, deferred %d", daemon_id, this_run["scheduler"]["fired"],
                 this_run["scheduler"]["skipped"], this_run["scheduler"]["deferred"],
                 extra={"event": "daemon_stopped", "daemon_id": daemon_id, "runs": this_run["runs"],
                        "deliveries": this_run["deliveries"]})
        return {**await summary(book), "run": this_run}
    finally:
        if metrics is not None:
            metrics.close()
        await daemon.close()  # the channels' and follow-ups' clients, after the last dispatch pass; the lease
        await book.engine.dispose()
