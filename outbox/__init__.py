"""statebook.outbox — the durable dispatch outbox, driven through the lifecycle engine."""

from .policy import DISPATCH, DISPATCH_REASONS
from .schema import DISPATCH_STATUSES, dispatch_outbox

__all__ = ["DISPATCH", "DISPATCH_REASONS", "DISPATCH_STATUSES", "dispatch_outbox"]
