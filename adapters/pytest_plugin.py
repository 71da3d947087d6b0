"""statebook's pytest plugin (entry point ``pytest11``, installed with ``pip install 'statebook[testing]'``).

Fixtures, every one prefixed ``statebook_`` so they never shadow a project's own:

- ``statebook_clock`` — a :class:`~statebook.lifecycle.FakeClock`;
- ``statebook_registry`` — the application's registry (``--statebook-app module:attr``), else the built-in one;
- ``statebook_sqlite_book`` — a fresh Book on a SQLite file in the test's temporary directory;
- ``statebook_pg_book`` — a Book on PostgreSQL (``--statebook-pg-url URL`` or ``$STATEBOOK_TEST_PG_URL``), its
  tables emptied before and after each test; skipped, with the reason, when no URL is given;
- ``statebook_book`` — the test once with each of the two.

The book fixtures are pytest-asyncio fixtures, and an ``async def`` test that asks for one of them is marked
``asyncio`` by the plugin: it runs under pytest-asyncio's default (strict) mode as under ``asyncio_mode = auto``,
with no setting in the project. Other async tests keep the project's mode.

Hypothesis profiles ``ci`` and ``deep`` are registered; pick one with Hypothesis's ``--hypothesis-profile``.

Loading the plugin costs one import of ``statebook.adapters`` (the storage backends register there);
the database layer, the application and Hypothesis are imported by the fixture or option that needs them.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from statebook.lifecycle import Book, FakeClock, Registry

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - statebook installed without the [testing] extra
    pytest_asyncio = None  # type: ignore[assignment]

PG_URL_ENV = "STATEBOOK_TEST_PG_URL"
NO_PG_REASON = (
    "statebook_pg_book needs a PostgreSQL database: pass --statebook-pg-url postgresql://USER@HOST/DB "
    f"or set {PG_URL_ENV} (every table statebook manages there is emptied before and after each test)"
)
NO_ASYNCIO_REASON = "{name} is async and needs pytest-asyncio: pip install 'statebook[testing]'"
BOOK_FIXTURES = frozenset({"statebook_sqlite_book", "statebook_pg_book", "statebook_book"})
"""The fixtures that hand a test a Book: an async test asking for one runs on pytest-asyncio's loop."""

# The case classes users subclass live in the kit; their asserts should explain themselves too.
pytest.register_assert_rewrite("statebook.lifecycle.testing")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--statebook-pg-url`` and ``--statebook-app``."""
    group = parser.getgroup("statebook")
    group.addoption("--statebook-pg-url", metavar="URL", default=None,
                    help=f"PostgreSQL for statebook_pg_book / statebook_book (default ${PG_URL_ENV}); "
                         "its statebook tables are emptied before and after each test: use a scratch database")
    group.addoption("--statebook-app", metavar="MODULE:ATTR", default=None,
                    help="the application's Registry (or a callable returning one) for statebook_registry "
                         "and the book fixtures (default: statebook's built-in lifecycles)")


@pytest.hookimpl(tryfirst=True)  # before Hypothesis's own plugin loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    """Register the Hypothesis profiles when this run may use them (without importing Hypothesis otherwise)."""
    if importlib.util.find_spec("hypothesis") is None:
        return
    if "hypothesis" in sys.modules or config.getoption("hypothesis_profile", None):
        register_profiles()


def register_profiles() -> None:
    """Register ``ci`` (derandomised, no deadline: database round-trips vary) and ``deep`` (many more examples
    and longer stateful runs, for a nightly job). Call it yourself before ``settings.load_profile`` when
    Hypothesis is first imported after the plugin was configured."""
    from hypothesis import HealthCheck, settings

    slow = [HealthCheck.too_slow]
    settings.register_profile("ci", parent=settings.get_profile("ci"), deadline=None, derandomize=True,
                              database=None, print_blob=True, suppress_health_check=slow)
    settings.register_profile("deep", deadline=None, max_examples=2000, stateful_step_count=100,
                              suppress_health_check=slow)


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str, obj: object) -> None:
    """Mark an ``async def`` test that asks for a statebook book ``asyncio`` (as if decorated with
    ``@pytest.mark.asyncio``), so pytest-asyncio's strict mode runs it; nothing else is marked."""
    if pytest_asyncio is None or not inspect.iscoroutinefunction(obj) or not collector.funcnamefilter(name):
        return
    try:
        asked = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # pragma: no cover - a callable without a signature
        return
    marked = any(getattr(m, "name", None) == "asyncio" for m in getattr(obj, "pytestmark", ()))
    if not marked and not BOOK_FIXTURES.isdisjoint(asked):
        pytest.mark.asyncio(obj)


def _async_fixture(func: Callable[..., Any]) -> Any:
    """An async fixture under pytest-asyncio (any ``asyncio_mode``); without it, one that says what to install."""
    if pytest_asyncio is not None:
        return pytest_asyncio.fixture(func)

    @pytest.fixture(name=func.__name__)
    def missing() -> None:  # pragma: no cover - see NO_ASYNCIO_REASON
        pytest.fail(NO_ASYNCIO_REASON.format(name=func.__name__), pytrace=False)

    return missing


@pytest.fixture
def statebook_clock() -> FakeClock:
    """A FakeClock at its default start; ``advance(seconds)`` moves it."""
    from statebook.lifecycle import FakeClock

    return FakeClock()


@pytest.fixture(scope="session")
def statebook_registry(pytestconfig: pytest.Config) -> Registry:
    """The registry ``--statebook-app`` names (sealed), or the built-in one."""
    from statebook.adapters.registry import builtin_registry, load_registry
    from statebook.lifecycle import StatebookError

    spec = pytestconfig.getoption("statebook_app")
    if not spec:
        return builtin_registry()
    try:
        return load_registry(spec)
    except StatebookError as exc:
        pytest.fail(f"--statebook-app: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def statebook_pg_url(pytestconfig: pytest.Config) -> str:
    """The PostgreSQL URL of ``--statebook-pg-url`` or ``$STATEBOOK_TEST_PG_URL``; skips the test without one."""
    url = pytestconfig.getoption("statebook_pg_url") or os.environ.get(PG_URL_ENV)
    if not url:
        pytest.skip(NO_PG_REASON)
    return url


@_async_fixture
async def statebook_sqlite_book(tmp_path: Any, statebook_registry: Registry,
                                statebook_clock: FakeClock) -> AsyncIterator[Book]:
    """A Book on a new SQLite file (schema created for ``statebook_registry``), on ``statebook_clock``."""
    from statebook.adapters.db import open_book

    book = await open_book(f"sqlite:///{tmp_path / 'statebook.db'}", registry=statebook_registry,
                           clock=statebook_clock)
    try:
        yield book
    finally:
        await book.engine.dispose()


@_async_fixture
async def statebook_pg_book(statebook_pg_url: str, statebook_registry: Registry,
                            statebook_clock: FakeClock) -> AsyncIterator[Book]:
    """A Book on the PostgreSQL database, every table of statebook and of the registry emptied before and after."""
    from statebook.adapters.db import open_book

    book = await open_book(statebook_pg_url, registry=statebook_registry, clock=statebook_clock)
    try:
        await empty_tables(book)
        yield book
        await empty_tables(book)  # a shared database is left as it was found: verify there stays clean
    finally:
        await book.engine.dispose()


async def empty_tables(book: Book) -> None:
    """Delete every row of statebook's tables and of the registry's managed tables (tests only)."""
    from statebook.adapters.db import reset_schema
    from statebook.lifecycle.schema import metadata

    await reset_schema(book.engine)
    own = [lc.table for lc in book.registry if lc.table.name not in metadata.tables]
    if own:
        async with book.engine.begin() as conn:
            names = ", ".join(conn.dialect.identifier_preparer.format_table(t) for t in own)
            await conn.exec_driver_sql(f"TRUNCATE {names} RESTART IDENTITY CASCADE")


@pytest.fixture(params=["sqlite", "postgres"])
def statebook_book(request: pytest.FixtureRequest) -> Book:
    """``statebook_sqlite_book``, then ``statebook_pg_book`` (skipped without a PostgreSQL URL)."""
    book: Book = request.getfixturevalue("statebook_sqlite_book" if request.param == "sqlite" else "statebook_pg_book")
    return book
