"""The notifications' errors (specs/notifications.md)."""

from __future__ import annotations

from statebook.lifecycle.errors import InvalidArgument


class NotificationInvalid(InvalidArgument):
    """A notification argument is invalid; nothing was written (an :class:`InvalidArgument`, so a
    ``ValueError``). ``argument`` names the public argument, ``rule`` the rule it broke: the
    :mod:`statebook.lifecycle.inputs` rules, or ``mode`` (a GUARANTEED request without a persistent
    channel), ``channel`` (an unknown or repeated channel)."""
