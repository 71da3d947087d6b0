"""Shared fixtures: backends, database URLs, a Book on a fake clock.

PostgreSQL comes from ``STATEBOOK_TEST_PG_URL`` when set, otherwise from a
throwaway cluster (tests/pgcluster.py) started once per test process.  Without
PostgreSQL the postgres-parametrised tests skip, unless
``STATEBOOK_REQUIRE_PG=1``: then a missing server fails the run, and so does
any skipped test whose node id mentions postgres.

Under pytest-xdist (``-n``) each worker starts a throwaway cluster of its own
(why: the ``pg_url`` fixture) and keeps its SQLite files under its own
``tmp_path``; against ``STATEBOOK_TEST_PG_URL`` each worker gets a database of
its own, copied from a template the controller builds once.
Tests marked ``serial`` need the whole machine (processes racing, kills,
timings); ``make test`` runs them after the parallel phase (tests/run_suite.py).
"""

from __future__ import annotations

import contextlib
import os

import pytest
from hypothesis import settings
from sqlalchemy.engine import make_url

# pytest puts tests/ on sys.path (the folder of this conftest, in its default "prepend" import mode): the
# helpers at its top level import by name, the conformance cases by package (conformance.outbox.cases_dispatch_scan).
import pgcluster
import profiles

# Database round-trips make the 200 ms default deadline flaky; "ci" is built in. "deep" (make test-deep) runs ten
# times the examples; a test that names its own size scales it with profiles.examples().
settings.register_profile("dev", deadline=None)
settings.register_profile("deep", deadline=None, max_examples=10 * profiles.DEFAULT_EXAMPLES)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

REQUIRE_PG = os.environ.get("STATEBOOK_REQUIRE_PG") == "1"
_skipped_postgres: list[str] = []


def _no_postgres(reason: str) -> None:
    if REQUIRE_PG:
        pytest.fail(f"STATEBOOK_REQUIRE_PG=1 but {reason}", pytrace=False)
    pytest.skip(reason)


def _cluster_of_our_own():
    """A throwaway cluster for this process (a serial run, or one xdist worker), started on first use."""
    bindir = pgcluster.find_pg_bin()
    if bindir is None:
        _no_postgres("PostgreSQL is not available: set STATEBOOK_TEST_PG_URL or install "
                     f"server binaries under {pgcluster.PG_ROOT}/*/bin")
    return pgcluster.throwaway_cluster(bindir)


class _SharedServer:
    """``STATEBOOK_TEST_PG_URL`` under xdist: the controller builds the schema once, in a template database of
    this run's own (two runs may share the server), and each worker gets a copy of it to itself."""

    def __init__(self) -> None:
        self.template: str | None = None

    def prepare(self, url: str) -> str | None:
        """The template's name; None when the server cannot make one (the workers then use ``url`` itself, and
        its PostgreSQL tests say what is wrong with it)."""
        if self.template is None:
            try:
                self.template = pgcluster.make_template(url, f"{pgcluster.TEMPLATE}_{os.getpid()}")
            except Exception:  # noqa: BLE001 - unreachable, or no CREATEDB: each test reports it in its own words
                return None
        return self.template

    def close(self, url: str | None) -> None:
        if url and self.template:
            with contextlib.suppress(Exception):
                pgcluster.drop_database(url, self.template)


_SHARED = _SharedServer()
_WORKER_KEY = "statebook_pg_template"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # the xdist controller, before each worker starts
    url = os.environ.get("STATEBOOK_TEST_PG_URL")
    if url:
        node.workerinput[_WORKER_KEY] = _SHARED.prepare(url)


def pytest_unconfigure(config) -> None:
    _SHARED.close(os.environ.get("STATEBOOK_TEST_PG_URL"))


@pytest.fixture(scope="session")
def pg_url(request):
    """The PostgreSQL database of this process's tests.

    Without ``STATEBOOK_TEST_PG_URL`` each process (a serial run, or each xdist worker) starts a throwaway
    cluster of its own: PostgreSQL's snapshot horizon (``pg_snapshot_xmin``) spans a whole cluster, so on a
    shared one a transaction another worker holds open would delay this worker's tail reads and
    ``Reads.settle`` (specs/lifecycle.md L13; specs/testing.md). With it, a serial run uses that database
    itself and each worker a copy of the run's template (``statebook_test_gw0``, ...) on that server."""
    url = os.environ.get("STATEBOOK_TEST_PG_URL")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not url:
        with _cluster_of_our_own() as own:
            yield own
        return
    template = getattr(request.config, "workerinput", {}).get(_WORKER_KEY)
    if worker is None or template is None:
        yield url  # a serial run on the user's server uses the database it names, as it always did
        return
    name = f"{make_url(url).database or pgcluster.DBNAME}_{worker}"
    yield pgcluster.database_from(url, name, template)
    with contextlib.suppress(Exception):
        pgcluster.drop_database(url, name)


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
        if "chromium" in str(report.longrepr) and "tests/browser/" in report.nodeid:
            return  # no browser here (STATEBOOK_REQUIRE_BROWSER decides whether that fails), not no PostgreSQL
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
