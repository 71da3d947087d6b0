"""A griffe extension for the API reference: docstrings written for Sphinx readers render as Markdown.

The docstrings keep Sphinx's roles (``:func:`send_notification```) and literal blocks (``Example::``), which
read well in ``help()`` and an editor; converting them here, once, keeps a hundred-odd modules free of
Markdown-only syntax and lets a new docstring use the same conventions without knowing about the site:

- a role becomes a cross-reference to the object's page when the reference renders it, and plain code when it
  does not (an *optional* autorefs link: never a broken link, never a raw ``:func:``);
- a paragraph ending in ``::`` and the indented block after it become a fenced ``python`` block, whole;
- a class lists its public methods before its attributes and properties (its wiring): the order is handed to
  mkdocstrings as the class's exports (``members_order: [__all__, source]``), modules keep their ``__all__``.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(mod|func|class|meth|data|attr|exc|obj|const):`([^`]+)`")
"""a Sphinx cross-reference role and its target (``~`` shortens the title to the last name)"""


def _target(target: str, *, module: str, package: str, scope: str) -> tuple[str, str]:
    """(identifier, title) of a role's target, read where the docstring lives."""
    short = target.startswith("~")
    target = target.lstrip("~!")
    if target.startswith("."):
        dots = len(target) - len(target.lstrip("."))
        base = package.split(".")
        base = base[: len(base) - (dots - 1)] if dots > 1 else base
        identifier = ".".join([*base, target.lstrip(".")])
    elif target.split(".")[0] in ("statebook", "sqlalchemy", "hypothesis", "pytest", "asyncio", "typing"):
        identifier = target
    else:
        identifier = f"{scope}.{target}"
    title = target.rsplit(".", 1)[-1] if short or target.startswith(".") else target
    return identifier, title


def convert_roles(text: str, *, module: str, package: str, scope: str) -> str:
    """``text`` with each role replaced by an optional cross-reference showing the name as code."""

    def one(match: re.Match[str]) -> str:
        identifier, title = _target(match.group(2), module=module, package=package, scope=scope)
        return (f'<autoref identifier="{html.escape(identifier)}" optional>'
                f"<code>{html.escape(title)}</code></autoref>")

    return ROLE.sub(one, text)


def fence_literal_blocks(text: str) -> str:
    """``text`` with each reST literal block (a line ending in ``::``, a blank line, an indented block) fenced
    as ``python``, so Markdown keeps every line of it in one code block."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and not line.strip().startswith((">>>", "...")):
            indent = len(line) - len(line.lstrip())
            j = i + 1
            while j < len(lines) and not lines[j].strip():
                j += 1
            block_indent = len(lines[j]) - len(lines[j].lstrip()) if j < len(lines) else 0
            if j < len(lines) and block_indent > indent:
                body: list[str] = []
                while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) >= block_indent):
                    body.append(lines[j][block_indent:])
                    j += 1
                while body and not body[-1].strip():
                    body.pop()
                head = line.rstrip()[:-1].rstrip()
                pad = " " * indent
                out += [head if head.strip() else "", "", f"{pad}```python", *(pad + b if b else "" for b in body),
                        f"{pad}```", ""]
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def method_first(cls: griffe.Class) -> list[str]:
    """The names of ``cls``'s members, its methods (in source order) before everything else."""
    members = sorted(cls.members.values(), key=lambda m: (m.lineno or 0))
    methods = [m.name for m in members if m.is_function and "property" not in getattr(m, "labels", set())]
    return methods + [m.name for m in members if m.name not in methods]


class SphinxToMarkdown(griffe.Extension):
    """Rewrite each docstring griffe loads, and order each class's members methods first."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Convert the object's docstring, read in the scope it lives in."""
        if obj.docstring is None:
            return
        module = obj.module.path if not obj.is_module else obj.path
        package = module if (obj.module.is_init_module if not obj.is_module else obj.is_init_module) \
            else module.rsplit(".", 1)[0]
        scope = obj.path if obj.is_class or obj.is_module else (obj.parent.path if obj.parent else module)
        value = fence_literal_blocks(obj.docstring.value)
        obj.docstring.value = convert_roles(value, module=module, package=package, scope=scope)

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        """Give every class of the package its method-first order."""
        for cls in _classes(pkg):
            cls.exports = method_first(cls)


def _classes(obj: griffe.Object) -> list[griffe.Class]:
    found: list[griffe.Class] = []
    for member in obj.members.values():
        if member.is_alias:
            continue
        if member.is_class:
            found.append(member)
        if member.is_class or member.is_module:
            found += _classes(member)
    return found
