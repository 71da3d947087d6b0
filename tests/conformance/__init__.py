"""The lifecycle conformance suite: backend-neutral test cases a database backend inherits.

``suite.LifecycleConformance`` holds the cases; a backend subclasses it (plus the mixin for its
concurrency model) and provides one fixture, ``db_url``. See test_sqlite.py and test_postgres.py.
"""

import pytest

# The cases live outside test_*.py modules; ask pytest to rewrite their asserts all the same.
pytest.register_assert_rewrite(
    "conformance.support",
    "conformance.cases_commands",
    "conformance.cases_batch",
    "conformance.cases_audit",
    "conformance.cases_concurrency",
    "conformance.cases_tail",
    "conformance.cases_driver",
    "conformance.suite",
)
