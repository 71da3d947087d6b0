"""OpenTelemetry behind statebook's tracing port (the ``otel`` extra; docs/how-to/tracing.md).

:func:`enable_tracing` installs an :class:`OtelTracer` in ``statebook.lifecycle.tracing``: from then on an
enqueue, a delivery, each transition, each channel attempt and each scheduler fire opens a span on the
tracer provider given (default: OpenTelemetry's global one, so ``opentelemetry-instrument`` or an SDK set
up by the application receives them). ``statebook run`` does it when ``[tracing] enabled = true``.

Only ``opentelemetry-api`` is needed here: exporting needs an SDK, which the application configures.
Nothing of OpenTelemetry is imported until this module is (tests/test_install.py).

>>> tracer = enable_tracing(provider)   # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from statebook.lifecycle import tracing

from .extras import require

__all__ = ["SCHEMA_URL", "OtelTracer", "disable_tracing", "enable_tracing"]

trace = require("opentelemetry.trace", extra="otel", feature="tracing (OpenTelemetry)")
tracecontext = require("opentelemetry.trace.propagation.tracecontext", extra="otel", feature="tracing (OpenTelemetry)")

SCHEMA_URL = f"https://opentelemetry.io/schemas/{tracing.SEMCONV_VERSION}"
"""The semantic conventions' schema the spans follow, given to the tracer."""

_KINDS = {
    "internal": trace.SpanKind.INTERNAL, "producer": trace.SpanKind.PRODUCER, "consumer": trace.SpanKind.CONSUMER,
    "client": trace.SpanKind.CLIENT, "server": trace.SpanKind.SERVER,
}
_PROPAGATOR = tracecontext.TraceContextTextMapPropagator()


class _Span:
    """One OpenTelemetry span as the port's :class:`~statebook.lifecycle.tracing.Span`."""

    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: tracing.Attribute) -> None:
        self._span.set_attribute(key, value)

    def fail(self, error_type: str) -> None:
        self._span.set_attribute("error.type", error_type)
        self._span.set_status(trace.StatusCode.ERROR)

    def traceparent(self) -> str | None:
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(self._span))  # nothing for an invalid span
        return carrier.get("traceparent")


class OtelTracer:
    """The port's :class:`~statebook.lifecycle.tracing.Tracer` on an OpenTelemetry tracer provider."""

    def __init__(self, provider: Any = None) -> None:
        try:
            release = version("statebook")
        except PackageNotFoundError:  # a source tree that was never installed
            release = None
        self.tracer = trace.get_tracer("statebook", release, tracer_provider=provider, schema_url=SCHEMA_URL)

    @contextlib.contextmanager
    def span(self, name: str, kind: tracing.SpanKind, attributes: Mapping[str, tracing.Attribute], *,
             parent: str | None = None) -> Iterator[_Span]:
        """A current span; an exception marks it failed with its class as ``error.type`` and is re-raised.

        The exception's message is not recorded: it may quote a route or a URL, which can be secrets.
        """
        context = _PROPAGATOR.extract({"traceparent": parent}) if parent is not None else None
        with self.tracer.start_as_current_span(name, context=context, kind=_KINDS[kind], attributes=attributes,
                                               record_exception=False, set_status_on_exception=False) as span:
            try:
                yield _Span(span)
            except BaseException as exc:
                span.set_attribute("error.type", type(exc).__qualname__)
                span.set_status(trace.StatusCode.ERROR)
                raise


def enable_tracing(provider: Any = None) -> OtelTracer:
    """Send statebook's spans to OpenTelemetry: ``provider`` (a ``TracerProvider``), else the global one.
    Returns the tracer now installed; :func:`disable_tracing` removes it."""
    tracer = OtelTracer(provider)
    tracing.install(tracer)
    return tracer


def disable_tracing() -> None:
    """Stop opening spans (the default): every call site goes back to its untraced path."""
    tracing.install(None)
