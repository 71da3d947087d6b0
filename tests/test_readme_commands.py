"""The README's command list cannot drift from the command line: it names every command and subcommand of
``statebook --help`` (walked from the click tree, as docs/hooks.py does for the CLI reference), and every
option it shows is an option of some command."""

from __future__ import annotations

import re
from pathlib import Path

import typer.main

from statebook.adapters.cli import app

ROOT = Path(__file__).resolve().parent.parent


def command_list() -> str:
    """The first code block under the README's "## Command line"."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Command line"):]
    return re.search(r"^```\n(.*?)^```", section, re.S | re.M).group(1)


def tree() -> dict[str, tuple[list[str], set[str]]]:
    """Each top-level command: its subcommands and every option name of it and of its subcommands."""
    root = typer.main.get_command(app)
    ctx = root.context_class(root, info_name="statebook")
    found = {}
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        sub_ctx = command.context_class(command, info_name=name, parent=ctx)
        children = command.list_commands(sub_ctx) if hasattr(command, "list_commands") else []
        options = {opt for p in command.get_params(sub_ctx) for opt in getattr(p, "opts", [])}
        for child in children:
            sub = command.get_command(sub_ctx, child)
            options |= {opt for p in sub.get_params(sub_ctx) for opt in getattr(p, "opts", [])}
        found[name] = (children, options)
    return found


def test_the_command_list_names_every_command_and_subcommand():
    lines = command_list().splitlines()
    commands = tree()
    assert len(commands) > 15
    for name, (children, _) in commands.items():
        own = [line for line in lines if re.search(rf"statebook {re.escape(name)}\b", line)]
        assert own, f"the README's command list has no line for `statebook {name}`"
        for child in children:
            word = re.compile(rf"(?<![\w-]){re.escape(child)}(?![\w-])")
            assert any(word.search(line) for line in own), f"`statebook {name} {child}` is missing from the list"


def test_every_option_the_list_shows_exists():
    root = typer.main.get_command(app)
    known = {opt for p in root.params for opt in getattr(p, "opts", [])}
    for _, options in tree().values():
        known |= options
    shown = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", command_list()))
    assert shown and not shown - known, f"options the README shows that no command has: {sorted(shown - known)}"
