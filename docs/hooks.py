"""mkdocs hooks: the command-line reference, generated from the click tree of ``statebook.adapters.cli.app``.

A page containing the line ``<!-- statebook-cli -->`` gets, in its place, one section per command: its usage,
help text and options, walked with ``list_commands``/``get_command`` so commands loaded lazily are found too.
"""

from __future__ import annotations

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
