"""The channel contract can fail: a well-behaved in-process channel passes it, and each broken variant
fails the check written for its defect (specs/notifications.md N41)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field

import pytest

from statebook.adapters.channels.contract import ChannelContract, Scenario
from statebook.outbox.notifications import Delivery, Guard, Observation, ProviderOutcome

TOKEN = "xoxb-contract-secret-0123456789"


@dataclass
class Provider:
    """An in-process provider: ``received`` are its effects; ``behaviour`` is the scenario."""

    behaviour: str
    received: list[str] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)


class Good:
    """Keeps every rule: connects within the deadline, admits before the effect, guards each retry."""

    name = "webhook"
    persistent = True
    reports_admission = True
    guards_provider_attempts = True

    def __init__(self, provider: Provider) -> None:
        self.provider = provider

    def __repr__(self) -> str:
        return "Good(token=****)"

    async def connect(self, guard: Guard) -> bool:
        if self.provider.behaviour != "hang_before_admission":
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.Event().wait(), guard.remaining())
        return False

    async def effect(self, delivery: Delivery) -> None:
        self.provider.received.append(delivery.notification_id)

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        if not await self.connect(guard):
            return Observation(ProviderOutcome.NOT_STARTED, "could not connect in time")
        await guard.admit()
        await self.effect(delivery)
        behaviour = self.provider.behaviour
        if behaviour == "reject":
            return Observation(ProviderOutcome.REJECTED, "400")
        if behaviour == "rate_limited":
            return Observation(ProviderOutcome.RATE_LIMITED, "429", retry_after=3.0)
        if behaviour == "hang_after_admission":
            try:
                await asyncio.wait_for(self.provider.released.wait(), guard.remaining())
            except TimeoutError:
                return Observation(ProviderOutcome.UNKNOWN, "no answer in time")
        if behaviour == "retry_then_accept":
            await self.retry(delivery, guard)
            return Observation(ProviderOutcome.SUCCESS, "202 after a retry", retries=1)
        return Observation(ProviderOutcome.SUCCESS, "202")

    async def retry(self, delivery: Delivery, guard: Guard) -> None:
        await guard.guard_provider_attempt()
        await self.effect(delivery)


class EffectBeforeAdmission(Good):
    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        await self.effect(delivery)
        await guard.admit()
        return Observation(ProviderOutcome.SUCCESS, "202")


class UnguardedRetry(Good):
    async def retry(self, delivery: Delivery, guard: Guard) -> None:
        await self.effect(delivery)


class IgnoresTheDeadline(Good):
    async def connect(self, guard: Guard) -> bool:
        if self.provider.behaviour == "hang_before_admission":
            await asyncio.sleep(5.0)  # its own fixed socket timeout, longer than what is left
            return False
        return True


class LeaksItsToken(Good):
    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        observed = await super().send(delivery, guard)
        logging.getLogger("leaky").info("sent with %s", TOKEN)
        return observed


def contract_for(channel_class: type[Good]) -> type[ChannelContract]:
    class Contract(ChannelContract):
        deadline = 0.5

        @contextlib.asynccontextmanager
        async def scenario(self, name: str):
            provider = Provider(name)
            yield Scenario(channel_class(provider), effects=lambda: len(provider.received), secrets=(TOKEN,),
                           release=provider.released.set)

    return Contract


class TestAWellBehavedChannelPassesTheContract(contract_for(Good)):  # type: ignore[misc]
    """Every inherited check runs on the good channel and passes."""


@pytest.mark.parametrize(("broken", "check"), [
    (EffectBeforeAdmission, "test_accept_is_success_and_admission_comes_before_the_effect"),
    (EffectBeforeAdmission, "test_no_token_makes_no_effect"),
    (UnguardedRetry, "test_every_provider_effect_has_a_guard_right_before_it"),
    (UnguardedRetry, "test_a_refused_guard_stops_every_further_effect"),
    (IgnoresTheDeadline, "test_the_adapter_deadline_is_kept_without_being_cut"),
    (LeaksItsToken, "test_no_secret_reaches_a_fact_a_row_a_log_line_or_the_repr"),
])
def test_a_broken_channel_fails_the_check_for_its_defect(broken: type[Good], check: str) -> None:
    contract = contract_for(broken)()
    with pytest.raises(AssertionError):
        getattr(contract, check)()
