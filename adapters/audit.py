"""History an auditor can check, the files and keys (specs/audit.md): Ed25519 signing keys, checkpoint
files, audit bundles. The hashing and the Merkle root are ``statebook.lifecycle.chain``'s.

A bundle is a directory an auditor checks offline, with this package alone (no database, no settings)::

    facts.jsonl      one fact per line, as ``Fact.to_json`` (seq included), in (type, id, version) order
    checkpoint.json  the checkpoint of those facts: their heads, the Merkle root, signed when a key is given
    manifest.json    counts per type, the chain's switch-over, the facts' tree (the log's, for a whole-log
                     bundle: :mod:`.anchor`), whether the database verified, each file's SHA-256 and line
                     count; signed

Every line of every file is covered: a fact's line by its chain (and by the file's digest), the
checkpoint by its root and signature, the files by the manifest's digests, the manifest by its
signature. Without a public key only the consistency is checked (anyone may rewrite all of it consistently).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from statebook.lifecycle import Book, Fact
from statebook.lifecycle.chain import (
    Rule, chain_findings, checkpoint_body, checkpoint_problems, heads_of, read_switch, settled_seq, signed_bytes)
from statebook.lifecycle.replay import Report, fold, stream_facts, verify

from .anchor import Anchors, Leaves, anchor_findings, bundle_tree, export_findings, tree_findings
from .errors import ConfigError, DamagedHistory
from .extras import require

BUNDLE_FORMAT = "statebook-bundle/2"
"""/2 added the facts' tree and verify's result to the manifest; a /1 bundle is refused (export it again)."""
FACTS_FILE, CHECKPOINT_FILE, MANIFEST_FILE = "facts.jsonl", "checkpoint.json", "manifest.json"


# -- keys --------------------------------------------------------------------------------------


def _crypto(feature: str) -> tuple[Any, Any]:
    """cryptography's ``serialization`` and ``ed25519`` modules, or a one-line error naming the audit extra."""
    return (require("cryptography.hazmat.primitives.serialization", extra="audit", feature=feature),
            require("cryptography.hazmat.primitives.asymmetric.ed25519", extra="audit", feature=feature))


def keygen(path: Path) -> Path:
    """Write a new Ed25519 private key to ``path`` (PEM, PKCS#8, mode 0600) and its public key beside it
    (``path`` + ``.pub``); the public key's path. The same files as ``openssl genpkey -algorithm ed25519``
    and ``openssl pkey -in KEY -pubout``. An existing file is never overwritten."""
    serialization, ed25519 = _crypto("checkpoint keygen")
    public = Path(f"{path}.pub")
    for target in (path, public):
        if target.exists():
            raise ConfigError(f"{target} exists; choose another path (a key is never overwritten)")
    key = ed25519.Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return public


def _load(path: Path, private: bool) -> Any:
    serialization, ed25519 = _crypto("signing (--sign)" if private else "checking signatures (--public-key)")
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the key file {path}: {exc.strerror}") from None
    what = "private" if private else "public"
    try:
        key = (serialization.load_pem_private_key(data, password=None) if private
               else serialization.load_pem_public_key(data))
    except (ValueError, TypeError):
        raise ConfigError(f"{path} is not a PEM Ed25519 {what} key (make one with `statebook checkpoint keygen`)") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey if private else ed25519.Ed25519PublicKey):
        raise ConfigError(f"{path} is a {type(key).__name__}, not an Ed25519 {what} key")
    return key


def _key_id(public: Any) -> str:
    serialization, _ = _crypto("checking signatures (--public-key)")
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(body: Mapping[str, Any], private_key: Path | None) -> dict[str, Any] | None:
    """The signature of ``body`` (its ``signed_bytes``) with the key in ``private_key``, or None without one."""
    if private_key is None:
        return None
    key = _load(private_key, private=True)
    return {"alg": "ed25519", "key_id": _key_id(key.public_key()),
            "value": base64.b64encode(key.sign(signed_bytes(body))).decode()}


def signature_problems(body: Mapping[str, Any], signature: Any, public_key: Path | None, what: str) -> list[str]:
    """Why ``signature`` is not a valid signature of ``body`` by ``public_key`` (no key: nothing is checked)."""
    if public_key is None:
        return []
    key = _load(public_key, private=False)
    from cryptography.exceptions import InvalidSignature  # present: _load needed cryptography
    if not isinstance(signature, dict) or signature.get("alg") != "ed25519":
        return [f"the {what} is not signed (a public key was given, so it must be)"]
    try:
        key.verify(base64.b64decode(str(signature.get("value")), validate=True), signed_bytes(body))
    except (InvalidSignature, ValueError):
        return [f"the {what}'s signature does not verify with {public_key} (key id {_key_id(key)}): it was edited, "
                "or signed with another key"]
    return []


# -- checkpoint files ----------------------------------------------------------------------------


def checkpoint_document(body: Mapping[str, Any], private_key: Path | None) -> dict[str, Any]:
    """A checkpoint file's JSON: the checkpoint and its signature (None when unsigned)."""
    return {"checkpoint": dict(body), "signature": sign(body, private_key)}


def write_json(path: Path, value: Any) -> None:
    """``value`` as JSON into ``path``, whole or not at all (a temporary file renamed over it)."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_checkpoint(path: Path, public_key: Path | None) -> tuple[dict[str, Any] | None, list[str], list[str]]:
    """(the checkpoint, problems, notes) of a checkpoint file: its signature checked against ``public_key``
    and its heads against its root. The checkpoint is None when there is none to use."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read the checkpoint {path}: {exc.strerror}") from None
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        return None, [f"{path} is not JSON"], []
    body = document.get("checkpoint") if isinstance(document, dict) else None
    problems = checkpoint_problems(body)
    if problems:
        return None, problems, []
    assert isinstance(body, dict)  # checkpoint_problems refuses anything else
    problems = signature_problems(body, document.get("signature"), public_key, "checkpoint")
    notes = [] if public_key is not None else [
        "the checkpoint's signature was not checked: give --public-key" if document.get("signature") else
        "the checkpoint is not signed: it was checked against its own root only (sign it with --sign, check "
        "it with --public-key)"]
    return body, problems, notes


# -- bundles --------------------------------------------------------------------------------------


def _digest(path: Path) -> tuple[str, int]:
    h = hashlib.sha256()
    lines = 0
    with open(path, "rb") as f:
        for line in f:
            h.update(line)
            lines += 1
    return h.hexdigest(), lines


def _prefix(facts: list[Fact], as_of: float | None) -> list[Fact]:
    """An entity's facts up to ``as_of`` (the chain's prefix: it stops at the first later fact)."""
    if as_of is None:
        return facts
    out = []
    for f in facts:
        if f.at > as_of:
            break
        out.append(f)
    return out


class UnverifiedDatabase(DamagedHistory):
    """``export`` refused: verify found something in the database (``report``); ``force=True`` exports anyway,
    marking the bundle unverified."""

    def __init__(self, report: Report) -> None:
        super().__init__(f"export refused: verify found {len(report.findings)} finding(s) in the database; fix "
                         "them, or export anyway with --force (the bundle is marked unverified)")
        self.report = report


async def export_bundle(book: Book, directory: Path, *, entity_type: str | None = None, as_of: float | None = None,
                        private_key: Path | None = None, force: bool = False) -> dict[str, Any]:
    """Write an audit bundle of the book's facts (of one type, up to a time) into ``directory`` (new or
    empty); its manifest. The manifest and the checkpoint are signed with ``private_key`` when given.

    The book (that type) is verified first, with the book's chain key: a finding refuses the export
    (:class:`UnverifiedDatabase`, nothing written) unless ``force``, which writes the bundle with
    ``verified: false`` and the count of findings in its manifest."""
    if entity_type is not None:
        book.policy(entity_type)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigError(f"{directory} exists and is not an empty directory; a bundle goes into a new one")
    signer = _load(private_key, private=True) if private_key is not None else None  # a bad key: before any file
    del signer
    # Verify reads the database before the export does: a write between the two is exported unverified, but
    # the bundle's own check (audit verify) still sees every chain, and a checkpoint note the tree.
    checked = await verify(book, entity_type)
    if checked.findings and not force:
        raise UnverifiedDatabase(checked)
    directory.mkdir(parents=True, exist_ok=True)
    # The checkpoint pins the facts up to its seq: only those already final (L12d). Each entity's facts up to a
    # seq are a prefix of its history (seq rises with the version), so a later one is left out like --as-of's.
    top = await settled_seq(book)
    rows: list[tuple[Any, ...]] = []
    counts: dict[str, dict[str, int]] = {}
    with open(directory / FACTS_FILE, "w", encoding="utf-8") as out:
        entity: list[Fact] = []

        def flush() -> None:
            kept = _prefix(entity, as_of)
            if kept:
                c = counts.setdefault(kept[0].entity_type, {"entities": 0, "facts": 0})
                c["entities"] += 1
                c["facts"] += len(kept)
            for f in kept:
                out.write(json.dumps(f.to_json(), sort_keys=True, ensure_ascii=False) + "\n")
                rows.append((f.entity_type, f.entity_id, f.version, f.hash, f.seq))

        async for fact in stream_facts(book, entity_type):
            if entity and (fact.entity_type, fact.entity_id) != (entity[0].entity_type, entity[0].entity_id):
                flush()
                entity = []
            if top is None or (fact.seq or 0) <= top:
                entity.append(fact)
        flush()
    switch = await read_switch(book)
    now = float(book.clock.now())
    body = checkpoint_body(heads_of(rows), at=now, entity_type=entity_type,
                           chain_key_id=None if switch is None else switch.key_id, extra={"as_of": as_of})
    write_json(directory / CHECKPOINT_FILE, checkpoint_document(body, private_key))
    files = {}
    for name in (FACTS_FILE, CHECKPOINT_FILE):
        digest, lines = _digest(directory / name)
        files[name] = {"sha256": digest, "lines": lines}
    manifest = {
        "format": BUNDLE_FORMAT, "created_at": now, "scope": {"entity_type": entity_type, "as_of": as_of},
        "facts": len(rows), "counts": counts, "root": body["root"], "files": files,
        "chain": None if switch is None else {"keyed_after": switch.keyed_after, "key_id": switch.key_id},
        "tree": bundle_tree(((r[4], r[3]) for r in rows), whole_log=entity_type is None and as_of is None),
        "verified": checked.ok, "verify": {"findings": len(checked.findings), "notes": checked.notes},
    }
    write_json(directory / MANIFEST_FILE, {"manifest": manifest, "signature": sign(manifest, private_key)})
    return manifest


@dataclass
class BundleReport:
    """What ``audit verify`` found in a bundle; ``ok`` when nothing."""

    facts: int = 0
    entities: int = 0
    findings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the bundle check found nothing wrong."""
        return not self.findings

    def to_json(self) -> dict[str, Any]:
        """The report as JSON-ready data: ``ok``, counts of facts and entities, findings and notes."""
        return {"ok": self.ok, "facts": self.facts, "entities": self.entities, "findings": self.findings,
                "notes": self.notes}


def _read_document(path: Path, key: str, report: BundleReport) -> tuple[Any, Any]:
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        report.findings.append(f"{path.name}: cannot be read ({exc.strerror})")
        return None, None
    except (ValueError, RecursionError):  # RecursionError: nested past the parser's depth
        report.findings.append(f"{path.name}: not JSON")
        return None, None
    if not isinstance(document, dict) or not isinstance(document.get(key), dict):
        report.findings.append(f"{path.name}: has no {key!r} object")
        return None, None
    return document[key], document.get("signature")


def _facts(path: Path, report: BundleReport) -> Iterator[tuple[int, Fact]]:
    names = set(Fact.__dataclass_fields__)
    with open(path, "rb") as f:  # lines as _digest counts them; a line that is not UTF-8 is one finding
        for n, line in enumerate(f, start=1):
            try:
                value = json.loads(line.decode("utf-8"))
                if not isinstance(value, dict) or set(value) != names:
                    raise ValueError("not a fact's fields")
                if not (type(value["entity_type"]) is str and type(value["entity_id"]) is str):
                    raise ValueError("its entity_type and entity_id must be text")
                yield n, Fact(**value)
            except (ValueError, RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
                report.findings.append(f"{FACTS_FILE} line {n}: not a fact ({exc})")


def verify_bundle(directory: Path, public_key: Path | None = None, anchors: Anchors = Anchors()) -> BundleReport:
    """Check a bundle offline: signatures (with ``public_key``), file digests, every fact's chain, the
    checkpoint's heads and root, the manifest's counts and tree, whether the database verified at export;
    and the ``anchors`` given (a checkpoint note, the chain key id). Needs no database and no settings."""
    report = BundleReport()
    manifest, signature = _read_document(directory / MANIFEST_FILE, "manifest", report)
    if manifest is None:
        return report
    if manifest.get("format") != BUNDLE_FORMAT:
        earlier = " (an earlier format: export it again)" if manifest.get("format") == "statebook-bundle/1" else ""
        report.findings.append(f"{MANIFEST_FILE}: not a statebook bundle (format {BUNDLE_FORMAT!r} expected){earlier}")
        return report
    report.findings += signature_problems(manifest, signature, public_key, "manifest")
    found_at_export, export_notes = export_findings(manifest)
    report.findings += found_at_export
    report.notes += export_notes
    if public_key is None:
        report.notes.append("no --public-key: the bundle was checked for consistency only; anyone could have "
                            "rewritten all of it consistently")
    listed = manifest.get("files")
    files: dict[str, Any] = listed if isinstance(listed, dict) else {}
    for name in (FACTS_FILE, CHECKPOINT_FILE):
        entry = files.get(name)
        expected: dict[str, Any] = entry if isinstance(entry, dict) else {}
        try:
            digest, lines = _digest(directory / name)
        except OSError as exc:
            report.findings.append(f"{name}: cannot be read ({exc.strerror})")
            return report
        if digest != expected.get("sha256") or lines != expected.get("lines"):
            report.findings.append(f"{name}: {lines} line(s) with SHA-256 {digest[:16]}..., the manifest says "
                                   f"{expected.get('lines')} with {str(expected.get('sha256'))[:16]}... (edited)")
    body, body_signature = _read_document(directory / CHECKPOINT_FILE, "checkpoint", report)
    if body is not None:
        report.findings += [f"{CHECKPOINT_FILE}: {p}" for p in checkpoint_problems(body)]
        report.findings += signature_problems(body, body_signature, public_key, "checkpoint")
    chain = manifest.get("chain") if isinstance(manifest.get("chain"), dict) else None
    rule = Rule(None, chain.get("keyed_after")) if chain and type(chain.get("keyed_after")) is int else Rule()
    if chain:
        report.notes.append(f"the facts after seq {chain.get('keyed_after')} are keyed (key id {chain.get('key_id')}): "
                            "their HMACs need the chain key; the signatures cover their content")
    rows: list[tuple[Any, ...]] = []
    counts: dict[str, dict[str, int]] = {}
    entity: list[Fact] = []
    last: tuple[Any, ...] | None = None
    leaves = Leaves()

    def close() -> None:
        if not entity:
            return
        c = counts.setdefault(entity[0].entity_type, {"entities": 0, "facts": 0})
        c["entities"] += 1
        c["facts"] += len(entity)
        for kind, detail, _ in chain_findings(entity, rule):
            report.findings.append(f"{entity[0].entity_type} {entity[0].entity_id!r}: {kind}: {detail}")

    for n, fact in _facts(directory / FACTS_FILE, report):
        order = (str(fact.entity_type), str(fact.entity_id), fact.version if type(fact.version) is int else -1)
        if last is not None and order <= last:
            report.findings.append(f"{FACTS_FILE} line {n}: out of order (facts go by type, id, version)")
        if last is None or order[:2] != last[:2]:
            close()
            entity = []
        last = order
        entity.append(fact)
        rows.append((fact.entity_type, fact.entity_id, fact.version, fact.hash, fact.seq))
        problem = leaves.add(n, fact.seq, fact.hash)
        if problem is not None:
            report.findings.append(f"{FACTS_FILE} line {n}: {problem}")
    close()
    pairs = leaves.pairs()
    report.findings += tree_findings(manifest, pairs)
    found_by_anchors, anchor_notes = anchor_findings(manifest, pairs, anchors)
    report.findings += found_by_anchors
    report.notes += anchor_notes
    found = heads_of(rows)
    report.facts, report.entities = found.facts, len(found.heads)
    if body is not None and found.root != body.get("root"):
        report.findings.append(f"the facts' heads give root {found.root[:16]}..., the checkpoint says "
                               f"{str(body.get('root'))[:16]}... (a fact was changed, added or removed)")
    if found.root != manifest.get("root"):
        report.findings.append("the facts' heads do not give the manifest's root")
    if found.facts != manifest.get("facts") or counts != manifest.get("counts"):
        report.findings.append(f"the bundle holds {found.facts} fact(s) ({counts}), the manifest says "
                               f"{manifest.get('facts')} ({manifest.get('counts')})")
    return report


def replay_bundle(directory: Path, entity_type: str, entity_id: str, as_of: float | None = None) -> dict[str, Any] | None:
    """The row the bundle's facts of one entity describe (at ``as_of``); None when purged or not there.
    The fold of the facts alone: each creation fact records every data column."""
    facts = [f for _, f in _facts(directory / FACTS_FILE, BundleReport())
             if f.entity_type == entity_type and f.entity_id == entity_id]
    return fold(_prefix(facts, as_of))
