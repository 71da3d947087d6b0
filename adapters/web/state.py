"""What every page of one console app shares: the book, the settings and the live-update hub."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from starlette.requests import Request

    from statebook.adapters.settings import Settings, WebSettings
    from statebook.lifecycle import Book


@dataclass
class Console:
    """One console app's shared state (``request.app.state.console``)."""

    book: Book
    settings: Settings
    session_key: bytes
    """Signs session cookies and derives CSRF tokens (never shown, never logged)."""
    links: Any = None
    """The responders' link signer (``links.LinkSigner``) when ``[web] public_url`` is set."""
    live: Any = None
    """The live-update hub (``live.py``) once started."""
    extras: dict[str, Any] = field(default_factory=dict)

    @property
    def web(self) -> WebSettings:
        """The ``[web]`` section."""
        return self.settings.web

    @property
    def local(self) -> bool:
        """No sign-in configured: only loopback clients are served, each as the local operator."""
        return not self.web.sign_in


def console(request: Request) -> Console:
    """The :class:`Console` of the app serving ``request``."""
    served: Console = request.app.state.console
    return served
