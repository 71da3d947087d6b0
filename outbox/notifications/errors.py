"""The notifications' errors (specs/notifications.md)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from statebook.lifecycle.errors import InvalidArgument

T = TypeVar("T")


class NotificationInvalid(InvalidArgument):
    """A notification argument is invalid; nothing was written (an :class:`InvalidArgument`, so a
    ``ValueError``). ``argument`` names the public argument, ``rule`` the rule it broke: the
    :mod:`statebook.lifecycle.inputs` rules, or ``mode`` (a GUARANTEED request without a persistent
    channel), ``channel`` (an unknown or repeated channel)."""


def refused(argument: str, rule: str, message: str) -> NotificationInvalid:
    """The refusal of ``argument`` (its message starts with the argument's name)."""
    return NotificationInvalid(f"{argument}: {message}", argument=argument, rule=rule)


def checked(check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``check(*args, **kwargs)`` (a :mod:`statebook.lifecycle.inputs` rule), its refusal as a NotificationInvalid."""
    try:
        return check(*args, **kwargs)
    except NotificationInvalid:
        raise
    except InvalidArgument as exc:
        raise NotificationInvalid(str(exc), argument=exc.argument, rule=exc.rule) from None
