"""statebook.outbox.notifications — notifications people are meant to receive (specs/notifications.md).

An obligation to reach a recipient through channels (Slack, email, PagerDuty, WebSocket), with the
delivery semantics of the seed "Delivery and response semantics": GUARANTEED and BEST_EFFORT modes,
channel fallback in a fixed order, bounded delivery cycles with a visible dead letter, fenced provider
attempts recorded as their own entities, and rate limits shared by every worker through the database.

Intake and reads: :func:`send_notification`, :func:`get_notification`, :func:`list_notifications`,
:func:`notification_attempts`; reads return the frozen models of :mod:`.models` (:class:`Notification`,
:class:`ChannelAttempt`, ...). Explicit retention (never at start-up or by a worker):
:func:`apply_notification_retention`. Delivery: :func:`deliver_due_notifications` and its separate steps in
:mod:`.delivery`; rate limits shared by every worker: :func:`ensure_bucket`, :func:`draw`. The channel
protocol: :mod:`.channels`; test channels: :mod:`.scripted`.
"""

from .channels import (
    CHANNEL_NAMES, EPHEMERAL, FOLLOWS_RESPONSES, PERSISTENT_ORDER, Channel, Delivery, Guard, LeaseLost, Mode, NoToken, Observation, ProviderOutcome,
    check_order,
)
from .buckets import draw, ensure_bucket, hold
from .delivery import deliver_due_notifications
from .errors import IdempotencyConflict, NotificationInvalid
from .models import ChannelAttempt, DeadLetter, FollowUp, Notification, NotificationResponse, TimeoutCallback
from .intake import Accepted, get_notification, list_notifications, notification_attempts, send_notification
from .recovery import RecoveryRefused, Replayed, list_dead_letters, replay_notification, resolve_notification
from .policy import CHANNEL_ATTEMPT, DEDUP_CLAIM, NOTIFICATION, NOTIFICATION_RESPONSE, RATE_BUCKET, RETENTION_RUN
from .responses import (
    CallbackTransport, ResponseConflict, ack_notification, dismiss_notification, expire_responses, follow_ups, get_response,
    register_timeout_callback, timeout_callbacks, unregister_timeout_callback,
)
from .retention import RetentionReport, apply_notification_retention
from .schema import channel_attempts, dedup_claims, notification_retention_runs, notifications, rate_buckets
from .worker import NotificationWorker, ResponseTimeoutWorker

__all__ = [
    "CHANNEL_ATTEMPT", "CHANNEL_NAMES", "DEDUP_CLAIM", "IdempotencyConflict", "NOTIFICATION", "PERSISTENT_ORDER", "RATE_BUCKET", "Accepted", "Channel",
    "Delivery", "Guard", "LeaseLost", "Mode", "NoToken", "NotificationInvalid", "NotificationWorker", "Observation", "ProviderOutcome",
    "RETENTION_RUN", "RetentionReport", "apply_notification_retention", "notification_retention_runs",
    "channel_attempts", "dedup_claims", "deliver_due_notifications", "draw", "ensure_bucket", "get_notification", "list_notifications", "notification_attempts", "notifications",
    "rate_buckets", "send_notification", "RecoveryRefused", "Replayed", "list_dead_letters", "replay_notification",
    "resolve_notification", "NOTIFICATION_RESPONSE", "CallbackTransport", "ResponseConflict", "ack_notification",
    "dismiss_notification", "expire_responses", "get_response", "register_timeout_callback",
    "unregister_timeout_callback", "ResponseTimeoutWorker", "timeout_callbacks",
    "EPHEMERAL", "FOLLOWS_RESPONSES", "check_order", "follow_ups", "hold",
    "ChannelAttempt", "DeadLetter", "FollowUp", "Notification", "NotificationResponse", "TimeoutCallback",
]
