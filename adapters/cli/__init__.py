"""statebook's command line. ``main`` is the console-script entry point.

Commands are listed in ``app.COMMANDS`` (name, module, short help) and their module is imported when
they run; a new command module adds its line there.
"""

from __future__ import annotations

from .app import app


def main() -> None:
    """Run the ``statebook`` command."""
    app()


__all__ = ["app", "main"]
