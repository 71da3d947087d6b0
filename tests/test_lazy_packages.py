"""The packages whose names load on first use (``statebook.outbox``, ``.outbox.notifications``, ``.scheduler``):
a command imports only the modules it uses (specs/cli.md C10), while mypy, pyright and the API reference read
the same names from the imports under ``TYPE_CHECKING``. The two lists, and ``__all__``, must not drift apart."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

LAZY = ["statebook.outbox", "statebook.outbox.notifications", "statebook.scheduler"]


def typed_imports(package: object) -> dict[str, str]:
    """name -> relative module, from the ``if TYPE_CHECKING:`` block of the package's ``__init__``."""
    tree = ast.parse(inspect.getsource(package))  # type: ignore[arg-type]
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level == 1, ast.dump(imp)
                found.update({a.asname or a.name: "." + (imp.module or "") for a in imp.names})
    return found


@pytest.mark.parametrize("name", LAZY)
def test_every_public_name_loads_from_the_module_the_type_checker_reads(name: str):
    package = importlib.import_module(name)
    typed = typed_imports(package)
    lazy = package._MODULE_OF
    assert typed == lazy, "the TYPE_CHECKING imports and _WHERE differ"
    eager = {n for n in package.__all__ if n not in lazy}
    assert eager <= set(vars(package)), f"names in __all__ neither lazy nor imported: {eager - set(vars(package))}"
    assert set(lazy) <= set(package.__all__), f"lazy names missing from __all__: {set(lazy) - set(package.__all__)}"
    for public in package.__all__:
        value = getattr(package, public)
        if public in lazy:
            assert value is getattr(importlib.import_module(lazy[public], name), public)
    assert set(package.__all__) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error():
    import statebook.outbox

    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        statebook.outbox.no_such_name  # noqa: B018
    with pytest.raises(ImportError):
        exec("from statebook.scheduler import no_such_name", {})
