"""mkdocs hooks: the command-line reference, generated from the click tree of ``statebook.adapters.cli.app``,
and a check of the rendered API reference.

A page containing the line ``<!-- statebook-cli -->`` gets, in its place, one section per command: its usage,
help text and options, walked with ``list_commands``/``get_command`` so commands loaded lazily are found too.

After the build, :func:`reference_problems` reads each page under ``reference/api/``; any problem fails the
build (``make docs``) with the list.
"""

from __future__ import annotations

import html
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

MARKER = "<!-- statebook-cli -->"
ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "build" / "docs-src"
"""Where the API reference reads the code: ``statebook/<part>`` links to each top-level folder (the package
maps ``statebook.lifecycle`` to ``lifecycle/`` and so on, which a source reader cannot see from the tree)."""
PARTS = ("lifecycle", "outbox", "scheduler", "adapters")


def on_startup(command: str, dirty: bool) -> None:
    """Lay out ``build/docs-src/statebook/`` as links to the parts' folders, for mkdocstrings to read."""
    package = SOURCES / "statebook"
    package.mkdir(parents=True, exist_ok=True)
    for part in PARTS:
        link = package / part
        if not link.is_symlink():
            link.symlink_to(ROOT / part, target_is_directory=True)


def _root() -> Any:
    import typer.main

    from statebook.adapters.cli import app

    return typer.main.get_command(app)


def _walk(command: Any, path: list[str], ctx: Any):
    yield path, command, ctx
    if hasattr(command, "list_commands"):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or getattr(sub, "hidden", False):
                continue
            yield from _walk(sub, [*path, name], sub.context_class(sub, info_name=name, parent=ctx))


def _param_row(param: Any, ctx: Any) -> str | None:
    if getattr(param, "hidden", False):
        return None
    if param.param_type_name == "option":
        record = param.get_help_record(ctx)
        if record is None:
            return None
        names, text = record
        if names == "--help":
            return None  # on every command; said once, at the top of the page
    else:
        record = param.get_help_record(ctx) if hasattr(param, "get_help_record") else None
        names = record[0] if record else param.name.upper()
        text = getattr(param, "help", None) or ("required" if param.required else "optional")
    return f"| `{names}` | {_cell(text)} |"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def cli_reference() -> str:
    """The reference, as Markdown: a heading per command, then usage, help and a table of its parameters."""
    root = _root()
    lines: list[str] = []
    for path, command, ctx in _walk(root, ["statebook"], root.context_class(root, info_name="statebook")):
        depth = min(len(path) + 1, 6)
        lines += [f"{'#' * depth} `{' '.join(path)}`", ""]
        usage = " ".join(command.collect_usage_pieces(ctx))
        lines += ["```", f"{' '.join(path)} {usage}".rstrip(), "```", ""]
        help_text = (command.help or command.short_help or "").strip()
        if help_text:
            lines += [help_text.replace("\b\n", ""), ""]
        rows = [row for row in (_param_row(p, ctx) for p in command.get_params(ctx)) if row]
        if rows:
            lines += ["| parameter | meaning |", "| --- | --- |", *rows, ""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:
    """Expand the CLI marker on the page that has it."""
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    return markdown


RAW_ROLE = re.compile(r":(?:py:)?(?:mod|func|class|meth|data|attr|exc|obj|const):`")
HEADING = re.compile(r'<div class="doc doc-object doc-(\w+)">\s*<h(\d) id="([^"]+)"')


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def _code_lines(docstring: str) -> list[str]:
    """The lines of a docstring's examples: doctest lines, and each reST literal block (after ``::``)."""
    lines = docstring.splitlines()
    found = [line.strip() for line in lines if line.lstrip().startswith((">>> ", "... "))]
    for i, line in enumerate(lines):
        if line.rstrip().endswith("::"):
            indent = len(line) - len(line.lstrip())
            for body in lines[i + 1:]:
                if body.strip() and len(body) - len(body.lstrip()) <= indent:
                    break
                if body.strip():
                    found.append(body.strip())
    return found


def _docstring(path: str) -> str | None:
    """The docstring of the object at the dotted ``path`` (a module, or an attribute of one), if importable."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return None
        if not (inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj)):
            return None  # a value's docstring is its type's
        return inspect.cleandoc(obj.__doc__) if isinstance(obj.__doc__, str) else None
    return None


def reference_problems(page: str, name: str = "page") -> list[str]:
    """What is wrong with one rendered API page: a raw Sphinx role, not exactly one title, a class whose methods
    come after its attributes, or an example whose lines are not all in the page's code blocks."""
    problems = []
    visible = _text(re.sub(r"<(script|style)\b.*?</\1>", "", page, flags=re.S))
    for role in sorted(set(RAW_ROLE.findall(visible))):
        problems.append(f"{name}: a raw role {role!r} is shown")
    titles = re.findall(r"<h1\b", page)
    if len(titles) != 1:
        problems.append(f"{name}: {len(titles)} titles (<h1>), not one")
    headings = [(kind, anchor) for kind, _, anchor in HEADING.findall(page)]
    for kind, anchor in headings:
        if kind != "class":
            continue
        members = [(k, a) for k, a in headings if a.startswith(anchor + ".") and "." not in a[len(anchor) + 1:]]
        kinds = [k for k, _ in members]
        if "function" in kinds and any(k != "function" for k in kinds[: len(kinds) - kinds[::-1].index("function")]):
            problems.append(f"{name}: {anchor} lists a method after an attribute: {[a for _, a in members]}")
    code = "\n".join(_text(block) for block in re.findall(r"<pre\b.*?</pre>", page, flags=re.S))
    for _, anchor in headings:
        doc = _docstring(anchor)
        for line in _code_lines(doc or ""):
            if line not in code:
                problems.append(f"{name}: {anchor}: the example line {line!r} is not in a code block")
                break
    return problems


def on_post_build(config: Any) -> None:
    """Fail the build when a rendered API page has a problem (see :func:`reference_problems`)."""
    from mkdocs.exceptions import PluginError

    root = Path(config["site_dir"]) / "reference" / "api"
    problems = [p for page in sorted(root.rglob("index.html"))
                for p in reference_problems(page.read_text(), page.parent.name)]
    if problems:
        raise PluginError("the API reference renders badly:\n" + "\n".join(problems))
