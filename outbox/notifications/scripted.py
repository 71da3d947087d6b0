"""Scripted in-process channels for tests and demos: each call plays the next step of a script.

>>> slack = ScriptedChannel("slack", ["reject", "success"])  # doctest: +SKIP

Steps (a string, or a callable ``(delivery) -> step`` for scripts that depend on the delivery):

- ``success`` / ``reject``: admit, make the provider effect, report SUCCESS / REJECTED;
- ``retry_success``: admit, a failing effect, ``guard_provider_attempt()``, a second effect: SUCCESS with
  one provider retry;
- ``hang_before``: wait forever before admission (the runtime's deadline cuts it: NOT_STARTED);
- ``hang_after``: admit, make the effect, then never answer (the deadline cuts it: UNKNOWN);
- ``limited``: admit, the provider answers 429 with ``Retry-After`` 5 s: RATE_LIMITED;
- ``raise_before`` / ``raise_after``: raise before / after admission.

``effects`` lists every provider effect (deliveries that reached the "provider"), ``admitted`` the
deliveries admitted; a script that runs out repeats its last step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .channels import Delivery, Guard, Observation, PERSISTENT_ORDER, ProviderOutcome

STEPS = ("success", "reject", "retry_success", "hang_before", "hang_after", "limited", "raise_before", "raise_after")


@dataclass
class ScriptedChannel:
    """A channel that plays a script of steps (``success``, ``reject``, ``limited``, hangs, raises: see the
    module), for tests of the delivery runtime.
    """

    name: str
    script: Sequence[str | Callable[[Delivery], str]] = ("success",)
    reports_admission: bool = True
    guards_provider_attempts: bool = True
    effects: list[Delivery] = field(default_factory=list)
    admitted: list[Delivery] = field(default_factory=list)
    calls: int = 0

    def __post_init__(self) -> None:
        for step in self.script:
            if isinstance(step, str) and step not in STEPS:
                raise ValueError(f"unknown step {step!r}; steps are {', '.join(STEPS)}")
        if not self.script:
            raise ValueError("a script needs at least one step")

    @property
    def persistent(self) -> bool:
        """True when the channel's name is one of the persistent channels."""
        return self.name in PERSISTENT_ORDER

    async def hang(self) -> None:
        """What a hanging step does: wait for ever, until the call's deadline cuts it. A test whose runs must not
        depend on the event loop's timing (a state machine) overrides it to raise :class:`TimeoutError` at once,
        as the deadline would, so a slow database write never races the deadline."""
        await asyncio.Event().wait()

    def _step(self, delivery: Delivery) -> str:
        step: Any = self.script[min(self.calls, len(self.script) - 1)]
        self.calls += 1
        said: str = step(delivery) if callable(step) else step
        return said

    async def send(self, delivery: Delivery, guard: Guard) -> Observation:
        """Play the next step of the script for ``delivery``, calling ``guard`` as a real adapter would, and return
        its observation.
        """
        step = self._step(delivery)
        if step == "hang_before":
            await self.hang()
        if step == "raise_before":
            raise RuntimeError("the adapter failed before sending")
        if self.reports_admission:
            await guard.admit()
        self.admitted.append(delivery)
        self.effects.append(delivery)
        if step == "raise_after":
            raise RuntimeError("the adapter failed after sending")
        if step == "hang_after":
            await self.hang()
        if step == "limited":
            return Observation(ProviderOutcome.RATE_LIMITED, "429 Too Many Requests", retry_after=5.0)
        if step == "reject":
            return Observation(ProviderOutcome.REJECTED, "400 invalid recipient")
        if step == "retry_success":
            if self.guards_provider_attempts:
                await guard.guard_provider_attempt()
            self.effects.append(delivery)
            return Observation(ProviderOutcome.SUCCESS, "accepted after one retry", retries=1)
        return Observation(ProviderOutcome.SUCCESS, "accepted")
