"""Transports: how one claimed dispatch is sent. A small protocol with two implementations.

A transport never raises for a delivery problem: it returns a failed :class:`TransportResult`,
which the delivery step records as that row's failure. An argument no command line can carry is
refused with :class:`DispatchInvalid` instead (O22); delivery records that as a failure too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from statebook.lifecycle.inputs import DEFAULT_LIMITS, Limits

from . import checks
from .bounds import DELIVER_TO, PAYLOAD, DispatchLimits, dispatch_limits
from .errors import DispatchInvalid

NOTIFY_TIMEOUT_SECONDS = 10.0
ERROR_CAP = 2000
"""Stored error text is cut to this many characters (specs/outbox.md O13)."""


@dataclass(frozen=True)
class TransportResult:
    """What one send observed. ``ok`` is the only field the lifecycle needs.

    ``evidence`` is recorded in the finalizing fact's metadata (exit code, timeout, channel...), so a
    later transport can report per-channel observations without changing the delivery step.
    """

    ok: bool
    error: str | None = None
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def failed(cls, error: str, **evidence: Any) -> TransportResult:
        """A failed result with ``error`` (capped in length) and ``evidence`` recorded on the dispatch."""
        return cls(False, cap_error(error), evidence)


def cap_error(text: str) -> str:
    """``text`` cut to the length an error stored on a row may have, ending in an ellipsis when cut."""
    return text if len(text) <= ERROR_CAP else text[: ERROR_CAP - 1] + "…"


@runtime_checkable
class Transport(Protocol):
    """Sends one payload (JSON text) to one route.

    A transport may declare ``timeout`` (seconds), the longest one send takes; claims lease their
    rows for that long plus a margin (O21). Without one, :data:`NOTIFY_TIMEOUT_SECONDS` is assumed
    and delivery cuts a send that outlives its lease.
    """

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Deliver ``payload`` to ``deliver_to`` and say how it went; a transport reports failures in its result
        rather than raising.
        """
        ...


def send_timeout(transport: object) -> float:
    """The longest one send of ``transport`` may take: its ``timeout``, else the default.

    >>> send_timeout(ArgvTransport(["true", "{deliver_to}"], timeout=40)), send_timeout(object())
    (40.0, 10.0)
    """
    declared = getattr(transport, "timeout", None)
    if isinstance(declared, int | float) and not isinstance(declared, bool) and 0 < declared < float("inf"):
        return float(declared)
    return NOTIFY_TIMEOUT_SECONDS


def check_elements(argument: str, template: object) -> None:
    """Refuse a template element no command line can carry (O22): not text, a NUL, a lone surrogate.

    Only a list or tuple is looked into; any other template is :func:`check_template`'s problem.
    """
    if isinstance(template, list | tuple):
        for index, part in enumerate(template):
            checks.text_arg(f"{argument}[{index}]", part)


def check_template(template: object) -> str | None:
    """None when ``template`` is a usable argv template, else what is wrong with it."""
    if template is None:
        return "no notify_template is configured (set dispatch.notify_template to an argv list)"
    if isinstance(template, str | bytes) or not isinstance(template, Sequence) or not template:
        return f"notify_template must be a non-empty list of strings, got {template!r}"
    if not all(isinstance(part, str) for part in template):
        return f"notify_template must contain only strings, got {list(template)!r}"
    if DELIVER_TO not in template:
        return f"notify_template must contain an element exactly equal to {DELIVER_TO!r}, got {list(template)!r}"
    if template[0] in (DELIVER_TO, PAYLOAD) or not template[0]:
        return f"notify_template must start with a command, got {template[0]!r}"
    return None


class ArgvTransport:
    """Run a command built from an argv template; exit code 0 is success (specs/outbox.md O13).

    An element exactly equal to ``{deliver_to}`` or ``{payload}`` is replaced by the value; no
    partial interpolation and no shell. Without a ``{payload}`` element the payload goes to stdin.
    A run longer than ``timeout`` seconds is killed (its whole process group).

    A template element that is not text or holds a NUL is refused when the transport is built; a
    route or payload no command line can carry (NUL, lone surrogate) or a route starting with ``-``
    without a ``--`` before ``{deliver_to}`` is refused by :meth:`send` (:class:`DispatchInvalid`,
    recorded as that attempt's failure), never passed to the command (O22).

    >>> ArgvTransport(["notify-send", "{deliver_to}", "{payload}"])  # doctest: +ELLIPSIS
    ArgvTransport([...], timeout=10.0)
    """

    def __init__(self, template: Sequence[str] | None, timeout: float = NOTIFY_TIMEOUT_SECONDS) -> None:
        check_elements("template", template)
        self.template = None if template is None else list(template) if isinstance(template, list | tuple) else template
        self.timeout = checks.seconds("timeout", timeout)
        self.problem = check_template(self.template)
        self._dash = dispatch_limits(self.template).dash_routes

    def __repr__(self) -> str:
        return f"ArgvTransport({self.template!r}, timeout={self.timeout})"

    def limits(self, base: Limits = DEFAULT_LIMITS) -> DispatchLimits:
        """``base`` with what this template can carry: give it to the producers' book (``Book(limits=)``)."""
        return dispatch_limits(self.template, base)

    def argv(self, deliver_to: str, payload: str) -> list[str]:
        """The command line for one delivery: the template with whole-element ``{deliver_to}`` and ``{payload}``
        replaced (no shell).
        """
        assert self.problem is None and self.template is not None
        values = {DELIVER_TO: deliver_to, PAYLOAD: payload}
        return [values.get(part, part) for part in self.template]

    def _check(self, deliver_to: Any, payload: Any) -> None:
        """What enqueue refuses, refused again at the command line (rows enqueued under other limits)."""
        checks.text_arg("deliver_to", deliver_to)
        checks.text_arg("payload", payload)
        if deliver_to.startswith("-") and not self._dash:
            raise DispatchInvalid("deliver_to: starts with '-' and the template has no '--' before {deliver_to}, "
                                  "so the command would read it as an option; not sent", argument="deliver_to",
                                  rule="dash")

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Run the command for one delivery and return its result; a bad template, refused route, timeout or
        non-zero exit is a failed result.
        """
        if self.problem is not None:
            return TransportResult.failed(self.problem, reason="template")
        self._check(deliver_to, payload)
        argv = self.argv(deliver_to, payload)
        stdin = None if PAYLOAD in self.template else payload.encode()  # type: ignore[operator]
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            return TransportResult.failed(f"could not start {argv[0]!r}: {exc.strerror or exc}", reason="spawn")
        try:
            _out, err = await asyncio.wait_for(proc.communicate(stdin), self.timeout)
        except TimeoutError:
            _kill(proc)
            with contextlib.suppress(Exception):
                await proc.communicate()
            return TransportResult.failed(
                f"timeout: {argv[0]} ran longer than {self.timeout:g}s and was killed", timed_out=True
            )
        except BaseException:
            _kill(proc)
            raise
        if proc.returncode == 0:
            return TransportResult(True, None, {"exit_code": 0})
        message = err.decode(errors="replace").strip() or f"exit {proc.returncode}"
        return TransportResult.failed(message, exit_code=proc.returncode)


def _kill(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


SendFn = Callable[[str, str], Awaitable[Any]]


class CallableTransport:
    """An in-process transport: ``await fn(deliver_to, payload)``.

    The function may return a :class:`TransportResult`, or ``True``/``None`` for success and
    ``False`` for failure; an exception is a failure carrying its message. With ``timeout`` a call
    running longer is cancelled and counted as a timeout.
    """

    def __init__(self, fn: SendFn, timeout: float | None = None) -> None:
        if not callable(fn):
            raise DispatchInvalid(f"fn: expected an async callable (deliver_to, payload), got {type(fn).__name__}",
                                  argument="fn", rule="type")
        self.fn = fn
        self.timeout = None if timeout is None else checks.seconds("timeout", timeout)

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Await the function for one delivery (within ``timeout``); an exception or timeout is a failed result."""
        try:
            if self.timeout is None:
                value = await self.fn(deliver_to, payload)
            else:
                value = await asyncio.wait_for(self.fn(deliver_to, payload), self.timeout)
        except TimeoutError:
            return TransportResult.failed(f"timeout: the transport ran longer than {self.timeout:g}s", timed_out=True)
        except Exception as exc:  # the transport's failure, recorded on the row
            return TransportResult.failed(f"{type(exc).__name__}: {exc}")
        if isinstance(value, TransportResult):
            if not value.ok and value.error:
                return TransportResult(False, cap_error(value.error), value.evidence)
            return value
        if value is None or value is True:
            return TransportResult(True)
        if value is False:
            return TransportResult.failed("the transport reported failure")
        return TransportResult.failed(f"the transport returned {value!r}; expected a TransportResult or a bool")


class RoutingTransport:
    """Sends each route through the transport of the first prefix it starts with, else ``default``.

    The daemon routes ``callback:<name>`` to the notifications' in-process callbacks and everything else
    to its argv transport. Its ``timeout`` is the longest of its transports' (claims lease for it).

    >>> RoutingTransport({"callback:": CallbackTransport()}, ArgvTransport(["true", "{deliver_to}"]))  # doctest: +SKIP
    """

    def __init__(self, routes: Mapping[str, Transport], default: Transport) -> None:
        if not isinstance(routes, Mapping) or not all(isinstance(p, str) and p for p in routes):
            raise DispatchInvalid("routes: expected a mapping of non-empty route prefixes to transports",
                                  argument="routes", rule="type")
        for transport in (*routes.values(), default):
            checks.transport_arg(transport)
        self.routes = dict(routes)
        self.default = default
        self.timeout = max(send_timeout(t) for t in (*self.routes.values(), default))

    def __repr__(self) -> str:
        return f"RoutingTransport({self.routes!r}, default={self.default!r})"

    def _for(self, deliver_to: str) -> Transport:
        for prefix, transport in self.routes.items():
            if deliver_to.startswith(prefix):
                return transport
        return self.default

    async def send(self, deliver_to: str, payload: str) -> TransportResult:
        """Send through the transport whose route prefix matches ``deliver_to``."""
        return await self._for(deliver_to).send(deliver_to, payload)
