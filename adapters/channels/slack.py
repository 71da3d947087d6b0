"""Slack: an incoming webhook (its URL is the secret) or ``chat.postMessage`` with a bot token.

The message is the notification's text (:func:`~.http.text_of`: ``text``, else ``title`` and ``body``
on two lines). A delivery with response links adds ``blocks``: the text, then an Acknowledge and a
Dismiss button, each opening its link (``url``) and carrying its token (``action_id`` ``ack`` /
``dismiss``, ``value`` the token) for the interactive endpoint ``POST /hooks/slack``.

Outcomes, per Slack's documented answers:

- webhook: ``2xx`` SUCCESS; ``429`` RATE_LIMITED (``Retry-After``); ``5xx`` retried, then UNKNOWN; any
  other ``4xx`` REJECTED with Slack's error text (``invalid_payload``, ``channel_not_found``, ...);
- bot: ``{"ok": true}`` SUCCESS; ``{"ok": false, "error": "ratelimited"}`` or ``429`` RATE_LIMITED;
  ``{"ok": false, "error": CODE}`` REJECTED with the code — except Slack's transient codes
  (``internal_error``, ``fatal_error``, ``service_unavailable``, ``request_timeout``), retried like a
  ``5xx``; a ``2xx`` that is not Slack's JSON is UNKNOWN (it reached Slack; what it did is unknown).

The bot posts to the recipient's entry in ``channels`` (recipient -> Slack channel id), else to
``channel``; a recipient with neither is NOT_STARTED (nothing is sent).

>>> SlackConfig(webhook_url=SecretRef(env="SLACK_WEBHOOK_URL")).build()   # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from statebook.lifecycle.clock import Clock
from statebook.lifecycle.codec import dumps
from statebook.outbox.notifications import Delivery, Guard, Observation, ProviderOutcome

from .http import (MAX_TRIES, Answer, HttpSender, Outgoing, checked_header, checked_url, clock_or_system, code, rate_limited,
                   status_verdict, text_of)
from .links import BUTTON_IDS, LABELS, ordered, token_of
from .secrets import SecretRef, mask

SLACK_API = "https://slack.com/api"
BLOCK_ID = "statebook-response"
SECTION_CHARS = 3000
"""The most a section block's text holds (Slack's limit); the message's ``text`` stays whole."""
TRANSIENT = frozenset({"internal_error", "fatal_error", "service_unavailable", "request_timeout"})
"""``ok: false`` codes Slack documents as its own failures: retried, never read as a refusal."""


class SlackChannel:
    """The ``slack`` channel: persistent; reports its admission and guards its retries (:mod:`.http`)."""

    name = "slack"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, *, webhook_url: str | None = None, bot_token: str | None = None, api_url: str = SLACK_API,
                 channel: str | None = None, channels: dict[str, str] | None = None, max_tries: int = MAX_TRIES,
                 trust_env: bool = True, clock: Clock | None = None) -> None:
        if (webhook_url is None) == (bot_token is None):
            raise ValueError("a Slack channel posts through exactly one of a webhook URL or a bot token")
        self.webhook_url = webhook_url and checked_url(webhook_url, "the Slack webhook_url")
        self.bot_token = bot_token and checked_header(bot_token, "the Slack bot_token")
        self.api_url = checked_url(api_url, "the Slack api_url").rstrip("/")
        self.channel = channel
        self.channels = dict(channels or {})
        self.clock = clock_or_system(clock)
        self.secrets = tuple(s for s in (webhook_url, bot_token) if s)
        self.sender = HttpSender(secrets=self.secrets, max_tries=max_tries, trust_env=trust_env)

    def __repr__(self) -> str:
        how = f"webhook_url={mask(self.webhook_url)}" if self.webhook_url else f"bot_token={mask(self.bot_token)}"
        return f"SlackChannel({how})"

    __str__ = __repr__

    async def aclose(self) -> None:
        """Close the HTTP client."""
        await self.sender.aclose()

    @staticmethod
    def message(delivery: Delivery) -> dict[str, Any]:
        """The message's fields: ``text``, and ``blocks`` with the response buttons when it has links."""
        text = text_of(delivery.content)
        links = ordered(delivery.links)
        if not links:
            return {"text": text}
        buttons = [{"type": "button", "action_id": BUTTON_IDS[action], "url": url, "value": token_of(url),
                    "text": {"type": "plain_text", "text": LABELS[action]},
                    **({"style": "primary"} if action == "acked" else {})} for action, url in links]
        section = {"type": "section", "text": {"type": "plain_text", "text": text[:SECTION_CHARS]}}
        return {"text": text, "blocks": [section, {"type": "actions", "block_id": BLOCK_ID, "elements": buttons}]}

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """Post the notification's text (see the module for the outcomes)."""
        message = self.message(delivery)
        if self.webhook_url is not None:
            outgoing = Outgoing(self.webhook_url, dumps(message).encode())
            return await self.sender.post(guard, lambda: outgoing, self._webhook_verdict)
        target = self.channels.get(delivery.recipient, self.channel)
        if target is None:
            return Observation(ProviderOutcome.NOT_STARTED, f"no Slack channel for recipient {delivery.recipient!r} "
                                                            "(set channel or channels)")
        outgoing = Outgoing(f"{self.api_url}/chat.postMessage", dumps({"channel": target, **message}).encode(),
                            {"authorization": f"Bearer {self.bot_token}", "content-type": "application/json; charset=utf-8"})
        return await self.sender.post(guard, lambda: outgoing, self._bot_verdict)

    def _webhook_verdict(self, answer: Answer) -> Observation | None:
        return status_verdict(answer, clock=self.clock, secrets=self.secrets)

    def _bot_verdict(self, answer: Answer) -> Observation | None:
        if not 200 <= answer.status < 300:
            return status_verdict(answer, clock=self.clock, secrets=self.secrets,
                                  provider_code=lambda a: _error(a.json()))
        reply = answer.json()
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            return Observation(ProviderOutcome.UNKNOWN, f"HTTP {answer.status} without Slack's ok field")
        if reply["ok"]:
            return Observation(ProviderOutcome.SUCCESS, f"HTTP {answer.status} ok")
        error = _error(reply) or "unnamed error"
        if error == "ratelimited":
            return rate_limited(answer, clock=self.clock, detail="slack: ratelimited")
        if error in TRANSIENT:
            return None
        return Observation(ProviderOutcome.REJECTED, f"slack: {error}")


def _error(reply: Any) -> str | None:
    return code(reply.get("error")) if isinstance(reply, dict) else None


class SlackConfig(BaseModel):
    """``[notifications.slack]``: exactly one of ``webhook_url`` (an incoming webhook: the URL is the
    secret) or ``bot_token`` (``chat.postMessage``, posting to ``channels[recipient]`` else ``channel``)."""

    model_config = ConfigDict(extra="forbid")

    webhook_url: SecretRef | None = None
    bot_token: SecretRef | None = None
    api_url: str = SLACK_API
    channel: str | None = None
    channels: dict[str, str] = Field(default_factory=dict)
    max_tries: int = Field(default=MAX_TRIES, ge=1, le=10)
    trust_env: bool = True
    """Take proxy settings from the environment (httpx's ``trust_env``)."""

    @model_validator(mode="after")
    def _one_way(self) -> SlackConfig:
        if (self.webhook_url is None) == (self.bot_token is None):
            raise ValueError("slack posts through exactly one of webhook_url (an incoming webhook) or bot_token "
                             "(chat.postMessage)")
        if self.bot_token is not None and self.channel is None and not self.channels:
            raise ValueError("slack with a bot_token needs a channel (or a channels map of recipient = channel id)")
        return self

    def build(self, *, clock: Clock | None = None) -> SlackChannel:
        """The channel, its secrets revealed once (``SecretError`` when one cannot be read)."""
        return SlackChannel(webhook_url=self.webhook_url.reveal() if self.webhook_url else None,
                            bot_token=self.bot_token.reveal() if self.bot_token else None, api_url=self.api_url,
                            channel=self.channel, channels=self.channels, max_tries=self.max_tries,
                            trust_env=self.trust_env, clock=clock)
