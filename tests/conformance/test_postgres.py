"""L15: the conformance suites (lifecycle, outbox, scheduler) on PostgreSQL (the throwaway cluster, emptied per test)."""

from __future__ import annotations

import pytest

from .suite import (
    ConcurrentWriterCases, LifecycleConformance, NotificationConformance, OutboxConformance, SchedulerConformance,
)


@pytest.mark.postgres
class TestPostgres(
    LifecycleConformance, NotificationConformance, OutboxConformance, SchedulerConformance, ConcurrentWriterCases
):
    @pytest.fixture
    def db_url(self, pg_url: str) -> str:
        return pg_url

    @pytest.fixture
    def backend(self) -> str:
        return "postgres"
