"""Audit bundles and checkpoint files (specs/audit.md A7-A9): signed, checked offline, every line covered."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from conformance.lifecycle.support import new_task, prepare, start, task_registry

from statebook.adapters.audit import (
    UnverifiedDatabase, checkpoint_document, export_bundle, keygen, read_checkpoint, replay_bundle, verify_bundle,
    write_json)
from statebook.adapters.db import connect
from statebook.lifecycle import Book, FakeClock, verify
from statebook.lifecycle.chain import checkpoint
from statebook.lifecycle.facts import facts_table


@pytest.fixture
async def book(tmp_path):
    engine = connect(f"sqlite:///{tmp_path / 'audit.db'}")
    await prepare(engine, FakeClock())
    book = Book(engine, task_registry(), FakeClock())
    for entity_id in ("a1", "b2", "c3"):
        await new_task(book, entity_id)
        await start(book, entity_id)
    try:
        yield book
    finally:
        await engine.dispose()


@pytest.fixture
def keys(tmp_path) -> tuple[Path, Path]:
    private = tmp_path / "signing.pem"
    return private, keygen(private)


def _edit_fact(d: Path) -> None:
    lines = (d / "facts.jsonl").read_text().splitlines(keepends=True)
    fact = json.loads(lines[1])
    fact["actor_id"] = "mallory"
    lines[1] = json.dumps(fact, sort_keys=True) + "\n"
    (d / "facts.jsonl").write_text("".join(lines))


def _delete_line(d: Path) -> None:
    lines = (d / "facts.jsonl").read_text().splitlines(keepends=True)
    (d / "facts.jsonl").write_text("".join(lines[:-1]))


def _reorder(d: Path) -> None:
    lines = (d / "facts.jsonl").read_text().splitlines(keepends=True)
    lines[0], lines[1] = lines[1], lines[0]
    (d / "facts.jsonl").write_text("".join(lines))


def _edit_json(name: str, key: str, change) -> object:  # type: ignore[no-untyped-def]
    def edit(d: Path) -> None:
        document = json.loads((d / name).read_text())
        change(document[key])
        (d / name).write_text(json.dumps(document))
    return edit


EDITS = {
    "fact": _edit_fact,
    "deleted_line": _delete_line,
    "reordered_line": _reorder,
    "manifest": _edit_json("manifest.json", "manifest", lambda m: m["counts"]["task"].update(facts=5)),
    "checkpoint": _edit_json("checkpoint.json", "checkpoint", lambda c: c.update(max_seq=c["max_seq"] + 1)),
}


@pytest.mark.parametrize("edit", list(EDITS))
async def test_a_bundle_edited_in_any_line_fails(book, keys, tmp_path, edit):
    """A fact, a deleted or a reordered line, the manifest, the checkpoint: each edit fails audit verify."""
    private, public = keys
    d = tmp_path / "bundle"
    await export_bundle(book, d, private_key=private)
    assert verify_bundle(d, public).ok, verify_bundle(d, public).findings
    EDITS[edit](d)
    report = verify_bundle(d, public)
    assert not report.ok
    assert not verify_bundle(d, None).ok  # the digests catch a lone edit even without the key


async def test_a_bundle_of_facts_reordered_in_seq_fails(book, keys, tmp_path):
    """L12d / A3: facts whose seq does not rise with their version (two seqs swapped in the database before the
    export) fail ``audit verify`` with ``seq_out_of_order``, though the bundle is signed and consistent."""
    t = facts_table
    async with book.engine.begin() as conn:
        first, second = (await conn.execute(sa.select(t.c.seq).where(t.c.entity_id == "b2").order_by(t.c.version))
                         ).scalars().all()
        for old, new in ((first, -1), (second, first), (-1, second)):
            await conn.execute(sa.update(t).where(t.c.seq == old).values(seq=new))
    private, public = keys
    d = tmp_path / "bundle"
    with pytest.raises(UnverifiedDatabase) as refused:  # A3: export verifies first
        await export_bundle(book, d, private_key=private)
    assert [(f.kind, f.entity_id) for f in refused.value.report.findings] == [("seq_out_of_order", "b2")]
    await export_bundle(book, d, private_key=private, force=True)
    report = verify_bundle(d, public)
    forced = "the bundle was exported with --force from a database with 1 finding(s)"
    assert forced in report.findings
    assert [f for f in report.findings if "seq_out_of_order" in f and "'b2'" in f] == [
        f for f in report.findings if f != forced] != []


async def test_a_consistent_rewrite_needs_the_signing_key(book, keys, tmp_path):
    """Recomputing every digest after an edit passes the unsigned check, not the signature."""
    private, public = keys
    d = tmp_path / "bundle"
    await export_bundle(book, d, private_key=private)
    EDITS["manifest"](d)
    document = json.loads((d / "manifest.json").read_text())
    document["manifest"]["counts"]["task"]["facts"] = 6  # back to the truth, but the signature is over the first
    document["manifest"]["created_at"] += 1
    (d / "manifest.json").write_text(json.dumps(document))
    assert verify_bundle(d, None).ok
    assert any("signature" in f for f in verify_bundle(d, public).findings)


async def test_replay_from_a_bundle_and_as_of(book, tmp_path):
    """audit replay folds one entity's facts from the bundle alone, and at a time."""
    d = tmp_path / "bundle"
    await export_bundle(book, d)
    state = replay_bundle(d, "task", "b2")
    assert state is not None and state["status"] == "working" and state["attempt"] == 1
    first = json.loads((d / "facts.jsonl").read_text().splitlines()[0])
    assert replay_bundle(d, "task", "a1", first["at"] - 1) is None


async def test_a_signed_checkpoint_file_detects_tampering(book, keys, tmp_path):
    """verify --checkpoint: an edited checkpoint fails its signature; an intact one verifies the database."""
    private, public = keys
    path = tmp_path / "cp.json"
    write_json(path, checkpoint_document(await checkpoint(book), private))
    body, problems, _ = read_checkpoint(path, public)
    assert not problems and (await verify(book, checkpoint=body)).ok
    document = json.loads(path.read_text())
    document["checkpoint"]["heads"] = document["checkpoint"]["heads"][1:]
    document["checkpoint"]["entities"] -= 1
    from statebook.lifecycle.chain import merkle_root

    document["checkpoint"]["root"] = merkle_root(document["checkpoint"]["heads"])
    path.write_text(json.dumps(document))
    _, problems, _ = read_checkpoint(path, public)
    assert problems and "signature" in problems[0]


async def test_a_bundle_verifies_in_a_clean_environment(book, keys, tmp_path):
    """`statebook audit verify` and `audit replay` in a subprocess with no settings, no database URL and a
    working directory without a database: only the package and the public key."""
    private, public = keys
    d = tmp_path / "bundle"
    await export_bundle(book, d, private_key=private)
    clean = tmp_path / "elsewhere"
    clean.mkdir()
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(clean)}
    cli = [sys.executable, "-c", "from statebook.adapters.cli import main; main()"]
    done = subprocess.run([*cli, "audit", "verify", str(d), "--public-key", str(public), "--json"], cwd=clean, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["ok"] is True
    assert not list(clean.iterdir())  # no database was created
    replayed = subprocess.run([*cli, "audit", "replay", str(d), "task", "c3"], cwd=clean, env=env,
                              capture_output=True, text=True, timeout=120)
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["status"] == "working"
    _edit_fact(d)
    failed = subprocess.run([*cli, "audit", "verify", str(d), "--public-key", str(public)], cwd=clean, env=env,
                            capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "finding" in failed.stdout


def _consistent(d: Path, facts: bytes) -> None:
    """``facts`` as the bundle's facts.jsonl, the manifest's digests recomputed (unsigned): what a forger writes."""
    import hashlib

    (d / "facts.jsonl").write_bytes(facts)
    document = json.loads((d / "manifest.json").read_text())
    document["manifest"]["files"]["facts.jsonl"] = {"sha256": hashlib.sha256(facts).hexdigest(),
                                                    "lines": len(facts.splitlines(keepends=True))}
    document["signature"] = None
    (d / "manifest.json").write_text(json.dumps(document))


def _with_field(name: str, value: object):  # type: ignore[no-untyped-def]
    def damage(lines: list[bytes]) -> bytes:
        fact = json.loads(lines[2])
        fact[name] = value
        return b"".join([*lines[:2], json.dumps(fact).encode() + b"\n", *lines[3:]])
    return damage


DAMAGE = {
    "not_utf8": lambda lines: b"".join([lines[0], b"\xff\xfe{}\n", *lines[1:]]),
    "nested_too_deep": lambda lines: b"".join([lines[0], b"[" * 100_000 + b"]" * 100_000 + b"\n", *lines[1:]]),
    "entity_id_a_list": _with_field("entity_id", ["b2"]),
    "entity_type_an_object": _with_field("entity_type", {"task": 1}),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
async def test_a_damaged_bundle_is_a_finding_never_a_crash(book, tmp_path, damage):
    """Bytes that are not UTF-8, JSON nested past the parser's depth, a fact whose type or id is not text:
    each is a finding of `audit verify` (exit 1) and a refusal of `audit replay`, never an internal error."""
    from typer.testing import CliRunner

    from statebook.adapters.cli import app

    d = tmp_path / "bundle"
    await export_bundle(book, d)
    _consistent(d, DAMAGE[damage]((d / "facts.jsonl").read_bytes().splitlines(keepends=True)))
    report = verify_bundle(d)
    assert not report.ok and any("facts.jsonl line" in f for f in report.findings), report.findings
    for args in (["audit", "verify", str(d)], ["audit", "replay", str(d), "task", "a1"]):
        done = CliRunner().invoke(app, args)
        assert done.exit_code == 1 and "internal error" not in done.output, done.output


@pytest.mark.parametrize("name", ["manifest.json", "checkpoint.json"])
async def test_a_damaged_bundle_document_is_a_finding(book, tmp_path, name):
    """A manifest or checkpoint nested past the JSON parser's depth is 'not JSON', like any other garbage."""
    d = tmp_path / "bundle"
    await export_bundle(book, d)
    (d / name).write_text("[" * 100_000 + "]" * 100_000)
    report = verify_bundle(d)
    assert not report.ok and any(f.startswith(f"{name}: not JSON") for f in report.findings), report.findings


def _heads_edit(change):  # type: ignore[no-untyped-def]
    def edit(body: dict) -> None:
        from statebook.lifecycle.chain import merkle_root

        change(body)
        body["root"] = merkle_root(body["heads"])
    return edit


CHECKPOINT_DAMAGE = {
    "max_seq_past_bigint": lambda c: c.update(max_seq=10**30),
    "max_seq_below_bigint": lambda c: c.update(max_seq=-10**30),
    "entity_type_an_int": lambda c: c.update(entity_type=5),
    "entity_type_a_list": lambda c: c.update(entity_type=["task"]),
    "head_hash_an_int": _heads_edit(lambda c: c["heads"][0].__setitem__(3, 5)),
    "head_id_a_list": _heads_edit(lambda c: c["heads"][0].__setitem__(1, ["a1"])),
    "nested_too_deep": None,
}


@pytest.mark.parametrize("damage", list(CHECKPOINT_DAMAGE))
async def test_a_checkpoint_of_the_wrong_shape_is_bad_checkpoint(book, tmp_path, damage):
    """An unsigned checkpoint consistent with its root but with fields no checkpoint has (a seq past BIGINT,
    a type or head that is not text) is `bad_checkpoint`, never an error of the database or an internal one."""
    path = tmp_path / "cp.json"
    write_json(path, checkpoint_document(await checkpoint(book), None))
    if CHECKPOINT_DAMAGE[damage] is None:
        path.write_text('{"checkpoint": ' + "[" * 100_000 + "]" * 100_000 + "}")
    else:
        document = json.loads(path.read_text())
        CHECKPOINT_DAMAGE[damage](document["checkpoint"])
        path.write_text(json.dumps(document))
    body, problems, _ = read_checkpoint(path, None)
    assert body is None and problems, problems


async def test_an_unchecked_checkpoint_says_so(book, keys, tmp_path):
    """Without --public-key a checkpoint is checked against its own root only; the notes say so whether or not
    it carries a signature (a forger rewriting it consistently would simply leave the signature out)."""
    private, _ = keys
    for signer in (private, None):
        path = tmp_path / f"cp-{signer is None}.json"
        write_json(path, checkpoint_document(await checkpoint(book), signer))
        body, problems, notes = read_checkpoint(path, None)
        assert body is not None and not problems
        assert any("--public-key" in n for n in notes), notes


def test_a_chain_key_that_cannot_be_read_is_a_configuration_error(monkeypatch, tmp_path):
    """[audit] chain_key naming an unset variable or a missing file: a one-line refusal (exit 2) naming where,
    not an internal error."""
    from statebook.adapters.cli.funnel import REFUSED, classify
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.settings import AuditSettings

    monkeypatch.delenv("STATEBOOK_TEST_UNSET_KEY", raising=False)
    for ref in ({"env": "STATEBOOK_TEST_UNSET_KEY"}, {"file": str(tmp_path / "no-such-key")}):
        with pytest.raises(ConfigError) as refused:
            AuditSettings(chain_key=ref).key()
        code, line = classify(refused.value)
        assert code == REFUSED and "chain_key" in line and "internal error" not in line, line
