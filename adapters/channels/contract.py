"""The contract every channel adapter keeps, as a test case to subclass (ours and the ones users write).

Like eventsourcing's recorder test cases: a subclass names how to build its channel against a real
server in each *scenario*, and inherits the checks of specs/notifications.md N4-N6 and N40-N44:

- admission before the first provider effect, and a guard before every further one;
- a refused guard (``LeaseLost``) or a missing token (``NoToken``) stops every further effect;
- a call cut before admission is ``NOT_STARTED`` with no effect; after it, ``UNKNOWN`` — and a late
  completion never rewrites the recorded observation;
- the adapter deadline (``guard.remaining()``) is kept without the runtime having to cut the call;
- no secret in any fact, row, log line or ``repr`` of the channel.

>>> class TestMySms(ChannelContract):                     # doctest: +SKIP
...     @contextlib.asynccontextmanager
...     async def scenario(self, name):
...         async with my_fake_sms_server(behaviour=name) as server:
...             yield Scenario(MySmsChannel(url=server.url, token="t0ken"), effects=lambda: len(server.received),
...                            secrets=("t0ken",))

Scenarios (:data:`SCENARIOS`): ``accept``, ``reject``, ``retry_then_accept`` (a retriable failure,
then acceptance: two provider effects), ``hang_before_admission`` (the provider cannot be reached in
time: no effect), ``hang_after_admission`` (the provider took the content and never answers; it may
finish later), ``rate_limited`` (the provider answers "too many requests"). List the ones a channel
cannot have in ``unsupported``. The test methods are plain functions that run their own event loop,
so the class works under pytest (any asyncio mode) and unittest alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from statebook.lifecycle.clock import SYSTEM_CLOCK
from statebook.outbox.notifications import (
    Channel, Delivery, LeaseLost, Mode, NoToken, Observation, ProviderOutcome, send_notification,
)
from statebook.outbox.notifications.calls import attempt_channel
from statebook.outbox.notifications.delivery import claim_due

SCENARIOS = ("accept", "reject", "retry_then_accept", "hang_before_admission", "hang_after_admission",
             "rate_limited")
SLACK_SECONDS = 1.0
"""How far past its deadline a channel may return (scheduling, a socket close) before it counts as late."""


@dataclass
class Scenario:
    """A channel wired to a real server that behaves as the scenario says. ``effects()``: how many
    provider effects (content the server took) it has seen so far; ``secrets``: every value that must
    never appear in a fact, a log line or ``repr(channel)``; ``release()``: let a hanging server finish
    (``hang_after_admission``), to show a late completion changes nothing."""

    channel: Channel
    effects: Callable[[], int]
    secrets: Sequence[str] = ()
    recipient: str = "alice"
    content: Mapping[str, Any] = field(default_factory=lambda: {"title": "disk full", "body": "/var is at 97%"})
    release: Callable[[], Any] | None = None


class RecordingGuard:
    """A :class:`~statebook.outbox.notifications.Guard` that records each call with the provider
    effects seen at that moment, and can refuse (``lose_at``: the n-th guard call raises
    ``LeaseLost``; ``lose_after``: the first guard call once the provider has seen that many effects
    raises it; ``no_token``: admission raises ``NoToken``)."""

    def __init__(self, effects: Callable[[], int], deadline: float, *, lose_at: int | None = None,
                 lose_after: int | None = None, no_token: bool = False) -> None:
        self.effects = effects
        self.end = time.monotonic() + deadline
        self.lose_at = lose_at
        self.lose_after = lose_after
        self.no_token = no_token
        self.events: list[tuple[str, int]] = []
        self.admitted = False

    def remaining(self) -> float:
        """Seconds left before the scenario's deadline (never negative)."""
        return max(0.0, self.end - time.monotonic())

    def _check(self, kind: str) -> None:
        self.events.append((kind, self.effects()))
        if self.lose_at is not None and len(self.events) >= self.lose_at:
            raise LeaseLost("the test took the lease away")
        if self.lose_after is not None and self.events[-1][1] >= self.lose_after:
            raise LeaseLost("the test took the lease away after the first effect")

    async def admit(self) -> None:
        """Record the admission (once); raises ``NoToken`` when the scenario has no token, ``LeaseLost`` when the test
        takes the lease away.
        """
        if self.admitted:
            return
        if self.no_token:
            self.events.append(("no_token", self.effects()))
            raise NoToken(5.0)
        self._check("admit")
        self.admitted = True

    async def guard_provider_attempt(self) -> None:
        """Record a guard before a provider effect; raises ``LeaseLost`` once the test takes the lease away."""
        self._check("guard")


def _judge(guard: RecordingGuard, observed: Observation | None) -> ProviderOutcome:
    """What the runtime would record (delivery._judged): a cut call is UNKNOWN once admitted."""
    if observed is None:
        return ProviderOutcome.UNKNOWN if guard.admitted else ProviderOutcome.NOT_STARTED
    return observed.outcome


class ChannelContract:
    """Subclass it (name it ``Test...``) and implement :meth:`scenario`."""

    deadline: float = 2.0
    """The adapter deadline the checks give each call (seconds)."""
    unsupported: frozenset[str] = frozenset()

    def scenario(self, name: str) -> contextlib.AbstractAsyncContextManager[Scenario]:
        """An async context manager yielding the ``Scenario`` called ``name``; a subclass implements it against its
        provider's test server.
        """
        raise NotImplementedError("a ChannelContract subclass implements scenario(name) as an async context manager")

    # -- helpers -----------------------------------------------------------------------------------
    def _needs(self, *names: str) -> None:
        missing = [n for n in names if n in self.unsupported]
        if missing:
            import pytest  # the checks need pytest only to skip

            pytest.skip(f"the channel declares {', '.join(missing)} unsupported")

    def _run(self, fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        asyncio.run(fn())

    def _delivery(self, s: Scenario) -> Delivery:
        return Delivery("n" * 26, s.recipient, dict(s.content), cycle=1, attempt=1, channel=s.channel.name)

    async def _call(self, s: Scenario, guard: RecordingGuard, *, cut: bool = True) -> tuple[Observation | None, BaseException | None]:
        """The channel's call as the runtime makes it: admitted at entry when it does not report its
        admission, cut at the deadline (``cut``) or at a generous outer bound (to see lateness)."""
        bound = self.deadline if cut else self.deadline + 10 * SLACK_SECONDS
        try:
            async with asyncio.timeout(bound):
                if not s.channel.reports_admission:
                    await guard.admit()
                return await s.channel.send(self._delivery(s), guard), None
        except (TimeoutError, LeaseLost, NoToken) as exc:
            return None, exc

    # -- the checks --------------------------------------------------------------------------------
    def test_accept_is_success_and_admission_comes_before_the_effect(self) -> None:
        """An accepted send is SUCCESS, and the channel asks for admission before the provider sees any effect."""
        async def check() -> None:
            async with self.scenario("accept") as s:
                guard = RecordingGuard(s.effects, self.deadline)
                observed, failure = await self._call(s, guard)
                assert failure is None and observed is not None, f"the accepted send failed: {failure!r}"
                assert observed.outcome is ProviderOutcome.SUCCESS, observed
                # Lease-only checks (guard_provider_attempt, which writes nothing) may come before it.
                kinds = [kind for kind, _ in guard.events]
                assert "admit" in kinds and guard.events[kinds.index("admit")][1] == 0, (
                    f"no admission before the effect: {guard.events}")
                assert s.effects() >= 1, "SUCCESS without the provider having seen anything"
        self._run(check)

    def test_reject_is_rejected_after_admission(self) -> None:
        """A provider's refusal is REJECTED, observed after admission."""
        self._needs("reject")

        async def check() -> None:
            async with self.scenario("reject") as s:
                guard = RecordingGuard(s.effects, self.deadline)
                observed, failure = await self._call(s, guard)
                assert observed is not None and observed.outcome is ProviderOutcome.REJECTED, (observed, failure)
                assert guard.admitted
        self._run(check)

    def test_every_provider_effect_has_a_guard_right_before_it(self) -> None:
        """Each provider effect, retries included, is preceded by its own guard call."""
        self._needs("retry_then_accept")

        async def check() -> None:
            async with self.scenario("retry_then_accept") as s:
                guard = RecordingGuard(s.effects, self.deadline)
                observed, failure = await self._call(s, guard)
                assert observed is not None and observed.outcome is ProviderOutcome.SUCCESS, (observed, failure)
                made = s.effects()
                assert made >= 2 and observed.retries >= 1, f"expected a provider retry: {made} effects, {observed}"
                if s.channel.guards_provider_attempts:
                    guarded = {seen for _, seen in guard.events}
                    unguarded = [k for k in range(made) if k not in guarded]
                    assert not unguarded, f"effects {[k + 1 for k in unguarded]} had no guard right before them: {guard.events}"
        self._run(check)

    def test_a_refused_guard_stops_every_further_effect(self) -> None:
        """Once a guard refuses (the lease is lost), the channel makes no further provider effect."""
        self._needs("retry_then_accept")

        async def check() -> None:
            async with self.scenario("retry_then_accept") as s:
                if not s.channel.guards_provider_attempts:
                    return  # guarded at its entry only: its retries are its provider library's
                # The retry's guard refuses (lease-only checks before admission do not count).
                guard = RecordingGuard(s.effects, self.deadline, lose_after=1)
                observed, failure = await self._call(s, guard)
                await asyncio.sleep(0.05)
                assert s.effects() == 1, f"{s.effects()} effects after the guard refused the retry ({observed}, {failure!r})"
                assert observed is None or observed.outcome is not ProviderOutcome.SUCCESS
        self._run(check)

    def test_no_token_makes_no_effect(self) -> None:
        """Without a rate-limit token the channel makes no provider effect at all."""
        async def check() -> None:
            async with self.scenario("accept") as s:
                if not s.channel.reports_admission:
                    return  # the runtime draws its token before the call
                guard = RecordingGuard(s.effects, self.deadline, no_token=True)
                observed, failure = await self._call(s, guard)
                await asyncio.sleep(0.05)
                assert s.effects() == 0, f"the provider saw {s.effects()} effects without a token"
                assert observed is None or observed.outcome in (ProviderOutcome.NOT_STARTED, ProviderOutcome.RATE_LIMITED)
        self._run(check)

    def test_a_call_cut_before_admission_is_not_started_with_no_effect(self) -> None:
        """A call cut before admission is NOT_STARTED and the provider saw nothing."""
        self._needs("hang_before_admission")

        async def check() -> None:
            async with self.scenario("hang_before_admission") as s:
                if not s.channel.reports_admission:
                    return  # admitted at its entry: a cut is UNKNOWN by the runtime's rule
                guard = RecordingGuard(s.effects, self.deadline)
                observed, _ = await self._call(s, guard)
                assert _judge(guard, observed) is ProviderOutcome.NOT_STARTED, (observed, guard.events)
                assert not guard.admitted and s.effects() == 0
        self._run(check)

    def test_a_call_cut_after_admission_is_unknown(self) -> None:
        """A call cut after admission is UNKNOWN: the provider may have acted."""
        self._needs("hang_after_admission")

        async def check() -> None:
            async with self.scenario("hang_after_admission") as s:
                guard = RecordingGuard(s.effects, self.deadline)
                observed, _ = await self._call(s, guard)
                assert _judge(guard, observed) is ProviderOutcome.UNKNOWN, (observed, guard.events)
                assert guard.admitted and s.effects() >= 1
        self._run(check)

    def test_the_adapter_deadline_is_kept_without_being_cut(self) -> None:
        """A hanging provider call returns by the adapter's own deadline, before the runtime has to cut it."""
        hanging = [n for n in ("hang_before_admission", "hang_after_admission") if n not in self.unsupported]
        if not hanging:
            self._needs("hang_before_admission", "hang_after_admission")

        async def check() -> None:
            for name in hanging:
                async with self.scenario(name) as s:
                    guard = RecordingGuard(s.effects, self.deadline)
                    started = time.monotonic()
                    observed, failure = await self._call(s, guard, cut=False)
                    took = time.monotonic() - started
                    assert took <= self.deadline + SLACK_SECONDS, (
                        f"{name}: the call took {took:.2f}s with {self.deadline:g}s remaining (socket budgets must come "
                        f"from guard.remaining()); {observed}, {failure!r}")
        self._run(check)

    def test_rate_limited_reports_rate_limited(self) -> None:
        """A provider's rate limit is reported as RATE_LIMITED, with a non-negative retry-after when one is given.
        """
        self._needs("rate_limited")

        async def check() -> None:
            async with self.scenario("rate_limited") as s:
                guard = RecordingGuard(s.effects, self.deadline)
                observed, failure = await self._call(s, guard)
                assert observed is not None and observed.outcome is ProviderOutcome.RATE_LIMITED, (observed, failure)
                assert observed.retry_after is None or observed.retry_after >= 0
        self._run(check)

    def test_no_secret_reaches_a_fact_a_row_a_log_line_or_the_repr(self) -> None:
        """No secret of the scenario appears in the channel's repr, a fact, a row or a log line, in any scenario."""
        async def check() -> None:
            for name in (n for n in SCENARIOS if n not in self.unsupported):
                async with self.scenario(name) as s:
                    secrets = [x for x in s.secrets if x]
                    for text in (repr(s.channel), str(s.channel)):
                        leaked = [x for x in secrets if x in text]
                        assert not leaked, f"repr/str of the channel shows a secret ({name})"
                    rows, logged = await _through_the_runtime(s, self.deadline)
                    for secret in secrets:
                        assert secret not in rows, f"{name}: a secret reached a fact or a row"
                        assert secret not in logged, f"{name}: a secret reached a log line"
        self._run(check)

    def test_a_late_completion_never_rewrites_the_observation(self) -> None:
        """A provider call that completes after it was recorded UNKNOWN never rewrites the recorded observation."""
        self._needs("hang_after_admission")

        async def check() -> None:
            async with self.scenario("hang_after_admission") as s:
                book, path = await _book()
                try:
                    attempt = await _attempt(book, s, self.deadline)
                    assert attempt["status"] == "unknown", attempt
                    if s.release is not None:
                        s.release()
                    await asyncio.sleep(0.3)
                    after = await _attempts(book)
                    assert after == [attempt], f"the observation changed after a late completion: {after}"
                finally:
                    await book.engine.dispose()
                    path.cleanup()
        self._run(check)


# -- the real runtime, on a throwaway SQLite book ---------------------------------------------------
async def _book() -> tuple[Any, tempfile.TemporaryDirectory[str]]:
    from statebook.adapters.db import open_book

    folder = tempfile.TemporaryDirectory(prefix="statebook-contract-")
    book = await open_book(f"sqlite:///{Path(folder.name) / 'contract.db'}", clock=SYSTEM_CLOCK)  # real servers, real time
    return book, folder


async def _attempt(book: Any, s: Scenario, deadline: float) -> dict[str, Any]:
    mode = Mode.GUARANTEED if s.channel.persistent else Mode.BEST_EFFORT
    await send_notification(book, recipient=s.recipient, content=dict(s.content), mode=mode, channels=[s.channel.name])
    won, _ = await claim_due(book, now=book.clock.now(), limit=1, lease_seconds=deadline + 30)
    [lease] = won
    with contextlib.suppress(LeaseLost):
        await attempt_channel(book, lease, s.channel, deadline=deadline)
    [attempt] = await _attempts(book)
    return attempt


async def _attempts(book: Any) -> list[dict[str, Any]]:
    from statebook.outbox.notifications.schema import channel_attempts

    async with book.read() as conn:
        return [dict(r._mapping) for r in await conn.execute(sa.select(channel_attempts))]


async def _through_the_runtime(s: Scenario, deadline: float) -> tuple[str, str]:
    """Run the scenario's call through the real runtime; every row of every table and every log line
    (all loggers, DEBUG) as text."""
    from statebook.lifecycle.schema import metadata

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(self.format(record))

    handler, root = Keep(logging.DEBUG), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    book, folder = await _book()
    try:
        await _attempt(book, s, deadline)
        async with book.read() as conn:
            rows = [repr(dict(r._mapping)) for table in metadata.sorted_tables for r in await conn.execute(sa.select(table))]
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        await book.engine.dispose()
        folder.cleanup()
    return "\n".join(rows), "\n".join(records)
