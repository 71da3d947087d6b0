"""The notifications' conformance cases (specs/notifications.md), run by test_notifications.py on each backend."""
