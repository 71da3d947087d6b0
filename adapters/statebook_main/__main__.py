"""``python -m statebook``: the same command as the ``statebook`` script.

This folder is installed as the top of the ``statebook`` namespace package (pyproject's package-dir),
holding only this file, so the parts (statebook.lifecycle, ...) stay where they are."""

from statebook.adapters.cli import main

if __name__ == "__main__":
    main()
