"""Child process of the memory figure: drain N pending dispatches, report peak RSS growth.

    python tests/bench/memory.py URL N     (the database already holds N pending dispatches)

The first two delivery passes warm up imports, pools and statement caches; then the baseline RSS is
read, the peak counter is reset (``/proc/self/clear_refs`` 5) and the rest is drained. Growth =
VmHWM after the drain - VmRSS at the baseline. Prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import statebook_side as sb  # noqa: E402
from statebook.adapters.db import open_book  # noqa: E402

WARM_UP = 200


def status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise LookupError(f"{field} not in /proc/self/status")


async def main(url: str, n: int) -> dict[str, float | int | bool]:
    book = await open_book(url)
    try:
        sink = sb.Sink()
        await sb.drain_due(book, sink, min(WARM_UP, n))
        baseline = status_mb("VmRSS")
        try:
            Path("/proc/self/clear_refs").write_text("5")
            reset = True
        except OSError:
            reset = False
        await sb.drain_due(book, sink, n)
        peak = status_mb("VmHWM")
    finally:
        await book.engine.dispose()
    return {"baseline_mb": round(baseline, 1), "peak_mb": round(peak, 1), "growth_mb": round(peak - baseline, 1),
            "delivered": sink.count, "peak_reset": reset}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], int(sys.argv[2])))))
