"""Lifecycle declarations and the registry that validates them.

A :class:`Lifecycle` is a closed graph: statuses, initial and terminal sets, edges, the columns a
transition may patch, and the reason codes it may cite. The :class:`Registry` refuses a declaration
that could not be operated safely, with a message naming the offending part.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Literal

import sqlalchemy as sa

from .errors import PolicyError, RegistrySealed, TransitionRejected, UnknownEntityType, UnknownReason
from .inputs import shown
from .validation import validate

SameStatus = Literal["edge", "allow"]
"""How a move to the same status is treated: ``edge`` — only along a declared self-edge;
``allow`` — any non-terminal status may move to itself (a patch-only update)."""


def _fs(values: Iterable[str] | str | None) -> frozenset[str]:
    if values is None:
        return frozenset()
    if isinstance(values, str):
        return frozenset((values,))
    return frozenset(values)


@dataclass(frozen=True, init=False)
class Edge:
    """One allowed move. Empty ``actors`` means any actor type may take it."""

    source: str
    target: str
    actors: frozenset[str] = frozenset()
    requires_patch: frozenset[str] = frozenset()
    requires_guard: frozenset[str] = frozenset()

    # Written out so a checker accepts the sets and lists a user writes; they are stored frozen.
    def __init__(self, source: str, target: str, actors: Iterable[str] = (), requires_patch: Iterable[str] = (),
                 requires_guard: Iterable[str] = ()) -> None:
        set_ = object.__setattr__
        set_(self, "source", source)
        set_(self, "target", target)
        set_(self, "actors", _fs(actors))
        set_(self, "requires_patch", _fs(requires_patch))
        set_(self, "requires_guard", _fs(requires_guard))

    @property
    def gated(self) -> bool:
        """True when only the named actor types may take this edge."""
        return bool(self.actors)

    def canonical(self) -> dict[str, object]:
        """The edge as sorted, JSON-ready data, for the policy fingerprint."""
        return {
            "source": self.source,
            "target": self.target,
            "actors": sorted(self.actors),
            "requires_patch": sorted(self.requires_patch),
            "requires_guard": sorted(self.requires_guard),
        }


def edges(
    source: str,
    *targets: str,
    actors: Iterable[str] | str | None = None,
    patch: Iterable[str] | str | None = None,
    guard: Iterable[str] | str | None = None,
) -> list[Edge]:
    """Edges from ``source`` to each target sharing the same requirements.

    >>> [e.target for e in edges("pending", "delivering", "expired")]
    ['delivering', 'expired']
    """
    return [Edge(source, t, _fs(actors), _fs(patch), _fs(guard)) for t in targets]


@dataclass(frozen=True, init=False)
class Lifecycle:
    """A declared lifecycle for one entity type stored in one managed table."""

    entity_type: str
    table: sa.Table
    statuses: tuple[str, ...]
    initial: frozenset[str]
    terminal: frozenset[str]
    edges: tuple[Edge, ...]
    patch_fields: frozenset[str] = frozenset()
    reason_prefixes: frozenset[str] = frozenset()
    reasons: frozenset[str] = frozenset()
    same_status: SameStatus = "edge"
    purgeable: frozenset[str] = frozenset()
    """The statuses ``purge`` may remove; the terminal ones unless declared."""
    description: str = ""
    notify_channel: str | None = field(default=None, compare=False)
    """PostgreSQL only: a channel the engine NOTIFYs (payload: the entity id) in the statement that
    creates an entity, so listeners wake when it commits. Operational, not part of the fingerprint."""
    accepts: tuple[Lifecycle, ...] | None = field(default=None, compare=False, repr=False)
    """Earlier declarations of this lifecycle whose facts ``verify`` still accepts (specs/lifecycle.md
    L12c), with the declarations they accepted in turn. ``None``: the history is not declared, and a fact
    written under another fingerprint is judged by the current policy. A tuple (even empty): every fact
    must be written under the current policy or an accepted one, and take a move that policy allowed."""
    _index: Mapping[tuple[str, str], Edge] = field(init=False, repr=False, compare=False)
    _fingerprint: str = field(default="", init=False, repr=False, compare=False)
    _allowed: set[tuple[object, ...]] = field(default_factory=set, init=False, repr=False, compare=False)
    """Command shapes check_command accepted (it is a pure function of them)."""

    # Written out so a checker accepts the sets and lists a user writes (``initial={"open"}``); every
    # collection is stored as a tuple or a frozenset, so a declaration stays immutable and hashable.
    def __init__(
        self,
        entity_type: str,
        table: sa.Table,
        statuses: Iterable[str],
        initial: Iterable[str],
        terminal: Iterable[str],
        edges: Iterable[Edge],
        patch_fields: Iterable[str] = (),
        reason_prefixes: Iterable[str] = (),
        reasons: Iterable[str] = (),
        same_status: SameStatus = "edge",
        purgeable: Iterable[str] | None = None,
        description: str = "",
        notify_channel: str | None = None,
        accepts: Iterable[Lifecycle] | None = None,
    ) -> None:
        set_ = object.__setattr__
        set_(self, "entity_type", entity_type)
        set_(self, "table", table)
        set_(self, "statuses", tuple(statuses))
        set_(self, "initial", _fs(initial))
        set_(self, "terminal", _fs(terminal))
        set_(self, "edges", tuple(edges))
        set_(self, "patch_fields", _fs(patch_fields))
        set_(self, "reason_prefixes", _fs(reason_prefixes))
        set_(self, "reasons", _fs(reasons))
        set_(self, "same_status", same_status)
        set_(self, "purgeable", self.terminal if purgeable is None else _fs(purgeable))
        set_(self, "description", description)
        set_(self, "notify_channel", notify_channel)
        set_(self, "accepts", None if accepts is None else _earlier(entity_type, accepts))
        set_(self, "_index", MappingProxyType({(e.source, e.target): e for e in self.edges}))
        text = json.dumps(self.canonical(), sort_keys=True, separators=(",", ":"))
        set_(self, "_fingerprint", hashlib.sha256(text.encode()).hexdigest()[:16])
        set_(self, "_allowed", set())

    # -- reading ------------------------------------------------------------------------------
    @property
    def table_name(self) -> str:
        """The name of the table holding this lifecycle's entities."""
        return self.table.name

    def edge(self, source: str, target: str) -> Edge | None:
        """The edge ``source -> target``, including an implicit same-status move when allowed."""
        found = self._index.get((source, target))
        if found is None and source == target and self.same_status == "allow" and source not in self.terminal:
            return Edge(source, target)
        return found

    @property
    def accepted(self) -> tuple[Lifecycle, ...]:
        """The earlier declarations whose facts verify accepts (see ``accepts``), each once."""
        return tuple(self.accepts or ())

    def policy_for(self, fingerprint: str) -> Lifecycle | None:
        """The declaration a fact written under ``fingerprint`` was checked against: this one, an
        accepted one, or None (unknown)."""
        if fingerprint == self.fingerprint:
            return self
        return next((lc for lc in self.accepted if lc.fingerprint == fingerprint), None)

    def targets(self, source: str) -> list[str]:
        """The statuses an edge leads to from ``source``, in declaration order."""
        return [e.target for e in self.edges if e.source == source]

    @property
    def active(self) -> tuple[str, ...]:
        """The non-terminal statuses, in declared order: what a due scan or an open-work index names."""
        return tuple(s for s in self.statuses if s not in self.terminal)

    def canonical(self) -> dict[str, object]:
        """The whole declaration as sorted, JSON-ready data: what the policy fingerprint hashes."""
        return {
            "entity_type": self.entity_type,
            "table": self.table.name,
            "statuses": list(self.statuses),
            "initial": sorted(self.initial),
            "terminal": sorted(self.terminal),
            "edges": sorted((e.canonical() for e in self.edges), key=lambda d: (d["source"], d["target"])),
            "patch_fields": sorted(self.patch_fields),
            "reason_prefixes": sorted(self.reason_prefixes),
            "reasons": sorted(self.reasons),
            "same_status": self.same_status,
            "purgeable": sorted(self.purgeable),
        }

    @property
    def fingerprint(self) -> str:
        """A stable hash of the canonical form: equal declarations give equal fingerprints."""
        return self._fingerprint

    # -- deriving -----------------------------------------------------------------------------
    def extend(
        self,
        *,
        statuses: Iterable[str] = (),
        initial: Iterable[str] = (),
        terminal: Iterable[str] = (),
        edges: Iterable[Edge] = (),
        patch_fields: Iterable[str] = (),
        reasons: Iterable[str] = (),
        reason_prefixes: Iterable[str] = (),
        table: sa.Table | None = None,
        entity_type: str | None = None,
        description: str | None = None,
    ) -> Lifecycle:
        """A copy with more statuses, edges, patch fields or reason codes (never fewer).

        The copy accepts what this declaration wrote and what it accepts (L12c) — and the same extension
        of each declaration it accepts, so an application's extension of an earlier built-in policy
        still verifies after the built-in one grew. A copy under another entity type has no history.
        """
        statuses, initial, terminal, edges = tuple(statuses), tuple(initial), tuple(terminal), tuple(edges)
        patch_fields, reasons, reason_prefixes = tuple(patch_fields), tuple(reasons), tuple(reason_prefixes)

        def grown(lc: Lifecycle, entity_type: str | None = None) -> Lifecycle:
            return lc._extended(statuses=statuses, initial=initial, terminal=terminal, edges=edges,
                                patch_fields=patch_fields, reasons=reasons, reason_prefixes=reason_prefixes,
                                table=table, entity_type=entity_type, description=description)

        derived = grown(self, entity_type)
        if self.accepts is None or derived.entity_type != self.entity_type:
            return derived
        earlier = tuple(grown(lc) for lc in self.accepted)
        return replace(derived, accepts=(self, *self.accepted, *earlier))

    def _extended(self, *, statuses: Iterable[str] = (), initial: Iterable[str] = (), terminal: Iterable[str] = (),
                  edges: Iterable[Edge] = (), patch_fields: Iterable[str] = (), reasons: Iterable[str] = (),
                  reason_prefixes: Iterable[str] = (), table: sa.Table | None = None, entity_type: str | None = None,
                  description: str | None = None) -> Lifecycle:
        """The copy :meth:`extend` makes, with no history declared."""
        return replace(
            self,
            entity_type=entity_type or self.entity_type,
            table=self.table if table is None else table,
            statuses=self.statuses + tuple(s for s in statuses if s not in self.statuses),
            initial=self.initial | _fs(initial),
            terminal=self.terminal | _fs(terminal),
            edges=self.edges + tuple(e for e in edges if (e.source, e.target) not in self._index),
            patch_fields=self.patch_fields | _fs(patch_fields),
            reasons=self.reasons | _fs(reasons),
            reason_prefixes=self.reason_prefixes | _fs(reason_prefixes),
            purgeable=self.purgeable | _fs(terminal),
            description=self.description if description is None else description,
            accepts=None,
        )

    # -- checking commands --------------------------------------------------------------------
    def check_reason(self, code: str) -> None:
        """Raise ``UnknownReason`` (naming the declared codes for that status) unless ``code`` is declared."""
        if code not in self.reasons:
            near = sorted(r for r in self.reasons if r.split(".")[1:2] == code.split(".")[1:2])
            hint = f"; declared codes for that status: {', '.join(near)}" if near else ""
            raise UnknownReason(
                f"reason code {code!r} is not declared by lifecycle {self.entity_type!r}{hint}"
            )

    def check_command(
        self,
        sources: Iterable[str],
        target: str,
        *,
        actor_type: str,
        patch: Iterable[str] = (),
        guard: Iterable[str] = (),
        reason_code: str,
    ) -> None:
        """Refuse, with the rule's name, a command this policy forbids from any expected status."""
        sources, patch, guard = tuple(sources), tuple(patch), tuple(guard)
        shape = (sources, target, actor_type, patch, guard, reason_code)
        allowed = self._allowed
        if shape in allowed:
            return
        self._check_command(sources, target, actor_type=actor_type, patch=patch, guard=guard, reason_code=reason_code)
        if len(allowed) < 4096:
            allowed.add(shape)

    def _check_command(
        self, sources: tuple[str, ...], target: str, *, actor_type: str, patch: tuple[str, ...],
        guard: tuple[str, ...], reason_code: str,
    ) -> None:
        self.check_reason(reason_code)
        for status in (target, *sources):
            if status not in self.statuses:
                raise TransitionRejected(
                    f"{self.entity_type}: unknown status {status!r}; statuses are {', '.join(self.statuses)}",
                    rule="status",
                )
        patch_keys, guard_keys = set(patch), set(guard)
        undeclared = sorted((patch_keys | guard_keys) - self.patch_fields)
        if undeclared:
            raise TransitionRejected(
                f"{self.entity_type}: column(s) {', '.join(undeclared)} are not patch fields of this "
                f"lifecycle (patch fields: {', '.join(sorted(self.patch_fields)) or 'none'})",
                rule="patch",
            )
        unguardable = sorted(g for g in guard_keys if isinstance(self.table.c[g].type, sa.JSON))
        if unguardable:
            raise TransitionRejected(
                f"{self.entity_type}: column(s) {', '.join(unguardable)} hold JSON and cannot be guards "
                "(JSON equality is not portable); guard a scalar column instead",
                rule="guard",
            )
        srcs = list(sources)
        if not srcs:
            raise TransitionRejected(f"{self.entity_type}: a transition needs at least one expected status", rule="status")
        for source in srcs:
            edge = self.edge(source, target)
            if edge is None:
                allowed = ", ".join(self.targets(source)) or "none (terminal)"
                raise TransitionRejected(
                    f"{self.entity_type}: edge {source} -> {target} is not declared; from {source} the "
                    f"allowed targets are: {allowed}",
                    rule="edge",
                )
            if edge.actors and actor_type not in edge.actors:
                raise TransitionRejected(
                    f"{self.entity_type}: edge {source} -> {target} is reserved for actor type(s) "
                    f"{', '.join(sorted(edge.actors))}; got {actor_type!r}",
                    rule="actor",
                )
            missing = sorted(edge.requires_patch - patch_keys)
            if missing:
                raise TransitionRejected(
                    f"{self.entity_type}: edge {source} -> {target} requires patch field(s) {', '.join(missing)}",
                    rule="patch",
                )
            missing = sorted(edge.requires_guard - guard_keys)
            if missing:
                raise TransitionRejected(
                    f"{self.entity_type}: edge {source} -> {target} requires a guard on {', '.join(missing)} "
                    f"(pass guards={{{', '.join(repr(m) + ': <expected value>' for m in missing)}}})",
                    rule="guard",
                )


def _earlier(entity_type: str, accepts: Iterable[Lifecycle]) -> tuple[Lifecycle, ...]:
    """``accepts`` with what each accepted in turn, once each; refuses another entity type's declaration."""
    found: dict[str, Lifecycle] = {}
    for lc in accepts:
        if not isinstance(lc, Lifecycle) or lc.entity_type != entity_type:
            raise PolicyError(
                f"{entity_type}: accepts= lists earlier declarations of {entity_type!r} (Lifecycle objects); "
                f"got {lc.entity_type if isinstance(lc, Lifecycle) else type(lc).__name__!r}"
            )
        for one in (lc, *lc.accepted):
            found.setdefault(one.fingerprint, one)
    return tuple(found.values())


class Registry:
    """The set of lifecycles an application runs. Seal it once assembled; it is then immutable."""

    def __init__(self, lifecycles: Iterable[Lifecycle] = ()) -> None:
        self._by_type: dict[str, Lifecycle] = {}
        self._sealed = False
        for lc in lifecycles:
            self.register(lc)

    @property
    def sealed(self) -> bool:
        """True once :meth:`seal` was called: no more registrations."""
        return self._sealed

    def _guard(self) -> None:
        if self._sealed:
            raise RegistrySealed("the registry is sealed; register and extend lifecycles before sealing it")

    def _check_against_others(self, lc: Lifecycle, ignore: str | None = None) -> None:
        for other in self._by_type.values():
            if other.entity_type == ignore:
                continue
            if other.entity_type == lc.entity_type:
                raise PolicyError(f"entity type {lc.entity_type!r} is already registered")
            if other.table.name == lc.table.name:
                raise PolicyError(
                    f"{lc.entity_type}: table {lc.table.name!r} is already managed by {other.entity_type!r}"
                )
            clash = sorted(lc.reason_prefixes & other.reason_prefixes)
            if clash:
                raise PolicyError(
                    f"{lc.entity_type}: reason prefix(es) {', '.join(clash)} are already used by {other.entity_type!r}"
                )

    def register(self, lc: Lifecycle) -> Lifecycle:
        """Validate ``lc`` and add it; raises ``PolicyError`` for a bad declaration or a clash with another
        lifecycle, ``RegistrySealed`` once the registry is sealed.
        """
        self._guard()
        validate(lc)
        self._check_against_others(lc)
        self._by_type[lc.entity_type] = lc
        return lc

    def extend(self, entity_type: str, **additions: object) -> Lifecycle:
        """Replace a registered lifecycle by an extended copy (see :meth:`Lifecycle.extend`)."""
        self._guard()
        base = self.get(entity_type)
        if "entity_type" in additions and additions["entity_type"] not in (None, entity_type):
            raise PolicyError("extend() keeps the entity type; register a derived copy under a new type instead")
        derived = base.extend(**additions)  # type: ignore[arg-type]
        validate(derived)
        self._check_against_others(derived, ignore=entity_type)
        self._by_type[entity_type] = derived
        return derived

    def seal(self) -> Registry:
        """Freeze the registry (later registrations raise) and return it."""
        self._sealed = True
        self._by_type = MappingProxyType(dict(self._by_type))  # type: ignore[assignment]
        return self

    def get(self, entity_type: str) -> Lifecycle:
        """The lifecycle of ``entity_type``; raises ``UnknownEntityType`` naming the known types."""
        try:
            return self._by_type[entity_type]
        except (KeyError, TypeError):  # TypeError: an unhashable value is no type name either
            known = ", ".join(sorted(self._by_type)) or "none"
            raise UnknownEntityType(f"no lifecycle is registered for {shown(entity_type)}; known types: {known}") from None

    def __contains__(self, entity_type: object) -> bool:
        try:
            return entity_type in self._by_type
        except TypeError:
            return False

    def __iter__(self) -> Iterator[Lifecycle]:
        return iter(list(self._by_type.values()))

    def __len__(self) -> int:
        return len(self._by_type)
