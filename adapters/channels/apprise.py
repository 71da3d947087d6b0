"""The Apprise channel: the many services Apprise reaches (``pip install 'statebook[apprise]'``).

>>> AppriseConfig(urls=SecretRef(env="APPRISE_URLS")).build()   # doctest: +SKIP

Apprise URLs embed their credentials (``tgram://bottoken/ChatID``, ``json://user:password@host/path``),
so the URLs are one secret (whitespace- or comma-separated when there are several), read once at
``build`` and never shown: ``repr`` names how many there are and of which schemes.

What this channel can and cannot tell (specs/notifications.md N4-N6):

- It does not report its admission (``reports_admission = False``): Apprise makes its provider's effect
  somewhere inside ``async_notify``, so the runtime admits the call at its entry and everything after
  may be an effect — a timeout or a cut is ``UNKNOWN``, never ``NOT_STARTED``.
- It does not guard provider attempts (``guards_provider_attempts = False``): the retries Apprise makes
  are its own and cannot be fenced; only the entry is guarded.
- ``async_notify`` answers with a truth value: true is ``SUCCESS``; false is ``UNKNOWN``, never
  ``REJECTED`` — Apprise does not tell a refusal (a 400) from a failure (a 500, a reset) or a partial
  delivery to several URLs, and a ``5xx`` does not prove nothing happened. A provider's 429 is the same
  false: this channel never reports ``RATE_LIMITED`` (the runtime's own bucket still limits it).

The call is bounded by ``guard.remaining()`` (given to Apprise as its own ``timeout`` where Apprise
supports one, and enforced around it); when it is cut, Apprise's worker thread may still finish later —
its late answer changes nothing, the observation is already recorded.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict

from statebook.lifecycle.errors import StatebookError
from statebook.outbox.notifications import Delivery, Guard, Observation, ProviderOutcome

from ..extras import MissingExtra, require
from .links import with_lines
from .secrets import SecretRef, scrub

__all__ = ["AppriseChannel", "AppriseConfig", "AppriseUnavailable"]

log = logging.getLogger("statebook.adapters.channels.apprise")

MARGIN_SECONDS = 0.05
"""Kept back from ``guard.remaining()``: the channel ends its own call just before the runtime would cut it."""


class AppriseUnavailable(StatebookError):
    """The Apprise channel is configured but cannot be built: the extra is not installed, or a URL is
    not one Apprise understands (the message never shows a URL: they hold credentials)."""


class AppriseMissing(MissingExtra, AppriseUnavailable):
    """The apprise channel is configured but its extra is not installed."""


def _apprise() -> Any:
    return require("apprise", extra="apprise", feature="the apprise channel", error=AppriseMissing)


class AppriseConfig(BaseModel):
    """The ``[notifications.apprise]`` settings: ``urls``, where the Apprise URLs are read from."""

    model_config = ConfigDict(extra="forbid")

    urls: SecretRef

    def build(self) -> AppriseChannel:
        """The channel, with the URLs read once and loaded into Apprise."""
        urls = [u for u in re.split(r"[\s,]+", self.urls.reveal()) if u]
        return AppriseChannel(urls)


class _Scrubbing(logging.Filter):
    """Scrubs the URLs' secrets from Apprise's own log records (it may log a URL it failed on)."""

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        clean = scrub(text, self.secrets)
        if clean != text:
            record.msg, record.args = clean, None
        return True


class AppriseChannel:
    """An Apprise channel over the given URLs (see the module docstring for its outcomes)."""

    name = "apprise"
    persistent = True
    reports_admission = False
    guards_provider_attempts = False

    def __init__(self, urls: Sequence[str]) -> None:
        apprise = _apprise()
        if not urls:
            raise AppriseUnavailable("the apprise channel's urls secret holds no URL")
        self._secrets = _secret_parts(urls)
        self._schemes = sorted({u.split("://", 1)[0] for u in urls})
        self._apprise = apprise.Apprise()
        for position, url in enumerate(urls, start=1):
            if not self._apprise.add(url):
                raise AppriseUnavailable(f"Apprise does not understand URL {position} of {len(urls)} "
                                         f"({_shown_scheme(url)})")
        self._count = len(urls)
        self._timeout = "timeout" in inspect.signature(apprise.Apprise.notify).parameters  # Apprise >= 2
        logger = logging.getLogger("apprise")
        if not any(isinstance(f, _Scrubbing) and f.secrets == self._secrets for f in logger.filters):
            logger.addFilter(_Scrubbing(self._secrets))

    def __repr__(self) -> str:
        return f"AppriseChannel({self._count} url{'s' if self._count != 1 else ''}: {', '.join(self._schemes)})"

    __str__ = __repr__

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """One ``async_notify`` over every URL: SUCCESS when Apprise says so, UNKNOWN otherwise."""
        content = delivery.content
        title = str(content.get("title") or content.get("subject") or "")
        body = content.get("body", content.get("text"))
        text = str(body) if body not in (None, "") else (title or "(no content)")
        budget = max(0.0, guard.remaining() - MARGIN_SECONDS)
        options = {"timeout": max(0.001, budget)} if self._timeout else {}
        try:
            async with asyncio.timeout(budget):
                result = await self._apprise.async_notify(body=with_lines(text, delivery.links), title=title, **options)
        except TimeoutError:
            return Observation(ProviderOutcome.UNKNOWN, "no answer within the adapter deadline")
        except Exception as exc:  # Apprise's text may hold a URL: the type names it
            return Observation(ProviderOutcome.UNKNOWN, f"apprise failed: {type(exc).__name__}")
        if result:
            return Observation(ProviderOutcome.SUCCESS, f"apprise accepted it ({self._count} url{'s' if self._count != 1 else ''})")
        status = getattr(getattr(result, "status", None), "name", None)  # Apprise >= 2: FAILURE, TIMEOUT, PARTIAL
        return Observation(ProviderOutcome.UNKNOWN, "apprise reported a failure" + (f" ({status.lower()})" if status else "")
                           + "; it cannot tell a refusal from a failure")


def _shown_scheme(url: str) -> str:
    """A refused URL's scheme when it is one Apprise knows, else no part of it: a URL pasted without
    its scheme (``user:token@host``) or a token where the scheme goes would otherwise show its start."""
    scheme = url.split("://", 1)[0] if "://" in url else None
    try:
        from apprise.manager_plugins import NotificationManager

        # Apprise's plugin manager is unannotated.
        known = set(NotificationManager().schemas())  # type: ignore[no-untyped-call]
    except (ImportError, AttributeError):  # an Apprise without its plugin manager: show nothing
        known = set()
    if scheme is not None and scheme.lower() in known:
        return f"scheme {scheme!r}"
    return "an unknown scheme" if scheme is not None else "no scheme://"


def _secret_parts(urls: Sequence[str]) -> tuple[str, ...]:
    """What must never be shown: each URL, and each credential-looking part of it (user info, path
    segments and query values: Apprise URLs carry tokens in all of them)."""
    parts: set[str] = set()
    for url in urls:
        parts.add(url)
        rest = url.split("://", 1)[-1]
        userinfo, _, hostpath = rest.rpartition("@")
        for piece in re.split(r"[:/?&=#]+", userinfo):
            if len(piece) >= 4:
                parts.add(piece)
        path = hostpath.split("/", 1)[1] if "/" in hostpath else ""
        for piece in re.split(r"[/?&=#]+", path):
            if len(piece) >= 8:
                parts.add(piece)
    return tuple(sorted(parts, key=len, reverse=True))
