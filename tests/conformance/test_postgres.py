"""L15: the lifecycle conformance suite on PostgreSQL (the session's throwaway cluster, emptied per test)."""

from __future__ import annotations

import pytest

from .suite import ConcurrentWriterCases, LifecycleConformance


@pytest.mark.postgres
class TestPostgres(LifecycleConformance, ConcurrentWriterCases):
    @pytest.fixture
    def db_url(self, pg_url: str) -> str:
        return pg_url
