"""Every public function and class of statebook has a docstring (issue 17, "Documentation").

The walk imports every module under the ``statebook`` packages, takes the public names *defined* in each module
(not re-exports), and the public methods and properties those classes define themselves, and lists what has no
docstring. A name is public when it does not start with ``_``; a module's ``__all__``, when it has one, narrows
its names to those listed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

PACKAGES = ("statebook.lifecycle", "statebook.outbox", "statebook.scheduler", "statebook.adapters")

# Modules that are not importable code: Alembic's environment script and its revision scripts, which Alembic
# loads by file path inside a migration context (importing them outside one fails by design).
SCRIPTS_PREFIXES: tuple[str, ...] = ("statebook.adapters.migrations.env", "statebook.adapters.migrations.versions.")

# Modules whose missing docstrings are not reported. Empty: every module is held to the rule.
ALLOWED_MISSING: frozenset[str] = frozenset()


def modules() -> list[str]:
    """Every importable module name under the statebook packages, sorted."""
    names: set[str] = set()
    for package_name in PACKAGES:
        package = importlib.import_module(package_name)
        names.add(package_name)
        for info in pkgutil.walk_packages(package.__path__, prefix=package_name + "."):
            if not info.name.startswith(SCRIPTS_PREFIXES):
                names.add(info.name)
    return sorted(names)


def _public(module, name: str) -> bool:
    if name.startswith("_"):
        return False
    exported = getattr(module, "__all__", None)
    return exported is None or name in exported


def _own_doc(obj) -> bool:
    doc = obj.__doc__ if not isinstance(obj, property) else (obj.fget.__doc__ if obj.fget else None)
    return bool(doc and doc.strip())


def missing_in(module_name: str) -> list[str]:
    """The public functions, classes and methods of one module that have no docstring of their own."""
    module = importlib.import_module(module_name)
    missing = []
    if not (module.__doc__ or "").strip():
        missing.append(f"{module_name} (module)")
    for name, obj in vars(module).items():
        if not _public(module, name) or getattr(obj, "__module__", None) != module_name:
            continue
        if inspect.isfunction(obj):
            if not _own_doc(obj):
                missing.append(f"{module_name}.{name}")
        elif inspect.isclass(obj):
            # A dataclass, enum or NamedTuple without a docstring gets a generated one: that is not a docstring.
            doc = obj.__dict__.get("__doc__")
            generated = doc is not None and doc.startswith(f"{obj.__name__}(")
            if not (doc and doc.strip()) or generated:
                missing.append(f"{module_name}.{name}")
            for attr, member in vars(obj).items():
                if attr.startswith("_"):
                    continue
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if inspect.isfunction(member) and not member.__qualname__.startswith(obj.__qualname__ + "."):
                    continue  # a function assigned into the class, documented where it is defined
                if inspect.isfunction(member) or isinstance(member, property):
                    if not _own_doc(member) and not _inherited_doc(obj, attr):
                        missing.append(f"{module_name}.{name}.{attr}")
    return missing


def _inherited_doc(cls, attr: str) -> bool:
    """An override of a documented method (a Protocol's, a base class's) inherits its documentation."""
    for base in cls.__mro__[1:]:
        member = base.__dict__.get(attr)
        if member is not None and _own_doc(member.__func__ if isinstance(member, (staticmethod, classmethod))
                                           else member):
            return True
    return False


def test_the_walk_finds_every_part():
    """The walk covers each part and its subpackages, so a missing docstring cannot hide in an unwalked module."""
    found = modules()
    for expected in ("statebook.lifecycle.engine", "statebook.outbox.notifications.intake",
                     "statebook.scheduler.engine", "statebook.adapters.channels.slack",
                     "statebook.lifecycle.testing"):
        assert expected in found


def test_the_check_sees_a_missing_docstring(monkeypatch):
    """The check is able to fail: a public function stripped of its docstring is reported."""
    from statebook.lifecycle import engine

    monkeypatch.setattr(engine.transition, "__doc__", None)
    assert "statebook.lifecycle.engine.transition" in missing_in("statebook.lifecycle.engine")


def test_the_allow_list_names_real_modules():
    """Each allowed module exists, so the list cannot silently outlive a rename."""
    assert ALLOWED_MISSING <= set(modules())


@pytest.mark.parametrize("module_name", [m for m in modules() if m not in ALLOWED_MISSING])
def test_every_public_function_and_class_has_a_docstring(module_name):
    """Every public function, class and public method defined in the module has a docstring."""
    assert missing_in(module_name) == []
