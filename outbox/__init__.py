"""statebook.outbox — the durable dispatch outbox, driven through the lifecycle engine.

Producers :func:`enqueue_dispatch`; a :class:`DeliveryWorker` (or :func:`deliver_due_dispatches`
on a tick) claims due rows, runs a :class:`Transport` outside any transaction and records each
outcome as one transition; consumers :func:`ack_dispatch`; operators inspect, retry, expedite and purge.
Bad arguments are refused before any query (:class:`DispatchInvalid`, an ``InvalidArgument``);
:func:`dispatch_limits` gives a book the bounds its delivery template can carry (O22).
Three subpackages: :mod:`.core` (the delivery machinery every leased lifecycle shares), :mod:`.dispatch`
(the dispatch lifecycle on it; the pipeline's separate steps live in :mod:`.dispatch.steps` and
:mod:`.dispatch.attempts`) and :mod:`.notifications`.
"""

from typing import TYPE_CHECKING

from statebook.lifecycle.lazy import lazy_names

if TYPE_CHECKING:  # what a type checker and the API reference read; at run time each module loads on first use
    from .dispatch.ack import ack_dispatch
    from .dispatch.admin import (
        apply_retention, expedite_dispatch, get_dispatch, list_dispatches, purge_dispatch, purge_dispatches, retry_dispatch,
    )
    from .dispatch.bounds import DispatchLimits, dispatch_limits
    from .dispatch.delivery import deliver_due_dispatches
    from .dispatch.enqueue import enqueue_dispatch, enqueue_dispatches, enqueue_revival_heartbeat
    from .dispatch.errors import AckRejected, DispatchInvalid
    from .dispatch.models import Dispatch
    from .dispatch.policy import DISPATCH
    from .dispatch.schema import dispatch_outbox
    from .dispatch.signal import DispatchSignal, Signal
    from .dispatch.transport import ArgvTransport, CallableTransport, RoutingTransport, Transport, TransportResult
    from .dispatch.worker import DeliveryWorker, Retention

_WHERE = {
    ".dispatch.ack": ("ack_dispatch",),
    ".dispatch.admin": (
        "apply_retention", "expedite_dispatch", "get_dispatch", "list_dispatches", "purge_dispatch",
        "purge_dispatches", "retry_dispatch",
    ),
    ".dispatch.bounds": ("DispatchLimits", "dispatch_limits"),
    ".dispatch.delivery": ("deliver_due_dispatches",),
    ".dispatch.enqueue": ("enqueue_dispatch", "enqueue_dispatches", "enqueue_revival_heartbeat"),
    ".dispatch.errors": ("AckRejected", "DispatchInvalid"),
    ".dispatch.models": ("Dispatch",),
    ".dispatch.policy": ("DISPATCH",),
    ".dispatch.schema": ("dispatch_outbox",),
    ".dispatch.signal": ("DispatchSignal", "Signal"),
    ".dispatch.transport": ("ArgvTransport", "CallableTransport", "RoutingTransport", "Transport", "TransportResult"),
    ".dispatch.worker": ("DeliveryWorker", "Retention"),
}
"""The module of each public name: ``statebook ...`` commands import only what they use (specs/cli.md C10)."""
_MODULE_OF, __getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


__all__ = [
    "DISPATCH", "AckRejected", "ArgvTransport", "CallableTransport", "DeliveryWorker", "Dispatch", "DispatchInvalid",
    "DispatchLimits", "DispatchSignal", "Retention", "RoutingTransport", "Signal", "Transport", "TransportResult", "ack_dispatch",
    "apply_retention", "deliver_due_dispatches", "dispatch_limits", "dispatch_outbox", "enqueue_dispatch",
    "enqueue_dispatches", "enqueue_revival_heartbeat", "expedite_dispatch", "get_dispatch", "list_dispatches", "purge_dispatch",
    "purge_dispatches", "retry_dispatch",
]
