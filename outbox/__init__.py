"""statebook.outbox — the durable dispatch outbox, driven through the lifecycle engine.

Producers :func:`enqueue_dispatch`; a :class:`DeliveryWorker` (or :func:`deliver_due_dispatches`
on a tick) claims due rows, runs a :class:`Transport` outside any transaction and records each
outcome as one transition; consumers :func:`ack_dispatch`; operators inspect, retry, expedite and purge.
Bad arguments are refused before any query (:class:`DispatchInvalid`, an ``InvalidArgument``);
:func:`dispatch_limits` gives a book the bounds its delivery template can carry (O22).
The pipeline's separate steps (scan, claim, execute, finalize, release) live in :mod:`.delivery`
and :mod:`.attempts`; constants beside the code they govern.
"""

from .ack import ack_dispatch
from .admin import (
    apply_retention, expedite_dispatch, get_dispatch, list_dispatches, purge_dispatch, purge_dispatches, retry_dispatch,
)
from .bounds import DispatchLimits, dispatch_limits
from .dispatch.delivery import deliver_due_dispatches
from .enqueue import enqueue_dispatch, enqueue_dispatches, enqueue_revival_heartbeat
from .errors import AckRejected, DispatchInvalid
from .models import Dispatch
from .policy import DISPATCH
from .schema import dispatch_outbox
from .signal import DispatchSignal, Signal
from .transport import ArgvTransport, CallableTransport, RoutingTransport, Transport, TransportResult
from .dispatch.worker import DeliveryWorker, Retention

__all__ = [
    "DISPATCH", "AckRejected", "ArgvTransport", "CallableTransport", "DeliveryWorker", "Dispatch", "DispatchInvalid",
    "DispatchLimits", "DispatchSignal", "Retention", "RoutingTransport", "Signal", "Transport", "TransportResult", "ack_dispatch",
    "apply_retention", "deliver_due_dispatches", "dispatch_limits", "dispatch_outbox", "enqueue_dispatch",
    "enqueue_dispatches", "enqueue_revival_heartbeat", "expedite_dispatch", "get_dispatch", "list_dispatches", "purge_dispatch",
    "purge_dispatches", "retry_dispatch",
]
