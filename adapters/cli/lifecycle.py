"""Lifecycle commands: inspect declarations (no database), read history, replay, verify, demo.

Imports only typer at the top: rich and statebook's parts are imported by the command that uses them, so
``statebook verify --help`` and ``statebook lifecycle ls --json`` start without them (specs/cli.md C10).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from .app import _console, app, cli_registry, fail, parse_time, print_table, run, with_book

if TYPE_CHECKING:
    from rich.table import Table

    from statebook.lifecycle import Book, Fact, Lifecycle
    from statebook.lifecycle.replay import Report

LAZY = ("history", "verify")
"""Names of statebook.lifecycle this module reads on first use (tests replace them here)."""


def _lazy(name: str) -> Any:
    if name not in globals():
        import statebook.lifecycle as lifecycle

        globals()[name] = getattr(lifecycle, name)
    return globals()[name]


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return _lazy(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


lifecycle_app = typer.Typer(help="Inspect the declared lifecycles (works without a database).", no_args_is_help=True)
app.add_typer(lifecycle_app, name="lifecycle")


class GraphFormat(str, Enum):
    """What ``lifecycle graph`` prints: a Mermaid diagram or indented text."""

    mermaid = "mermaid"
    text = "text"


def _policy(entity_type: str) -> Lifecycle:
    return cli_registry().get(entity_type)  # UnknownEntityType: the funnel adds the --app hint


def _dump(value: Any, *, indent: int | None = None) -> str:
    return json.dumps(value, sort_keys=True, indent=indent, default=str, ensure_ascii=False)


# -- rendering (also used by the demo) --------------------------------------------------------


def history_table(facts: list[Fact], title: str = "") -> Table:
    """One row per fact: version, time, move, reason, actor, patched columns."""
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title or None, title_justify="left")
    for name in ("v", "at (UTC)", "move", "actor"):
        table.add_column(name, no_wrap=name in ("v", "at (UTC)"), overflow="fold")
    table.add_column("reason", overflow="fold", ratio=2)
    table.add_column("patch", overflow="fold", ratio=1)
    for f in facts:
        move = f"{f.previous_status or '(new)'} -> {f.status or '(purged)'}"
        reason = f.reason_code + (f": {f.reason_summary}" if f.reason_summary else "")
        if f.is_creation:
            patch = ""
        elif isinstance(f.patch, dict):
            patch = ", ".join(f"{k}={v!r}" for k, v in sorted(f.patch.items()))
        else:  # a damaged fact: its stored text, as read (the command then reports the damage)
            patch = repr(f.patch)
        actor = f"{f.actor_type}:{f.actor_id}" if f.actor_id else f.actor_type
        at = datetime.fromtimestamp(f.at, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
        table.add_row(str(f.version), at, move, escape(actor), escape(reason), escape(patch))
    return table


def report_summary(report: Report) -> str:
    """``verified N entities, M facts: ok`` (or how many findings)."""
    verdict = "ok" if report.ok else f"{len(report.findings)} finding(s)"
    return f"verified {report.entities} entities, {report.facts} facts: {verdict}"


def print_report(report: Report) -> None:
    """A verify report: its summary line, a table of findings, its notes."""
    from rich.markup import escape
    from rich.table import Table

    console = _console("console")
    console.print(report_summary(report), style="green" if report.ok else "red", highlight=False)
    if report.findings:
        table = Table()
        for name in ("kind", "type", "entity", "detail"):
            table.add_column(name, overflow="fold")
        for f in report.findings:
            table.add_row(f.kind, f.entity_type, f.entity_id, escape(f.detail))
        print_table(table)
    for note in report.notes:
        console.print(f"note: {escape(note)}", highlight=False)


# -- lifecycle ls / show / graph --------------------------------------------------------------


@lifecycle_app.command("ls")
def lifecycle_ls(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List the registered lifecycles (the built-in ones, or the --app registry's)."""
    lifecycles = sorted(cli_registry(), key=lambda lc: lc.entity_type)
    if as_json:
        typer.echo(_dump([{"type": lc.entity_type, "table": lc.table_name, "statuses": list(lc.statuses),
                           "fingerprint": lc.fingerprint} for lc in lifecycles], indent=2))
        return
    from rich.table import Table

    table = Table()
    for name in ("type", "table", "statuses", "fingerprint"):
        table.add_column(name, no_wrap=True)
    for lc in lifecycles:
        table.add_row(lc.entity_type, lc.table_name, str(len(lc.statuses)), lc.fingerprint)
    print_table(table, whole=True)  # never cut a name or a fingerprint, even on a terminal: scripts read them


@lifecycle_app.command("show")
def lifecycle_show(
    entity_type: str = typer.Argument(..., metavar="TYPE"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """Statuses, edges, patch fields and reason codes of one lifecycle."""
    from rich.markup import escape
    from rich.table import Table

    from statebook.lifecycle.diagram import accepted_edges, is_implicit, requirements

    lc = _policy(entity_type)
    if as_json:
        typer.echo(_dump({
            "type": lc.entity_type, "table": lc.table_name, "fingerprint": lc.fingerprint,
            "description": lc.description or None,
            "statuses": [{"status": s, "initial": s in lc.initial, "terminal": s in lc.terminal} for s in lc.statuses],
            "edges": [{"from": e.source, "to": e.target, "implicit": is_implicit(lc, e), "requirements": requirements(e)}
                      for e in accepted_edges(lc)],
            "patch_fields": sorted(lc.patch_fields), "reasons": sorted(lc.reasons),
        }, indent=2))
        return
    console = _console("console")
    console.print(f"[bold]{lc.entity_type}[/bold] (table {lc.table_name}, fingerprint {lc.fingerprint})")
    if lc.description:
        console.print(escape(lc.description), highlight=False)
    statuses = Table(title="statuses", title_justify="left")
    for name in ("status", "initial", "terminal"):
        statuses.add_column(name)
    for s in lc.statuses:
        statuses.add_row(s, "yes" if s in lc.initial else "", "yes" if s in lc.terminal else "")
    print_table(statuses)
    moves = Table(title="edges", title_justify="left")
    for name in ("from", "to", "requirements"):
        moves.add_column(name)
    for e in accepted_edges(lc):
        moves.add_row(e.source, e.target, "same status, patch only" if is_implicit(lc, e) else requirements(e))
    print_table(moves)
    console.print("patch fields: " + (", ".join(sorted(lc.patch_fields)) or "none"), highlight=False)
    console.print("reasons:", highlight=False)
    for code in sorted(lc.reasons):
        console.print(f"  {code}", highlight=False)


@lifecycle_app.command("graph")
def lifecycle_graph(
    entity_type: str = typer.Argument(..., metavar="TYPE"),
    format: GraphFormat = typer.Option(GraphFormat.mermaid, "--format", "-f", help="mermaid or text"),
) -> None:
    """Print the lifecycle's graph; Mermaid goes to stdout as is, ready to pipe."""
    from statebook.lifecycle.diagram import accepted_edges, is_implicit, requirements, to_mermaid, trigger_name

    lc = _policy(entity_type)
    if format is GraphFormat.mermaid:
        typer.echo(to_mermaid(lc), nl=False)
        return
    for s in lc.statuses:
        marks = [m for m, on in (("initial", s in lc.initial), ("terminal", s in lc.terminal)) if on]
        typer.echo(s + (f" ({', '.join(marks)})" if marks else ""))
        for e in (e for e in accepted_edges(lc) if e.source == s):
            need = "same status, patch only" if is_implicit(lc, e) else requirements(e)
            typer.echo(f"  -> {e.target}" + (f"  [{need}]" if need else "") + f"  ({trigger_name(e.source, e.target)})")


# -- history / replay / verify ----------------------------------------------------------------




CHAIN_DAMAGE = ("malformed_fact", "broken_chain", "hash_mismatch", "status_discontinuity", "version_gap")
"""verify's finding kinds that mean the facts themselves are damaged (what history and replay check)."""


async def _facts(book: Book, entity_type: str, entity_id: str) -> list[Fact]:
    from statebook.adapters.errors import DamagedHistory
    from statebook.lifecycle import EntityNotFound, StatebookError

    try:
        facts: list[Fact] = await _lazy("history")(book, entity_type, entity_id)
    except StatebookError:
        raise
    except (ValueError, TypeError, UnicodeDecodeError) as exc:  # a stored value no fact was written with
        raise DamagedHistory(f"the facts of {entity_type} {entity_id!r} cannot be read ({type(exc).__name__}); "
                             f"the history is damaged: `statebook verify --type {entity_type}` names the damage") from None
    if not facts:
        raise EntityNotFound(f"{entity_type} {entity_id!r} has no history in this database")
    return facts


async def _damage(book: Book, entity_type: str, entity_id: str, facts: list[Fact]) -> str | None:
    """The first chain finding of these facts (the checks verify runs), or None when they chain. On a
    keyed chain the facts after the switch-over are checked for their links only (no key here)."""
    from statebook.lifecycle.chain import Rule, read_switch
    from statebook.lifecycle.replay import check_entity

    switch = await read_switch(book)
    rule = Rule() if switch is None else Rule(None, switch.keyed_after)
    found = [f for f in check_entity(book.policy(entity_type), entity_id, facts, None, rule) if f.kind in CHAIN_DAMAGE]
    if not found:
        return None
    return (f"the history of {entity_type} {entity_id!r} is damaged ({found[0].kind}: {found[0].detail}); "
            f"`statebook verify --type {entity_type}` lists every finding")


async def _history(book: Book, entity_type: str, entity_id: str) -> tuple[list[Fact], str | None]:
    facts = await _facts(book, entity_type, entity_id)
    return facts, await _damage(book, entity_type, entity_id, facts)


@app.command("history")
def history_cmd(
    entity_type: str = typer.Argument(..., metavar="TYPE"),
    entity_id: str = typer.Argument(..., metavar="ID"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per fact"),
) -> None:
    """Every fact of one entity, oldest first; exit 1 (after printing them) when they do not chain."""
    facts, damage = run(with_book(_history)(entity_type, entity_id))
    if as_json:
        for f in facts:
            typer.echo(_dump(f.to_json()))
    else:
        print_table(history_table(facts, f"{entity_type} {entity_id}"))
    if damage:
        raise fail(damage, 1)


async def _replay(book: Book, entity_type: str, entity_id: str, when: float | None) -> dict[str, Any] | None:
    from statebook.adapters.errors import DamagedHistory
    from statebook.lifecycle.replay import fold
    from statebook.lifecycle.schema import row_defaults

    facts = await _facts(book, entity_type, entity_id)
    damage = await _damage(book, entity_type, entity_id, facts)
    if damage:
        raise DamagedHistory(damage)  # a state folded over a gap would be a wrong answer
    defaults = row_defaults(book.policy(entity_type).table)
    return fold((f for f in facts if when is None or f.at <= when), defaults)


@app.command("replay")
def replay_cmd(
    entity_type: str = typer.Argument(..., metavar="TYPE"),
    entity_id: str = typer.Argument(..., metavar="ID"),
    as_of_: str = typer.Option(None, "--as-of", metavar="TIME", help="epoch seconds or ISO-8601 (UTC if no zone)"),
) -> None:
    """Fold an entity's facts into its state (now, or as it was at --as-of) and print it as JSON.

    Damaged history (facts that do not chain) is a finding: one line, exit 1, no state."""
    when = None if as_of_ is None else parse_time(as_of_, "--as-of")
    state = run(with_book(_replay)(entity_type, entity_id, when))
    if state is None:
        _console("err_console").print("no state: the entity did not exist yet or was purged at that time", highlight=False)
    typer.echo(_dump(state, indent=2))


PROGRESS_FROM_FACTS = 5000
"""Below this many facts verify is quick; the progress bar only appears for longer runs."""


async def _verify(book: Book, entity_type: str | None, show_progress: bool, checkpoint: Any = None,
                  key: Any = None, tree_head: Any = None) -> Report:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    verify = _lazy("verify")
    book = book.with_chain_key(key)
    if not show_progress:
        report: Report = await verify(book, entity_type, checkpoint=checkpoint, tree_head=tree_head)
        return report
    columns = (TextColumn("verifying facts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    bar = Progress(*columns, console=_console("err_console"), transient=True)
    task = bar.add_task("verify", total=None)

    def tick(done: int, total: int) -> None:
        if total >= PROGRESS_FROM_FACTS:
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)

    try:
        report = await verify(book, entity_type, progress=tick, checkpoint=checkpoint, tree_head=tree_head)
        return report
    finally:
        if bar.live.is_started:
            bar.stop()


@app.command("verify")
def verify_cmd(
    entity_type: str = typer.Option(
        None, "--type", metavar="TYPE",
        help="check one entity type only (without it, facts and managed tables of types the registry does not "
             "declare are findings)"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    checkpoint: Path = typer.Option(None, "--checkpoint", metavar="FILE",
                                    help="also check the heads a checkpoint covers (truncation, erasure, rewrites)"),
    public_key: Path = typer.Option(None, "--public-key", metavar="FILE",
                                    help="the Ed25519 public key the checkpoint must be signed with"),
    config: Path = typer.Option(None, "--config", help="settings file whose \\[audit] chain_key keys the chain"),
    tree_head: Path = typer.Option(None, "--tree-head", metavar="NOTE",
                                   help="also check the fact log against a signed checkpoint note (checkpoint "
                                        "publish), or the latest in a checkpoint directory: its first SIZE facts "
                                        "must give its root"),
    log_key: list[str] = typer.Option([], "--key", metavar="VKEY",
                                      help="the log's public key the --tree-head note must open with (text or file)"),
    witnesses: list[str] = typer.Option(None, "--witness", metavar="VKEY",
                                        help="a witness's public key (text or file; repeat for several)"),
    k: int = typer.Option(0, "--k", min=0, help="how many of the --witness keys must have cosigned the checkpoint"),
) -> None:
    """Check every row against its facts and every fact against its chain and policy; exit 1 on a finding.

    What it cannot check is a finding too: unregistered types, damaged facts (specs/lifecycle.md L12a/b).
    With the chain key configured ([audit] chain_key) keyed hashes are checked; --checkpoint FILE checks
    the history it covers (specs/audit.md)."""
    from statebook.adapters.audit import read_checkpoint
    from statebook.lifecycle.replay import Finding, Report

    from .audit import chain_key

    key = chain_key(config)
    head = None if tree_head is None else _tree_head(tree_head, log_key, witnesses or [], k)
    if tree_head is None and (log_key or witnesses):
        raise fail("--key and --witness open a checkpoint note: give --tree-head NOTE too")
    body, problems, notes = (None, [], []) if checkpoint is None else read_checkpoint(checkpoint, public_key)
    if checkpoint is None and public_key is not None:
        raise fail("--public-key checks a checkpoint's signature: give --checkpoint FILE too")
    if problems:
        report = Report(findings=[Finding("bad_checkpoint", "", "", p) for p in problems])
    else:
        show_progress = _console("err_console").is_terminal and not as_json
        report = run(with_book(_verify)(entity_type, show_progress, body, key, head))
    report.notes += notes
    if as_json:
        typer.echo(_dump(report.to_json(), indent=2))
    else:
        print_report(report)
    if not report.ok:
        raise typer.Exit(1)


def _tree_head(path: Path, keys: list[str], witnesses: list[str], k: int) -> Any:
    """The tree head of the checkpoint note at ``path``, opened with one of ``keys`` (and cosigned by ``k`` of
    ``witnesses``); a one-line error otherwise."""
    from statebook.adapters.anchor import open_checkpoint, read_verifiers
    from statebook.adapters.note import COSIGNATURE_V1, NoteError
    from statebook.lifecycle import tlog

    if k > len(witnesses):
        raise fail(f"--k {k} asks for more cosignatures than the {len(witnesses)} --witness key(s) given")

    if not keys:
        raise fail("--tree-head needs the log's public key (--key VKEY): an unsigned tree head anchors nothing")
    from statebook.adapters.checkpoints import checkpoint_file

    found = checkpoint_file(path)  # a checkpoint directory ([audit] checkpoint_dir): its latest
    if found is None:
        raise fail(f"--tree-head {path} is a directory without a checkpoint in it")
    path = found
    try:
        text, _ = open_checkpoint(path.read_bytes(), read_verifiers(keys),
                                  read_verifiers(witnesses, "--witness", COSIGNATURE_V1), k)
        return tlog.parse_checkpoint(text)
    except OSError as exc:
        raise fail(f"--tree-head {path}: {exc.strerror}") from None
    except (NoteError, tlog.CheckpointFormatError) as exc:
        raise fail(f"--tree-head {path} does not verify: {exc}", 1) from None


# -- demo -------------------------------------------------------------------------------------


@app.command("demo")
def demo_cmd(
    db: str = typer.Option("./statebook-demo.db", "--db", help="SQLite file for the demo (recreated each run)"),
) -> None:
    """Walk a small example lifecycle through statebook on an embedded SQLite database."""
    from statebook.adapters.demo import run_demo

    report = run(run_demo(db, _console("console")))
    if not report.ok:
        raise typer.Exit(1)
