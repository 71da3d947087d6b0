"""The scheduler's conformance cases (specs/scheduler.md) on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from ..suite import PostgresBackend, SQLiteBackend
from .cases_chains_and_notify import ChainsAndNotifyCases
from .cases_gate import GateCases
from .cases_github_poll import GithubPollCases
from .cases_inputs import SchedulerInputCases
from .cases_launcher import LauncherCases
from .cases_leadership import LeadershipCases
from .cases_missed_and_recovery import MissedAndRecoveryCases
from .cases_set_evaluation import SetEvaluationCases
from .cases_stale_claim import StaleClaimCases
from .cases_times import SchedulerTimeCases


class SchedulerConformance(
    SetEvaluationCases, GateCases, StaleClaimCases, MissedAndRecoveryCases, ChainsAndNotifyCases, GithubPollCases,
    LeadershipCases, LauncherCases, SchedulerInputCases, SchedulerTimeCases,
):
    """The scheduler's cases, from this folder's cases_*.py."""


class TestSchedulerSQLite(SQLiteBackend, SchedulerConformance):
    pass


@pytest.mark.postgres
class TestSchedulerPostgres(PostgresBackend, SchedulerConformance):
    pass
