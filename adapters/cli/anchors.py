"""The fact log's anchors on the command line (issue 31, specs/audit.md A6-A8): ``checkpoint note-key``,
``checkpoint publish``, ``audit prove``, ``audit check-proof``, ``audit witness``. Registered on the ``checkpoint``
and ``audit`` groups of :mod:`.audit`, which imports this module last.

Private keys are read from files only (a key on the command line would sit in the shell's history and in
``ps``); public keys are given as their ``name+id+key`` text or a file holding it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import typer

from statebook.lifecycle import Book

from .app import fail, run, settings_file, with_book
from .audit import audit_app, checkpoint_app

KEY_HELP = "the log's public key: its name+id+key text, or a file holding it (repeat for several)"


def _signer(path: Path, what: str) -> Any:
    from statebook.adapters.note import NoteError, Signer

    try:
        return Signer.from_skey(path.read_text(encoding="utf-8").strip())
    except OSError as exc:
        raise fail(f"{what} {path}: {exc.strerror}") from None
    except NoteError as exc:
        raise fail(f"{what} {path} is not a private key text ({exc})") from None


def _checkpoint_note(path: Path) -> tuple[bytes, Any]:
    """The note at ``path`` and its tree head (its signatures are the reader's to check)."""
    from statebook.lifecycle import tlog

    try:
        note = path.read_bytes()
        return note, tlog.parse_checkpoint(note.partition(b"\n\n")[0] + b"\n")
    except OSError as exc:
        raise fail(f"--checkpoint {path}: {exc.strerror}") from None
    except tlog.CheckpointFormatError as exc:
        raise fail(f"--checkpoint {path} is not a checkpoint note ({exc})") from None


@checkpoint_app.command("note-key")
def note_key_cmd(
    name: str = typer.Option(..., "--name", metavar="ORIGIN", help="the key's name: the log's origin, e.g. "
                             "example.com/statebook, or a witness's name"),
    out: Path = typer.Option(..., "--out", metavar="KEYFILE", help="the private key's file (mode 0600, never "
                             "overwritten); its public key text is printed"),
    witness: bool = typer.Option(False, "--witness", help="a witness's cosigning key (C2SP tlog-cosignature)"),
) -> None:
    """Make a key for signing the log's checkpoints (or, with --witness, for cosigning them) as C2SP signed notes."""
    from statebook.adapters.note import COSIGNATURE_V1, ED25519, NoteError, Signer

    try:
        signer = Signer.generate(name, COSIGNATURE_V1 if witness else ED25519)
    except NoteError as exc:
        raise fail(f"--name {name!r}: {exc}") from None
    try:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise fail(f"{out} exists; choose another path (a key is never overwritten)") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(signer.skey + "\n")
    typer.echo(signer.verifier().vkey)


@checkpoint_app.command("publish")
def publish_cmd(config: Path = typer.Option(None, "--config", help="Settings file with [audit] log_key and "
                                            "checkpoint_dir")) -> None:
    """Take one checkpoint of the fact log now, as `statebook run` does by itself: signed with [audit] log_key,
    checked to extend the last one in checkpoint_dir, written there (and to checkpoint_command); exit 1 on an
    alarm (the log does not extend the last checkpoint), nothing written."""
    from statebook.adapters.checkpoints import (
        BookLog, CheckpointAlarm, CommandSink, DirectorySink, take_checkpoint,
    )
    from statebook.adapters.settings import load_settings

    audit = load_settings(settings_file(config)).audit
    signer = audit.log_signer()
    if signer is None or audit.checkpoint_dir is None:
        raise fail("checkpoint publish needs [audit] log_key and checkpoint_dir in the settings "
                   "(`statebook checkpoint note-key` makes a key)")
    more = [CommandSink(tuple(audit.checkpoint_command))] if audit.checkpoint_command else []
    directory = DirectorySink(audit.checkpoint_dir)

    async def go(book: Book) -> Any:
        return await take_checkpoint(BookLog(book), signer, directory, more)

    try:
        done = run(with_book(go)())
    except CheckpointAlarm as alarm:
        raise fail(f"checkpoint alarm: {alarm}; nothing was written", 1) from None
    state = "published" if done.note is not None else "unchanged since the last checkpoint"
    typer.echo(f"checkpoint of {done.head.size} facts, root {done.head.root_hash.hex()}: {state}")


@audit_app.command("prove")
def prove_cmd(
    fact_id: str = typer.Argument(..., metavar="FACT_ID"),
    checkpoint: Path = typer.Option(None, "--checkpoint", metavar="FILE",
                                    help="the checkpoint note to prove against (default: the latest in [audit] "
                                         "checkpoint_dir)"),
    config: Path = typer.Option(None, "--config", help="Settings file naming [audit] checkpoint_dir"),
) -> None:
    """Print a C2SP tlog-proof that the fact is in the log a checkpoint states: give it, with the fact
    (`statebook history --json`), to `statebook audit check-proof` anywhere, offline."""
    from statebook.adapters.checkpoints import DirectorySink
    from statebook.adapters.proofs import proof_text
    from statebook.adapters.settings import load_settings
    from statebook.lifecycle import factlog, tlog

    path = checkpoint
    if path is None:
        folder = load_settings(settings_file(config)).audit.checkpoint_dir
        path = None if folder is None else DirectorySink(folder).latest()
        if path is None:
            raise fail("no checkpoint to prove against: give --checkpoint FILE, or set [audit] checkpoint_dir")
    note, head = _checkpoint_note(path)

    async def go(book: Book) -> tuple[int, list[bytes]]:
        return await factlog.inclusion_proof_for(book, fact_id, head.size)

    index, proof = run(with_book(go)())
    sys.stdout.buffer.write(proof_text(index, proof, note))


@audit_app.command("witness-request")
def witness_request_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", metavar="FILE", help="the checkpoint note to have cosigned"),
    old: int = typer.Option(..., "--old", min=0, help="the size the witness last cosigned (0 for its first)"),
) -> None:
    """Print the add-checkpoint request a witness takes (`statebook audit witness`): the old size, the consistency
    proof from the database, the note."""
    from statebook.adapters.witness import witness_request
    from statebook.lifecycle import factlog, tlog

    note, head = _checkpoint_note(checkpoint)
    if old > head.size:
        raise fail(f"--old {old} is above the checkpoint's size {head.size}")

    async def go(book: Book) -> list[bytes]:
        return [] if old == 0 else await factlog.consistency_proof_for(book, old, head.size)

    sys.stdout.buffer.write(witness_request(old, run(with_book(go)()), note))


@audit_app.command("check-proof")
def check_proof_cmd(
    proof: Path = typer.Argument(..., metavar="PROOF", help="the tlog-proof file `statebook audit prove` printed"),
    fact: Path = typer.Option(..., "--fact", metavar="FILE", help="the fact as JSON (one of `statebook history "
                              "--json`'s, or a line of a bundle's facts.jsonl)"),
    key: list[str] = typer.Option(..., "--key", metavar="VKEY", help=KEY_HELP),
    witness: list[str] = typer.Option([], "--witness", metavar="VKEY", help="a witness's public key (repeat)"),
    k: int = typer.Option(0, "--k", min=0, help="how many of the --witness keys must have cosigned"),
    chain_key: Path = typer.Option(None, "--chain-key", metavar="FILE",
                                   help="the chain key's file, for a fact of a keyed chain"),
) -> None:
    """Check offline that a fact is in the log a signed checkpoint states: exit 0 and one line, or exit 1 naming
    what fails. Needs the proof, the fact and the log's public key; no database."""
    from statebook.adapters.anchor import read_verifiers
    from statebook.adapters.note import COSIGNATURE_V1
    from statebook.adapters.proofs import ProofRefused, check_proof

    if k > len(witness):
        raise fail(f"--k {k} asks for more cosignatures than the {len(witness)} --witness key(s) given")
    try:
        text = proof.read_bytes()
        document = json.loads(fact.read_text(encoding="utf-8"))
        secret = chain_key.read_bytes().strip() if chain_key is not None else None
    except OSError as exc:
        raise fail(f"{exc.filename}: {exc.strerror}") from None
    except ValueError as exc:
        raise fail(f"--fact {fact} is not JSON ({exc})") from None
    if isinstance(document, list) and len(document) == 1:
        document = document[0]
    if not isinstance(document, dict):
        raise fail(f"--fact {fact} holds no fact object")
    try:
        witnesses = read_verifiers(witness, "--witness", COSIGNATURE_V1)
        checked = check_proof(text, document, read_verifiers(key), witnesses=witnesses, k=k, chain_key=secret)
    except ProofRefused as refused:
        raise fail(f"NOT OK: {refused}", 1) from None
    cosigned = f", cosigned by {', '.join(checked.witnesses)}" if checked.witnesses else ""
    typer.echo(f"ok: fact {document.get('id')} is leaf {checked.index} of the {checked.head.size} facts of "
               f"{checked.head.origin}'s checkpoint{cosigned}")


@audit_app.command("witness")
def witness_cmd(
    request: Path = typer.Argument(..., metavar="REQUEST", help="the add-checkpoint request (old size, proof, note); "
                                   "- for standard input"),
    log_key: list[str] = typer.Option(..., "--log-key", metavar="VKEY", help=KEY_HELP),
    key: Path = typer.Option(..., "--key", metavar="KEYFILE", help="this witness's private key file (note-key "
                             "--witness)"),
    state: Path = typer.Option(..., "--state", metavar="DIR", help="this witness's own directory: the last "
                               "checkpoint it cosigned, per log"),
) -> None:
    """Cosign a checkpoint only if it extends the last one this witness cosigned (C2SP tlog-witness): print the
    cosignature line, to append to the note; exit 1 naming why not (a conflict names the size this witness has)."""
    from statebook.adapters.anchor import read_verifiers
    from statebook.adapters.witness import WitnessRefused, add_checkpoint
    from statebook.lifecycle.clock import SystemClock

    body = sys.stdin.buffer.read() if str(request) == "-" else request.read_bytes()
    try:
        line = add_checkpoint(body, read_verifiers(log_key, "--log-key"), _signer(key, "--key"), state,
                              now=int(SystemClock().now()))
    except WitnessRefused as refused:
        raise fail(f"not cosigned: {refused}", 1) from None
    typer.echo(line, nl=False)
