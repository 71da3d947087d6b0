"""Bundles anchored (specs/audit.md A3, issue 31): export verifies the database first, the manifest records the
facts' Merkle tree, and ``audit verify`` checks a bundle against a checkpoint note and the chain key id.

Each test states what the attacker knows. The forgeries are test_audit_forgery's: plain SQL by someone with
write access to the database who knows the plain hashing but holds neither the chain key nor a signing key.
The checkpoint notes are signed here, the way the log signs its tree head: the facts' (seq, hash) read with
plain SQL, hashed with ``lifecycle.tlog`` (not with the code under test), ``checkpoint_body`` and ``sign_note``.
"""

from __future__ import annotations

import asyncio
import base64
import json
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from conformance.lifecycle.support import new_task, prepare, start, task_registry
from test_audit_forgery import (
    KEY, OTHER, appended, cut_tail, engine, erased, field_edit, forged_rehashed, inserted, reordered, seeded)
from typer.testing import CliRunner

from statebook.adapters.anchor import Anchors
from statebook.adapters.audit import UnverifiedDatabase, export_bundle, keygen, verify_bundle
from statebook.adapters.cli import app
from statebook.adapters.db import connect, reset_schema
from statebook.adapters.note import Signer, Verifier, sign_note
from statebook.lifecycle import Book, FakeClock
from statebook.lifecycle.tlog import checkpoint_body, fact_leaf, leaf_hash, root

ORIGIN = "statebook.test/log"
APP = "conformance.lifecycle.support:task_registry"
runner = CliRunner()




@pytest.fixture(scope="module")
def log_key() -> Signer:
    return Signer.generate(ORIGIN)


async def log_leaves(book: Book) -> list[bytes]:
    """The log's leaf hashes: every fact's (seq, hash) in seq order, read with plain SQL."""
    async with book.engine.connect() as conn:
        rows = (await conn.execute(sa.text("SELECT seq, hash FROM status_transitions ORDER BY seq"))).fetchall()
    return [leaf_hash(fact_leaf(seq, h)) for seq, h in rows]


async def log_checkpoint(book: Book, signer: Signer, *, size: int | None = None, root_hash: bytes | None = None) -> bytes:
    """A checkpoint note of the log as it is now (or of the size and root given), signed by ``signer``."""
    leaves = await log_leaves(book)
    body = checkpoint_body(ORIGIN, len(leaves) if size is None else size,
                           root(leaves) if root_hash is None else root_hash)
    return sign_note(body, signer)


def manifest_of(d: Path) -> dict[str, Any]:
    manifest: dict[str, Any] = json.loads((d / "manifest.json").read_text())["manifest"]
    return manifest


# -- export verifies first ---------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["plain", "keyed"])
async def test_export_refuses_a_forged_database_and_names_the_findings(engine, tmp_path, mode):
    """Attacker: write access and the plain hashing; no chain key, no signing key. A field edited without a
    re-hash (plain chain), a fact re-hashed (keyed chain, exported with the key): each is a verify finding, so
    export refuses, names it, and writes nothing. (Plain verify, without the key, is blind to the second.)"""
    book, _ = await seeded(engine, mode)
    await (field_edit if mode == "plain" else forged_rehashed)(book)
    if mode == "keyed":
        await export_bundle(Book(engine, task_registry(), FakeClock()), tmp_path / "without-key")
    with pytest.raises(UnverifiedDatabase) as refused:
        await export_bundle(book, tmp_path / "bundle")
    assert {(f.kind, f.entity_id) for f in refused.value.report.findings} == {("hash_mismatch", "victim")}
    assert not (tmp_path / "bundle").exists()


def _forged_database(db_url: str) -> None:
    async def go() -> None:
        engine = connect(db_url)
        await prepare(engine, FakeClock())
        book, _ = await seeded(engine, "plain")
        await field_edit(book)
        await engine.dispose()
    asyncio.run(go())


def _reset(db_url: str) -> None:
    async def go() -> None:
        engine = connect(db_url)
        await reset_schema(engine)
        await engine.dispose()
    asyncio.run(go())


def test_the_cli_refuses_then_force_writes_verified_false_which_audit_verify_reports(db_url, tmp_path):
    """Attacker: write access and the plain hashing, no key; a field edited. `statebook export` prints each
    finding on a line and a summary, exit 1, no bundle; with --force the signed manifest says verified: false
    and the count, `audit verify` reports it, and setting it back to true breaks the manifest's signature."""
    _forged_database(db_url)
    try:
        d = tmp_path / "bundle"
        done = runner.invoke(app, ["--app", APP, "--db", db_url, "export", "--bundle", str(d)])
        lines = done.output.splitlines()
        assert done.exit_code == 1, done.output
        assert lines[0].startswith("finding: hash_mismatch task 'victim': "), lines
        assert "export refused: verify found 1 finding(s)" in lines[-1] and len(lines) == 2, lines
        assert not d.exists()
        private = tmp_path / "signing.pem"
        public = keygen(private)
        done = runner.invoke(app, ["--app", APP, "--db", db_url, "export", "--bundle", str(d), "--force",
                                   "--sign", str(private)])
        assert done.exit_code == 0 and "UNVERIFIED (1 finding(s), --force)" in done.output, done.output
    finally:
        _reset(db_url)
    manifest = manifest_of(d)
    assert manifest["verified"] is False and manifest["verify"]["findings"] == 1
    checked = runner.invoke(app, ["audit", "verify", str(d), "--public-key", str(public)])
    assert checked.exit_code == 1
    assert "finding: the bundle was exported with --force from a database with 1 finding(s)" in checked.output
    document = json.loads((d / "manifest.json").read_text())
    document["manifest"]["verified"] = True
    (d / "manifest.json").write_text(json.dumps(document))
    report = verify_bundle(d, public)
    assert any("manifest's signature does not verify" in f for f in report.findings), report.findings


# -- the tree and the checkpoint note ---------------------------------------------------------------------


async def test_a_clean_export_verifies_against_the_logs_checkpoint(engine, tmp_path, log_key):
    """No attacker. A clean book exports verified: true with the log's own tree (its size and root are the
    checkpoint's), and the bundle verifies against the checkpoint note with the log's key, as API and CLI, the
    key given as text or as a file; the chain key id of a keyed log too."""
    book, _ = await seeded(engine, "keyed")
    note = await log_checkpoint(book, log_key)
    await new_task(book, "later")  # growth after the checkpoint: in the bundle, not anchored by it
    d = tmp_path / "bundle"
    manifest = await export_bundle(book, d)
    leaves = await log_leaves(book)
    assert manifest["verified"] is True and manifest["verify"]["findings"] == 0
    assert manifest["tree"] == {"size": 7, "root": base64.b64encode(root(leaves)).decode(), "whole_log": True}
    report = verify_bundle(d, anchors=Anchors(note, (log_key.verifier(),), KEY.id))
    assert report.ok, report.findings
    assert any("first 6 facts give the root" in n and "the 1 after it are not anchored" in n for n in report.notes)
    (tmp_path / "cp.note").write_bytes(note)
    (tmp_path / "log.vkey").write_text(log_key.verifier().vkey + "\n")
    for key in (log_key.verifier().vkey, str(tmp_path / "log.vkey")):
        done = runner.invoke(app, ["audit", "verify", str(d), "--checkpoint", str(tmp_path / "cp.note"), "--key", key,
                                   "--chain-key-id", KEY.id])
        assert done.exit_code == 0, done.output


async def test_the_same_bundle_fails_against_another_checkpoint_key_or_chain_key_id(engine, tmp_path, log_key):
    """The auditor is handed a checkpoint that is not the log's, or checks with another key, or the bundle comes
    from a log keyed with another chain key. Attacker: can write a note and sign it with a key of their own
    under the log's name, or edit a signed note; has no log key. Each is a finding naming what differs."""
    book, _ = await seeded(engine, "keyed")
    d = tmp_path / "bundle"
    await export_bundle(book, d)
    leaves = await log_leaves(book)
    mallory = Signer.generate(ORIGIN)
    log = (log_key.verifier(),)
    cases: dict[str, tuple[Anchors, str]] = {
        "larger size": (Anchors(await log_checkpoint(book, log_key, size=7), log),
                        "the checkpoint's tree holds 7 facts, the bundle only 6"),
        "smaller size, the full root": (Anchors(await log_checkpoint(book, log_key, size=5), log),
                                        "the bundle's first 5 facts in seq order give root"),
        "another root": (Anchors(await log_checkpoint(book, log_key, root_hash=root(leaves[:-1])), log),
                         "the bundle's first 6 facts in seq order give root"),
        "signed by another key under the log's name": (Anchors(await log_checkpoint(book, mallory), log),
                                                       "no signature on the note is by a configured key"),
        "checked with another key": (Anchors(await log_checkpoint(book, log_key), (mallory.verifier(),)),
                                     "no signature on the note is by a configured key"),
        "edited after signing": (Anchors((await log_checkpoint(book, log_key)).replace(b"\n6\n", b"\n5\n"), log),
                                 "does not verify"),
        "another chain key id": (Anchors(chain_key_id=OTHER.id), f"keyed with chain key id {OTHER.id}, the bundle's "
                                 f"facts with {KEY.id}"),
    }
    assert verify_bundle(d, anchors=Anchors(await log_checkpoint(book, log_key), log, KEY.id)).ok
    for case, (anchors, expected) in cases.items():
        report = verify_bundle(d, anchors=anchors)
        assert len(report.findings) == 1 and expected in report.findings[0], (case, report.findings)


async def test_a_partial_bundle_is_not_compared_with_the_logs_checkpoint(engine, tmp_path, log_key):
    """No attacker. A bundle of one type (or up to a time) records a tree of its own facts, whole_log false: an
    anchor of the whole log cannot vouch for it, so checking it against a checkpoint is a finding saying why."""
    book, _ = await seeded(engine, "plain")
    d = tmp_path / "bundle"
    manifest = await export_bundle(book, d, entity_type="task")
    assert manifest["tree"]["whole_log"] is False and manifest["tree"]["size"] == 6
    assert verify_bundle(d).ok
    report = verify_bundle(d, anchors=Anchors(await log_checkpoint(book, log_key), (log_key.verifier(),)))
    assert len(report.findings) == 1 and "holds part of the log only" in report.findings[0], report.findings


async def test_the_manifests_tree_must_be_the_facts(engine, tmp_path):
    """Attacker: edits an unsigned bundle's manifest (no signing key needed without --public-key): a tree
    with another root or size, or a partial bundle's tree claimed to be the whole log's, is a finding."""
    book, _ = await seeded(engine, "plain")
    edits = {"root": lambda t: t.update(root=base64.b64encode(b"\0" * 32).decode()),
             "size": lambda t: t.update(size=t["size"] - 1), "whole_log": lambda t: t.update(whole_log=True)}
    for name, edit in edits.items():
        d = tmp_path / name
        await export_bundle(book, d, entity_type="task" if name == "whole_log" else None)
        document = json.loads((d / "manifest.json").read_text())
        edit(document["manifest"]["tree"])
        (d / "manifest.json").write_text(json.dumps(document))
        report = verify_bundle(d)
        assert len(report.findings) == 1 and "tree" in report.findings[0], (name, report.findings)


@pytest.mark.parametrize("seq", ["shared", "text"])
async def test_a_fact_without_its_own_place_in_the_tree_is_a_finding(engine, tmp_path, seq):
    """Attacker: rewrites an unsigned bundle consistently (the digests recomputed): a fact given another's seq,
    or a seq that is no integer, has no place in the log's tree; it is named by its line."""
    from test_audit_bundle import _consistent

    book, _ = await seeded(engine, "plain")
    d = tmp_path / "bundle"
    await export_bundle(book, d)
    lines = (d / "facts.jsonl").read_bytes().splitlines(keepends=True)
    first, second = json.loads(lines[0]), json.loads(lines[1])
    second["seq"] = first["seq"] if seq == "shared" else str(second["seq"])
    _consistent(d, b"".join([lines[0], json.dumps(second).encode() + b"\n", *lines[2:]]))
    expected = f"line 2: seq {first['seq']} again (line 1" if seq == "shared" else "line 2: its seq is no non-negative"
    assert any(expected in f for f in verify_bundle(d).findings), verify_bundle(d).findings


AFTER_THE_CHECKPOINT = {
    # forgery: (what the finding says, or None: it passes the checkpoint)
    "forged_rehashed": (forged_rehashed, "the bundle's first 6 facts in seq order give root"),
    "cut_tail": (cut_tail, "the checkpoint's tree holds 6 facts, the bundle only 5"),
    "erased": (erased, "the checkpoint's tree holds 6 facts, the bundle only 4"),
    "inserted": (inserted, "the bundle's first 6 facts in seq order give root"),
    "reordered": (reordered, "the bundle's first 6 facts in seq order give root"),
    "appended": (appended, None),
}


@pytest.mark.parametrize("forgery", list(AFTER_THE_CHECKPOINT))
async def test_a_bundle_of_a_database_forged_after_the_checkpoint_fails_against_it(engine, tmp_path, log_key, forgery):
    """Attacker: write access to the database and the plain hashing; neither the log's note key nor the bundle's
    signing key nor a chain key. The log's checkpoint note was taken before the forgery. The bundle is exported
    with --force from the forged database and signed by the honest exporter: it verifies alone where plain
    verify is blind (a re-hashed rewrite, a cut tail, an erasure), and fails against the checkpoint, naming
    the sizes or the roots. A fact appended after the checkpoint is growth it does not anchor (A4)."""
    book, _ = await seeded(engine, "plain")
    note = await log_checkpoint(book, log_key)
    forge, expected = AFTER_THE_CHECKPOINT[forgery]
    await forge(book)
    private = tmp_path / "signing.pem"
    public = keygen(private)
    d = tmp_path / "bundle"
    await export_bundle(book, d, private_key=private, force=True)
    anchored = verify_bundle(d, public, Anchors(note, (log_key.verifier(),)))
    if expected is None:
        assert [f for f in anchored.findings if "checkpoint" in f] == [], anchored.findings
        return
    assert [f for f in anchored.findings if expected in f], anchored.findings
    if forgery in ("forged_rehashed", "cut_tail", "erased"):
        assert verify_bundle(d, public).ok  # the bundle alone: signed, consistent, verified at export


def test_the_cli_options_of_an_anchor_are_checked(tmp_path, log_key):
    """--checkpoint needs --key and --key needs --checkpoint (exit 2); a signer key given as --key is refused
    without echoing it; a witness key is not the log's key."""
    d = tmp_path / "bundle"
    d.mkdir()
    (d / "manifest.json").write_text("{}")
    (tmp_path / "cp.note").write_bytes(b"x\n")
    for args in (["--checkpoint", str(tmp_path / "cp.note")], ["--key", log_key.verifier().vkey]):
        done = runner.invoke(app, ["audit", "verify", str(d), *args])
        assert done.exit_code == 2 and "go together" in done.output, done.output
    witness = Signer.generate("witness.example/w1").as_kind(0x04).verifier().vkey
    for key, said in ((log_key.skey, "signer key"), (witness, "witness key")):
        done = runner.invoke(app, ["audit", "verify", str(d), "--checkpoint", str(tmp_path / "cp.note"), "--key", key])
        assert done.exit_code == 2 and said in done.output, done.output
        assert log_key.skey.rsplit("+", 1)[1][:12] not in done.output
    assert Verifier.from_vkey(log_key.verifier().vkey) == log_key.verifier()
