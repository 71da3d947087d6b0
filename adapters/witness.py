"""A witness (issue 31): someone outside the log's operator who cosigns a checkpoint only after checking that it
extends the last one they cosigned — so a log cannot show two histories, one to each auditor, without a witness
noticing. It follows the C2SP ``tlog-witness`` add-checkpoint exchange:

- the request is ``old <size>`` (the size the log believes the witness last cosigned), one line per consistency
  proof hash in base64, an empty line, then the signed checkpoint note;
- the witness opens the note with the log's key, refuses an ``old`` that is not its own last size
  (:class:`WitnessConflict`, which names the size it has, so the log can send the right proof), verifies the
  proof from its last (size, root) to the new one, then keeps the new one and answers its cosignature line.

The witness's state (its last cosigned checkpoint per log) is a directory of its own, on its own host.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

from statebook.lifecycle import tlog

from .note import COSIGNATURE_V1, NoteError, Signer, Verifier, open_note
from .proofs import hash_lines

__all__ = ["WitnessConflict", "WitnessRefused", "add_checkpoint", "witness_request"]


class WitnessRefused(Exception):
    """The witness does not cosign: the request is malformed, the note is not the log's, or the proof fails."""


class WitnessConflict(WitnessRefused):
    """The request's ``old`` size is not the size this witness last cosigned (``known``)."""

    def __init__(self, known: int) -> None:
        super().__init__(f"this witness last cosigned size {known}; send a consistency proof from there")
        self.known = known


def witness_request(old_size: int, proof: Sequence[bytes], note: bytes) -> bytes:
    """The add-checkpoint request body for ``note``, with the proof from ``old_size``."""
    lines = [f"old {old_size}".encode(), *(base64.b64encode(h) for h in proof)]
    return b"\n".join(lines) + b"\n\n" + note


def _parse(request: bytes) -> tuple[int, list[bytes], bytes]:
    head, sep, note = request.partition(b"\n\n")
    lines = head.split(b"\n")
    if not sep or not lines[0].startswith(b"old "):
        raise WitnessRefused("a request starts with 'old <size>', then proof lines, an empty line and the note")
    size = lines[0][4:]
    if not size.isdigit() or (size != b"0" and size.startswith(b"0")):
        raise WitnessRefused("the old size is a decimal integer without leading zeros")
    proof = hash_lines(lines[1:])
    if isinstance(proof, str):
        raise WitnessRefused(proof)
    return int(size), proof, note


def _state_file(state: Path, origin: str) -> Path:
    # One file per log, named by a digest of its origin (an origin may hold any character but a newline).
    return state / f"{hashlib.sha256(origin.encode()).hexdigest()[:32]}.checkpoint"


def _last(state: Path, origin: str) -> tlog.TreeHead | None:
    path = _state_file(state, origin)
    return tlog.parse_checkpoint(path.read_bytes()) if path.exists() else None


def _keep(state: Path, head: tlog.TreeHead) -> None:
    state.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=state, prefix=".incoming-")
    with os.fdopen(fd, "wb") as out:
        out.write(head.body())
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, _state_file(state, head.origin))


def add_checkpoint(request: bytes, logs: Iterable[Verifier], witness: Signer, state: Path, *, now: int) -> str:
    """Check ``request`` against this witness's state and cosign it: its cosignature line (stating ``now``, Unix
    seconds from the caller's clock). :class:`WitnessRefused` (or :class:`WitnessConflict`) otherwise; the state
    moves only when the cosignature is given."""
    old_size, proof, note = _parse(request)
    try:
        text, _ = open_note(note, list(logs))
        head = tlog.parse_checkpoint(text)
    except (NoteError, tlog.CheckpointFormatError) as exc:
        raise WitnessRefused(f"the checkpoint does not open with the log's key: {exc}") from None
    last = _last(state, head.origin)
    known = 0 if last is None else last.size
    if old_size != known:
        raise WitnessConflict(known)
    if head.size < known:
        raise WitnessRefused(f"the checkpoint's size {head.size} is below the {known} already cosigned")
    if last is None:
        consistent = not proof  # a first checkpoint: nothing to be consistent with, and no proof is expected
    else:
        consistent = tlog.verify_consistency(last.size, head.size, last.root_hash, head.root_hash, proof)
    if not consistent:
        raise WitnessRefused(f"the consistency proof from size {known} to {head.size} does not verify: the log "
                             "does not extend what this witness cosigned")
    cosigner = witness if witness.kind == COSIGNATURE_V1 else witness.as_kind(COSIGNATURE_V1)
    line = cosigner.signature_line(text.encode(), now)
    _keep(state, head)
    return line
