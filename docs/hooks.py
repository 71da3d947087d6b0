"""mkdocs hooks: the command-line reference, generated from the click tree of ``statebook.adapters.cli.app``.

A page containing the line ``<!-- statebook-cli -->`` gets, in its place, one section per command: its usage,
help text and options, walked with ``list_commands``/``get_command`` so commands loaded lazily are found too.
"""

from __future__ import annotations

import click

MARKER = "<!-- statebook-cli -->"


def _root() -> click.Command:
    import typer.main

    from statebook.adapters.cli import app

    return typer.main.get_command(app)


def _walk(command: click.Command, path: list[str], ctx: click.Context):
    yield path, command, ctx
    if isinstance(command, click.Group):
        for name in command.list_commands(ctx):
            sub = command.get_command(ctx, name)
            if sub is None or sub.hidden:
                continue
            yield from _walk(sub, [*path, name], click.Context(sub, info_name=name, parent=ctx))


def _param_row(param: click.Parameter, ctx: click.Context) -> str | None:
    record = param.get_help_record(ctx) if isinstance(param, click.Option) else None
    if isinstance(param, click.Option):
        if param.hidden or record is None:
            return None
        names, text = record
    else:
        names, text = param.human_readable_name, getattr(param, "help", "") or "(argument)"
    return f"| `{names}` | {_cell(text)} |"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def cli_reference() -> str:
    """The reference, as Markdown: a heading per command, then usage, help and a table of its parameters."""
    root = _root()
    lines: list[str] = []
    for path, command, ctx in _walk(root, ["statebook"], click.Context(root, info_name="statebook")):
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
