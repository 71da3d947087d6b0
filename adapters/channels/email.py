"""The email channel: one message per notification over SMTP (``aiosmtplib``), with STARTTLS or
implicit TLS and login.

>>> EmailConfig(host="smtp.example.com", port=587, starttls=True, username="alerts@example.com",
...             password=SecretRef(env="SMTP_PASSWORD"), sender="alerts@example.com",
...             to="{recipient}@example.com").build()                           # doctest: +SKIP

Where the admission is (specs/notifications.md N4-N6): the message *content* is the provider effect, so
the channel admits right before the ``DATA`` command that hands it over. Before it — the lease check
before connecting, the connection, EHLO, STARTTLS, AUTH, ``MAIL FROM`` and ``RCPT TO`` — nothing was
delivered: a timeout, a cancellation or a failure there is ``NOT_STARTED``. From ``DATA`` on, a timeout
or a lost connection is ``UNKNOWN`` (the server may have queued the message before its reply was lost).

A refused envelope (a ``5xx`` reply to ``MAIL FROM`` or ``RCPT TO``) is ``REJECTED``, and a result
other than ``NOT_STARTED`` needs an admission (the runtime records an unadmitted one as ``UNKNOWN``).
The channel therefore closes the connection first and admits afterwards: the ``started`` fact still
precedes every effect (there is none: the content was never sent), the refusal pays its rate-limit
token like any answered send, and the window in which a hang counts as ``NOT_STARTED`` stays exactly
"before the content". The price is small: when the admission then finds no token (``NoToken``) or a
lost lease, the runtime records that instead of the refusal — and the next attempt meets it again.
Admitting before ``RCPT`` instead would have turned every hang between ``RCPT`` and ``DATA`` into
``UNKNOWN`` (a duplicate risk for a send that never happened).

Failures before ``MAIL FROM`` that are no answer to this message (authentication refused, STARTTLS
missing, a certificate that does not verify, a ``5xx`` greeting) are ``NOT_STARTED`` with what went
wrong: nothing was sent, and the fix is the operator's. Transient failures (a ``4xx`` reply anywhere,
a refused or dropped connection) are retried on a fresh connection while the adapter deadline
allows, each retry behind ``guard.guard_provider_attempt()``; a ``4xx`` (or a lost connection) after
the content that no retry could clear is ``UNKNOWN``. Every socket operation's budget is
``guard.remaining()``; the password (and its base64 forms) is scrubbed from every detail.

The message carries ``Message-ID: <notification id.cycle@sender's domain>``, the same for every
attempt of a cycle, so a repeat after ``UNKNOWN`` is recognisable as the same message; it carries no
``Date`` (time comes only from the runtime's clock, and a submission server adds it, RFC 6409 8.1).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import socket
import ssl
import string
from collections.abc import Mapping
from email.message import EmailMessage
from email.policy import SMTP as SMTP_POLICY
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from statebook.outbox.notifications import Delivery, Guard, Observation, ProviderOutcome

from ..extras import require
from .links import with_lines
from .secrets import SecretRef, mask, scrub

if TYPE_CHECKING:
    import aiosmtplib
else:
    aiosmtplib = require("aiosmtplib", extra="channels", feature="the email channel")

__all__ = ["EmailChannel", "EmailConfig"]

log = logging.getLogger("statebook.adapters.channels.email")

MARGIN_SECONDS = 0.05
"""Kept back from ``guard.remaining()``: the channel ends its own call just before the runtime would cut it."""
BACKOFF_SECONDS = 0.2
"""The wait before the first retry; it doubles before each further one (while it fits the deadline)."""
DETAIL_CHARS = 300


class EmailConfig(BaseModel):
    """The ``[notifications.email]`` settings.

    ``to`` says where a recipient's mail goes: a template with ``{recipient}`` (``"{recipient}"`` when
    recipients are addresses already, ``"{recipient}@example.com"``), or a map from recipient to
    address (a recipient missing from it is ``NOT_STARTED``: there is nobody to send to).
    ``starttls``: ``True`` requires it, ``"auto"`` upgrades when the server offers it, ``False`` never;
    ``tls``: implicit TLS from the first byte (SMTPS, port 465). ``ca_file``: the certificates that
    verify the server (the system's when unset).
    """

    model_config = ConfigDict(extra="forbid")

    host: str
    port: int | None = Field(default=None, ge=1, le=65535)
    tls: bool = False
    starttls: bool | Literal["auto"] = "auto"
    ca_file: Path | None = None
    username: str | None = None
    password: SecretRef | None = None
    sender: str
    to: str | dict[str, str] = "{recipient}"
    subject_prefix: str = ""
    local_hostname: str | None = None
    max_retries: int = Field(default=3, ge=0, le=20)

    @field_validator("to")
    @classmethod
    def _template(cls, value: str | dict[str, str]) -> str | dict[str, str]:
        if isinstance(value, str):
            try:
                fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(value)
                          if name is not None]
            except ValueError as exc:
                raise ValueError(f"the address template {value!r} is not a format string: {exc}") from None
            # a conversion or a format spec ({recipient!r}, {recipient:>99999999999}) fails or pads at send time
            if {f for f, _, _ in fields} != {"recipient"} or any(spec or conversion for _, spec, conversion in fields):
                raise ValueError(f"the address template names {{recipient}} and nothing else; got {value!r}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> EmailConfig:
        if self.tls and self.starttls is True:
            raise ValueError("tls (implicit TLS) and starttls = true exclude each other; set one")
        if self.password is not None and not self.username:
            raise ValueError("a password needs a username")
        if _address_error(self.sender):
            raise ValueError(f"sender {self.sender!r}: {_address_error(self.sender)}")
        return self

    def build(self) -> EmailChannel:
        """The channel, with the password read once (:class:`~.secrets.SecretError` when it cannot be)."""
        return EmailChannel(self, password=self.password.reveal() if self.password is not None else None,
                            local_hostname=self.local_hostname or socket.getfqdn())


def _address_error(address: str) -> str | None:
    """Why ``address`` cannot go into an SMTP envelope, or None."""
    if not address.isascii():
        return "not an ASCII address (SMTPUTF8 is not supported)"
    if address.count("@") != 1 or address.startswith("@") or address.endswith("@"):
        return "not an address of the form local@domain"
    if any(c.isspace() or c in "<>,;\"()[]\\" for c in address):
        return "an address holds no spaces, brackets, quotes or separators"
    return None


class EmailChannel:
    """An SMTP channel (see the module docstring for where it admits and what each failure means)."""

    name = "email"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, config: EmailConfig, *, password: str | None, local_hostname: str) -> None:
        self.config = config
        self._password = password
        self._local_hostname = local_hostname
        self._secrets = _secret_forms(config.username, password)
        self._domain = config.sender.rsplit("@", 1)[1]
        self._context = self._tls_context()  # read once, at build: an unreadable ca_file is an error at start

    def __repr__(self) -> str:
        c = self.config
        login = f", username={c.username!r}, password={mask(self._password)!r}" if c.username else ""
        return f"EmailChannel(host={c.host!r}, port={self._port()}, tls={c.tls}, starttls={c.starttls!r}{login})"

    __str__ = __repr__

    def _port(self) -> int:
        c = self.config
        return c.port or (465 if c.tls else 587 if c.starttls is True else 25)

    # -- the message ------------------------------------------------------------------------------
    def address(self, recipient: str) -> str | None:
        """The recipient's address, or None when ``to`` maps no address to it."""
        to = self.config.to
        return to.get(recipient) if isinstance(to, Mapping) else to.format(recipient=recipient)

    def message(self, delivery: Delivery, address: str) -> bytes:
        """The message for ``delivery``: subject from the content's ``title`` (or ``subject``), body from
        its ``body`` (or ``text``; the content as JSON when it has neither), then its response links, one
        ``Acknowledge: URL`` / ``Dismiss: URL`` line each."""
        content = delivery.content
        subject = str(content.get("title") or content.get("subject") or "Notification")
        body = content.get("body", content.get("text"))
        text = str(body) if body is not None else json.dumps(dict(content), indent=2, sort_keys=True, default=str)
        msg = EmailMessage(policy=SMTP_POLICY)
        msg["From"] = self.config.sender
        msg["To"] = address
        msg["Subject"] = " ".join(f"{self.config.subject_prefix}{subject}".split())  # no header injection
        msg["Message-ID"] = f"<{delivery.notification_id}.{delivery.cycle}@{self._domain}>"
        msg["X-Statebook-Notification"] = f"{delivery.notification_id} cycle={delivery.cycle} attempt={delivery.attempt}"
        msg.set_content(with_lines(text, delivery.links))
        return msg.as_bytes()

    # -- the call ---------------------------------------------------------------------------------
    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """One observation: connect, EHLO, STARTTLS, login, MAIL, RCPT, admit, DATA — retried while the
        deadline allows (module docstring)."""
        address = self.address(delivery.recipient)
        if address is None:
            return Observation(ProviderOutcome.NOT_STARTED, "no email address is configured for this recipient")
        if error := _address_error(address):
            return Observation(ProviderOutcome.NOT_STARTED, f"the recipient's address is unusable: {error}")
        progress = _Progress()
        try:
            async with asyncio.timeout(max(0.0, guard.remaining() - MARGIN_SECONDS)):
                return await self._attempts(self.message(delivery, address), address, guard, progress)
        except TimeoutError:
            if progress.phase == "admitting":
                raise  # whether the started fact committed is the runtime's to know (it judges the cut)
            where = progress.stage
            outcome = ProviderOutcome.UNKNOWN if progress.phase == "admitted" else ProviderOutcome.NOT_STARTED
            return Observation(outcome, f"no answer within the adapter deadline ({where})", retries=progress.retries)

    async def _attempts(self, message: bytes, address: str, guard: Guard, progress: _Progress) -> Observation:
        """Provider attempts until one is decided or the deadline (or ``max_retries``) leaves no retry."""
        while True:
            decided, failure = await self._attempt(message, address, guard, progress)
            if decided is not None:
                return decided
            wait = BACKOFF_SECONDS * 2 ** progress.retries
            if progress.retries >= self.config.max_retries or wait + MARGIN_SECONDS >= guard.remaining():
                outcome = ProviderOutcome.UNKNOWN if progress.phase == "admitted" else ProviderOutcome.NOT_STARTED
                return Observation(outcome, f"{failure}; no retry left within the adapter deadline", retries=progress.retries)
            log.info("email: retrying after %s (retry %d)", failure, progress.retries + 1)
            await asyncio.sleep(wait)
            progress.retries += 1

    async def _attempt(self, message: bytes, address: str, guard: Guard, progress: _Progress
                       ) -> tuple[Observation | None, str]:
        """One connection's try: a decided observation, or None and why it may be retried."""
        c = self.config
        progress.stage = "lease check"
        if progress.phase != "admitted":
            # Before connecting, nothing admitted yet: a lease check that writes nothing. After the admission
            # the check before DATA below is the one that counts (it records the retry before its effect, N10b);
            # a connection alone is no effect, so checking here too would count each retry twice.
            await guard.guard_provider_attempt()
        smtp = aiosmtplib.SMTP(hostname=c.host, port=self._port(), use_tls=c.tls,
                               start_tls=None if c.starttls == "auto" else c.starttls, tls_context=self._tls(),
                               local_hostname=self._local_hostname, timeout=self._budget(guard))
        try:
            try:
                progress.stage = "connect"
                await smtp.connect(timeout=self._budget(guard))
                if c.username is not None:
                    progress.stage = "login"
                    await smtp.login(c.username, self._password or "", timeout=self._budget(guard))
                progress.stage = "MAIL FROM"
                await smtp.mail(c.sender, timeout=self._budget(guard))
                progress.stage = "RCPT TO"
                await smtp.rcpt(address, timeout=self._budget(guard))
            except aiosmtplib.SMTPResponseException as exc:
                if exc.code >= 500 and isinstance(exc, (aiosmtplib.SMTPSenderRefused, aiosmtplib.SMTPRecipientRefused)):
                    smtp.close()
                    await self._admit(guard, progress)  # the refusal's admission (module docstring)
                    return Observation(ProviderOutcome.REJECTED, self._reply(progress.stage, exc), progress.retries), ""
                if exc.code >= 500 or exc.code < 400:
                    return Observation(ProviderOutcome.NOT_STARTED, self._reply(progress.stage, exc), progress.retries), ""
                return None, self._reply(progress.stage, exc)
            except (aiosmtplib.SMTPTimeoutError, ssl.SSLCertVerificationError, aiosmtplib.SMTPException) as exc:
                # A timeout here spent the budget; the others (no STARTTLS, no AUTH, a bad certificate) are
                # the operator's to fix: none is worth a retry.
                if isinstance(exc, (aiosmtplib.SMTPServerDisconnected, aiosmtplib.SMTPConnectError)) \
                        and not isinstance(exc, aiosmtplib.SMTPTimeoutError):
                    return None, f"{progress.stage}: {self._failure(exc)}"
                return Observation(ProviderOutcome.NOT_STARTED, f"{progress.stage}: {self._failure(exc)}", progress.retries), ""
            except OSError as exc:
                return None, f"{progress.stage}: {self._failure(exc)}"
            if progress.phase == "admitted":
                await guard.guard_provider_attempt()  # a retry of the content: a lease check right before it
            else:
                await self._admit(guard, progress)
            progress.stage = "DATA"
            try:
                reply = await smtp.data(message, timeout=self._budget(guard))
            except aiosmtplib.SMTPResponseException as exc:
                if exc.code >= 500:
                    return Observation(ProviderOutcome.REJECTED, self._reply("DATA", exc), progress.retries), ""
                return None, self._reply("DATA", exc)
            except (aiosmtplib.SMTPTimeoutError, TimeoutError) as exc:
                return Observation(ProviderOutcome.UNKNOWN, f"DATA: {self._failure(exc)}", progress.retries), ""
            except (aiosmtplib.SMTPException, OSError) as exc:
                return None, f"DATA: {self._failure(exc)}"
            detail = f"{reply.code} {self._text(reply.message)}".strip()
            if progress.retries:
                detail += f" (after {progress.retries} {'retry' if progress.retries == 1 else 'retries'})"
            return Observation(ProviderOutcome.SUCCESS, detail, progress.retries), ""
        finally:
            smtp.close()  # no QUIT: a hanging QUIT must not cost the observation its deadline

    async def _admit(self, guard: Guard, progress: _Progress) -> None:
        progress.phase = "admitting"
        await guard.admit()
        progress.phase = "admitted"

    def _budget(self, guard: Guard) -> float:
        """A socket operation's budget: what is left of the adapter deadline (never zero: aiosmtplib reads 0 as none)."""
        return max(0.001, guard.remaining() - MARGIN_SECONDS)

    def _tls(self) -> ssl.SSLContext | None:
        return self._context

    def _tls_context(self) -> ssl.SSLContext | None:
        if self.config.ca_file is None:
            return None
        try:
            return ssl.create_default_context(cafile=str(self.config.ca_file))
        except (OSError, ssl.SSLError) as exc:
            why = "no certificate in it" if isinstance(exc, ssl.SSLError) else exc.strerror or type(exc).__name__
            raise ValueError(f"ca_file {self.config.ca_file} cannot be used: {why}") from None

    # -- details, scrubbed ------------------------------------------------------------------------
    def _text(self, text: str) -> str:
        return " ".join(scrub(str(text), self._secrets).split())[:DETAIL_CHARS]

    def _reply(self, stage: str, exc: aiosmtplib.SMTPResponseException) -> str:
        return f"{stage}: {exc.code} {self._text(exc.message)}".strip()

    def _failure(self, exc: BaseException) -> str:
        if isinstance(exc, aiosmtplib.SMTPTimeoutError | TimeoutError):
            return "timed out"
        if isinstance(exc, ssl.SSLCertVerificationError):
            return f"the server's certificate does not verify ({self._text(exc.verify_message or '')})"
        if isinstance(exc, OSError) and exc.strerror:
            return f"{type(exc).__name__}: {self._text(exc.strerror)}"
        return f"{type(exc).__name__}: {self._text(str(exc))}"


class _Progress:
    """How far one call got: ``phase`` (before / admitting / admitted), the stage, the retries so far."""

    def __init__(self) -> None:
        self.phase: Literal["before", "admitting", "admitted"] = "before"
        self.stage = "start"
        self.retries = 0


def _secret_forms(username: str | None, password: str | None) -> tuple[str, ...]:
    """The password as it may come back in a server's text: plain, and the base64 of AUTH LOGIN and PLAIN."""
    if not password:
        return ()
    forms = [password, base64.b64encode(password.encode()).decode()]
    if username:
        forms.append(base64.b64encode(f"\0{username}\0{password}".encode()).decode())
    return tuple(forms)

