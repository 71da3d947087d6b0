"""Where the suite's time goes: a per-folder table and the slowest tests, from pytest's JUnit XML.

    python -m pytest --junitxml=/tmp/run.xml ...
    python tests/suite_times.py /tmp/run.xml [--slowest 30] [--markdown]

A test's seconds are its setup, call and teardown together (JUnit's ``time``); a folder's are the
sum over its tests, so under xdist they add up to more than the wall clock. specs/testing.md keeps
the tables this prints for the revisions it compares.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import PurePosixPath


def cases(path: str) -> list[tuple[str, float, str]]:
    """``(node id, seconds, outcome)`` of every test case in a JUnit XML file."""
    out = []
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        # classname is "tests.outbox.test_x" or "tests.conformance.outbox.test_outbox.TestOutboxSQLite"
        parts = module.split("/")
        while parts and not parts[-1].startswith("test"):
            parts.pop()
        outcome = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                outcome = tag
        out.append(("/".join(parts) + ".py::" + case.get("name", ""), float(case.get("time", 0)), outcome))
    return out


def folder(nodeid: str) -> str:
    path = PurePosixPath(nodeid.split("::")[0])
    # tests/test_x.py -> tests/ (top level); tests/outbox/test_y.py -> tests/outbox
    parent = path.parent
    while parent.name.startswith("test_"):  # a TestClass folded into the module path
        parent = parent.parent
    return str(parent)


def table(rows: list[tuple[str, float, str]], slowest: int, markdown: bool) -> str:
    per: dict[str, list[float]] = defaultdict(list)
    for nodeid, seconds, _ in rows:
        per[folder(nodeid)].append(seconds)
    lines = []
    header = ("folder", "tests", "seconds", "s/test")
    if markdown:
        lines += ["| " + " | ".join(header) + " |", "| --- | ---: | ---: | ---: |"]
    else:
        lines.append(f"{header[0]:<24}{header[1]:>7}{header[2]:>10}{header[3]:>9}")
    total_n, total_s = 0, 0.0
    for name, times in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        n, s = len(times), sum(times)
        total_n, total_s = total_n + n, total_s + s
        if markdown:
            lines.append(f"| `{name}` | {n} | {s:.0f} | {s / n:.2f} |")
        else:
            lines.append(f"{name:<24}{n:>7}{s:>10.1f}{s / n:>9.2f}")
    if markdown:
        lines.append(f"| **all** | {total_n} | {total_s:.0f} | {total_s / max(total_n, 1):.2f} |")
    else:
        lines.append(f"{'all':<24}{total_n:>7}{total_s:>10.1f}{total_s / max(total_n, 1):>9.2f}")
    lines.append("")
    top = sorted(rows, key=lambda r: -r[1])[:slowest]
    if markdown:
        lines += ["| seconds | test |", "| ---: | --- |"]
        lines += [f"| {s:.1f} | `{nodeid}` |" for nodeid, s, _ in top]
    else:
        lines += [f"{s:8.1f}  {nodeid}" for nodeid, s, _ in top]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("xml", nargs="+", help="JUnit XML files of one run (a serial phase and a parallel one)")
    parser.add_argument("--slowest", type=int, default=30)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    rows = [row for path in args.xml for row in cases(path)]
    print(table(rows, args.slowest, args.markdown))


if __name__ == "__main__":
    main()
