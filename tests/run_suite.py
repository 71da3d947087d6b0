"""``make test``: the whole suite in two phases, then where its time went.

    python tests/run_suite.py [pytest arguments...]

1. Every test not marked ``serial``, spread over pytest-xdist workers (``TEST_WORKERS``, default 3: on
   two cores a third worker fills the time the others spend waiting on PostgreSQL and subprocesses),
   each with a throwaway PostgreSQL cluster and SQLite files of its own.
2. The tests marked ``serial`` (processes racing each other, SIGKILL/SIGSTOP, bounds in seconds), one
   at a time with the machine to themselves.

Both phases get the same arguments (a path or ``-k`` narrows both). Then it prints the time per folder
and the 30 slowest tests of the two phases together (tests/suite_times.py), and a closing count. The
exit status is the first failing phase's; 5 (no test ran) only when neither phase ran a test.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from suite_times import cases, table  # noqa: E402

NO_TESTS = 5
RESULTS = HERE.parent / "build" / "test-results"
"""Each phase's JUnit XML stays here after the run: ``python tests/suite_times.py build/test-results/*.xml``."""


def phase(label: str, args: list[str], xml: Path) -> tuple[int, float, float]:
    """Run one phase: (exit status, wall seconds, CPU seconds of its process tree, user + system)."""
    print(f"==> {label}: pytest {' '.join(args)}", flush=True)
    started, before = time.monotonic(), resource.getrusage(resource.RUSAGE_CHILDREN)
    code = subprocess.call([sys.executable, "-m", "pytest", *args, f"--junitxml={xml}"])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return code, time.monotonic() - started, cpu


def workers() -> str:
    """``TEST_WORKERS``, else 3; else 1 against ``STATEBOOK_TEST_PG_URL``: workers sharing one server would hold
    back each other's snapshot horizon, which the tail and settle cases read (tests/conftest.py, ``pg_url``)."""
    chosen = os.environ.get("TEST_WORKERS")
    if chosen:
        return chosen
    if os.environ.get("STATEBOOK_TEST_PG_URL"):
        print("==> STATEBOOK_TEST_PG_URL is set: one worker (TEST_WORKERS=N spreads the tests over N workers that "
              "share that server; its tail and settle cases may then wait on each other)", flush=True)
        return "1"
    return "3"


def main(argv: list[str]) -> int:
    n = workers()
    RESULTS.mkdir(parents=True, exist_ok=True)
    parallel, serial = RESULTS / "parallel.xml", RESULTS / "serial.xml"
    for stale in (parallel, serial):
        stale.unlink(missing_ok=True)
    first, first_s, first_cpu = phase(f"parallel phase ({n} workers)",
                                      ["-q", "-n", n, "--dist", "worksteal", "-m", "not serial", *argv], parallel)
    second, second_s, second_cpu = phase("serial phase", ["-q", "-p", "no:xdist", "-m", "serial", *argv], serial)
    rows = [row for xml in (parallel, serial) if xml.exists() for row in cases(str(xml))]
    print(f"\n==> where the time went: parallel phase {first_s:.0f} s wall, {first_cpu:.0f} s CPU; serial phase "
          f"{second_s:.0f} s wall, {second_cpu:.0f} s CPU; in all {first_s + second_s:.0f} s wall, "
          f"{first_cpu + second_cpu:.0f} s CPU (user + system of the pytest process trees). Seconds below are each "
          "test's setup + call + teardown.")
    print(table(rows, slowest=30, markdown=False))
    counts = {outcome: sum(1 for *_, o in rows if o == outcome) for outcome in ("passed", "failure", "error", "skipped")}
    print(f"\nsuite: {counts['passed']} passed, {counts['failure'] + counts['error']} failed, "
          f"{counts['skipped']} skipped")
    codes = [code for code in (first, second) if code not in (0, NO_TESTS)]
    if codes:
        return codes[0]
    return NO_TESTS if first == second == NO_TESTS else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
