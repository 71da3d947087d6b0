"""The default registry: the built-in lifecycles of the outbox and the scheduler."""

from __future__ import annotations

from statebook.lifecycle import Registry
from statebook.outbox import DISPATCH
from statebook.scheduler import SCHEDULE, SCHEDULE_RUN


def builtin_registry(*, seal: bool = True) -> Registry:
    """A registry holding ``dispatch``, ``schedule`` and ``schedule_run``.

    Pass ``seal=False`` to register or extend lifecycles before sealing it yourself.
    """
    registry = Registry([DISPATCH, SCHEDULE, SCHEDULE_RUN])
    return registry.seal() if seal else registry
