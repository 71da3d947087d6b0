"""From ``[notifications]`` settings to running channels: the built-in sections, the custom adapters
(``channels = { name = "module:attr" }``), the WebSocket endpoint to serve, and the dispatch transports
that make provider incidents follow the human (``follow:<channel>``).

Sections are checked against their adapter's model when the settings load (:func:`check_sections`; a section
whose extra is missing only when its channel is built or listed);
secrets are read only when the daemon builds the channels (:func:`build_channels`), and an unreadable
one is a one-line :class:`~statebook.adapters.errors.ConfigError` naming where it was looked for.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from statebook.lifecycle.clock import Clock
from statebook.outbox.notifications import Channel

from ..errors import ConfigError
from ..extras import MissingExtra
from .secrets import SecretError

log = logging.getLogger(__name__)

BUILTINS: Mapping[str, tuple[str, str]] = {
    "slack": ("statebook.adapters.channels.slack", "SlackConfig"),
    "email": ("statebook.adapters.channels.email", "EmailConfig"),
    "pagerduty": ("statebook.adapters.channels.pagerduty", "PagerDutyConfig"),
    "webhook": ("statebook.adapters.channels.webhook", "WebhookConfig"),
    "websocket": ("statebook.adapters.channels.websocket", "WebSocketConfig"),
    "apprise": ("statebook.adapters.channels.apprise", "AppriseConfig"),
}
"""Channel name -> (module, config model) of the built-in adapters."""


def config_model(name: str) -> type[BaseModel]:
    """The pydantic settings model of the built-in channel ``name`` (imported on demand); ``KeyError`` for an
    unknown name.
    """
    module, attr = BUILTINS[name]
    model: type[BaseModel] = getattr(importlib.import_module(module), attr)
    return model


def _problem(name: str, exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"notifications.{name}{'.' + where if where else ''}: {first['msg']}"


def check_sections(settings: Any, *, missing_ok: bool = False) -> dict[str, BaseModel]:
    """Each built-in section given in ``settings`` (a NotificationSettings) parsed by its adapter's
    model; ValueError naming the first problem, or a channel configured both as a section and in
    ``channels``. A section whose adapter's extra is not installed is :class:`~..extras.MissingExtra`, or
    left out with ``missing_ok`` (loading settings: a command that sends nothing must still run)."""
    found: dict[str, BaseModel] = {}
    for name in BUILTINS:
        section = getattr(settings, name, None)
        if section is None:
            continue
        if name in settings.channels:
            raise ValueError(f"channel {name!r} is configured twice: as [notifications.{name}] and in "
                             "notifications.channels; keep one")
        try:
            model = config_model(name)
        except MissingExtra:
            if missing_ok:
                continue
            raise
        try:
            found[name] = model.model_validate(section)
        except ValidationError as exc:
            raise ValueError(_problem(name, exc)) from None
    return found


@dataclass
class Built:
    """What the daemon runs: the channels by name, services to start before delivery and stop after
    it (the WebSocket endpoint), dispatch transports by route prefix, and clients to close."""

    channels: dict[str, Channel] = field(default_factory=dict)
    services: list[Any] = field(default_factory=list)
    transports: dict[str, Any] = field(default_factory=dict)
    closers: list[Any] = field(default_factory=list)

    async def aclose(self) -> None:
        """Close every client the built channels opened; a client that fails to close is logged and the others still
        close.
        """
        for item in self.closers:
            try:
                await item.aclose()
            except Exception:  # noqa: BLE001 - one client that fails to close must not keep the others open
                log.warning("could not close %s", type(item).__name__)


def build_channels(settings: Any, *, clock: Clock | None = None) -> Built:
    """The built-in channels the sections configure (secrets read now), as :class:`Built`; ``clock``
    (the book's) for what they time themselves (Retry-After dates, signature timestamps)."""
    built = Built()
    for name, config in check_sections(settings).items():
        try:
            build = config.build  # type: ignore[attr-defined]
            made = build(clock=clock) if "clock" in inspect.signature(build).parameters else build()
        except SecretError as exc:
            raise ConfigError(f"notifications.{name}: {exc}") from None
        except ValueError as exc:
            raise ConfigError(f"notifications.{name}: {exc}") from None
        if isinstance(made, tuple):  # (service, channel): the WebSocket endpoint and its channel
            service, made = made
            built.services.append(service)
        built.channels[name] = made
        if callable(getattr(made, "aclose", None)):
            built.closers.append(made)
        follow = getattr(config, "build_follow", None)
        if callable(follow):  # a provider that keeps incidents: its follow:<name> dispatch transport
            transport = follow()
            built.transports[f"follow:{name}"] = transport
            if callable(getattr(transport, "aclose", None)):
                built.closers.append(transport)
    return built
