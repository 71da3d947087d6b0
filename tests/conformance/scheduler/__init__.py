"""The scheduler's conformance cases (specs/scheduler.md), run by test_scheduler.py on each backend."""
