"""A bundle's facts as the fact log's Merkle tree, whether the database verified at export, and the anchors
outside the bundle it is checked against (specs/audit.md A3): a signed checkpoint note of the log's tree head,
the chain key's id.

The leaves are ``tlog.fact_leaf(seq, hash)`` of the facts in ``seq`` order, as in the log itself, so the tree of
a bundle of the whole log (no ``--type``, no ``--as-of``) is the log's tree at the bundle's size, and its first
N facts give the root of any checkpoint of size N taken before the export. A partial bundle's tree is over its
own facts only: it says nothing about the log's.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statebook.lifecycle.tlog import CheckpointFormatError, Frontier, fact_leaf, leaf_hash, parse_checkpoint

from .errors import ConfigError
from .note import ED25519, NoteError, Verifier, open_note, open_witnessed

__all__ = ["Anchors", "Leaves", "anchor_findings", "bundle_tree", "export_findings", "open_checkpoint", "read_verifiers",
           "tree_findings"]


def _b64(root: bytes) -> str:
    return base64.b64encode(root).decode("ascii")


def _object(document: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = document.get(key)
    return value if isinstance(value, dict) else {}


def _leaves(pairs: Iterable[tuple[int, str]]) -> list[bytes]:
    return [leaf_hash(fact_leaf(seq, h)) for seq, h in sorted(pairs, key=lambda p: p[0])]


def bundle_tree(pairs: Iterable[tuple[int, str]], *, whole_log: bool) -> dict[str, Any]:
    """The manifest's ``tree`` of the facts given as (seq, hash): their size and root (base64, as a checkpoint
    note writes it), and whether they are the whole log up to their highest seq."""
    frontier = Frontier()
    frontier.append(_leaves(pairs))
    return {"size": frontier.size, "root": _b64(frontier.root()), "whole_log": whole_log}


class Leaves:
    """The (seq, hash) of a bundle's facts as they are read, each seq once."""

    def __init__(self) -> None:
        self._lines: dict[int, tuple[int, str]] = {}  # seq -> (line, hash)

    def add(self, line: int, seq: Any, fact_hash: Any) -> str | None:
        """Take one fact's place in the tree; why it has none (a finding), or None."""
        if type(seq) is not int or seq < 0 or type(fact_hash) is not str:
            return "its seq is no non-negative integer or its hash no text: it has no place in the log's tree"
        if seq in self._lines:
            return f"seq {seq} again (line {self._lines[seq][0]} holds it)"
        self._lines[seq] = (line, fact_hash)
        return None

    def pairs(self) -> list[tuple[int, str]]:
        """Every (seq, hash) taken."""
        return [(seq, h) for seq, (_, h) in self._lines.items()]


def export_findings(manifest: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """(findings, notes) of what the manifest says of the database's verify at export: ``verified: false``
    (exported with --force) is a finding; verify's notes are passed on."""
    checked = _object(manifest, "verify")
    findings = []
    if manifest.get("verified") is not True:
        findings.append(f"the bundle was exported with --force from a database with {checked.get('findings')} "
                        "finding(s)" if manifest.get("verified") is False else
                        "the manifest does not say whether the database verified at export")
    notes = checked.get("notes")
    return findings, [f"verify at export noted: {n}" for n in (notes if isinstance(notes, list) else ())]


def read_verifiers(keys: Iterable[str], option: str = "--key", kind: int = ED25519) -> list[Verifier]:
    """Note keys from ``option``'s values: each a vkey text, or a file holding one vkey a line; the log's keys
    (``kind`` ED25519) or witnesses' (COSIGNATURE_V1). A private key text is refused without being quoted."""
    found: list[Verifier] = []
    for given in keys:
        texts = [given]
        if "+" not in given or Path(given).is_file():
            try:
                texts = [line.strip() for line in Path(given).read_text(encoding="utf-8").splitlines() if line.strip()]
            except (OSError, UnicodeDecodeError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
                raise ConfigError(f"{option} {given[:80]!r} is neither a verifier key (vkey) text nor a readable "
                                  f"file ({reason})") from None
        for text in texts:
            if text.startswith("PRIVATE+KEY+"):  # never quoted: it is a signing secret
                raise ConfigError(f"{option} was given a signer key (PRIVATE+KEY+...): give its public verifier key")
            try:
                verifier = Verifier.from_vkey(text)
            except NoteError as exc:
                raise ConfigError(f"{option}: {exc}") from None
            if verifier.kind != kind:
                what, wanted = (("a witness key (type 0x04)", "the log's note key (type 0x01)") if kind == ED25519
                                else ("a log's note key (type 0x01)", "a witness key (type 0x04)"))
                raise ConfigError(f"{option} {verifier.name} is {what}; give {wanted}")
            found.append(verifier)
    return found


def open_checkpoint(note: bytes, keys: Sequence[Verifier], witnesses: Sequence[Verifier] = (),
                    k: int = 0) -> tuple[str, list[str]]:
    """The note's text and who signed it: one of the log's ``keys`` and, when ``k`` > 0, ``k`` of ``witnesses``
    (their cosignatures checked, C2SP tlog-cosignature). :class:`NoteError` when the policy is not met."""
    if k <= 0:
        return open_note(note, keys)
    seen = open_witnessed(note, keys, witnesses, k)
    return seen.text, [seen.log, *(c.name for c in seen.cosignatures)]


@dataclass(frozen=True)
class Anchors:
    """What ``audit verify`` checks a bundle against besides itself: a checkpoint note (its bytes) signed by
    one of ``keys``, and the chain key id the log is keyed with. Empty: nothing beyond the bundle."""

    checkpoint: bytes | None = None
    keys: Sequence[Verifier] = field(default_factory=tuple)
    chain_key_id: str | None = None
    witnesses: Sequence[Verifier] = field(default_factory=tuple)
    k: int = 0
    """how many of ``witnesses`` must have cosigned the checkpoint (0: none asked)"""


def tree_findings(manifest: Mapping[str, Any], pairs: Sequence[tuple[int, str]]) -> list[str]:
    """Whether the facts (seq, hash) give the manifest's tree, and its ``whole_log`` matches the bundle's scope."""
    recorded = manifest.get("tree")
    if not isinstance(recorded, dict):
        return ["the manifest records no tree of the facts"]
    scope = _object(manifest, "scope")
    whole = scope.get("entity_type") is None and scope.get("as_of") is None
    found = bundle_tree(pairs, whole_log=whole)
    findings = []
    if recorded.get("whole_log") is not whole:
        findings.append(f"the manifest's tree says whole_log {recorded.get('whole_log')!r}, the bundle's scope "
                        f"{scope} makes it {whole}")
    if (recorded.get("size"), recorded.get("root")) != (found["size"], found["root"]):
        findings.append(f"the facts in seq order give a tree of {found['size']} with root {found['root']}, the "
                        f"manifest says {recorded.get('size')} with root {recorded.get('root')}")
    return findings


def _checkpoint_findings(manifest: Mapping[str, Any], pairs: Sequence[tuple[int, str]], anchors: Anchors,
                         notes: list[str]) -> list[str]:
    assert anchors.checkpoint is not None
    try:
        text, signers = open_checkpoint(anchors.checkpoint, anchors.keys, anchors.witnesses, anchors.k)
        head = parse_checkpoint(text)
    except (NoteError, CheckpointFormatError) as exc:
        return [f"the checkpoint note: {exc}"]
    scope = _object(manifest, "scope")
    if scope.get("entity_type") is not None or scope.get("as_of") is not None:
        return [f"the bundle holds part of the log only (scope {scope}): its tree covers its own facts and cannot "
                "be compared with the log's checkpoint; export the whole log (no --type, no --as-of)"]
    leaves = _leaves(pairs)
    if len(leaves) < head.size:
        return [f"the checkpoint's tree holds {head.size} facts, the bundle only {len(leaves)}: facts the log had "
                "when the checkpoint was taken are missing (cut or erased), or the bundle is older than it"]
    frontier = Frontier()
    frontier.append(leaves[:head.size])
    if frontier.root() != head.root_hash:
        return [f"the bundle's first {head.size} facts in seq order give root {_b64(frontier.root())}, the checkpoint "
                f"of {head.origin} at size {head.size} says {_b64(head.root_hash)}: history it covers was rewritten, "
                "reordered, inserted or erased"]
    later = len(leaves) - head.size
    notes.append(f"the bundle's first {head.size} facts give the root of {head.origin}'s checkpoint (signed by "
                 f"{', '.join(signers)})" + (f"; the {later} after it are not anchored by it" if later else ""))
    return []


def anchor_findings(manifest: Mapping[str, Any], pairs: Sequence[tuple[int, str]],
                    anchors: Anchors) -> tuple[list[str], list[str]]:
    """(findings, notes) of the bundle's facts (seq, hash) against the anchors: the checkpoint note opens with
    one of the keys, its tree head's root is the facts' at its size; the chain key id is the manifest's."""
    findings: list[str] = []
    notes: list[str] = []
    if anchors.checkpoint is not None:
        findings += _checkpoint_findings(manifest, pairs, anchors, notes)
    if anchors.chain_key_id is not None:
        key_id = _object(manifest, "chain").get("key_id")
        if key_id != anchors.chain_key_id:
            findings.append(f"the log is keyed with chain key id {anchors.chain_key_id}, the bundle's facts "
                            + ("are not keyed" if key_id is None else f"with {key_id}"))
    return findings, notes
