"""Real notification channels: Slack, email, PagerDuty, signed webhooks, WebSocket and Apprise.

Each adapter is a small module implementing :class:`statebook.outbox.notifications.Channel`, configured
by a section of ``[notifications]`` in the settings; secrets come from the environment or a file
(:mod:`.secrets`) and never reach a log line, a fact or ``channels ls``. :mod:`.contract` is the test
case every adapter — ours and the ones users write — subclasses.
"""
