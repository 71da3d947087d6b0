"""Audit commands (specs/audit.md): ``checkpoint [keygen]``, ``export --bundle``, ``audit verify|replay``.

``audit verify`` and ``audit replay`` read only the bundle: no database, no settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from statebook.lifecycle import Book

from .app import app, emit_json, fail, parse_time, run, with_book

checkpoint_app = typer.Typer(help="Checkpoints of every entity's chain head (and the key that signs them).",
                             invoke_without_command=True, no_args_is_help=False)
audit_app = typer.Typer(help="Check an audit bundle offline: no database, no settings, only the bundle.",
                        no_args_is_help=True)
app.add_typer(checkpoint_app, name="checkpoint")
app.add_typer(audit_app, name="audit")

CONFIG_HELP = "Settings file (TOML) whose \\[audit] chain_key names the chain key (env or file)"


def chain_key(config: Path | None):  # type: ignore[no-untyped-def]
    """The chain key the settings name (``[audit] chain_key`` in ``config``, else the global --config or
    ./statebook.toml; ``STATEBOOK_AUDIT__CHAIN_KEY__FILE`` / ``__ENV``), or None."""
    from statebook.adapters.settings import load_settings

    from .app import settings_file

    return load_settings(settings_file(config)).audit.key()


@checkpoint_app.callback()
def checkpoint_cmd(
    ctx: typer.Context,
    sign: Path = typer.Option(None, "--sign", metavar="KEYFILE", help="Ed25519 private key (PEM) to sign it with"),
    out: Path = typer.Option(None, "--out", metavar="FILE", help="write it to FILE (default: standard output)"),
    entity_type: str = typer.Option(None, "--type", metavar="TYPE", help="one entity type only"),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Print (or write) a checkpoint: the Merkle root of every entity's chain head, the fact count, the highest
    seq, the time; signed with --sign. Later: `statebook verify --checkpoint FILE --public-key KEY.pub`."""
    if ctx.invoked_subcommand is not None:
        return
    from statebook.adapters.audit import checkpoint_document, write_json
    from statebook.lifecycle.chain import checkpoint

    if out is not None and out.exists() and out.is_dir():
        raise fail(f"--out {out} is a directory; name a file")

    async def go(book: Book) -> dict[str, Any]:
        return await checkpoint(book.with_chain_key(chain_key(config)), entity_type)

    body = run(with_book(go)())
    document = checkpoint_document(body, sign)
    if out is None:
        typer.echo(json.dumps(document, sort_keys=True, ensure_ascii=False))
    else:
        write_json(out, document)
        typer.echo(f"checkpoint of {body['entities']} entities, {body['facts']} facts (up to seq {body['max_seq']}), "
                   f"root {body['root']}{', signed' if sign else ''}: {out}", err=True)


@checkpoint_app.command("keygen")
def keygen_cmd(out: Path = typer.Option(..., "--out", metavar="KEYFILE",
                                        help="the private key's file (its public key goes to KEYFILE.pub)")) -> None:
    """Make an Ed25519 key pair for signing checkpoints and bundles (or: openssl genpkey -algorithm ed25519)."""
    from statebook.adapters.audit import keygen

    public = keygen(out)
    typer.echo(f"private key: {out} (keep it off the database host); public key: {public}")


@app.command("export")
def export_cmd(
    bundle: Path = typer.Option(..., "--bundle", metavar="DIR", help="a new (or empty) directory for the bundle"),
    entity_type: str = typer.Option(None, "--type", metavar="TYPE", help="one entity type only"),
    as_of: str = typer.Option(None, "--as-of", metavar="TIME", help="each history up to TIME (POSIX or ISO-8601)"),
    sign: Path = typer.Option(None, "--sign", metavar="KEYFILE", help="Ed25519 private key to sign the bundle with"),
    force: bool = typer.Option(False, "--force", help="export even when verify finds something in the database; "
                               "the manifest then says verified: false, which audit verify reports"),
    config: Path = typer.Option(None, "--config", help=CONFIG_HELP),
) -> None:
    """Write an audit bundle: the facts as JSON Lines, their checkpoint and a manifest (counts, chain heads,
    file digests), signed with --sign. The manifest records the facts' Merkle tree and whether the database
    verified: a finding refuses the export (exit 1) unless --force. `statebook audit verify DIR` checks the
    bundle offline."""
    from statebook.adapters.audit import UnverifiedDatabase, export_bundle

    when = None if as_of is None else parse_time(as_of, "--as-of")
    key = chain_key(config)

    async def go(book: Book) -> dict[str, Any]:
        return await export_bundle(book.with_chain_key(key), bundle, entity_type=entity_type, as_of=when,
                                   private_key=sign, force=force)

    try:
        manifest = run(with_book(go)())
    except UnverifiedDatabase as refused:
        for f in refused.report.findings:
            typer.echo(f"finding: {f.kind} {f.entity_type} {f.entity_id!r}: {f.detail}", err=True)
        raise fail(str(refused), 1) from None
    for note in manifest["verify"]["notes"]:
        typer.echo(f"note: {note}", err=True)
    verdict = "" if manifest["verified"] else f", UNVERIFIED ({manifest['verify']['findings']} finding(s), --force)"
    typer.echo(f"bundle of {manifest['facts']} facts{verdict}: {bundle}", err=True)


@audit_app.command("verify")
def audit_verify_cmd(
    bundle: Path = typer.Argument(..., metavar="DIR"),
    public_key: Path = typer.Option(None, "--public-key", metavar="FILE", help="the signer's Ed25519 public key (PEM)"),
    checkpoint: Path = typer.Option(
        None, "--checkpoint", metavar="FILE",
        help="a checkpoint note of the log (C2SP signed note of its tree head), or a checkpoint directory (its "
             "latest): the bundle's facts must give its root at its size; needs --key"),
    keys: list[str] = typer.Option(
        None, "--key", metavar="VKEY",
        help="the log's note verifier key (vkey text, or a file holding it) the checkpoint must be signed with; "
             "repeat for several"),
    chain_key_id: str = typer.Option(None, "--chain-key-id", metavar="ID",
                                     help="the id of the log's chain key: the bundle's facts must be keyed with it"),
    witnesses: list[str] = typer.Option(None, "--witness", metavar="VKEY",
                                        help="a witness's public key (text or file; repeat for several)"),
    k: int = typer.Option(0, "--k", min=0, help="how many of the --witness keys must have cosigned the checkpoint"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Check a bundle offline (signatures with --public-key, digests, every chain, the checkpoint, the facts'
    tree), and against a checkpoint note (--checkpoint, --key) and the chain key id; exit 1 on a finding."""
    from statebook.adapters.anchor import Anchors, read_verifiers
    from statebook.adapters.audit import verify_bundle

    if not (bundle / "manifest.json").is_file():
        raise fail(f"{bundle} is not an audit bundle (no manifest.json)")
    keys = keys or []
    if (checkpoint is None) != (not keys):
        raise fail("--checkpoint FILE and --key VKEY go together: a checkpoint note is checked with the log's key")
    checkpoint_note = None
    if checkpoint is not None:  # a checkpoint directory ([audit] checkpoint_dir): its latest
        from statebook.adapters.checkpoints import checkpoint_file

        found = checkpoint_file(checkpoint)
        if found is None:
            raise fail(f"--checkpoint {checkpoint} is a directory without a checkpoint in it")
        checkpoint = found
    if checkpoint is not None:
        try:
            checkpoint_note = checkpoint.read_bytes()
        except OSError as exc:
            raise fail(f"cannot read the checkpoint note {checkpoint}: {exc.strerror}") from None
    from statebook.adapters.note import COSIGNATURE_V1

    witnesses = witnesses or []
    if k > len(witnesses) or (witnesses and checkpoint is None):
        raise fail("--witness and --k check a checkpoint's cosignatures: give --checkpoint, and at most as many --k "
                   "as --witness keys")
    anchors = Anchors(checkpoint_note, tuple(read_verifiers(keys)), chain_key_id,
                      tuple(read_verifiers(witnesses, "--witness", COSIGNATURE_V1)), k)
    report = verify_bundle(bundle, public_key, anchors)
    if as_json:
        emit_json(report.to_json())
    else:
        for finding in report.findings:
            typer.echo(f"finding: {finding}")
        for note in report.notes:
            typer.echo(f"note: {note}")
        typer.echo(f"{'ok' if report.ok else 'NOT OK'}: {report.entities} entities, {report.facts} facts, "
                   f"{len(report.findings)} finding(s)")
    if not report.ok:
        raise typer.Exit(1)


@audit_app.command("replay")
def audit_replay_cmd(
    bundle: Path = typer.Argument(..., metavar="DIR"),
    entity_type: str = typer.Argument(..., metavar="TYPE"),
    entity_id: str = typer.Argument(..., metavar="ID"),
    as_of: str = typer.Option(None, "--as-of", metavar="TIME", help="the state at TIME (POSIX or ISO-8601)"),
    public_key: Path = typer.Option(None, "--public-key", metavar="FILE", help="check the bundle's signatures first"),
) -> None:
    """Print the row one entity's facts in the bundle describe (at --as-of); the bundle is verified first."""
    from statebook.adapters.audit import replay_bundle, verify_bundle

    if not (bundle / "manifest.json").is_file():
        raise fail(f"{bundle} is not an audit bundle (no manifest.json)")
    when = None if as_of is None else parse_time(as_of, "--as-of")
    report = verify_bundle(bundle, public_key)
    if not report.ok:
        raise fail(f"the bundle does not verify ({report.findings[0]}); `statebook audit verify {bundle}` lists "
                   "every finding", 1)
    state = replay_bundle(bundle, entity_type, entity_id, when)
    if state is None:
        raise fail(f"{entity_type} {entity_id!r} has no state in the bundle{' at that time' if when else ''} "
                   "(not in it, or purged)")
    emit_json(state)


from . import anchors  # noqa: E402, F401 - its commands join the groups above
