"""Prometheus metrics: the latest :class:`~.stats.Stats` snapshot and the daemon's own counters.

:class:`Metrics` owns a :class:`~prometheus_client.CollectorRegistry` of its own (never the process-wide
default, so two daemons or two tests in one process do not collide). Its collector reads only what is
already in memory — the snapshot the daemon refreshes in a task of its own (:meth:`Metrics.refresh_every`)
and the in-process counters a callable returns — so a scrape never touches the database and never waits
on the event loop. :meth:`Metrics.serve` starts the HTTP endpoint (``/metrics``) in a thread.

The names, labels and meanings are listed in docs/how-to/metrics.md.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from statebook.lifecycle import Book, verify
from statebook.lifecycle.replay import Report

from .errors import ConfigError
from .extras import require
from .stats import REFRESH_SECONDS, VERIFY_SECONDS, Stats, collect_stats

require("prometheus_client", extra="metrics", feature="serving metrics (--metrics-port)")  # one line, not a traceback
from prometheus_client import CollectorRegistry  # noqa: E402
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric  # noqa: E402
from prometheus_client.exposition import generate_latest, start_http_server  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

__all__ = ["REFRESH_SECONDS", "VERIFY_SECONDS", "Metrics", "families", "verify_families"]

log = logging.getLogger("statebook.metrics")

Process = Callable[[], Mapping[str, Any]]
"""Returns the daemon's in-process counters: ``{"scheduler": {...}, "deliveries": {lc: {...}}, "leader": bool}``."""


def families(stats: Stats) -> list[Metric]:
    """The metric families of one snapshot (what ``/metrics`` shows of the database)."""
    entities = GaugeMetricFamily("statebook_entities", "Rows by lifecycle and status.", labels=["lifecycle", "status"])
    for lifecycle, by_status in sorted(stats.entities.items()):
        for status, n in sorted(by_status.items()):
            entities.add_metric([lifecycle, status], n)
    transitions = CounterMetricFamily("statebook_transitions", "Facts recorded, by lifecycle and reason code.",
                                      labels=["lifecycle", "reason"])
    for lifecycle, by_reason in sorted(stats.transitions.items()):
        for reason, n in sorted(by_reason.items()):
            transitions.add_metric([lifecycle, reason], n)
    due = GaugeMetricFamily("statebook_due", "Rows due for delivery now (the due backlog).", labels=["lifecycle"])
    age = GaugeMetricFamily("statebook_due_oldest_age_seconds",
                            "How long the oldest due row has been due (0 when nothing is due).", labels=["lifecycle"])
    for lifecycle, d in sorted(stats.due.items()):
        due.add_metric([lifecycle], d.count)
        age.add_metric([lifecycle], d.oldest_age_seconds or 0.0)
    deliveries = CounterMetricFamily("statebook_deliveries", "Delivery attempts that ended, by outcome.",
                                     labels=["lifecycle", "outcome"])
    for lifecycle, by_outcome in sorted(stats.deliveries.items()):
        for outcome, n in sorted(by_outcome.items()):
            deliveries.add_metric([lifecycle, outcome], n)
    attempts = CounterMetricFamily("statebook_attempts", "Delivery attempts started (claims).", labels=["lifecycle"])
    for lifecycle, n in sorted(stats.attempts.items()):
        attempts.add_metric([lifecycle], n)
    latency = HistogramMetricFamily("statebook_attempt_latency_seconds",
                                    "Channel attempts from send admission to the observation, by channel.",
                                    labels=["channel"])
    for channel, lat in sorted(stats.latency.items()):
        latency.add_metric([channel], list(lat.buckets.items()), lat.sum_seconds)
    observations = CounterMetricFamily("statebook_channel_observations", "Channel attempt observations, by outcome.",
                                       labels=["outcome"])
    for outcome, n in sorted(stats.channel_observations.items()):
        observations.add_metric([outcome], n)
    waits = CounterMetricFamily("statebook_rate_limit_waits", "Times a notification waited for a rate-limit token.")
    waits.add_metric([], stats.rate_limit_waits)
    decisions = CounterMetricFamily("statebook_scheduler_decisions",
                                    "Scheduler fires, skips and recorded deferrals (from the run records).",
                                    labels=["decision"])
    for decision, n in sorted(stats.scheduler.items()):
        decisions.add_metric([decision], n)
    runs = GaugeMetricFamily("statebook_runs", "Schedule runs by status (outcome, once terminal).", labels=["status"])
    for status, n in sorted(stats.runs.items()):
        runs.add_metric([status], n)
    taken = GaugeMetricFamily("statebook_stats_timestamp_seconds", "When the snapshot shown was read.")
    taken.add_metric([], stats.at)
    return [entities, transitions, due, age, deliveries, attempts, latency, observations, waits, decisions, runs, taken]


def verify_families(report: Report, at: float) -> list[Metric]:
    """The families of the last ``verify`` this process ran: findings by kind, what it checked, when."""
    findings = GaugeMetricFamily("statebook_verify_findings",
                                 "Findings of the last verify this daemon ran, by kind (0 in all: history checks out).",
                                 labels=["kind"])
    by_kind: dict[str, int] = {}
    for finding in report.findings:
        by_kind[finding.kind] = by_kind.get(finding.kind, 0) + 1
    findings.add_metric(["any"], len(report.findings))
    for kind, n in sorted(by_kind.items()):
        findings.add_metric([kind], n)
    checked = GaugeMetricFamily("statebook_verify_checked", "What the last verify checked.", labels=["what"])
    checked.add_metric(["entities"], report.entities)
    checked.add_metric(["facts"], report.facts)
    when = GaugeMetricFamily("statebook_verify_timestamp_seconds", "When the last verify this daemon ran ended.")
    when.add_metric([], at)
    return [findings, checked, when]


def _process_families(process: Mapping[str, Any]) -> list[Metric]:
    """The daemon's in-process counters (this process since it started)."""
    out: list[Metric] = []
    scheduler = process.get("scheduler") or {}
    if scheduler:
        fam = CounterMetricFamily("statebook_daemon_scheduler", "This daemon's scheduler decisions since it started.",
                                  labels=["decision"])
        for decision in ("fired", "skipped", "deferred", "errors"):
            if decision in scheduler:
                fam.add_metric([decision], scheduler[decision])
        out.append(fam)
    deliveries = process.get("deliveries") or {}
    if deliveries:
        fam = CounterMetricFamily("statebook_daemon_deliveries", "This daemon's delivery outcomes since it started.",
                                  labels=["lifecycle", "outcome"])
        for lifecycle, by_outcome in sorted(deliveries.items()):
            for outcome, n in sorted(by_outcome.items()):
                fam.add_metric([lifecycle, outcome], n)
        out.append(fam)
    checkpoints = process.get("checkpoints")
    if checkpoints is not None:
        taken = CounterMetricFamily("statebook_checkpoints", "Checkpoints of the fact log this daemon published.")
        taken.add_metric([], checkpoints["taken"])
        alarms = GaugeMetricFamily("statebook_checkpoint_alarms",
                                   "Checkpoints this daemon refused to publish because the log does not extend the last "
                                   "one (non-zero: the database's history changed; specs/audit.md A7).")
        alarms.add_metric([], checkpoints["alarms"])
        out += [taken, alarms]
    if "leader" in process:
        leader = GaugeMetricFamily("statebook_daemon_leader", "1 while this daemon holds the scheduler lease.")
        leader.add_metric([], 1.0 if process["leader"] else 0.0)
        out.append(leader)
    return out


class _Collector(Collector):
    """Yields the families of what :class:`Metrics` holds; reads nothing else."""

    def __init__(self, owner: Metrics) -> None:
        self.owner = owner

    def collect(self) -> Iterator[Metric]:
        stats = self.owner.snapshot
        if stats is not None:
            yield from families(stats)
        verified = self.owner.verified
        if verified is not None:
            yield from verify_families(*verified)
        if self.owner.process is not None:
            try:
                yield from _process_families(self.owner.process())
            except Exception:  # noqa: BLE001 - a scrape must not fail on a counter
                log.warning("could not read the daemon's counters for /metrics", exc_info=True)


class Metrics:
    """The metrics of one book: a snapshot refreshed by the caller, exposed on a registry of its own."""

    def __init__(self, book: Book, process: Process | None = None) -> None:
        self.book = book
        self.process = process
        self.snapshot: Stats | None = None
        self.verified: tuple[Report, float] | None = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._server: Any = None
        self._thread: Any = None

    async def refresh(self) -> Stats:
        """Read a new snapshot (one query per part) and expose it."""
        self.snapshot = await collect_stats(self.book)
        return self.snapshot

    async def refresh_every(self, seconds: float = REFRESH_SECONDS) -> None:
        """Every ``seconds``, refresh until cancelled; a failed read is logged and the last snapshot stays."""
        while True:
            await asyncio.sleep(seconds)
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - the daemon goes on; the snapshot ages
                log.warning("could not refresh the metrics snapshot (%s: %s)", type(exc).__name__, exc)

    async def verify(self) -> Report:
        """Run ``verify`` over the whole database and expose its findings (a read; nothing is written)."""
        report = await verify(self.book)
        self.verified = (report, self.book.clock.now())
        level = logging.INFO if report.ok else logging.WARNING
        log.log(level, "verify for /metrics: %d entities, %d facts, %d finding(s)", report.entities, report.facts,
                len(report.findings), extra={"event": "verify", "findings": len(report.findings)})
        return report

    async def verify_every(self, seconds: float = VERIFY_SECONDS) -> None:
        """Verify now, then every ``seconds``, until cancelled; a failed run is logged, the last result stays."""
        while True:
            try:
                await self.verify()
            except Exception as exc:  # noqa: BLE001 - the daemon goes on; the result ages (its timestamp says so)
                log.warning("could not verify for /metrics (%s: %s)", type(exc).__name__, exc)
            await asyncio.sleep(seconds)

    def render(self) -> bytes:
        """The text exposition of the current snapshot (what a scrape returns)."""
        return generate_latest(self.registry)

    def serve(self, host: str, port: int) -> int:
        """Serve ``/metrics`` on ``host:port`` in a thread (port 0: any free one); the bound port."""
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"--metrics-port {port}: cannot serve metrics on {host}:{port} "
                              f"({exc.strerror or exc})") from None
        bound = int(self._server.server_port)
        log.info("serving metrics on http://%s:%d/metrics", host, bound, extra={"metrics_port": bound})
        return bound

    def close(self) -> None:
        """Stop the HTTP endpoint (if serving)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=5)
            self._server = self._thread = None
