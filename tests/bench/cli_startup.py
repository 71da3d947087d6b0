"""How long the ``statebook`` command takes to start: the median of N runs of ``statebook --help``,
``statebook --version``, ``statebook lifecycle ls --json``, ``statebook dispatch ls`` (on a small SQLite database
made first) and ``statebook verify --help`` (and, for comparison, of a bare ``python -c pass``): wall-clock and CPU
milliseconds. The last three are meant to start within 300 ms on an idle machine (issue 30).

    .venv/bin/python tests/bench/cli_startup.py            # 20 runs each
    .venv/bin/python tests/bench/cli_startup.py --runs 50 --statebook /path/to/.venv/bin/statebook

The figure is printed, never asserted (specs/cli.md C10: what the root imports is the test).
``hyperfine --warmup 3 '.venv/bin/statebook --help'`` measures the same thing where hyperfine is installed.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def median_ms(argv: list[str], runs: int) -> tuple[float, float]:
    """The median wall-clock time and the median CPU time (user + system, steadier on a busy machine) of
    ``runs`` runs of ``argv`` (after one warm-up run), in milliseconds."""
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall, cpu = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        wall.append((time.perf_counter() - start) * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return statistics.median(wall), statistics.median(cpu)


def main() -> None:
    """Print one line per measured command."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    default = Path(sys.executable).with_name("statebook")
    parser.add_argument("--statebook", default=str(default), help=f"the script to time (default {default})")
    args = parser.parse_args()
    if not os.access(args.statebook, os.X_OK):
        raise SystemExit(f"error: {args.statebook} is not an executable statebook script; give --statebook PATH")
    with tempfile.TemporaryDirectory(prefix="statebook-startup-") as folder:
        db = f"sqlite:///{Path(folder) / 'small.db'}"
        subprocess.run([args.statebook, "--db", db, "db", "upgrade"], stdout=subprocess.DEVNULL, check=True)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "statebook --help": [args.statebook, "--help"],
            "statebook --version": [args.statebook, "--version"],
            "lifecycle ls --json": [args.statebook, "lifecycle", "ls", "--json"],
            "dispatch ls": [args.statebook, "--db", db, "dispatch", "ls"],
            "verify --help": [args.statebook, "verify", "--help"],
        }
        for label, argv in cases.items():
            wall, cpu = median_ms(argv, args.runs)
            print(f"{label:22} median {wall:7.1f} ms wall, {cpu:7.1f} ms CPU over {args.runs} runs")


if __name__ == "__main__":
    main()
