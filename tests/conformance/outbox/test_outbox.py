"""The outbox's conformance cases (specs/outbox.md) on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from ..suite import PostgresBackend, SQLiteBackend
from .cases_ack_token import AckTokenCases
from .cases_argv_transport import ArgvTransportCases
from .cases_backoff_cap import BackoffCapCases
from .cases_bulk_purge import BulkPurgeCases
from .cases_delivery_worker import DeliveryWorkerCases
from .cases_dispatch_ack import DispatchAckCases
from .cases_dispatch_admin import DispatchAdminCases
from .cases_dispatch_atomicity import DispatchAtomicityCases
from .cases_dispatch_enqueue import DispatchEnqueueCases
from .cases_dispatch_outcome import DispatchOutcomeCases
from .cases_dispatch_scan import DispatchScanCases
from .cases_inputs import OutboxInputCases
from .cases_kill import KillCases
from .cases_lease_timeout import LeaseTimeoutCases
from .cases_offer import OfferCases
from .cases_purge_race import PurgeRaceCases
from .cases_times import TimeCases


class OutboxConformance(
    DispatchEnqueueCases, DispatchScanCases, DispatchAtomicityCases, DispatchOutcomeCases, DispatchAckCases,
    AckTokenCases, DispatchAdminCases, BulkPurgeCases, PurgeRaceCases, OfferCases, LeaseTimeoutCases,
    BackoffCapCases, DeliveryWorkerCases, ArgvTransportCases, KillCases, OutboxInputCases, TimeCases,
):
    """The outbox's cases, from this folder's cases_*.py."""


class TestOutboxSQLite(SQLiteBackend, OutboxConformance):
    pass


@pytest.mark.postgres
class TestOutboxPostgres(PostgresBackend, OutboxConformance):
    pass
