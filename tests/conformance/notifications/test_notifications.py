"""The notifications' conformance cases (specs/notifications.md) on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest

from ..suite import PostgresBackend, SQLiteBackend
from .cases_bucket import NotificationBucketCases
from .cases_channel import NotificationChannelCases
from .cases_delivery import NotificationDeliveryCases
from .cases_evidence import NotificationEvidenceCases
from .cases_intake import NotificationIntakeCases
from .cases_ownership import NotificationOwnershipCases
from .cases_pass import NotificationPassCases
from .cases_recovery import NotificationRecoveryCases
from .cases_response import NotificationResponseCases
from .cases_retention import NotificationRetentionCases
from .cases_times import NotificationTimeCases
from .cases_worker import NotificationWorkerCases


class NotificationConformance(
    NotificationIntakeCases, NotificationDeliveryCases, NotificationBucketCases, NotificationWorkerCases,
    NotificationPassCases, NotificationOwnershipCases, NotificationRecoveryCases, NotificationResponseCases,
    NotificationRetentionCases, NotificationChannelCases, NotificationEvidenceCases, NotificationTimeCases,
):
    """The notifications' cases, from this folder's cases_*.py."""


class TestNotificationsSQLite(SQLiteBackend, NotificationConformance):
    pass


@pytest.mark.postgres
class TestNotificationsPostgres(PostgresBackend, NotificationConformance):
    pass
