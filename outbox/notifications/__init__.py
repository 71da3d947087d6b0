"""statebook.outbox.notifications — notifications people are meant to receive (specs/notifications.md).

An obligation to reach a recipient through channels (Slack, email, PagerDuty, WebSocket), with the
delivery semantics of the seed "Delivery and response semantics": GUARANTEED and BEST_EFFORT modes,
channel fallback in a fixed order, bounded delivery cycles with a visible dead letter, fenced provider
attempts recorded as their own entities, and rate limits shared by every worker through the database.
Delivered on the delivery core (:mod:`statebook.outbox.core`), like dispatches.

Intake and reads: :func:`send_notification`, :func:`get_notification`, :func:`list_notifications`,
:func:`notification_attempts`. Reads return the frozen models of :mod:`.models` (:class:`Notification`,
:class:`ChannelAttempt`, ...). Delivery: :class:`NotificationWorker` or :func:`deliver_due_notifications`
(its steps: :mod:`.delivery`; what a claim and a finalization write: :mod:`.attempts`; the channel side
of an attempt: :mod:`.calls`). Responses: :func:`ack_notification`, :func:`dismiss_notification`, timeout
callbacks (:mod:`.responses`). Recovery and explicit retention: :mod:`.recovery`,
:func:`apply_notification_retention`. The channel protocol: :mod:`.channels`; rate-limit buckets:
:mod:`.buckets`; tables: :mod:`.schema`; test channels: :mod:`.scripted`.
"""

from typing import TYPE_CHECKING

from statebook.lifecycle.errors import IdempotencyMismatch
from statebook.lifecycle.lazy import lazy_names

if TYPE_CHECKING:  # what a type checker and the API reference read; at run time each module loads on first use
    from .buckets import ensure_bucket
    from .channels import Channel, Delivery, Guard, LeaseLost, LinkHook, Mode, NoToken, Observation, ProviderOutcome
    from .delivery import deliver_due_notifications
    from .errors import NotificationInvalid
    from .models import ChannelAttempt, DeadLetter, FollowUp, Notification, NotificationResponse, TimeoutCallback
    from .intake import Accepted, get_notification, list_notifications, notification_attempts, send_notification
    from .policy import CHANNEL_ATTEMPT, DEDUP_CLAIM, NOTIFICATION, NOTIFICATION_RESPONSE, RATE_BUCKET, RETENTION_RUN
    from .recovery import RecoveryRefused, Replayed, list_dead_letters, replay_notification, resolve_notification
    from .responses import (
        CallbackTransport, ResponseConflict, ack_notification, dismiss_notification, get_response,
        register_timeout_callback, timeout_callbacks, unregister_timeout_callback,
    )
    from .retention import RetentionReport, apply_notification_retention
    from .schema import notifications
    from .worker import NotificationWorker, ResponseTimeoutWorker

_WHERE = {
    ".buckets": ("ensure_bucket",),
    ".channels": (
        "Channel", "Delivery", "Guard", "LeaseLost", "LinkHook", "Mode", "NoToken", "Observation", "ProviderOutcome",
    ),
    ".delivery": ("deliver_due_notifications",),
    ".errors": ("NotificationInvalid",),
    ".models": ("ChannelAttempt", "DeadLetter", "FollowUp", "Notification", "NotificationResponse", "TimeoutCallback"),
    ".intake": ("Accepted", "get_notification", "list_notifications", "notification_attempts", "send_notification"),
    ".policy": (
        "CHANNEL_ATTEMPT", "DEDUP_CLAIM", "NOTIFICATION", "NOTIFICATION_RESPONSE", "RATE_BUCKET", "RETENTION_RUN",
    ),
    ".recovery": ("RecoveryRefused", "Replayed", "list_dead_letters", "replay_notification", "resolve_notification"),
    ".responses": (
        "CallbackTransport", "ResponseConflict", "ack_notification", "dismiss_notification", "get_response",
        "register_timeout_callback", "timeout_callbacks", "unregister_timeout_callback",
    ),
    ".retention": ("RetentionReport", "apply_notification_retention"),
    ".schema": ("notifications",),
    ".worker": ("NotificationWorker", "ResponseTimeoutWorker"),
}
"""The module of each public name: ``statebook ...`` commands import only what they use (specs/cli.md C10)."""
_MODULE_OF, __getattr__, __dir__ = lazy_names(__name__, _WHERE, globals())


__all__ = [
    "CHANNEL_ATTEMPT", "DEDUP_CLAIM", "NOTIFICATION", "NOTIFICATION_RESPONSE", "RATE_BUCKET", "RETENTION_RUN",
    "Accepted", "CallbackTransport", "Channel", "Delivery", "Guard", "IdempotencyMismatch", "LeaseLost", "LinkHook",
    "Mode", "NoToken", "NotificationInvalid", "NotificationWorker", "Observation", "ProviderOutcome", "RecoveryRefused",
    "Replayed", "ResponseConflict", "ResponseTimeoutWorker", "RetentionReport", "ack_notification",
    "apply_notification_retention", "deliver_due_notifications", "dismiss_notification", "ensure_bucket",
    "get_notification", "get_response", "list_dead_letters", "list_notifications", "notification_attempts",
    "notifications", "register_timeout_callback", "replay_notification", "resolve_notification", "send_notification",
    "timeout_callbacks", "unregister_timeout_callback",
    "ChannelAttempt", "DeadLetter", "FollowUp", "Notification", "NotificationResponse", "TimeoutCallback",
]
