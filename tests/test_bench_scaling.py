"""``tests/bench/scaling.py`` (W2p) and ``run.py --durable``: small runs, no timing asserted.

Two worker processes drain a few hundred dispatches (SQLite, and PostgreSQL for statebook and
pgqueuer) and every one is delivered exactly once; ``--durable`` starts its cluster with fsync,
synchronous_commit and full_page_writes on.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent / "bench"
_PATH = list(sys.path)
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import common  # noqa: E402
import pgcluster  # noqa: E402
import run  # noqa: E402
import scaling  # noqa: E402

sys.path[:] = _PATH  # the bench's flat module names stay out of the rest of the session's imports

N = 300


def test_two_processes_deliver_every_dispatch_once_on_sqlite(tmp_path: Path) -> None:
    outcome = asyncio.run(scaling.drain("statebook", f"sqlite:///{tmp_path / 'w2p.db'}", 2, N))
    assert outcome.n == N and len(outcome.ids) == N and set(outcome.ids.values()) == {1}
    assert outcome.span > 0 and outcome.cpu > 0


# statebook's side needs only the suite's PostgreSQL; pgqueuer's needs the bench extra too, so its case is not
# marked postgres (nor named so): a missing extra is not a missing server (CI runs without the bench extra).
@pytest.mark.parametrize("side", [pytest.param("statebook", marks=pytest.mark.postgres), "pgqueuer"])
def test_two_processes_deliver_every_item_once_on_the_server(pg_url: str, side: str) -> None:
    assert set(scaling.SIDES) == {"statebook", "pgqueuer"}
    if side == "pgqueuer":
        pytest.importorskip("pgqueuer", reason="pgqueuer comes with the bench extra (pip install -e '.[bench]')")

    async def go() -> scaling.Outcome:
        url = (await common.recreate_databases(pg_url, [f"bench_scaling_{side}"]))[f"bench_scaling_{side}"]
        try:
            return await scaling.drain(side, url, 2, N)
        finally:
            await common.drop_databases(pg_url, [f"bench_scaling_{side}"])

    outcome = asyncio.run(go())
    assert sum(outcome.ids.values()) == N and len(outcome.ids) == N


def test_a_double_delivery_or_a_missing_one_fails_the_check() -> None:
    with pytest.raises(RuntimeError, match="more than once"):
        scaling.Outcome(3, 1.0, Counter({"a": 1, "b": 2}), 0.0).check()
    with pytest.raises(RuntimeError, match="2 items delivered of 3"):
        scaling.Outcome(3, 1.0, Counter({"a": 1, "b": 1}), 0.0).check()


def test_w2p_is_a_workload_but_not_compared_with_a_baseline() -> None:
    assert "W2p" in run.WORKLOADS and "W2p" not in run.COMPARED
    args, _, only = run.parse_args(["--only", "W2p", "--durable"])
    assert only == ["W2p"] and args.durable and args.json == run.RESULTS_DURABLE
    assert run.parse_args([])[0].json == run.RESULTS


def test_the_notes_give_each_side_against_one_process() -> None:
    lines = [common.Line(f"W2p drain, {k} processes (10)", "postgresql", "deliv/s", 100.0 * k, "pgqueuer", 200.0)
             for k in (1, 2)]
    assert scaling.notes(lines)[0] == "W2p against 1 process: 2 processes: statebook x2.00, pgqueuer x1.00."
    assert scaling.notes([common.Line("W2 drain", "postgresql", "deliv/s", 1.0)]) == []


@pytest.mark.postgres
def test_durable_asks_the_cluster_for_fsync_on(monkeypatch: pytest.MonkeyPatch) -> None:
    if pgcluster.find_pg_bin() is None:
        if os.environ.get("STATEBOOK_REQUIRE_PG") == "1":
            pytest.fail("STATEBOOK_REQUIRE_PG=1 but no PostgreSQL binaries", pytrace=False)
        pytest.skip("no PostgreSQL binaries")
    seen: dict[str, dict[str, str]] = {}

    async def bench(url: str, *args) -> int:  # type: ignore[no-untyped-def]
        seen["durable" if args[-1] else "fast"] = await common.server_durability(url)  # the last: durable
        return 0

    monkeypatch.delenv("STATEBOOK_TEST_PG_URL", raising=False)  # the throwaway cluster, not the user's server
    monkeypatch.setattr(run, "bench", bench)
    args, sizes, only = run.parse_args(["--durable", "--only", "W1"])
    assert run._run(args, sizes, only, None, None) == 0
    assert seen == {"durable": dict.fromkeys(common.DURABILITY_SETTINGS, "on")}
