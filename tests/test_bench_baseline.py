"""``tests/bench/run.py --baseline REV``: options, round order, the table and results with a fake result set.

No figure is asserted (speed is never a test assertion); these check the plumbing: what is parsed,
which contender runs when, what the table and results.json show for a compared, an n/a and a
not-compared line, and that the child process speaks its protocol.
"""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent / "bench"
_PATH = list(sys.path)
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import baseline  # noqa: E402
import child  # noqa: E402
import run  # noqa: E402
from common import Line, interleave, median_ci, render_table, round_order  # noqa: E402

sys.path[:] = _PATH  # the bench's flat module names stay out of the rest of the session's imports

OLD_HEADER = ("| workload | backend | statebook | peer/floor | ratio | target | result | client CPU/op |")


# -- options -----------------------------------------------------------------------------------

def test_baseline_options_are_parsed() -> None:
    args, sizes, only = run.parse_args(["--baseline", "HEAD~1", "--only", "W1,W3", "--rounds", "1",
                                        "--keep-baseline", "/tmp/kept"])
    assert args.baseline == "HEAD~1"
    assert args.keep_baseline == Path("/tmp/kept")
    assert only == ["W1", "W3"]
    assert sizes.rounds == 1


def test_without_baseline_nothing_changes() -> None:
    args, _, only = run.parse_args([])
    assert args.baseline is None and args.keep_baseline is None
    assert only == list(run.WORKLOADS)


def test_keep_baseline_needs_baseline(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run.parse_args(["--keep-baseline", "/tmp/kept"])
    assert "--keep-baseline needs --baseline" in capsys.readouterr().err


def test_a_revision_resolves_to_a_commit() -> None:
    sha, subject = baseline.resolve("HEAD")
    assert len(sha) == 40 and subject.startswith(sha[:7])
    with pytest.raises(baseline.BaselineError, match="does not name a commit"):
        baseline.resolve("no-such-revision-anywhere")



def test_the_working_side_is_the_tree_as_it_is_now(tmp_path: Path) -> None:
    """The working tree's install holds uncommitted edits and new files, and leaves out ignored files
    and deleted ones, so it measures what ``git status`` shows rather than the last commit."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.email=t@example.org", "-c", "user.name=t", "-C", str(repo)]
    (repo / ".gitignore").write_text("*.log\n")
    (repo / "kept.py").write_text("old\n")
    (repo / "gone.py").write_text("x\n")
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    (repo / "kept.py").write_text("edited\n")
    (repo / "gone.py").unlink()
    (repo / "pkg").mkdir()
    (repo / "pkg" / "new.py").write_text("new\n")
    (repo / "noise.log").write_text("ignored\n")
    baseline.copy_worktree(repo, tmp_path / "copy")
    copied = sorted(str(f.relative_to(tmp_path / "copy")) for f in (tmp_path / "copy").rglob("*") if f.is_file())
    assert copied == [".gitignore", "kept.py", "pkg/new.py"]
    assert (tmp_path / "copy" / "kept.py").read_text() == "edited\n"

# -- rounds ------------------------------------------------------------------------------------

def test_pairs_alternate_their_order_every_other_round() -> None:
    contenders = [("sb", 1), ("sb@baseline", 2), ("peer", 3), ("sb-sq", 4), ("sb-sq@baseline", 5)]
    pairs = [("sb", "sb@baseline"), ("sb-sq", "sb-sq@baseline")]
    names = [[n for n, _ in round_order(contenders, r, pairs)] for r in range(3)]
    assert names[0] == ["sb", "sb@baseline", "peer", "sb-sq", "sb-sq@baseline"]
    assert names[1] == ["sb@baseline", "sb", "peer", "sb-sq@baseline", "sb-sq"]
    assert names[2] == names[0]
    assert [n for n, _ in round_order(contenders, 1)] == [n for n, _ in contenders]  # no pairs: as given


class FakeChild:
    """Stands in for baseline.Child: answers from a table, or fails like a baseline lacking an API."""

    def __init__(self, label: str, seconds: float | None, error: str | None = None) -> None:
        self.label, self.python, self.seconds, self.error = label, f"/fake/{label}/python", seconds, error
        self.ready, self.statebook, self.calls, self.closed = True, f"/fake/{label}/statebook", [], False

    async def start(self) -> None:
        pass

    async def call(self, op: str, backend: str, **args: object) -> tuple[object, float]:
        self.calls.append((op, backend, args))
        if self.error:
            raise baseline.ChildError(self.error)
        return self.seconds, 0.5

    async def close(self) -> None:
        self.closed = True


def sides(tmp_path: Path) -> baseline.Sides:
    return baseline.Sides("/w/python", "/b/python", "postgresql://w", "postgresql://b", tmp_path, lambda _: None)


def test_sides_pair_each_statebook_contender_and_keep_the_others(tmp_path: Path) -> None:
    order: list[str] = []

    async def peer() -> float:
        order.append("peer")
        return 100.0

    async def inprocess() -> float:  # replaced: never runs in a --baseline run
        raise AssertionError("the in-process statebook contender ran")

    s = sides(tmp_path)
    work, base = FakeChild("working", 2.0), FakeChild("baseline", 4.0)
    remote = baseline.Remote("enqueue_single", "sqlite", {"n": 200}, lambda name, sec: order.append(name) or 200 / sec)

    async def go() -> dict[str, list[float]]:
        async with s.contenders([("statebook-sqlite", inprocess), ("floor-sqlite", peer)],
                                {"statebook-sqlite": remote}, children=(work, base)) as (contenders, alternate):
            assert [n for n, _ in contenders] == ["statebook-sqlite", "statebook-sqlite@baseline", "floor-sqlite"]
            return await interleave(2, contenders, lambda _: None, {}, alternate)

    r = asyncio.run(go())
    assert order == ["statebook-sqlite", "statebook-sqlite@baseline", "peer",
                     "statebook-sqlite@baseline", "statebook-sqlite", "peer"]
    assert r == {"statebook-sqlite": [100.0, 100.0], "statebook-sqlite@baseline": [50.0, 50.0],
                 "floor-sqlite": [100.0, 100.0]}
    assert work.calls == base.calls == [("enqueue_single", "sqlite", {"n": 200})] * 2
    assert work.closed and base.closed
    line = s.compare(Line("W1", "sqlite", "enq/s", 100.0, "floor", 100.0, 1.0), "statebook-sqlite", r)
    assert line.baseline == 50.0 and line.baseline_ratio == 0.5 and line.vs_baseline == 2.0



def test_repeated_pairs_run_back_to_back_and_give_paired_ratios(tmp_path: Path) -> None:
    """With ``repeat`` a pair runs K times per round in alternating order, the peer once per round, and
    ``vs baseline`` is the median of the ratios of runs made back to back, not the ratio of medians."""
    order: list[str] = []
    speeds = iter([4.0, 2.0, 1.0, 1.0, 8.0, 4.0, 1.0, 1.0])  # seconds, in call order; peer: 100 enq/s

    class Timed(FakeChild):
        async def call(self, op: str, backend: str, **args: object) -> tuple[object, float]:
            order.append(self.label)
            return next(speeds), 0.5

    async def peer() -> float:
        order.append("peer")
        return 100.0

    s = sides(tmp_path)
    s.repeat = 2
    remote = baseline.Remote("enqueue_single", "sqlite", {"n": 8}, lambda _name, sec: 8 / sec)

    async def go() -> dict[str, list[float]]:
        async with s.contenders([("sb", None), ("peer", peer)], {"sb": remote},
                                children=(Timed("working", 0), Timed("baseline", 0))) as (contenders, alternate):
            return await interleave(2, contenders, lambda _: None, None, alternate, repeat=s.repeat)

    r = asyncio.run(go())
    assert order == ["working", "baseline", "baseline", "working", "peer",
                     "baseline", "working", "working", "baseline", "peer"]
    assert r["sb"] == [2.0, 8.0, 2.0, 8.0] and r["sb@baseline"] == [4.0, 8.0, 1.0, 8.0]
    line = s.compare(Line("W1", "sqlite", "enq/s", 5.0, "floor", 100.0, 0.05), "sb", r)
    assert line.paired == [0.5, 1.0, 2.0, 1.0]
    assert line.vs_baseline == 1.0  # the ratio of the two medians would be 5.0 / 6.0


def test_the_interval_of_a_median_comes_from_order_statistics() -> None:
    assert median_ci([1.0] * 5) is None  # too few for a 95% interval
    got = median_ci([float(i) for i in range(40, 0, -1)])  # 40 pairs: the 14th and 27th of 1..40
    assert got == (14.0, 27.0)
    line = Line("W", "sqlite", "enq/s", 1.0, compared=True, baseline=1.0, paired=[1.0 + i / 100 for i in range(40)])
    assert "1.19x [1.13-1.26]" in render_table([line])

def test_a_baseline_that_cannot_serve_a_request_is_na_and_not_asked_again(tmp_path: Path) -> None:
    s = sides(tmp_path)
    work, base = FakeChild("working", 2.0), FakeChild("baseline", None, "AttributeError: no enqueue_dispatches")
    remote = baseline.Remote("enqueue_batches", "postgresql", {"total": 10, "batch": 5}, lambda _n, sec: 10 / sec)

    async def go() -> dict[str, list[float]]:
        async with s.contenders([("statebook-pg-batch", None)], {"statebook-pg-batch": remote},
                                children=(work, base)) as (contenders, alternate):
            return await interleave(3, contenders, lambda _: None, None, alternate)

    r = asyncio.run(go())
    assert r["statebook-pg-batch"] == [5.0, 5.0, 5.0]
    assert all(math.isnan(v) for v in r["statebook-pg-batch@baseline"])
    assert len(base.calls) == 1
    line = s.compare(Line("W1 batch", "postgresql", "enq/s", 5.0, "floor", 10.0, 0.5), "statebook-pg-batch", r)
    assert line.compared and line.baseline is None and "no enqueue_dispatches" in line.baseline_note
    assert "| n/a " in render_table([line])


def test_the_working_trees_failure_is_an_error_not_na(tmp_path: Path) -> None:
    s = sides(tmp_path)
    work, base = FakeChild("working", None, "TypeError: boom"), FakeChild("baseline", 1.0)
    remote = baseline.Remote("drain", "sqlite", {"n": 1}, lambda _n, sec: 1 / sec)

    async def go() -> None:
        async with s.contenders([("statebook-sqlite", None)], {"statebook-sqlite": remote},
                                children=(work, base)) as (contenders, _):
            await contenders[0][1]()

    with pytest.raises(RuntimeError, match="working tree"):
        asyncio.run(go())
    assert work.closed and base.closed


# -- the table and results.json ----------------------------------------------------------------

def fake_lines() -> list[Line]:
    compared = Line("W1 enqueue single (2,000)", "postgresql", "enq/s", 2_200.0, "pgqueuer", 4_000.0, 0.55,
                    ">= 1x", False, cpu_us=(150.0, 60.0), compared=True, baseline=2_000.0, baseline_cpu_us=160.0)
    na = Line("W3 latency (LISTEN) p50", "postgresql", "ms", 2.0, "pgqueuer", 2.0, 1.0, "<= 20 ms", True,
              compared=True, baseline_note="n/a (ImportError: listen)")
    alone = Line("W3 latency (commit hook) p50", "sqlite", "ms", 1.2, target="<= 20 ms", passed=True,
                 compared=True, baseline=1.5)
    not_compared = Line("W5 verify (100,002 facts)", "sqlite", "facts/s", 120_000.0, target=">= 100,000 facts/s",
                        passed=True)
    return [compared, na, alone, not_compared]


def test_the_table_has_a_baseline_and_a_vs_baseline_column() -> None:
    table = render_table(fake_lines())
    header, _rule, *rows = table.splitlines()
    cells = [[c.strip() for c in row.strip("|").split("|")] for row in (header, *rows)]
    assert cells[0] == ["workload", "backend", "statebook", "peer/floor", "ratio", "baseline", "vs baseline",
                        "target", "result", "client CPU/op"]
    assert cells[1][4:7] == ["0.55x", "2,000 enq/s (0.50x)", "1.10x"]
    assert cells[1][9] == "150 / 60 us, baseline 160 us"
    assert cells[2][5:7] == ["n/a", "n/a"]
    assert cells[3][5:7] == ["1.5 ms", "0.80x"]
    assert cells[4][5:7] == ["-", "-"]


def test_without_baseline_the_table_and_lines_are_as_before() -> None:
    plain = [Line("W1 enqueue single (2,000)", "postgresql", "enq/s", 2_200.0, "pgqueuer", 4_000.0, 0.55,
                  ">= 1x", False)]
    header = render_table(plain).splitlines()[0]
    assert " ".join(header.split()) == OLD_HEADER
    assert "baseline" not in plain[0].to_json() and "compared" not in plain[0].to_json()


def test_results_record_both_columns() -> None:
    got = fake_lines()[0].to_json()
    assert got["statebook"] == 2_200.0 and got["baseline"] == 2_000.0
    assert got["baseline_ratio"] == 0.5 and got["vs_baseline"] == pytest.approx(1.1)


# -- the child process -------------------------------------------------------------------------

def test_the_child_serves_requests_on_sqlite(tmp_path: Path) -> None:
    """The working tree's own child, on SQLite (no PostgreSQL needed): a figure, an error, a clean exit."""

    async def go() -> None:
        child = baseline.Child("working", sys.executable, None, tmp_path / "child")
        await child.start()
        try:
            assert child.ready, child.error
            assert child.statebook is not None and child.statebook.endswith("__init__.py")
            seconds, cpu = await child.call("enqueue_single", "sqlite", n=5)
            assert seconds > 0 and cpu >= 0
            with pytest.raises(baseline.ChildError, match="without a PostgreSQL URL"):
                await child.call("drain", "postgresql", n=1)
            with pytest.raises(baseline.ChildError, match="unknown op"):
                await child.call("nope", "sqlite")
        finally:
            await child.close()
        assert child.proc is not None and child.proc.returncode == 0

    asyncio.run(go())


def test_a_child_whose_install_lacks_the_drivers_imports_says_so(tmp_path: Path) -> None:
    """An interpreter that cannot import statebook (``-S``: no site-packages) answers not ready, and exits."""
    out = subprocess.run([sys.executable, "-S", str(BENCH / "child.py"),
                          '{"label": "baseline", "pg": null, "sqlite_dir": "%s"}' % tmp_path],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.startswith(baseline.MARK) and '"ready": false' in out.stdout


def test_both_processes_use_the_same_reply_mark() -> None:
    assert child.MARK == baseline.MARK
