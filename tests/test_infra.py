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
        if "STATEBOOK_TEST_PG_URL" not in os.environ:
            assert await conn.fetchval("SELECT current_database()") == pgcluster.DBNAME
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


@pytest.mark.parametrize("require, expected", [("0", 0), ("1", 1)])
def test_missing_postgres_skips_or_fails(require, expected, tmp_path):
    """Without binaries the postgres test skips, or fails the run under REQUIRE_PG."""
    env = {k: v for k, v in os.environ.items() if k != "STATEBOOK_TEST_PG_URL"}
    env.update(STATEBOOK_PG_BINDIR=str(tmp_path), STATEBOOK_REQUIRE_PG=require)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         f"{Path(__file__).name}::test_postgres_cluster_answers"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == expected, proc.stdout + proc.stderr
    assert ("1 skipped" in proc.stdout) == (require == "0"), proc.stdout
