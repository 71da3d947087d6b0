"""Write ``specs/<entity_type>.md`` for every built-in lifecycle, or check that they are current.

    python -m statebook.adapters.specgen          # rewrite the pages
    python -m statebook.adapters.specgen --check  # exit 1 when a page is stale or missing
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from statebook.lifecycle import Registry
from statebook.lifecycle.diagram import spec_page

from .registry import builtin_registry

SPECS_DIR = Path(__file__).resolve().parent.parent / "specs"
"""The ``specs/`` folder next to ``adapters/`` in the source tree."""


def pages(registry: Registry | None = None, specs_dir: Path = SPECS_DIR) -> dict[Path, str]:
    """Each lifecycle's page path and its expected content."""
    registry = registry if registry is not None else builtin_registry()
    return {specs_dir / f"{lc.entity_type}.md": spec_page(lc) for lc in sorted(registry, key=lambda lc: lc.entity_type)}


def stale(registry: Registry | None = None, specs_dir: Path = SPECS_DIR) -> list[Path]:
    """Pages that are missing or differ from what their lifecycle generates."""
    return [
        path for path, text in pages(registry, specs_dir).items()
        if not path.exists() or path.read_text(encoding="utf-8") != text
    ]


def write(registry: Registry | None = None, specs_dir: Path = SPECS_DIR) -> list[Path]:
    """Rewrite the pages that changed; returns them."""
    changed = stale(registry, specs_dir)
    expected = pages(registry, specs_dir)
    specs_dir.mkdir(parents=True, exist_ok=True)
    for path in changed:
        path.write_text(expected[path], encoding="utf-8")
    return changed


def main(argv: list[str] | None = None, specs_dir: Path = SPECS_DIR) -> int:
    """Write (or with ``--check`` report stale) the generated spec pages of the built-in lifecycles; returns the
    exit code.
    """
    parser = argparse.ArgumentParser(prog="python -m statebook.adapters.specgen", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report stale pages and exit 1 instead of writing")
    args = parser.parse_args(argv)
    if args.check:
        outdated = stale(specs_dir=specs_dir)
        for path in outdated:
            print(f"stale: {path} (regenerate with python -m statebook.adapters.specgen)", file=sys.stderr)
        return 1 if outdated else 0
    for path in write(specs_dir=specs_dir):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
