"""``tests/bench/growth.py``: the table and the plot from made-up numbers (no database, no figure asserted).

The table needs nothing beyond the test extra; the plot needs matplotlib (the bench extra) and is
skipped without it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent / "bench"
_PATH = list(sys.path)
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import growth  # noqa: E402

sys.path[:] = _PATH  # the bench's flat module names stay out of the rest of the session's imports

SIZES = [10_000, 100_000, 1_000_000]


def made_up() -> growth.Results:
    def history(scale: float) -> dict[str, list[dict[str, float]]]:
        return {b: [{"x": n, "rate": 5_000 / (1 + i * scale), "samples": [1.0]} for i, n in enumerate(SIZES)]
                for b in growth.BACKENDS}

    verify = {b: [{"x": 3 * n, "rows": n, "rate": 100_000.0, "seconds": 3 * n / 100_000, "samples": [1.0]}
                  for n in SIZES] for b in growth.BACKENDS}
    sched = {b: [{"x": n, "due": max(1, n // 10), "none_ms": 2.0, "due_ms": n / 40, "samples": {}}
                 for n in growth.SCHEDULES] for b in growth.BACKENDS}
    return {"drain": history(0.1), "verify": verify, "scheduler": sched}


def test_the_table_has_a_row_per_size() -> None:
    table = growth.render_table(made_up()).splitlines()
    rows = table[2:]
    assert table[0].startswith("| measurement") and set(table[1]) <= {"|", "-"}
    assert len(rows) == 2 * len(SIZES) + 2 * len(growth.SCHEDULES)
    for n in SIZES:
        assert sum(f"| {n:,} rows " in r for r in rows) == 1
        assert sum(f"| {3 * n:,} facts " in r for r in rows) == 1
    assert "5,000 (1.00x)" in rows[0] and "(0.83x)" in rows[2]  # each figure against the smallest size


def test_the_plot_is_written(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib", reason="matplotlib comes with the bench extra (pip install -e '.[bench]')")
    png = tmp_path / "specs" / "growth.png"
    growth.plot(made_up(), png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sizes_options() -> None:
    assert growth.parse_args([]).sizes == list(growth.SIZES)
    assert growth.parse_args(["--quick"]).sizes == list(growth.QUICK)
    assert growth.parse_args(["--sizes", "1000,20_000"]).sizes == [1000, 20_000]
    with pytest.raises(SystemExit):
        growth.parse_args(["--sizes", "10k"])
