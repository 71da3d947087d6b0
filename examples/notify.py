"""A harmless notification receiver for the argv transport: ``notify.py DELIVER_TO PAYLOAD``.

Prints one line to stderr and appends the payload to $STATEBOOK_NOTIFY_LOG (default
``statebook-notifications.log`` in the daemon's directory), so a newcomer can see what was delivered.
"""

import json
import os
import sys


def main() -> int:
    deliver_to, payload = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else sys.stdin.read()
    try:
        body = json.loads(payload).get("body", {})
    except (ValueError, AttributeError):
        body = {}
    print(
        f"notify -> {deliver_to}: schedule {body.get('schedule')} run {body.get('run_id')} {body.get('status')}"
        f" ({body.get('reason')})",
        file=sys.stderr,
    )
    with open(os.environ.get("STATEBOOK_NOTIFY_LOG") or "statebook-notifications.log", "a") as fh:
        fh.write(payload + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
