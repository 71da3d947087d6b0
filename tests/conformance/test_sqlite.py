"""L15: the conformance suites (lifecycle, outbox, scheduler) on SQLite (a fresh database file per test)."""

from __future__ import annotations

import pytest

from .suite import (
    LifecycleConformance, NotificationConformance, OutboxConformance, SchedulerConformance, SerialWriterCases,
)


class TestSQLite(
    LifecycleConformance, NotificationConformance, OutboxConformance, SchedulerConformance, SerialWriterCases
):
    @pytest.fixture
    def db_url(self, tmp_path) -> str:
        return f"sqlite:///{tmp_path / 'conformance.db'}"

    @pytest.fixture
    def backend(self) -> str:
        return "sqlite"
