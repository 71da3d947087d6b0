"""The outbox's conformance cases (specs/outbox.md), run by test_outbox.py on each backend."""
