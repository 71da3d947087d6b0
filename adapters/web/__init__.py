"""The web console and the responders' pages (``statebook[web]``; docs/console.md).

>>> app = create_app(book, settings)          # doctest: +SKIP  -- an ASGI app: mount it, or serve it
>>> uvicorn.run(app, host="127.0.0.1", port=8780)                                  # doctest: +SKIP

``statebook web`` serves it on its own and ``statebook run --web-port N`` from the daemon. Every page
is a client of the same public API as the CLI: an action is that API's transition with the signed-in
person as actor, and a responder's answer is the response lifecycle's transition with the link's
recipient as actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["create_app"]

if TYPE_CHECKING:
    from starlette.applications import Starlette

    from statebook.adapters.settings import Settings
    from statebook.lifecycle import Book


def create_app(book: Book, settings: Settings | None = None, **options: Any) -> Starlette:
    """The console as an ASGI application over ``book`` (see :func:`statebook.adapters.web.app.create_app`)."""
    from statebook.adapters.extras import require

    require("starlette", extra="web", feature="the web console")
    require("jinja2", extra="web", feature="the web console")
    from .app import create_app as build

    return build(book, settings, **options)
