"""``statebook check``: an application's registry, checked statically and against a database's history — a CI step.

Static: every refusal of registration (the registry does not load: the PolicyError is the finding), reason
codes no command can meaningfully cite (their status segment names no status of the lifecycle), and gated
exits (edges leaving a terminal status, for a reviewer to confirm). With ``--db``, drift: facts written under
a policy fingerprint the registry no longer accepts, or of an entity type it does not declare. Exit 1 on a
finding, 0 when clean, 2 on bad input. A finding a team has reviewed is accepted with ``--accept KEY``.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass

import typer

from statebook.lifecycle import Lifecycle, Registry
from statebook.lifecycle.errors import PolicyError

from .app import app, fail, run
from .options import own_or_global

PURGED_SEGMENT = "purged"
"""The status segment of a purge's reason code (``<domain>.purged.<cause>``): a purge leaves no status."""


@dataclass(frozen=True)
class Finding:
    """One thing ``check`` reports; ``key`` names it for ``--accept``."""

    kind: str
    entity_type: str
    detail: str
    key: str


def registration_finding(spec: str, error: PolicyError) -> Finding:
    """The registry named by ``spec`` refused a declaration while loading."""
    return Finding("registration_refused", "", str(error), f"registration_refused:{spec}")


def static_findings(registry: Registry) -> list[Finding]:
    """Unused reason codes and gated exits of the application's declarations (the built-in ones are ours)."""
    from statebook.adapters.registry import builtin_registry

    builtins = {lc.entity_type: lc for lc in builtin_registry()}
    found: list[Finding] = []
    for lc in registry:
        ours = builtins.get(lc.entity_type)
        found += _unused_reasons(lc, ours) + _gated_exits(lc, ours)
    return found


def _unused_reasons(lc: Lifecycle, builtin: Lifecycle | None) -> list[Finding]:
    found = []
    for code in sorted(lc.reasons - (builtin.reasons if builtin else frozenset())):
        status = code.split(".")[1]
        if status not in lc.statuses and status != PURGED_SEGMENT:
            found.append(Finding(
                "unused_reason", lc.entity_type,
                f"reason code {code!r} names status {status!r}, which {lc.entity_type} does not have "
                f"(statuses: {', '.join(lc.statuses)}); rename it or remove it from reasons",
                f"unused_reason:{lc.entity_type}:{code}"))
    return found


def _gated_exits(lc: Lifecycle, builtin: Lifecycle | None) -> list[Finding]:
    theirs = {(e.source, e.target, e.actors) for e in builtin.edges} if builtin else set()
    found = []
    for e in lc.edges:
        if e.source in lc.terminal and (e.source, e.target, e.actors) not in theirs:
            found.append(Finding(
                "gated_exit", lc.entity_type,
                f"terminal status {e.source!r} can be left for {e.target!r} by {', '.join(sorted(e.actors))}; "
                "confirm it is meant, then accept it",
                f"gated_exit:{lc.entity_type}:{e.source}->{e.target}"))
    return found


async def drift_findings(registry: Registry, url: str) -> list[Finding]:
    """Facts in the database at ``url`` under a fingerprint (or entity type) the registry does not accept."""
    import sqlalchemy as sa

    from statebook.adapters.db import connect
    from statebook.lifecycle.facts import facts_table as f

    engine = connect(url, must_exist=True)
    try:
        async with engine.connect() as conn:
            rows = (await conn.execute(
                sa.select(f.c.entity_type, f.c.policy_fingerprint, sa.func.count())
                .group_by(f.c.entity_type, f.c.policy_fingerprint).order_by(f.c.entity_type, f.c.policy_fingerprint)
            )).all()
    finally:
        await engine.dispose()
    found = []
    for entity_type, fingerprint, count in rows:
        if entity_type not in registry:
            found.append(Finding(
                "unknown_entity_type", entity_type,
                f"{count} fact(s) of entity type {entity_type!r}, which the registry does not declare",
                f"unknown_entity_type:{entity_type}"))
            continue
        lc = registry.get(entity_type)
        if lc.policy_for(fingerprint) is None:
            accepted = ", ".join(p.fingerprint for p in lc.accepted) or "none"
            found.append(Finding(
                "unaccepted_policy", entity_type,
                f"{count} fact(s) of {entity_type} were written under policy {fingerprint}, which is neither the "
                f"current policy {lc.fingerprint} nor one it accepts ({accepted}); declare that earlier Lifecycle "
                "in accepts=",
                f"unaccepted_policy:{entity_type}:{fingerprint}"))
    return found


def load_app(spec: str) -> tuple[Registry | None, list[Finding]]:
    """The registry ``spec`` names, or the refusal of registration as a finding; other errors exit 2."""
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.registry import load_registry

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` would: the app module beside the caller imports
    try:
        return load_registry(spec), []
    except ConfigError as exc:
        refusal = exc.__context__  # load_registry raises "from None"; the PolicyError stays as the context
        if isinstance(refusal, PolicyError):
            return None, [registration_finding(spec, refusal)]
        raise


@app.command("check")
def check_cmd(
    app_spec: str = typer.Option(None, "--app", "-a", metavar="MODULE:ATTR",
                                 help="the application's Registry (default: the root --app or $STATEBOOK_APP)"),
    db: str = typer.Option(None, "--db", metavar="URL",
                           help="also check this database's facts for drift (default: the root --db, if given)"),
    accept: list[str] = typer.Option([], "--accept", metavar="KEY",
                                     help="a reviewed finding's key (shown in brackets); repeatable"),
    as_json: bool = typer.Option(False, "--json", help="print the findings as JSON"),
) -> None:
    """Check an application's registry (and, with --db, its history's policies); exit 1 on a finding.

    Findings: registration_refused, unused_reason, gated_exit; with --db, unaccepted_policy and
    unknown_entity_type. Exit 0 when every finding is accepted or there is none, 2 on bad input."""
    spec = own_or_global("--app", app_spec, "statebook check")
    if not spec:
        raise fail("check needs --app module:attr (the registry to check), e.g. statebook check --app myapp:registry")
    registry, findings = load_app(spec)
    url = own_or_global("--db", db, "statebook check")
    if registry is not None:
        findings += static_findings(registry)
        if url:
            findings += run(drift_findings(registry, url))
    accepted = [f for f in findings if f.key in accept]
    open_ = [f for f in findings if f.key not in accept]
    if as_json:
        typer.echo(json.dumps({"ok": not open_, "app": spec, "findings": [asdict(f) for f in open_],
                               "accepted": [asdict(f) for f in accepted],
                               "types": [lc.entity_type for lc in registry] if registry else []}, indent=2))
    else:
        for f in open_:
            typer.echo(f"{f.kind} {f.entity_type or spec}: {f.detail} [{f.key}]")
        what = f"{len(registry)} lifecycle(s)" if registry is not None else "the registry"
        tail = f", {len(accepted)} accepted" if accepted else ""
        typer.echo(f"check {spec}: {what}, {len(open_)} finding(s){tail}"
                   f"{'' if url or registry is None else ' (no --db: history not checked)'}")
    if open_:
        raise typer.Exit(1)
