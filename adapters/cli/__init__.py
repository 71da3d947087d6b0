"""statebook's command line. ``main`` is the console-script entry point."""

from __future__ import annotations

from .app import app

# Each module registers its commands on ``app`` when imported.
from . import lifecycle as _lifecycle  # noqa: F401,E402
from . import dispatch as _dispatch  # noqa: F401,E402
from . import notify as _notify  # noqa: F401,E402
from . import channels as _channels  # noqa: F401,E402
from . import schedule as _schedule  # noqa: F401,E402
from . import audit as _audit  # noqa: F401,E402
from . import check as _check  # noqa: F401,E402
from . import stats as _stats  # noqa: F401,E402
from . import db as _db  # noqa: F401,E402


def main() -> None:
    app()


__all__ = ["app", "main"]
