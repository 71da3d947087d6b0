"""L15: the lifecycle conformance suite on PostgreSQL (the session's throwaway cluster, emptied per test)."""

from __future__ import annotations

import pytest

from .suite import ConcurrentWriterCases, LifecycleConformance, OutboxConformance


@pytest.mark.postgres
class TestPostgres(LifecycleConformance, OutboxConformance, ConcurrentWriterCases):
    @pytest.fixture
    def db_url(self, pg_url: str) -> str:
        return pg_url

    @pytest.fixture
    def backend(self) -> str:
        return "postgres"
