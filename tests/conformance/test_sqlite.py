"""L15: the lifecycle conformance suite on SQLite (a fresh database file per test)."""

from __future__ import annotations

import pytest

from .suite import LifecycleConformance, SerialWriterCases


class TestSQLite(LifecycleConformance, SerialWriterCases):
    @pytest.fixture
    def db_url(self, tmp_path) -> str:
        return f"sqlite:///{tmp_path / 'conformance.db'}"
