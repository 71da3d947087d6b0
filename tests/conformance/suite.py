"""``LifecycleConformance``, ``OutboxConformance`` and ``SchedulerConformance``: the contracts of the engine and
of the parts built on it, as test cases a backend inherits.

A backend runs the suite by subclassing it together with the mixin for its concurrency model and
providing one fixture, ``db_url`` (a URL ``statebook.adapters.db.connect`` accepts)::

    class TestMyBackend(LifecycleConformance, ConcurrentWriterCases):
        @pytest.fixture
        def db_url(self):
            return "postgresql://..."

Every case gets ``book``: a Book over a prepared, empty database whose registry holds the built-in
lifecycles plus the suite's ``task`` lifecycle (conformance/support.py), on a FakeClock. Cases that
need more connections call ``more_engines()``; those engines are disposed after the test.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from statebook.adapters.db import connect, create_schema, reset_schema
from statebook.lifecycle import Book, Clock, FakeClock, Registry
from statebook.lifecycle.testing.cases import StorageConformance

from .cases_audit import AuditCases
from .cases_batch import BatchCases, PurgeManyCases
from .cases_commands import CommandCases
from .cases_concurrency import ConcurrentWriterCases, HonestSeqCases, RaceCases, SerialWriterCases
from .cases_driver import DriverCases
from .cases_inputs import InputCases
from .cases_store import StoreCases
from .cases_tail import TailCases
from .support import task_registry, tasks

from ack_token_cases import AckTokenCases  # noqa: E402  (tests/outbox, on sys.path from conftest)
from argv_transport_cases import ArgvTransportCases  # noqa: E402
from backoff_cap_cases import BackoffCapCases  # noqa: E402
from bulk_purge_cases import BulkPurgeCases  # noqa: E402
from delivery_worker_cases import DeliveryWorkerCases  # noqa: E402
from dispatch_ack_cases import DispatchAckCases  # noqa: E402
from dispatch_admin_cases import DispatchAdminCases  # noqa: E402
from dispatch_atomicity_cases import DispatchAtomicityCases  # noqa: E402
from dispatch_enqueue_cases import DispatchEnqueueCases  # noqa: E402
from dispatch_outcome_cases import DispatchOutcomeCases  # noqa: E402
from dispatch_scan_cases import DispatchScanCases  # noqa: E402
from kill_cases import KillCases  # noqa: E402
from lease_timeout_cases import LeaseTimeoutCases  # noqa: E402
from outbox_input_cases import OutboxInputCases  # noqa: E402
from offer_cases import OfferCases  # noqa: E402
from purge_race_cases import PurgeRaceCases  # noqa: E402
from notification_bucket_cases import NotificationBucketCases  # noqa: E402
from notification_channel_cases import NotificationChannelCases  # noqa: E402
from notification_delivery_cases import NotificationDeliveryCases  # noqa: E402
from notification_evidence_cases import NotificationEvidenceCases  # noqa: E402
from notification_intake_cases import NotificationIntakeCases  # noqa: E402
from notification_ownership_cases import NotificationOwnershipCases  # noqa: E402
from notification_pass_cases import NotificationPassCases  # noqa: E402
from notification_recovery_cases import NotificationRecoveryCases  # noqa: E402
from notification_response_cases import NotificationResponseCases  # noqa: E402
from notification_retention_cases import NotificationRetentionCases  # noqa: E402
from notification_worker_cases import NotificationWorkerCases  # noqa: E402

from chains_and_notify_cases import ChainsAndNotifyCases  # noqa: E402  (tests/scheduler, on sys.path)
from gate_cases import GateCases  # noqa: E402
from github_poll_cases import GithubPollCases  # noqa: E402
from schedule_input_cases import SchedulerInputCases  # noqa: E402
from launcher_cases import LauncherCases  # noqa: E402
from leadership_cases import LeadershipCases  # noqa: E402
from missed_and_recovery_cases import MissedAndRecoveryCases  # noqa: E402
from set_evaluation_cases import SetEvaluationCases  # noqa: E402
from stale_claim_cases import StaleClaimCases  # noqa: E402

__all__ = ["ConcurrentWriterCases", "LifecycleConformance", "NotificationConformance", "OutboxConformance",
           "SchedulerConformance", "SerialWriterCases"]

POOL_SIZE = 25
"""Room for the racing cases: every racer holds its own connection."""


class ConformanceFixtures(StorageConformance):
    """The storage cases users run (statebook.lifecycle.testing.cases) on our fixture ``db_url``, with the
    built-ins in the registry, every statebook table emptied around each test, and ``rival``/``more_engines``
    for the outbox's and scheduler's cases."""

    @pytest.fixture(autouse=True)
    def _url(self, db_url: str) -> None:
        self.db_url = db_url

    async def make_book(self, registry: Registry, clock: Clock) -> Book:
        engine = connect(self.db_url, pool_size=POOL_SIZE)
        try:
            await create_schema(engine, clock, registry=registry)  # the task table's CHECK from its lifecycle
        except BaseException:
            await engine.dispose()
            raise
        return Book(engine, registry, clock)

    def conformance_registry(self) -> Registry:
        return task_registry()

    async def empty_book(self, book: Book) -> None:
        # A shared PostgreSQL database outlives the test: leave no task rows or facts behind.
        await reset_schema(book.engine)
        async with book.engine.begin() as conn:
            await conn.execute(sa.delete(tasks))

    @pytest.fixture
    async def rival(self, book: Book, db_url: str, clock: FakeClock) -> AsyncIterator[Book]:
        """A second Book on the same database: its own engine, its own connections (another daemon)."""
        other = Book(connect(db_url), book.registry, clock)
        try:
            yield other
        finally:
            await other.engine.dispose()

    @pytest.fixture
    async def more_engines(self, db_url: str) -> AsyncIterator[Callable[[], AsyncEngine]]:
        made: list[AsyncEngine] = []

        def make() -> AsyncEngine:
            engine = connect(db_url, pool_size=POOL_SIZE)
            made.append(engine)
            return engine

        yield make
        for engine in made:
            await engine.dispose()


class LifecycleConformance(
    ConformanceFixtures, CommandCases, BatchCases, PurgeManyCases, AuditCases, TailCases, RaceCases,
    HonestSeqCases, DriverCases, InputCases, StoreCases
):
    """Every backend-neutral case (L3-L14), the storage cases users run among them, and the port's own
    (``StoreCases``). Add ConcurrentWriterCases or SerialWriterCases for your backend."""


class OutboxConformance(
    DispatchEnqueueCases, DispatchScanCases, DispatchAtomicityCases, DispatchOutcomeCases, DispatchAckCases,
    AckTokenCases, DispatchAdminCases, BulkPurgeCases, PurgeRaceCases, OfferCases, LeaseTimeoutCases,
    BackoffCapCases, DeliveryWorkerCases, ArgvTransportCases, KillCases, OutboxInputCases,
):
    """The outbox's cases (specs/outbox.md), from tests/outbox/*_cases.py: every one runs on each backend that
    inherits this class, next to ``LifecycleConformance``. Cases may ask for ``backend`` (the backend's name)."""


class NotificationConformance(
    NotificationIntakeCases, NotificationDeliveryCases, NotificationBucketCases, NotificationWorkerCases,
    NotificationPassCases, NotificationOwnershipCases, NotificationRecoveryCases, NotificationResponseCases,
    NotificationRetentionCases, NotificationChannelCases, NotificationEvidenceCases,
):
    """The notifications' cases (specs/notifications.md), from tests/outbox/notification_*_cases.py, on each
    backend that inherits this class."""


class SchedulerConformance(
    SetEvaluationCases, GateCases, StaleClaimCases, MissedAndRecoveryCases, ChainsAndNotifyCases, GithubPollCases,
    LeadershipCases, LauncherCases, SchedulerInputCases,
):
    """The scheduler's cases (specs/scheduler.md), from tests/scheduler/*_cases.py, on each backend that
    inherits this class."""
