"""OpenTelemetry spans (the ``otel`` extra, docs/how-to/tracing.md), recorded by the SDK's in-memory exporter.

One trace runs from an HTTP request whose handler enqueues a dispatch to the delivery that sends it: the
request's server span, the enqueue's ``send``, the delivery's ``process`` (its parent read from the
envelope's ``traceparent``) and the transport's HTTP ``POST``. With tracing off nothing is recorded and
the envelope is what it was before tracing existed.
"""

from __future__ import annotations

import asyncio
import contextlib

import httpx
import pytest
import sqlalchemy as sa
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.semconv._incubating.attributes import messaging_attributes as messaging
from opentelemetry.semconv.schemas import Schemas
from opentelemetry.trace import SpanKind, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from channels.http_server import serve
from conformance.scheduler.support import FakeSpawner, make, settings
from statebook.adapters.channels.pagerduty import FOLLOW_ROUTE, PagerDutyFollowTransport
from statebook.adapters.otel import SCHEMA_URL, disable_tracing, enable_tracing
from statebook.lifecycle import history, tracing, verify
from statebook.lifecycle.codec import loads
from statebook.outbox import deliver_due_dispatches, enqueue_dispatch, enqueue_dispatches
from statebook.outbox.dispatch.schema import dispatch_outbox
from statebook.outbox.dispatch.signal import DispatchSignal, traceparent_of
from statebook.outbox.notifications import deliver_due_notifications, send_notification
from statebook.outbox.notifications.scripted import ScriptedChannel
from statebook.scheduler.engine import SchedulerEngine

ROUTING_KEY = "R0UTINGkeySECRET0123456789abcdef"
BODY = {"action": "acknowledge", "dedup_key": "incident-7", "notification_id": "n" * 26, "responder": "alice"}


@pytest.fixture
def spans():
    """An SDK provider exporting to memory, installed as statebook's tracer for the test."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    enable_tracing(provider)
    try:
        yield exporter
    finally:
        disable_tracing()


def web_app(book, provider) -> Starlette:
    """A user's web app: its own server span (as an ASGI instrumentation would open), a handler that enqueues."""
    server = provider.get_tracer("test.web")

    async def page(request: Request) -> JSONResponse:
        dispatch_id = await enqueue_dispatch(book, kind="follow", deliver_to=FOLLOW_ROUTE, body=BODY)
        return JSONResponse({"id": dispatch_id})

    app = Starlette(routes=[Route("/page", page, methods=["POST"])])

    async def traced(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        with server.start_as_current_span(f"{scope['method']} /page", kind=SpanKind.SERVER):
            await app(scope, receive, send)

    return traced


def w3c(span) -> str:
    """The W3C ``traceparent`` of a finished span, as OpenTelemetry's own propagator writes it."""
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(span.context)))
    return carrier["traceparent"]


def by_name(exporter) -> dict[str, list]:
    found: dict[str, list] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


async def stored_payload(book, dispatch_id: str) -> str:
    async with book.read() as conn:
        return await conn.scalar(sa.select(sa.cast(dispatch_outbox.c.payload, sa.Text))
                                 .where(dispatch_outbox.c.id == dispatch_id))


async def test_one_trace_runs_from_the_request_that_enqueues_to_the_delivery_that_sends_it(book, spans):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    async with serve("pagerduty", "accept") as server:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web_app(book, provider)),
                                     base_url="http://app.test") as client:
            answer = await client.post("/page")
        dispatch_id = answer.json()["id"]
        transport = PagerDutyFollowTransport(routing_key=ROUTING_KEY, url=f"{server.url}/v2/enqueue")
        try:
            counts = await deliver_due_dispatches(book, transport=transport)
        finally:
            await transport.aclose()
    assert counts["delivered"] == 1 and len(server.received) == 1

    named = by_name(spans)
    [request], [send], [process], [post] = named["POST /page"], named["send dispatch"], named["process dispatch"], named["POST"]
    assert {s.context.trace_id for s in (request, send, process, post)} == {request.context.trace_id}
    assert send.parent.span_id == request.context.span_id
    assert process.parent.span_id == send.context.span_id and process.parent.is_remote  # read from the envelope
    assert post.parent.span_id == process.context.span_id
    assert (send.kind, process.kind, post.kind) == (SpanKind.PRODUCER, SpanKind.CONSUMER, SpanKind.CLIENT)

    assert dict(send.attributes) == {
        messaging.MESSAGING_SYSTEM: "statebook", messaging.MESSAGING_OPERATION_NAME: "send",
        messaging.MESSAGING_OPERATION_TYPE: "send", messaging.MESSAGING_DESTINATION_NAME: "dispatch",
        messaging.MESSAGING_MESSAGE_ID: dispatch_id, "statebook.dispatch.kind": "follow"}
    assert dict(process.attributes) == {
        messaging.MESSAGING_SYSTEM: "statebook", messaging.MESSAGING_OPERATION_NAME: "process",
        messaging.MESSAGING_OPERATION_TYPE: "process", messaging.MESSAGING_DESTINATION_NAME: "dispatch",
        messaging.MESSAGING_MESSAGE_ID: dispatch_id, "statebook.dispatch.kind": "follow",
        "statebook.dispatch.attempt": 1}
    host, port = server.url.removeprefix("http://").split(":")
    assert dict(post.attributes) == {"http.request.method": "POST", "server.address": host, "server.port": int(port),
                                     "http.response.status_code": 202}
    assert process.status.status_code is not StatusCode.ERROR
    assert send.instrumentation_scope.schema_url == SCHEMA_URL == Schemas.V1_44_0.value

    # The delivery's two transitions (claim, then delivered), each a span of its own.
    moves = [(dict(s.attributes)["statebook.transition.target"], dict(s.attributes)["statebook.entity.id"])
             for s in named["transition dispatch"]]
    assert moves == [("delivering", dispatch_id), ("delivered", dispatch_id)]

    # No secret in any attribute: not the routing key, the URL's path, the route or the body.
    for span in spans.get_finished_spans():
        for value in span.attributes.values():
            text = str(value)
            assert ROUTING_KEY not in text and "/v2/enqueue" not in text and "incident-7" not in text, (span.name, text)
            assert FOLLOW_ROUTE not in text, (span.name, text)

    # The envelope carries the send span's context; its history and verify are as before.
    payload = await stored_payload(book, dispatch_id)
    carried = w3c(send)
    assert traceparent_of(payload) == loads(payload)["traceparent"] == carried
    assert DispatchSignal.model_validate(loads(payload)).to_json() == loads(payload)
    [created, *_] = await history(book, "dispatch", dispatch_id)
    assert created.patch["payload"]["traceparent"] == carried  # hashed into the creation fact
    assert (await verify(book)).ok


async def test_with_tracing_off_nothing_is_recorded_and_the_envelope_has_no_traceparent(book):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    assert tracing.active() is None
    async with serve("pagerduty", "accept") as server:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=web_app(book, trace.NoOpTracerProvider())),
                                     base_url="http://app.test") as client:
            dispatch_id = (await client.post("/page")).json()["id"]
        transport = PagerDutyFollowTransport(routing_key=ROUTING_KEY, url=f"{server.url}/v2/enqueue")
        try:
            assert (await deliver_due_dispatches(book, transport=transport))["delivered"] == 1
        finally:
            await transport.aclose()
    assert exporter.get_finished_spans() == ()
    payload = await stored_payload(book, dispatch_id)
    assert "traceparent" not in loads(payload) and traceparent_of(payload) is None


async def test_a_batch_is_one_send_span_whose_context_every_envelope_carries(book, spans):
    ids = await enqueue_dispatches(book, [{"kind": "a", "deliver_to": "x"}, {"kind": "b", "deliver_to": "y"}])
    [send] = by_name(spans)["send dispatch"]
    assert dict(send.attributes)[messaging.MESSAGING_BATCH_MESSAGE_COUNT] == 2
    carried = {traceparent_of(await stored_payload(book, i)) for i in ids}
    assert carried == {w3c(send)}


async def test_a_failed_enqueue_marks_its_span_failed_without_the_message(book, spans):
    with pytest.raises(ValueError):
        await enqueue_dispatch(book, kind="k", deliver_to="-secret-route")
    [send] = by_name(spans)["send dispatch"]
    assert send.status.status_code is StatusCode.ERROR and send.status.description is None
    assert dict(send.attributes)["error.type"] == "DispatchInvalid" and not send.events


async def test_each_channel_attempt_is_a_client_span(book, spans):
    accepted = await send_notification(book, recipient="alice", content={"text": "disk full"}, mode="guaranteed",
                                       channels=["email", "slack"])
    assert accepted.channels == ("slack", "email")  # the fallback order: slack first
    channels = {"slack": ScriptedChannel("slack", ["reject"]), "email": ScriptedChannel("email", ["success"])}
    await deliver_due_notifications(book, channels, deadline=5.0)
    named = by_name(spans)
    [slack], [email] = named["attempt slack"], named["attempt email"]
    assert email.kind == slack.kind == SpanKind.CLIENT
    assert dict(slack.attributes) == {"statebook.channel.name": "slack", "statebook.notification.id": accepted.id,
                                      "statebook.notification.attempt": 1, "statebook.channel.outcome": "rejected",
                                      "error.type": "rejected"}
    assert slack.status.status_code is StatusCode.ERROR
    assert dict(email.attributes)["statebook.channel.outcome"] == "success"
    assert email.status.status_code is not StatusCode.ERROR
    assert slack.end_time <= email.start_time


async def test_a_scheduler_fire_is_a_span_over_its_run_and_the_dispatch_it_enqueues(book, clock, spans):
    s = await make(book, interval_sec=10, notify={"kind": "run_ended", "deliver_to": "ops"})
    engine = SchedulerEngine(book, settings(), clock=clock, launcher=FakeSpawner())
    await engine.start(loop=False)
    run_id = await engine.fire_now(s.id)
    await engine.wait_idle()
    await engine.stop()
    named = by_name(spans)
    [fire] = named[f"fire {s.name}"]
    assert fire.kind == SpanKind.INTERNAL
    assert dict(fire.attributes) == {"statebook.schedule.id": s.id, "statebook.schedule.name": s.name,
                                     "statebook.schedule_run.id": run_id, "statebook.schedule.trigger": "manual"}
    [send] = named["send dispatch"]
    assert send.parent.span_id == fire.context.span_id  # the run-ended notice, enqueued inside the fire
    ended = [t for t in named["transition schedule_run"] if t.parent is not None and t.parent.span_id == fire.context.span_id]
    assert ended, "the run's transitions are children of its fire"


def test_the_no_op_path_opens_nothing_and_the_port_checks_traceparents():
    assert tracing.active() is None
    good = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.is_traceparent(good) and not tracing.is_traceparent(good.upper())
    assert traceparent_of('{"body":{},"traceparent":"' + good + '"}') == good
    assert traceparent_of('{"traceparent":"' + good + '","body":{}}') == good  # not canonical: decoded
    assert traceparent_of('{"body":{},"traceparent":"not one"}') is None
    with pytest.raises(ValueError):
        DispatchSignal(created_at=0.0, traceparent="00-bad")
    assert TraceContextTextMapPropagator().extract({"traceparent": good})  # the value our spans write is W3C's


HOOK = "otelHOOKsecretT0KEN0123456789"
GLOBAL = InMemorySpanExporter()


def global_provider() -> InMemorySpanExporter:
    """OpenTelemetry's global tracer provider (set once per process), exporting to memory: what
    ``statebook run`` sends its spans to."""
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(GLOBAL))
        trace.set_tracer_provider(provider)
    GLOBAL.clear()
    return GLOBAL


def test_statebook_run_traces_with_tracing_enabled_and_no_secret_reaches_a_span(tmp_path, monkeypatch):
    """``[tracing] enabled = true``: the daemon's channel attempts are spans on the global provider; the Slack
    webhook URL (a secret) is in none of them."""
    from statebook.adapters.daemon import run_daemon
    from statebook.adapters.db import open_book
    from statebook.adapters.settings import load_settings

    exporter = global_provider()
    db = f"sqlite:///{tmp_path / 'traced.db'}"

    async def go():
        async with serve("slack_webhook", "accept") as slack:
            monkeypatch.setenv("OTEL_TEST_SLACK_HOOK", f"{slack.url}/services/T0/B0/{HOOK}")
            toml = tmp_path / "s.toml"
            toml.write_text(f'db = "{db}"\n[tracing]\nenabled = true\n[scheduler]\ntick_seconds = 0.3\n'
                            '[notifications.slack]\nwebhook_url = { env = "OTEL_TEST_SLACK_HOOK" }\n')
            book = await open_book(db)
            try:
                accepted = await send_notification(book, recipient="oncall", content={"title": "disk full"},
                                                   mode="guaranteed", channels=["slack"])
            finally:
                await book.engine.dispose()
            await run_daemon(load_settings(toml), run_for=2.0)
            return accepted.id

    try:
        notification_id = asyncio.run(go())
    finally:
        disable_tracing()
    [attempt] = by_name(exporter)["attempt slack"]
    assert dict(attempt.attributes)["statebook.notification.id"] == notification_id
    assert dict(attempt.attributes)["statebook.channel.outcome"] == "success"
    for span in exporter.get_finished_spans():
        for value in span.attributes.values():
            assert HOOK not in str(value) and "/services/" not in str(value), (span.name, value)


class _FixedSpan:
    def set(self, key, value):
        pass

    def fail(self, error_type):
        pass

    def traceparent(self):
        return "00-" + "a" * 32 + "-" + "b" * 16 + "-01"


class _FixedTracer:
    """A port tracer of our own: any object with ``span`` serves (no OpenTelemetry needed)."""

    @contextlib.contextmanager
    def span(self, name, kind, attributes, *, parent=None):
        yield _FixedSpan()


async def test_the_payload_bound_counts_the_traceparent_an_enqueue_carries(tmp_path):
    """O22 with tracing on: the 72 bytes of a traceparent count, so every accepted envelope still fits the
    bound at its last attempt, and the largest body is 72 bytes smaller than with tracing off."""
    from statebook.adapters.db import open_book
    from statebook.outbox.dispatch.bounds import DispatchLimits
    from statebook.outbox.dispatch.signal import TRACEPARENT_BYTES, with_attempt

    bound = 600
    book = await open_book(f"sqlite:///{tmp_path / 'bound.db'}", limits=DispatchLimits(payload_bytes=bound))
    largest = {}
    try:
        for tracer in (None, _FixedTracer()):
            with tracing.installed(tracer):
                for size in range(350, 200, -1):
                    try:
                        did = await enqueue_dispatch(book, kind="k", deliver_to="r", body={"t": "x" * size})
                    except ValueError:
                        continue
                    sent = with_attempt(await stored_payload(book, did), 8)
                    assert len(sent.encode()) <= bound and ("traceparent" in sent) == (tracer is not None)
                    largest[tracer is None] = size
                    break
    finally:
        await book.engine.dispose()
    assert largest[True] - largest[False] == TRACEPARENT_BYTES == 72
