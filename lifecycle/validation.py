"""Registration rules: what makes a lifecycle declaration safe to operate (specs/lifecycle.md L1).

:func:`validate` runs each named check; a refusal is a :class:`PolicyError` that names the status, edge or
column at fault and says what to change.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlalchemy as sa

from .errors import PolicyError
from .reasons import check_reason_code
from .schema import LIFECYCLE_COLUMNS, UNKNOWN, column_default

if TYPE_CHECKING:
    from .policy import Lifecycle


def validate(lc: Lifecycle) -> None:
    """Raise :class:`PolicyError` for a lifecycle that cannot be operated safely."""
    name = lc.entity_type
    check_foldable_defaults(lc)
    if not name or not name.replace("_", "").isalnum() or not name[0].isalpha():
        raise PolicyError(f"entity type {name!r} must be an identifier (letters, digits, underscores)")
    if not lc.statuses:
        raise PolicyError(f"{name}: a lifecycle needs at least one status")
    if len(set(lc.statuses)) != len(lc.statuses):
        raise PolicyError(f"{name}: statuses are listed twice: {sorted({s for s in lc.statuses if lc.statuses.count(s) > 1})}")
    known = set(lc.statuses)
    for label, group in (("initial", lc.initial), ("terminal", lc.terminal), ("purgeable", lc.purgeable or ())):
        unknown = sorted(set(group) - known)
        if unknown:
            raise PolicyError(f"{name}: {label} status(es) {', '.join(unknown)} are not among the statuses {sorted(known)}")
    if not lc.initial:
        raise PolicyError(f"{name}: at least one initial status is required")
    for e in lc.edges:
        for end in (e.source, e.target):
            if end not in known:
                raise PolicyError(f"{name}: edge {e.source} -> {e.target} names unknown status {end!r}")
        outside = sorted((e.requires_patch | e.requires_guard) - lc.patch_fields)
        if outside:
            raise PolicyError(
                f"{name}: edge {e.source} -> {e.target} requires field(s) {', '.join(outside)} that are not "
                f"patch fields (declare them in patch_fields)"
            )
        if e.source in lc.terminal and not e.gated:
            raise PolicyError(
                f"{name}: terminal status {e.source!r} has an ungated exit to {e.target!r}; a terminal status may "
                "only be left by an edge restricted to an actor type (e.g. actors='operator')"
            )
    if lc.same_status not in ("edge", "allow"):
        raise PolicyError(f"{name}: same_status must be 'edge' or 'allow', not {lc.same_status!r}")
    reached, frontier = set(lc.initial), list(lc.initial)
    while frontier:
        for target in lc.targets(frontier.pop()):
            if target not in reached:
                reached.add(target)
                frontier.append(target)
    unreachable = [s for s in lc.statuses if s not in reached]
    if unreachable:
        raise PolicyError(
            f"{name}: status(es) {', '.join(unreachable)} cannot be reached from the initial statuses "
            f"{sorted(lc.initial)}; add an edge into {'it' if len(unreachable) == 1 else 'each'} "
            f"(e.g. edges({sorted(lc.initial)[0]!r}, {unreachable[0]!r})), declare it initial, or remove it"
        )
    check_no_trap(lc)
    columns = set(lc.table.c.keys())
    if not set(LIFECYCLE_COLUMNS) <= columns or "id" not in columns:
        raise PolicyError(
            f"{name}: table {lc.table.name!r} is not a managed table; build it with lifecycle.managed_table()"
        )
    bad = sorted(f for f in lc.patch_fields if f not in columns or f in LIFECYCLE_COLUMNS or f == "id")
    if bad:
        raise PolicyError(f"{name}: patch field(s) {', '.join(bad)} are not data columns of table {lc.table.name!r}")
    for e in lc.edges:
        json_guards = sorted(g for g in e.requires_guard if isinstance(lc.table.c[g].type, sa.JSON))
        if json_guards:
            raise PolicyError(
                f"{name}: edge {e.source} -> {e.target} requires a guard on JSON column(s) {', '.join(json_guards)}; "
                "guards must be scalar columns"
            )
    check_table_statuses(lc)
    if not lc.reason_prefixes:
        raise PolicyError(f"{name}: declare at least one reason prefix (the <domain> of its reason codes)")
    for prefix in lc.reason_prefixes:
        check_reason_code(f"{prefix}.x.x")
    for code in lc.reasons:
        domain, _, _ = check_reason_code(code)
        if domain not in lc.reason_prefixes:
            raise PolicyError(
                f"{name}: reason code {code!r} does not start with one of its prefixes {sorted(lc.reason_prefixes)}"
            )


def check_no_trap(lc: Lifecycle) -> None:
    """Refuse a non-terminal status with no edge out of it (an entity reaching it would be stuck).

    A self-edge is no way out. A status meant to be final is declared terminal.
    """
    for status in lc.active:
        if not [t for t in lc.targets(status) if t != status]:
            raise PolicyError(
                f"{lc.entity_type}: status {status!r} is not terminal but has no edge out of it, so an entity "
                f"that reaches it is stuck there; add an edge from it (e.g. edges({status!r}, <target>)) or "
                f"declare it terminal (terminal={{..., {status!r}}})"
            )


def check_table_statuses(lc: Lifecycle) -> None:
    """A table built with the deprecated ``managed_table(statuses=...)`` must list the lifecycle's statuses.

    The CHECK follows the registry (see :func:`statebook.lifecycle.schema.schema_for`), so the two
    lists may not drift apart: the lifecycle's declaration is the one source of truth.
    """
    checked = lc.table.info.get("statuses")
    if checked is None or set(checked) == set(lc.statuses):
        return
    extra = sorted(set(lc.statuses) - set(checked))
    fewer = sorted(set(checked) - set(lc.statuses))
    differences = "; ".join(
        part for part in (
            f"the lifecycle adds {', '.join(extra)}" if extra else "",
            f"the table lists {', '.join(fewer)} the lifecycle does not declare" if fewer else "",
        ) if part
    )
    raise PolicyError(
        f"{lc.entity_type}: table {lc.table.name!r} was built with managed_table(statuses={list(checked)}), "
        f"which disagrees with the lifecycle's statuses {list(lc.statuses)} ({differences}); drop statuses= "
        "from managed_table — the status CHECK is built from the registry's lifecycle"
    )


def check_foldable_defaults(lc: Lifecycle) -> None:
    """Every data column's default must be a value a fact can record (L7: the row is the fold of its facts,
    every column): a literal, or none (NULL). A default the database computes at insert time — a SQL
    function, a sequence, an identity, a Python callable — would make the row hold what no fact says."""
    computed = [c.name for c in lc.table.columns
                if c.name not in LIFECYCLE_COLUMNS and column_default(c) is UNKNOWN]
    if computed:
        raise PolicyError(
            f"{lc.entity_type}: column(s) {', '.join(computed)} of table {lc.table.name!r} have a default computed "
            "at insert time, which no fact would record; declare a literal default (server_default='0', "
            "default=0) or none, and pass the value to create()"
        )
