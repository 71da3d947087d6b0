"""The optional extras: one import-or-explain helper, so a feature whose extra is missing is one line.

``pip install statebook`` is the core (lifecycles, outbox, scheduler, SQLite, the CLI, migrations); each edge
that needs a third-party library imports it through :func:`require` where the feature starts, never at the
import of a core module (tests/test_install.py checks both).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from statebook.lifecycle import StatebookError

__all__ = ["EXTRAS", "MissingExtra", "require"]

EXTRAS: dict[str, tuple[str, ...]] = {
    "postgres": ("asyncpg",),
    "channels": ("httpx", "aiosmtplib", "websockets"),
    "metrics": ("prometheus_client",),
    "audit": ("cryptography",),
    "apprise": ("apprise",),
    "web": ("starlette", "jinja2", "uvicorn", "argon2", "multipart"),
    "otel": ("opentelemetry",),
}
"""Each extra and the top-level modules it installs (pyproject.toml's ``optional-dependencies``)."""


class MissingExtra(StatebookError, ImportError):
    """A feature was used whose extra is not installed; the message names the feature and the pip command
    (the CLI exits 2)."""


def require(module: str, *, extra: str, feature: str, error: type[MissingExtra] = MissingExtra) -> ModuleType:
    """``module`` imported, or ``error`` naming ``feature`` and ``pip install 'statebook[extra]'``.

    >>> require("json", extra="metrics", feature="a test").__name__
    'json'
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; one of {', '.join(EXTRAS)}")
    try:
        __import__(module)  # the import statement's hook, so a test that hides a module hides it here too
    except ImportError as exc:
        missing = (getattr(exc, "name", None) or module).split(".")[0]
        raise error(f"{feature}: the {extra!r} extra is not installed (no module {missing}): "
                    f"pip install 'statebook[{extra}]'") from None
    return importlib.import_module(module)
