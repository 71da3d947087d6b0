"""The conformance suite: backend-neutral test cases, one folder per part, each run on every backend.

Each part's folder holds its case files (``cases_*.py``, mixins of test methods) and one test module with a
class per backend: ``TestLifecycleSQLite`` / ``TestLifecyclePostgres`` (lifecycle/), ``TestOutbox*``
(outbox/), ``TestNotifications*`` (notifications/) and ``TestScheduler*`` (scheduler/). What the classes
share, a Book per test on one backend, is in suite.py.
"""

import pytest

# The cases live outside test_*.py modules; ask pytest to rewrite their asserts all the same (a name covers
# every module under it).
pytest.register_assert_rewrite(
    "conformance.suite",
    "conformance.lifecycle",
    "conformance.outbox",
    "conformance.notifications",
    "conformance.scheduler",
)
