"""statebook.outbox — the durable dispatch outbox, driven through the lifecycle engine.

Producers :func:`enqueue_dispatch`; a :class:`DeliveryWorker` (or :func:`deliver_due_dispatches`
on a tick) claims due rows, runs a :class:`Transport` outside any transaction and records each
outcome as one transition; consumers :func:`ack_dispatch`; operators inspect, retry and purge.
"""

from .ack import ack_dispatch
from .admin import apply_retention, get_dispatch, list_dispatches, purge_dispatch, purge_dispatches, retry_dispatch
from .delivery import (
    CLAIM_LEASE_SECONDS,
    COUNTERS,
    Candidate,
    Lease,
    backoff_seconds,
    claim,
    claim_due,
    deliver_due_dispatches,
    execute,
    expire,
    finalize,
    finalize_all,
    next_due,
    release,
    run_leases,
    scan,
    settle,
)
from .enqueue import (
    DEFAULT_MAX_ATTEMPTS,
    NOTIFY_CHANNEL,
    enqueue_dispatch,
    enqueue_dispatches,
    enqueue_revival_heartbeat,
)
from .errors import AckRejected, DispatchInvalid
from .policy import DISPATCH, DISPATCH_REASONS
from .schema import DISPATCH_STATUSES, TERMINAL_STATUSES, dispatch_outbox
from .signal import SIGNAL_SCHEMA_VERSION, DispatchSignal, Signal
from .transport import NOTIFY_TIMEOUT_SECONDS, ArgvTransport, CallableTransport, Transport, TransportResult
from .worker import DeliveryWorker, Retention

__all__ = [
    "CLAIM_LEASE_SECONDS", "COUNTERS", "DEFAULT_MAX_ATTEMPTS", "DISPATCH", "DISPATCH_REASONS", "DISPATCH_STATUSES",
    "NOTIFY_CHANNEL", "NOTIFY_TIMEOUT_SECONDS", "SIGNAL_SCHEMA_VERSION", "TERMINAL_STATUSES", "AckRejected",
    "ArgvTransport", "CallableTransport", "Candidate", "DeliveryWorker", "DispatchInvalid", "DispatchSignal", "Lease",
    "Retention", "Signal", "Transport", "TransportResult", "ack_dispatch", "apply_retention", "backoff_seconds",
    "claim", "claim_due", "deliver_due_dispatches", "dispatch_outbox", "enqueue_dispatch", "enqueue_dispatches",
    "enqueue_revival_heartbeat", "execute", "expire", "finalize", "finalize_all", "get_dispatch", "list_dispatches", "next_due",
    "purge_dispatch", "purge_dispatches", "release", "retry_dispatch", "run_leases", "scan", "settle",
]
