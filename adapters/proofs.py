"""Proofs for one fact (issue 31): the C2SP ``tlog-proof`` text — ``c2sp.org/tlog-proof@v1``, ``index N``, the
inclusion proof one base64 hash a line, an empty line, then the signed checkpoint note — and its offline check:
what an auditor needs to confirm one decision is in the log a checkpoint states, without the whole history.

The leaf is the fact's (:func:`statebook.lifecycle.tlog.fact_leaf`: its ``seq`` and stored hash). The check also
recomputes the fact's hash from its content, so an edited fact fails: with the plain hashing, or — for a keyed
chain, whose hashes are HMACs (specs/audit.md) — with the chain key, without which such a fact is refused.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from statebook.lifecycle import tlog
from statebook.lifecycle.facts import Fact, fact_hash, legacy_fact_hash

from .note import NoteError, Verifier, open_note, open_witnessed

__all__ = ["HEADER", "CheckedProof", "ProofRefused", "check_proof", "hash_lines", "proof_text"]

HEADER = b"c2sp.org/tlog-proof@v1"


class ProofRefused(Exception):
    """The proof does not show the fact in the log: the message says which part failed."""


@dataclass(frozen=True)
class CheckedProof:
    """A proof that holds: the checkpoint it is against, the fact's index and the witnesses that cosigned it."""

    head: tlog.TreeHead
    index: int
    witnesses: tuple[str, ...]


def proof_text(index: int, proof: Sequence[bytes], checkpoint_note: bytes) -> bytes:
    """The tlog-proof text of the leaf at ``index`` in the tree ``checkpoint_note`` states."""
    lines = [HEADER, b"index %d" % index, *(base64.b64encode(h) for h in proof)]
    return b"\n".join(lines) + b"\n\n" + checkpoint_note


def _parse(text: bytes) -> tuple[int, list[bytes], bytes]:
    head, sep, note = text.partition(b"\n\n")
    lines = head.split(b"\n")
    if not sep or lines[0] != HEADER:
        raise ProofRefused(f"not a tlog-proof: it starts with {HEADER.decode()}, then index, proof lines, an empty "
                           "line and the checkpoint")
    at = 2 if len(lines) > 1 and lines[1].startswith(b"extra ") else 1  # extra data: unauthenticated, unused
    if len(lines) <= at or not lines[at].startswith(b"index "):
        raise ProofRefused("the proof has no index line")
    number = lines[at][len(b"index "):]
    if not number.isdigit() or (number != b"0" and number.startswith(b"0")):
        raise ProofRefused("the index is a decimal integer without leading zeros")
    hashes = hash_lines(lines[at + 1:])
    if isinstance(hashes, str):
        raise ProofRefused(hashes)
    return int(number), hashes, note


def hash_lines(lines: Sequence[bytes]) -> list[bytes] | str:
    """Proof lines (one 32-byte hash each, canonical base64) as hashes, or what is wrong with them."""
    hashes = []
    for line in lines:
        try:
            decoded = base64.b64decode(line, validate=True)
        except (binascii.Error, ValueError):
            return "a proof line is not base64"
        if len(decoded) != tlog.HASH_SIZE or base64.b64encode(decoded) != line:
            return "a proof line is not one 32-byte hash in canonical base64"
        hashes.append(decoded)
    return hashes


def check_proof(text: bytes, fact: Mapping[str, Any], logs: Iterable[Verifier], *,
                witnesses: Iterable[Verifier] = (), k: int = 0, chain_key: bytes | None = None) -> CheckedProof:
    """Check that ``fact`` (a fact as ``history --json`` or a bundle prints it) is in the tree the proof's
    checkpoint states: the checkpoint opens with one of ``logs`` (and is cosigned by ``k`` of ``witnesses``),
    the proof leads from the fact's leaf to its root, and the fact's content gives its hash — with the plain
    hashing, or with ``chain_key`` on a keyed chain. :class:`ProofRefused` naming the part that fails."""
    index, hashes, note = _parse(text)
    try:
        if k > 0:
            seen = open_witnessed(note, list(logs), list(witnesses), k)
            body, cosigners = seen.text, tuple(c.name for c in seen.cosignatures)
        else:
            body, cosigners = open_note(note, list(logs))[0], ()
        head = tlog.parse_checkpoint(body)
    except (NoteError, tlog.CheckpointFormatError) as exc:
        raise ProofRefused(f"the checkpoint does not verify: {exc}") from None
    parsed = _fact(fact)
    if parsed.seq is None or type(parsed.seq) is not int or parsed.seq < 0:
        raise ProofRefused("the fact has no seq (give it as `statebook history --json` prints it)")
    leaf = tlog.leaf_hash(tlog.fact_leaf(parsed.seq, parsed.hash))
    if not tlog.verify_inclusion(index, head.size, leaf, hashes, head.root_hash):
        raise ProofRefused(f"the proof does not lead from this fact (seq {parsed.seq}) at index {index} to the root "
                           f"of the checkpoint's {head.size} facts")
    content = parsed.content()
    if chain_key is not None:
        bound = hmac.compare_digest(parsed.hash, fact_hash(content, parsed.prev_hash, chain_key))
    else:
        bound = parsed.hash in (fact_hash(content, parsed.prev_hash), legacy_fact_hash(content, parsed.prev_hash))
    if not bound:
        raise ProofRefused("the fact's content does not give its hash" + (
            " under the chain key" if chain_key is not None else
            " with the plain hashing: it was edited, or its chain is keyed (give the chain key)"))
    return CheckedProof(head, index, cosigners)


def _fact(fact: Mapping[str, Any]) -> Fact:
    try:
        return Fact(**{name: fact[name] for name in Fact.__dataclass_fields__ if name in fact})
    except TypeError as exc:
        raise ProofRefused(f"the fact lacks a field ({exc})") from None
