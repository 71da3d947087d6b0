"""A worker process killed between the transport and finalize: another worker finishes the row.

The worker (tests/conformance/outbox/kill_worker.py) runs the pipeline step by step and SIGKILLs itself at a
named fault point; every run takes an explicit ``now`` so the lease expiry is decided by the test,
not by real time. Runs on SQLite (a file) and PostgreSQL through the ``book``/``db_url`` fixtures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from statebook.lifecycle import history, verify
from statebook.lifecycle.replay import read_row
from statebook.outbox import enqueue_dispatch
from statebook.outbox.dispatch.attempts import CLAIM_LEASE_SECONDS

WORKER = Path(__file__).with_name("kill_worker.py")


def run_worker(db_url: str, now: float, log: Path, fault: str = "") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "STATEBOOK_FAULT"}
    if fault:
        env["STATEBOOK_FAULT"] = fault
    return subprocess.run(
        [sys.executable, str(WORKER), db_url, repr(now), str(log)],
        env=env, capture_output=True, text=True, timeout=120,
    )


def transport_log(log: Path) -> list[tuple[str, int | str]]:
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(d, int(a) if a.isdigit() else a) for d, a in lines]


def claims(facts) -> list[int]:
    return [f.patch["attempt"] for f in facts if f.status == "delivering"]


class KillCases:
    """This module's cases: mixed into OutboxConformance, so each backend runs them (tests/conformance)."""

    async def test_killed_after_transport_is_reclaimed_after_the_lease(self, book, clock, db_url, tmp_path):
        """O5 (O-lease-recovery, O-at-least-once): a claimant SIGKILLed after its transport ran and before
        finalize leaves the row delivering with attempt 1 until its lease ends; nobody reclaims it
        earlier; after the lease a healthy worker claims attempt 2 and delivers. The facts show both
        claims, the transport ran twice (at-least-once), and the history verifies."""
        log = tmp_path / "transport.log"
        t0 = clock.now()
        did = await enqueue_dispatch(book, kind="kill_test", deliver_to="seat-1", body={"n": 1})

        killed = run_worker(db_url, t0, log, fault="after_transport")
        assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stdout, killed.stderr)
        assert transport_log(log) == [(did, 1)], "the transport must have run before the kill"
        row = await read_row(book, "dispatch", did)
        assert row["status"] == "delivering" and row["attempt"] == 1
        assert row["next_attempt_at"] == pytest.approx(t0 + CLAIM_LEASE_SECONDS)

        # Inside the lease a healthy worker leaves the row alone.
        early = run_worker(db_url, t0 + CLAIM_LEASE_SECONDS - 1, log)
        assert early.returncode == 0, early.stderr
        assert json.loads(early.stdout.splitlines()[-1])["claimed"] == []
        row = await read_row(book, "dispatch", did)
        assert row["status"] == "delivering" and row["attempt"] == 1

        late = run_worker(db_url, t0 + CLAIM_LEASE_SECONDS + 1, log)
        assert late.returncode == 0, late.stderr
        report = json.loads(late.stdout.splitlines()[-1])
        assert report["claimed"] == [[did, 2]]
        assert report["outcomes"] == [[did, "delivered"]]

        row = await read_row(book, "dispatch", did)
        assert row["status"] == "delivered" and row["attempt"] == 2
        facts = await history(book, "dispatch", did)
        assert claims(facts) == [1, 2]
        assert [f.status for f in facts] == ["pending", "delivering", "delivering", "delivered"]
        assert transport_log(log) == [(did, 1), (did, 2)]
        assert (await verify(book, "dispatch")).ok

    @pytest.mark.parametrize("fault", ["after_scan", "after_claim", "after_finalize"])
    async def test_kill_at_every_other_point_leaves_a_recoverable_row(self, book, clock, db_url, tmp_path, fault):
        """O7 (O-atomic), O5 (O-lease-recovery): a SIGKILL at any other fault point leaves a consistent row
        (row == fold of facts) that a later worker brings to delivered without a second success."""
        log = tmp_path / "transport.log"
        t0 = clock.now()
        did = await enqueue_dispatch(book, kind="kill_test", deliver_to="seat-1")

        killed = run_worker(db_url, t0, log, fault=fault)
        assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
        assert (await verify(book, "dispatch")).ok
        row = await read_row(book, "dispatch", did)
        expected_after_kill = {
            "after_scan": ("pending", 0), "after_claim": ("delivering", 1), "after_finalize": ("delivered", 1),
        }[fault]
        assert (row["status"], row["attempt"]) == expected_after_kill

        healthy = run_worker(db_url, t0 + CLAIM_LEASE_SECONDS + 1, log)
        assert healthy.returncode == 0, healthy.stderr
        row = await read_row(book, "dispatch", did)
        assert row["status"] == "delivered"
        facts = await history(book, "dispatch", did)
        expected_claims = {"after_scan": [1], "after_claim": [1, 2], "after_finalize": [1]}[fault]
        assert claims(facts) == expected_claims
        # The transport runs once per won claim that got that far: never for a killed-after-claim attempt.
        expected_runs = {"after_scan": [(did, 1)], "after_claim": [(did, 2)], "after_finalize": [(did, 1)]}[fault]
        assert transport_log(log) == expected_runs
        assert (await verify(book, "dispatch")).ok

    async def test_killed_inside_a_batch_pass_every_row_still_finishes(self, book, clock, db_url, tmp_path):
        """O5 (O-lease-recovery), O7: a pass claims five rows in one transaction and the process dies
        inside its third send. Every row is delivered after the lease by a healthy worker; a row whose
        outcome was recorded before the kill is not claimed again, every other row is reclaimed exactly
        once (attempt 2); each row was sent at least once per claim that reached its transport, and the
        history verifies."""
        log = tmp_path / "transport.log"
        t0 = clock.now()
        ids = [await enqueue_dispatch(book, kind="kill_test", deliver_to=f"seat-{n}") for n in range(5)]

        killed = run_worker(db_url, t0, log, fault="in_pass")
        assert killed.returncode == -signal.SIGKILL, (killed.returncode, killed.stderr)
        assert len(transport_log(log)) == 3
        after_kill = {did: (await read_row(book, "dispatch", did)) for did in ids}
        assert all(r["attempt"] == 1 and r["status"] in ("delivering", "delivered") for r in after_kill.values())
        finished = {did for did, r in after_kill.items() if r["status"] == "delivered"}
        assert len(finished) <= 2, "at most the two sends before the kill can have been recorded"
        assert (await verify(book, "dispatch")).ok

        healthy = run_worker(db_url, t0 + CLAIM_LEASE_SECONDS + 1, log)
        assert healthy.returncode == 0, healthy.stderr
        for did in ids:
            row = await read_row(book, "dispatch", did)
            assert row["status"] == "delivered"
            assert claims(await history(book, "dispatch", did)) == ([1] if did in finished else [1, 2])
        sent = Counter(d for d, _ in transport_log(log))
        assert set(sent) == set(ids) and all(1 <= n <= 2 for n in sent.values())
        assert all(sent[did] == 1 for did in finished)
        assert (await verify(book, "dispatch")).ok
