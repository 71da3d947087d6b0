"""A lifecycle as a ``transitions`` state machine, a Mermaid diagram and a markdown spec page.

The machine is a reference model for tests: it has one trigger per accepted edge, named
``<source>__to__<target>``, and an edge's requirements (actor gate, patch and guard fields) become
conditions checked against the command's keyword arguments::

    machine = to_machine(DISPATCH)
    machine.model.pending__to__delivering()
    machine.model.delivering__to__delivering(actor_type="system", guards={"attempt": 0})
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from transitions import Machine

from .policy import Edge, Lifecycle

NEW = "__new__"
"""The pseudo-state a machine starts in when a lifecycle has several initial statuses."""

GENERATOR = "python -m statebook.adapters.specgen"
"""The command that writes the pages of ``specs/`` from :func:`spec_page`."""

Check = Callable[..., bool]


def trigger_name(source: str, target: str) -> str:
    """The machine's trigger for the edge ``source -> target``.

    >>> trigger_name("pending", "delivering")
    'pending__to__delivering'
    """
    return f"{source}__to__{target}"


def accepted_edges(lc: Lifecycle) -> list[Edge]:
    """Every edge the engine accepts, declared or implicit (``same_status="allow"``), in status order."""
    order = {s: i for i, s in enumerate(lc.statuses)}
    found = {(e.source, e.target): e for e in lc.edges}
    if lc.same_status == "allow":
        for status in lc.statuses:
            if status not in lc.terminal:
                found.setdefault((status, status), Edge(status, status))
    return [found[key] for key in sorted(found, key=lambda k: (order[k[0]], order[k[1]]))]


def is_implicit(lc: Lifecycle, edge: Edge) -> bool:
    """True for a same-status move the lifecycle allows without declaring it."""
    return not any((e.source, e.target) == (edge.source, edge.target) for e in lc.edges)


# -- conditions -------------------------------------------------------------------------------


def _actor_check(actors: frozenset[str]) -> Check:
    def check(*_: Any, actor_type: str | None = None, **__: Any) -> bool:
        return actor_type in actors

    return check


def _field_check(kwarg: str, name: str) -> Check:
    def check(*_: Any, **kwargs: Any) -> bool:
        given: Iterable[str] | Mapping[str, Any] | None = kwargs.get(kwarg)
        return given is not None and name in given

    return check


def _actor_condition(actors: Iterable[str]) -> str:
    return f"actor_is_{'_or_'.join(sorted(actors))}"


def edge_conditions(edge: Edge) -> list[str]:
    """Condition names of one edge: ``actor_is_<a>[_or_<b>]``, ``patch_has_<f>``, ``guard_on_<f>``."""
    names = [_actor_condition(edge.actors)] if edge.actors else []
    names += [f"patch_has_{f}" for f in sorted(edge.requires_patch)]
    names += [f"guard_on_{f}" for f in sorted(edge.requires_guard)]
    return names


def conditions(lc: Lifecycle) -> dict[str, Check]:
    """Every condition the lifecycle's edges need, by name. Each takes the command's kwargs
    ``actor_type``, ``patch`` and ``guards`` and says whether that one requirement holds."""
    found: dict[str, Check] = {}
    for edge in lc.edges:
        if edge.actors:
            found[_actor_condition(edge.actors)] = _actor_check(edge.actors)
        for f in edge.requires_patch:
            found[f"patch_has_{f}"] = _field_check("patch", f)
        for f in edge.requires_guard:
            found[f"guard_on_{f}"] = _field_check("guards", f)
    return dict(sorted(found.items()))


class LifecycleModel:
    """The default model of :func:`to_machine`: it carries one condition method per requirement,
    e.g. ``LifecycleModel(DISPATCH).actor_is_operator(actor_type="system")`` is False."""

    state: str

    def __init__(self, lc: Lifecycle) -> None:
        self.lifecycle = lc
        for name, check in conditions(lc).items():
            setattr(self, name, check)


# -- the machine ------------------------------------------------------------------------------


def to_machine(lc: Lifecycle, model: Any = None) -> Machine:
    """A ``transitions`` machine accepting exactly the lifecycle's edges.

    Terminal statuses are ``final``. With one initial status the machine starts there; with several
    it starts in :data:`NEW` and ``create_<status>`` enters each. A ``model`` of your own gets the
    condition methods it lacks (see :func:`conditions`).
    """
    if model is None:
        model = LifecycleModel(lc)
    else:
        for name, check in conditions(lc).items():
            if not hasattr(model, name):
                setattr(model, name, check)
    states: list[dict[str, Any]] = [{"name": s, "final": s in lc.terminal} for s in lc.statuses]
    moves: list[dict[str, Any]] = []
    if len(lc.initial) == 1:
        (initial,) = lc.initial
    else:
        initial = NEW
        states.insert(0, {"name": NEW})
        moves += [{"trigger": f"create_{s}", "source": NEW, "dest": s} for s in sorted(lc.initial)]
    for edge in accepted_edges(lc):
        move: dict[str, Any] = {"trigger": trigger_name(edge.source, edge.target), "source": edge.source,
                                "dest": edge.target}
        if edge_conditions(edge):
            move["conditions"] = edge_conditions(edge)
        moves.append(move)
    return Machine(
        model=model, states=states, transitions=moves, initial=initial, auto_transitions=False,
        ignore_invalid_triggers=False, send_event=False,
    )


# -- Mermaid and markdown ---------------------------------------------------------------------


def requirements(edge: Edge, sep: str = "; ") -> str:
    """What an edge asks of a command, e.g. ``operator only; patch attempt, last_error``."""
    parts = []
    if edge.actors:
        parts.append(" or ".join(sorted(edge.actors)) + " only")
    if edge.requires_patch:
        parts.append("patch " + ", ".join(sorted(edge.requires_patch)))
    if edge.requires_guard:
        parts.append("guard " + ", ".join(sorted(edge.requires_guard)))
    return sep.join(parts)


def to_mermaid(lc: Lifecycle) -> str:
    """A ``stateDiagram-v2`` of the lifecycle; edge labels name their requirements."""
    lines = ["stateDiagram-v2"]
    lines += [f"    [*] --> {s}" for s in lc.statuses if s in lc.initial]
    for edge in accepted_edges(lc):
        # Mermaid ends a transition label at ':' or ';', so requirements are joined with ' / '.
        label = "same status (patch only)" if is_implicit(lc, edge) else requirements(edge, " / ")
        lines.append(f"    {edge.source} --> {edge.target}" + (f": {label}" if label else ""))
    lines += [f"    {s} --> [*]" for s in lc.statuses if s in lc.terminal]
    return "\n".join(lines) + "\n"


def _yes(flag: bool) -> str:
    return "yes" if flag else ""


def spec_page(lc: Lifecycle) -> str:
    """The markdown page ``specs/<entity_type>.md``: statuses, edges, fields, reasons, diagram."""
    same = (
        "any non-terminal status may move to itself (a patch-only update)"
        if lc.same_status == "allow" else "only along a declared self-edge"
    )
    out = [
        f"<!-- Generated by `{GENERATOR}` from the `{lc.entity_type}` lifecycle. Do not edit by hand. -->",
        "",
        f"# Lifecycle `{lc.entity_type}`",
        "",
        lc.description or "(no description)",
        "",
        f"- Table: `{lc.table_name}`",
        f"- Policy fingerprint: `{lc.fingerprint}`",
        f"- Same-status moves: {same}",
        f"- Purgeable statuses: {', '.join(f'`{s}`' for s in lc.statuses if s in (lc.purgeable or ())) or 'none'}",
        "",
        "## Statuses",
        "",
        "| Status | Initial | Terminal | Allowed targets |",
        "|---|---|---|---|",
    ]
    edges_ = accepted_edges(lc)
    for s in lc.statuses:
        targets = ", ".join(f"`{e.target}`" for e in edges_ if e.source == s) or "none"
        out.append(f"| `{s}` | {_yes(s in lc.initial)} | {_yes(s in lc.terminal)} | {targets} |")
    out += [
        "",
        "## Edges",
        "",
        "Terminal statuses are left only by actor-gated edges (L10). A command whose edge, actor, patch or",
        "guard does not match is rejected before anything is written (L3).",
        "",
        "| From | To | Trigger | Requirements |",
        "|---|---|---|---|",
    ]
    for e in edges_:
        need = "implicit same-status move" if is_implicit(lc, e) else requirements(e) or "none"
        out.append(f"| `{e.source}` | `{e.target}` | `{trigger_name(e.source, e.target)}` | {need} |")
    out += ["", "## Patch fields", ""]
    out += [f"- `{f}`" for f in sorted(lc.patch_fields)] or ["none"]
    out += ["", "## Reason codes", ""]
    out += [f"- `{code}`" for code in sorted(lc.reasons)] or ["none"]
    out += ["", "## Diagram", "", "```mermaid", to_mermaid(lc).rstrip("\n"), "```", ""]
    return "\n".join(out)


__all__ = [
    "GENERATOR", "NEW", "LifecycleModel", "accepted_edges", "conditions", "edge_conditions", "is_implicit",
    "requirements", "spec_page", "to_machine", "to_mermaid", "trigger_name",
]
