"""L15: the engine's conformance cases on SQLite and on PostgreSQL; each backend adds the cases of its
concurrency model (one writer at a time, or many at once)."""

from __future__ import annotations

import pytest

from statebook.lifecycle.testing.cases import StorageConformance

from ..suite import PostgresBackend, SQLiteBackend
from .cases_audit import AuditCases
from .cases_batch import BatchCases, PurgeManyCases
from .cases_commands import CommandCases
from .cases_conflict import TransitionConflictCases
from .cases_concurrency import ConcurrentWriterCases, HonestSeqCases, RaceCases, SerialWriterCases
from .cases_driver import DriverCases
from .cases_factlog import FactLogAttackCases, FactLogCases
from .cases_inputs import InputCases
from .cases_store import StoreCases
from .cases_tail import TailCases
from .cases_times import TimeCases


class LifecycleConformance(
    StorageConformance, CommandCases, TransitionConflictCases, BatchCases, PurgeManyCases, AuditCases, TailCases,
    RaceCases, HonestSeqCases, DriverCases, InputCases, StoreCases, TimeCases, FactLogCases,
    FactLogAttackCases,
):
    """Every backend-neutral case (L3-L14), the storage cases users run among them, and the port's own
    (``StoreCases``). A backend adds ConcurrentWriterCases or SerialWriterCases."""


class TestLifecycleSQLite(SQLiteBackend, LifecycleConformance, SerialWriterCases):
    pass


@pytest.mark.postgres
class TestLifecyclePostgres(PostgresBackend, LifecycleConformance, ConcurrentWriterCases):
    pass
