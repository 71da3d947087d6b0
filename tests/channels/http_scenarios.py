"""Scenario builders: each HTTP channel wired to a real :mod:`http_server` per contract scenario."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from http_server import HttpServer, serve, unreachable

from statebook.adapters.channels.contract import Scenario

BEHAVIOUR = {"accept": "accept", "reject": "reject", "retry_then_accept": "fail_then_accept",
             "hang_after_admission": "hang_after_body", "rate_limited": "rate_limited"}
"""Contract scenario -> server behaviour (``hang_before_admission`` is :func:`http_server.unreachable`)."""


@contextlib.asynccontextmanager
async def http_scenario(name: str, profile: str, make: Callable[[str], tuple[Any, tuple[str, ...]]],
                        **options: Any) -> AsyncIterator[Scenario]:
    """``make(base_url) -> (channel, secrets)``; the channel is closed on exit."""
    if name == "hang_before_admission":
        with unreachable() as base:
            channel, secrets = make(base)
            try:
                yield Scenario(channel, effects=lambda: 0, secrets=secrets)
            finally:
                await channel.aclose()
        return
    async with serve(profile, BEHAVIOUR[name], **options) as server:
        channel, secrets = make(server.url)
        try:
            yield Scenario(channel, effects=server.effects, secrets=secrets, release=server.release)
        finally:
            await channel.aclose()


@contextlib.asynccontextmanager
async def running(profile: str, behaviour: str, make: Callable[[str], Any], **options: Any
                  ) -> AsyncIterator[tuple[HttpServer, Any]]:
    """A server and a channel ``make(server.url)`` on it, both closed on exit."""
    async with serve(profile, behaviour, **options) as server:
        channel = make(server.url)
        try:
            yield server, channel
        finally:
            await channel.aclose()
