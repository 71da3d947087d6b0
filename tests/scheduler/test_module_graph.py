"""The modules of ``statebook.scheduler`` import each other as a DAG, at module level only.

A cycle (``engine`` ↔ ``polling``, ``requests → polling → runs → store → requests``) used to be dodged
with imports inside functions or under ``TYPE_CHECKING``; both count here: an edge is any import of a
sibling module anywhere in a module, and a function-level import of statebook code is refused.
"""

from __future__ import annotations

import ast
from pathlib import Path

import statebook.scheduler

PACKAGE = "statebook.scheduler"
ROOT = Path(statebook.scheduler.__path__[0])
MODULES = sorted(p.stem for p in ROOT.glob("*.py") if p.stem != "__init__")


def _targets(node: ast.ImportFrom | ast.Import) -> set[str]:
    """The sibling modules an import statement names."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.startswith(PACKAGE + "."):
                found.add(alias.name[len(PACKAGE) + 1:].split(".")[0])
        return found
    if node.level == 1:
        base = node.module or ""
    elif node.level == 0 and node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
        base = node.module[len(PACKAGE) + 1:] if node.module != PACKAGE else ""
    else:
        return found
    if base:
        found.add(base.split(".")[0])
    else:  # ``from . import admission``: the names are modules
        found.update(alias.name for alias in node.names if alias.name in MODULES)
    return found


def _statebook_import(node: ast.ImportFrom | ast.Import) -> bool:
    if isinstance(node, ast.Import):
        return any(alias.name.split(".")[0] == "statebook" for alias in node.names)
    return node.level > 0 or (node.module or "").split(".")[0] == "statebook"


def graph() -> tuple[dict[str, set[str]], list[str]]:
    """module -> sibling modules it imports; and every function-level import of statebook code."""
    edges: dict[str, set[str]] = {}
    lazy: list[str] = []
    for name in MODULES:
        tree = ast.parse((ROOT / f"{name}.py").read_text(), filename=f"{name}.py")
        edges[name] = set()
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                lazy += [f"{name}.py:{n.lineno} in {fn.name}()" for n in ast.walk(fn)
                         if isinstance(n, ast.Import | ast.ImportFrom) and _statebook_import(n)]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                edges[name] |= _targets(node) - {name}
    return edges, lazy


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``edges`` as a path (first module repeated at the end), or None."""
    state: dict[str, str] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_scheduler_modules_import_each_other_as_a_dag():
    edges, _ = graph()
    assert set(MODULES) >= {"engine", "polling", "requests", "runs", "store", "firing", "admission"}
    cycle = find_cycle(edges)
    assert cycle is None, f"import cycle in {PACKAGE}: {' -> '.join(cycle or [])}; move the shared piece to the module it belongs to"


def test_no_function_level_imports_of_statebook_code():
    _, lazy = graph()
    assert lazy == [], f"imports inside functions (they dodge a cycle or hide a dependency): {lazy}"


def test_the_cycle_finder_finds_a_cycle():
    """The checker itself can fail: the old engine <-> polling pair and a longer ring are cycles."""
    assert find_cycle({"engine": {"polling"}, "polling": {"engine"}}) == ["engine", "polling", "engine"]
    ring = {"requests": {"polling"}, "polling": {"runs"}, "runs": {"store"}, "store": {"requests"}}
    assert find_cycle(ring) == ["polling", "runs", "store", "requests", "polling"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
