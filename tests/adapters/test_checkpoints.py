"""Checkpoints that take themselves (issue 31, specs/audit.md A6): each one is checked to extend the last one
published before it is signed and written; one that does not is an alarm and nothing is written.

The tree comes from a list of leaves here (the database's log is tested in the conformance cases); the attacker
of these tests can change the log (cut, rewrite, reorder, insert) and the checkpoint directory, and has no
signing key."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from statebook.adapters.checkpoints import (
    CheckpointAlarm, CommandSink, DirectorySink, previous, take_checkpoint,
)
from statebook.adapters.errors import ConfigError
from statebook.adapters.note import Signer, open_note, sign_note
from statebook.lifecycle import tlog

pytest.importorskip("cryptography")

ORIGIN = "statebook.test/log"


class Leaves:
    """A log as a list of leaf data; ``proof`` replaces the consistency proofs it gives (a lying source)."""

    def __init__(self, count: int) -> None:
        self.data = [tlog.fact_leaf(seq, f"{seq:064x}") for seq in range(1, count + 1)]
        self.proof: Sequence[bytes] | None = None

    def hashes(self) -> list[bytes]:
        return [tlog.leaf_hash(d) for d in self.data]

    async def head(self) -> tuple[int, bytes]:
        return len(self.data), tlog.root(self.hashes())

    async def consistency(self, old_size: int, new_size: int) -> Sequence[bytes]:
        assert new_size == len(self.data)
        return self.proof if self.proof is not None else tlog.consistency_proof(old_size, self.hashes())

    def grow(self, count: int) -> None:
        start = len(self.data) + 1
        self.data += [tlog.fact_leaf(seq, f"{seq:064x}") for seq in range(start, start + count)]


@pytest.fixture
def signer() -> Signer:
    return Signer.generate(ORIGIN)


def take(log: Leaves, signer: Signer, folder: Path, *more):
    return asyncio.run(take_checkpoint(log, signer, DirectorySink(folder), more))


def files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_each_checkpoint_is_a_signed_note_of_the_logs_tree_head_in_a_file_of_its_own(tmp_path, signer):
    log = Leaves(5)
    first = take(log, signer, tmp_path)
    assert first.note is not None and files(tmp_path) == ["00000000000000000005.checkpoint"]
    text, names = open_note((tmp_path / files(tmp_path)[0]).read_bytes(), [signer.verifier()])
    head = tlog.parse_checkpoint(text)
    assert names == [ORIGIN] and (head.origin, head.size, head.root_hash) == (ORIGIN, 5, tlog.root(log.hashes()))
    log.grow(3)
    second = take(log, signer, tmp_path)
    assert second.head.size == 8 and len(files(tmp_path)) == 2
    assert previous(DirectorySink(tmp_path), signer.verifier(), ORIGIN) == second.head
    # Nothing new: nothing written.
    assert take(log, signer, tmp_path).note is None and len(files(tmp_path)) == 2


@pytest.mark.parametrize("change", ["cut", "erase", "rewrite", "swap", "insert"])
def test_a_log_that_does_not_extend_the_last_checkpoint_is_an_alarm_and_nothing_is_written(tmp_path, signer, change):
    """Attacker: write access to the log (no signing key). Every change to what the last checkpoint covered —
    fewer leaves, a leaf changed, two swapped, one inserted before its size — is an alarm, also once the log has
    grown past it; nothing is published."""
    log = Leaves(6)
    take(log, signer, tmp_path)
    log.grow(4)
    if change == "cut":
        del log.data[3:]
    elif change == "erase":
        del log.data[2]
    elif change == "rewrite":
        log.data[1] = tlog.fact_leaf(2, "f" * 64)
    elif change == "swap":
        log.data[0], log.data[4] = log.data[4], log.data[0]
    else:
        log.data.insert(3, tlog.fact_leaf(99, "e" * 64))
    with pytest.raises(CheckpointAlarm):
        take(log, signer, tmp_path)
    assert files(tmp_path) == ["00000000000000000006.checkpoint"]


def test_a_change_after_the_last_checkpoint_is_the_next_ones_to_anchor(tmp_path, signer):
    """What the spec's table says: facts written after the last checkpoint are anchored by the next one; a change
    to them before it is taken is not an alarm (the next checkpoint states the changed log)."""
    log = Leaves(4)
    take(log, signer, tmp_path)
    log.grow(3)
    log.data[5] = tlog.fact_leaf(6, "d" * 64)
    assert take(log, signer, tmp_path).head.size == 7


def test_a_lying_proof_is_an_alarm(tmp_path, signer):
    log = Leaves(4)
    take(log, signer, tmp_path)
    log.grow(2)
    log.proof = [b"\x00" * 32]
    with pytest.raises(CheckpointAlarm, match="no longer give"):
        take(log, signer, tmp_path)


def test_a_last_checkpoint_not_signed_by_the_logs_key_is_never_built_upon(tmp_path, signer):
    """Attacker: write access to the directory, no signing key: a note signed by another key (of the same name),
    garbage, or a checkpoint of another log in the directory is an alarm."""
    log = Leaves(3)
    take(log, signer, tmp_path)
    forger = Signer.generate(ORIGIN)
    forged = sign_note(tlog.checkpoint_body(ORIGIN, 9, b"\x01" * 32), forger)
    (tmp_path / "00000000000000000009.checkpoint").write_bytes(forged)
    with pytest.raises(CheckpointAlarm, match="does not verify"):
        take(log, signer, tmp_path)
    (tmp_path / "00000000000000000009.checkpoint").write_bytes(b"not a note")
    with pytest.raises(CheckpointAlarm, match="does not verify"):
        take(log, signer, tmp_path)
    (tmp_path / "00000000000000000009.checkpoint").write_bytes(
        sign_note(tlog.checkpoint_body("other/log", 9, b"\x01" * 32), signer))
    with pytest.raises(CheckpointAlarm, match="other/log"):
        take(log, signer, tmp_path)


def test_a_published_file_is_never_replaced(tmp_path, signer):
    log = Leaves(3)
    take(log, signer, tmp_path)
    (tmp_path / "00000000000000000003.checkpoint").unlink()
    (tmp_path / "00000000000000000003.checkpoint").write_bytes(b"something else")
    with pytest.raises(CheckpointAlarm):
        asyncio.run(DirectorySink(tmp_path).write(3, sign_note(tlog.checkpoint_body(ORIGIN, 3, b"\x02" * 32), signer)))
    assert (tmp_path / "00000000000000000003.checkpoint").read_bytes() == b"something else"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".incoming")] == []


def test_a_command_sink_gets_the_note_on_standard_input(tmp_path, signer):
    out = tmp_path / "pushed"
    copy = CommandSink((sys.executable, "-c", f"import sys; open({str(out)!r}, 'wb').write(sys.stdin.buffer.read())"))
    published = take(Leaves(2), signer, tmp_path / "dir", copy)
    assert out.read_bytes() == published.note
    failing = CommandSink((sys.executable, "-c", "import sys; print('bucket gone', file=sys.stderr); sys.exit(3)"))
    with pytest.raises(ConfigError, match="exited 3: bucket gone"):
        take(Leaves(4), signer, tmp_path / "dir", failing)
    slow = CommandSink((sys.executable, "-c", "import time; time.sleep(30)"), timeout=0.5)
    with pytest.raises(ConfigError, match="longer than 0.5s"):
        take(Leaves(6), signer, tmp_path / "dir2", slow)
