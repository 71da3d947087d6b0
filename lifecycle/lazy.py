"""Package names that load on first use (PEP 562), for ``statebook.outbox``, ``.outbox.notifications`` and
``.scheduler``: a command imports only the modules it uses (specs/cli.md C10). A package lists its names under
``TYPE_CHECKING`` for type checkers and the API reference, and the same names by module for :func:`lazy_names`
(tests/test_lazy_packages.py keeps the two lists together)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, where: Mapping[str, tuple[str, ...]], namespace: dict[str, Any]
               ) -> tuple[dict[str, str], Callable[[str], Any], Callable[[], list[str]]]:
    """For ``package`` (its ``__name__``) whose names live in the modules of ``where`` (relative module -> names):
    the name -> module table, and the module's ``__getattr__`` (imports the module, keeps the value in
    ``namespace``, the package's globals) and ``__dir__``."""
    module_of = {name: module for module, names in where.items() for name in names}

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *module_of})

    return module_of, __getattr__, __dir__
