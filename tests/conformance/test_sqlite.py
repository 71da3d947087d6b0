"""L15: the lifecycle conformance suite on SQLite (a fresh database file per test)."""

from __future__ import annotations

import pytest

from .suite import LifecycleConformance, OutboxConformance, SerialWriterCases


class TestSQLite(LifecycleConformance, OutboxConformance, SerialWriterCases):
    @pytest.fixture
    def db_url(self, tmp_path) -> str:
        return f"sqlite:///{tmp_path / 'conformance.db'}"

    @pytest.fixture
    def backend(self) -> str:
        return "sqlite"
