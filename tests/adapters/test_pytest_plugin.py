"""The pytest plugin (adapters/pytest_plugin.py), run the way a user's project runs it: in pytester sessions."""

from __future__ import annotations

import subprocess
import sys

import pytest

# In-process pytester runs drop the modules they imported afterwards; these define tables on statebook's
# MetaData, so they must be imported once, here, not again by each inner run.
import statebook.adapters.db  # noqa: F401
import statebook.adapters.registry  # noqa: F401

pytest_plugins = ["pytester"]

APP = '''
import sqlalchemy as sa
from statebook.lifecycle import Lifecycle, Registry, edges, managed_table

doors = managed_table("plugin_doors", sa.Column("id", sa.String(32), primary_key=True),
                      sa.Column("colour", sa.Text, nullable=True), meta=sa.MetaData())
DOOR = Lifecycle(entity_type="door", table=doors, statuses=("shut", "open"), initial={"shut"}, terminal=(),
                 edges=(*edges("shut", "open"), *edges("open", "shut")), reason_prefixes={"door"},
                 reasons={"door.shut.built", "door.open.pushed", "door.shut.pulled"})
registry = Registry([DOOR]).seal()
'''

WRITES = '''
from statebook.lifecycle import Actor, Reason, create, history, verify

async def fill(book):
    """Fails unless the book starts empty; leaves one door behind for the next test to (not) see."""
    assert (await verify(book)).facts == 0
    await create(book, "door", values={"colour": "red"}, status="shut", reason=Reason("door.shut.built"),
                 actor=Actor("system"), entity_id="d1")
    assert len(await history(book, "door", "d1")) == 1
'''


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A user's project: an application module, asyncio in auto mode, and no statebook settings."""
    pytester.makepyfile(myapp=APP, writes=WRITES)
    pytester.makeini("[pytest]\nasyncio_mode = auto\nasyncio_default_fixture_loop_scope = function\n")
    pytester.syspathinsert()
    return pytester


@pytest.fixture
def strict_project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A user's project that leaves pytest-asyncio in its default (strict) mode: no asyncio setting at all."""
    pytester.makepyfile(myapp=APP, writes=WRITES)
    pytester.makeini("[pytest]\n")
    pytester.syspathinsert()
    return pytester


def test_async_tests_asking_for_a_book_run_in_pytest_asyncios_strict_mode(strict_project: pytest.Pytester):
    """K3 (issue 25): with no asyncio_mode set, an unmarked async test asking for a statebook book runs (the plugin
    marks it; before, pytest failed it: "async def functions are not natively supported"), a marked one too, and
    so do the kit's storage cases; an async test asking for no book keeps strict mode's rule."""
    strict_project.makepyfile(test_it='''
        import pytest
        from writes import fill

        async def test_unmarked(statebook_sqlite_book):
            await fill(statebook_sqlite_book)

        async def test_each_backend(statebook_book):
            await fill(statebook_book)

        class TestInAClass:
            async def test_method(self, statebook_sqlite_book):
                await fill(statebook_sqlite_book)

        @pytest.mark.asyncio
        async def test_marked(statebook_sqlite_book):
            await fill(statebook_sqlite_book)

        def test_sync(statebook_sqlite_book):
            assert statebook_sqlite_book.registry.get("door")

        async def test_no_book():
            pass
    ''', test_storage='''
        from statebook.adapters.db import open_book
        from statebook.lifecycle.testing.cases import StorageConformance

        class TestOurSQLite(StorageConformance):
            async def make_book(self, registry, clock):
                return await open_book(f"sqlite:///{self.folder}/ours.db", registry=registry, clock=clock)

            import pytest

            @pytest.fixture(autouse=True)
            def _folder(self, tmp_path):
                self.folder = tmp_path
    ''')
    result = strict_project.runpytest_subprocess("-p", "no:cacheprovider", "--statebook-app", "myapp:registry",
                                                 "-k", "not storage or chain", "-rA")
    result.stdout.re_match_lines([r".*mode=(Mode\.)?(strict|STRICT)\b"])
    outcomes = result.parseoutcomes()
    # test_no_book: pytest-asyncio's strict mode leaves it to pytest, which refuses an unmarked coroutine.
    assert outcomes.get("failed") == 1 and outcomes.get("skipped") == 1 and outcomes["passed"] == 5 + 1, outcomes
    result.stdout.fnmatch_lines(["FAILED test_it.py::test_no_book*"])


def test_clock_and_the_builtin_registry(project: pytest.Pytester):
    project.makepyfile(test_it='''
        from statebook.lifecycle import FakeClock

        def test_fixtures(statebook_clock, statebook_registry):
            assert isinstance(statebook_clock, FakeClock)
            start = statebook_clock.now()
            statebook_clock.advance(5)
            assert statebook_clock.now() == start + 5
            assert "dispatch" in statebook_registry and statebook_registry.sealed
    ''')
    project.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_app_option_names_the_registry_of_every_book(project: pytest.Pytester):
    project.makepyfile(test_it='''
        from writes import fill

        def test_registry(statebook_registry):
            assert [lc.entity_type for lc in statebook_registry] == ["door"]

        async def test_book(statebook_sqlite_book):
            assert statebook_sqlite_book.registry.get("door")
            await fill(statebook_sqlite_book)
    ''')
    project.runpytest("--statebook-app", "myapp:registry").assert_outcomes(passed=2)


def test_a_bad_app_option_fails_with_the_loaders_message(project: pytest.Pytester):
    project.makepyfile(test_it="def test_registry(statebook_registry):\n    pass\n")
    result = project.runpytest("--statebook-app", "myapp:nothing")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*--statebook-app*has no attribute 'nothing'*registries it defines: registry*"])


def test_each_sqlite_book_is_a_fresh_file(project: pytest.Pytester):
    project.makepyfile(test_it='''
        from writes import fill

        async def test_one(statebook_sqlite_book, tmp_path):
            assert str(tmp_path) in str(statebook_sqlite_book.engine.url)
            await fill(statebook_sqlite_book)

        async def test_two(statebook_sqlite_book):
            await fill(statebook_sqlite_book)
    ''')
    project.runpytest("--statebook-app", "myapp:registry").assert_outcomes(passed=2)


def test_pg_book_without_a_url_skips_saying_how_to_give_one(project: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("STATEBOOK_TEST_PG_URL", raising=False)
    project.makepyfile(test_it='''
        async def test_pg(statebook_pg_book):
            raise AssertionError("must not run")

        async def test_both(statebook_book):
            assert statebook_book.dialect == "sqlite"
    ''')
    result = project.runpytest("-rs", "-v")
    result.assert_outcomes(passed=1, skipped=2)
    result.stdout.fnmatch_lines(["*SKIPPED*statebook_pg_book needs a PostgreSQL database: pass --statebook-pg-url*"
                                 "STATEBOOK_TEST_PG_URL*"])
    result.stdout.fnmatch_lines(["*test_both?sqlite? PASSED*", "*test_both?postgres? SKIPPED*"])


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["option", "environment"])
def test_pg_book_is_emptied_before_each_test(project: pytest.Pytester, pg_url: str, how: str,
                                             monkeypatch: pytest.MonkeyPatch):
    project.makepyfile(test_it='''
        from writes import fill

        async def test_one(statebook_pg_book):
            assert statebook_pg_book.dialect == "postgresql"
            await fill(statebook_pg_book)

        async def test_two(statebook_pg_book):
            await fill(statebook_pg_book)

        async def test_both(statebook_book):
            await fill(statebook_book)
    ''')
    args = ["--statebook-app", "myapp:registry", "-v"]
    if how == "option":
        monkeypatch.delenv("STATEBOOK_TEST_PG_URL", raising=False)
        args += ["--statebook-pg-url", pg_url]
    else:
        monkeypatch.setenv("STATEBOOK_TEST_PG_URL", pg_url)
    result = project.runpytest_subprocess(*args)  # in-process, a second asyncpg session crashed the interpreter
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_both?sqlite? PASSED*", "*test_both?postgres? PASSED*"])


@pytest.mark.parametrize("profile, checks", [
    ("ci", "p.deadline is None and p.derandomize and p.database is None"),
    ("deep", "p.deadline is None and p.max_examples == 2000 and p.stateful_step_count == 100"),
])
def test_hypothesis_profiles_are_selected_with_hypothesis_option(project: pytest.Pytester, profile: str,
                                                                 checks: str):
    project.makepyfile(test_it=f'''
        from hypothesis import given, settings, strategies as st

        def test_profile():
            p = settings()
            assert settings.get_current_profile_name() == {profile!r}
            assert {checks}
    ''')
    project.runpytest_subprocess("--hypothesis-profile", profile).assert_outcomes(passed=1)


def test_loading_the_plugin_imports_nothing_heavy():
    """Every user's pytest run loads the plugin: no Hypothesis, database layer, driver or CLI at load."""
    heavy = ["hypothesis", "asyncpg", "aiosqlite", "typer", "rich", "pydantic", "statebook.adapters.db",
             "statebook.adapters.cli", "statebook.outbox", "statebook.scheduler", "statebook.lifecycle.testing"]
    code = ("import sys, statebook.adapters.pytest_plugin; "
            f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_users_storage_conformance_subclass_runs_every_case(project: pytest.Pytester):
    """The kit's storage cases, subclassed the way the README shows, on the user's own SQLite set-up."""
    project.makepyfile(test_storage='''
        import sqlalchemy as sa
        from statebook.adapters.db import open_book
        from statebook.lifecycle.testing.cases import StorageConformance

        class TestOurSQLite(StorageConformance):
            async def make_book(self, registry, clock):
                book = await open_book(f"sqlite:///{self.path}", registry=registry, clock=clock)
                async with book.engine.connect() as conn:  # the user's own pragma, checked to be in force
                    await conn.exec_driver_sql("PRAGMA cache_size=-4000")
                return book

            import pytest

            @pytest.fixture(autouse=True)
            def _path(self, tmp_path):
                self.path = tmp_path / "ours.db"

        class TestForgotten(StorageConformance):
            pass
    ''')
    result = project.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] >= 40 and outcomes["errors"] == outcomes["passed"], outcomes
    result.stdout.fnmatch_lines(["*TestForgotten must define 'async def make_book(self, registry, clock)'*"])
