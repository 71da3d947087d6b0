"""The test infrastructure itself: the throwaway cluster and the REQUIRE_PG policy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

import pgcluster


@pytest.mark.postgres
async def test_postgres_cluster_answers(pg_url):
    conn = await asyncpg.connect(pg_url)
    try:
        assert await conn.fetchval("SELECT 1") == 1
        worker, external = os.environ.get("PYTEST_XDIST_WORKER"), "STATEBOOK_TEST_PG_URL" in os.environ
        name = await conn.fetchval("SELECT current_database()")
        if not external:  # a cluster of this process's own (each xdist worker starts one)
            assert name == pgcluster.DBNAME
        elif worker:  # the user's server: a database of this worker's own, copied from the run's template
            assert name.endswith(f"_{worker}"), name
            tables = {r[0] for r in await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
            assert {"status_transitions", "dispatch_outbox", "statebook_alembic_version"} <= tables, tables
    finally:
        await conn.close()


@pytest.mark.skipif(not pgcluster.PG_ROOT.exists(), reason="no /usr/lib/postgresql here")
def test_find_pg_bin_finds_initdb(monkeypatch):
    monkeypatch.delenv("STATEBOOK_PG_BINDIR", raising=False)
    bindir = pgcluster.find_pg_bin()
    assert bindir is not None
    assert (bindir / "initdb").is_file()
    assert (bindir / "pg_ctl").is_file()


def test_find_pg_bin_honours_missing_override(monkeypatch, tmp_path):
    monkeypatch.setenv("STATEBOOK_PG_BINDIR", str(tmp_path))
    assert pgcluster.find_pg_bin() is None


@pytest.mark.parametrize("require, expected, workers", [("0", 0, []), ("1", 1, []), ("0", 0, ["-n", "2"]),
                                                          ("1", 1, ["-n", "2"])])
def test_missing_postgres_skips_or_fails(require, expected, workers, tmp_path):
    """Without binaries the postgres test skips, or fails the run under REQUIRE_PG; under xdist too, where the
    controller looks for the server and its workers give its reason."""
    env = {k: v for k, v in os.environ.items() if k not in ("STATEBOOK_TEST_PG_URL", "PYTEST_XDIST_WORKER")}
    env.update(STATEBOOK_PG_BINDIR=str(tmp_path), STATEBOOK_REQUIRE_PG=require)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers,
         f"{Path(__file__).name}::test_postgres_cluster_answers"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert ("1 skipped" in proc.stdout) == (require == "0"), proc.stdout
