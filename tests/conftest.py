"""Shared fixtures: backends, database URLs, a Book on a fake clock.

PostgreSQL comes from ``STATEBOOK_TEST_PG_URL`` when set, otherwise from a
throwaway cluster (tests/pgcluster.py) started once per session.  Without
PostgreSQL the postgres-parametrised tests skip, unless
``STATEBOOK_REQUIRE_PG=1``: then a missing server fails the run, and so does
any skipped test whose node id mentions postgres.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from hypothesis import settings

_TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(_TESTS))
# The outbox and scheduler case modules (``*_cases.py``) are imported by tests/conformance/suite.py.
sys.path[1:1] = [str(_TESTS / "outbox"), str(_TESTS / "scheduler")]

import pgcluster  # noqa: E402

# Database round-trips make the 200 ms default deadline flaky; "ci" is built in.
settings.register_profile("dev", deadline=None)
settings.register_profile("deep", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REQUIRE_PG = os.environ.get("STATEBOOK_REQUIRE_PG") == "1"
_skipped_postgres: list[str] = []


def _no_postgres(reason: str) -> None:
    if REQUIRE_PG:
        pytest.fail(f"STATEBOOK_REQUIRE_PG=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_url():
    url = os.environ.get("STATEBOOK_TEST_PG_URL")
    if url:
        yield url
        return
    bindir = pgcluster.find_pg_bin()
    if bindir is None:
        _no_postgres(
            "PostgreSQL is not available: set STATEBOOK_TEST_PG_URL or install "
            f"server binaries under {pgcluster.PG_ROOT}/*/bin"
        )
    with pgcluster.throwaway_cluster(bindir) as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request) -> str:
    return request.param


@pytest.fixture
def db_url(backend, tmp_path, request) -> str:
    if backend == "postgres":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'statebook.db'}"


@pytest.fixture
def clock():
    from statebook.lifecycle import FakeClock

    return FakeClock()


@pytest.fixture
async def book(db_url, backend, clock):
    from statebook.adapters.db import open_book, reset_schema

    book = await open_book(db_url, clock=clock)
    try:
        if backend == "postgres":
            await reset_schema(book.engine)
        yield book
    finally:
        await book.engine.dispose()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and ("postgres" in report.nodeid or "postgres" in report.keywords):
        _skipped_postgres.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if REQUIRE_PG and _skipped_postgres and session.exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if REQUIRE_PG and _skipped_postgres:
        terminalreporter.section("STATEBOOK_REQUIRE_PG", sep="=", red=True, bold=True)
        terminalreporter.write_line(
            f"{len(_skipped_postgres)} PostgreSQL test(s) skipped; the run counts as failed:"
        )
        for nodeid in _skipped_postgres:
            terminalreporter.write_line(f"  {nodeid}")
