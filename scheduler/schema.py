"""The ``schedules`` and ``schedule_runs`` tables plus the lifecycle columns (specs/schedule.md, specs/schedule_run.md)."""

from __future__ import annotations

import sqlalchemy as sa

from statebook.lifecycle import managed_table
from statebook.lifecycle.schema import metadata

SCHEDULE_STATUSES = ("active", "paused", "exhausted", "deleted")
RUN_STATUSES = (
    "queued", "waiting_dependency", "running", "retry_wait", "completed", "failed", "timed_out", "skipped",
    "cancelled",
)
TRIGGER_TYPES = ("cron", "interval", "github_poll", "at")
ACTION_KINDS = ("agent", "flow", "fanout", "play", "flow_yaml", "command")
"""SCHEDULE_STATUSES and RUN_STATUSES are the built-in lifecycles' statuses, as SCHEDULE and SCHEDULE_RUN
declare them; the tables do not list them (their status CHECKs are built from the registry)."""


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


schedules = managed_table(
    "schedules",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("name", sa.Text, nullable=False, unique=True),
    sa.Column("description", sa.Text, nullable=True),
    sa.Column("enabled", sa.Integer, nullable=False, server_default="1"),
    sa.Column("trigger_type", sa.Text, nullable=False),
    sa.Column("cron_expr", sa.Text),
    sa.Column("timezone", sa.Text),
    sa.Column("interval_sec", sa.Integer),
    sa.Column("at_time", sa.Float),
    sa.Column("github_repo", sa.Text),
    sa.Column("github_filter", sa.JSON),
    sa.Column("github_cursor", sa.Text),
    sa.Column("poll_interval_sec", sa.Integer),
    sa.Column("action_kind", sa.Text, nullable=False),
    sa.Column("action_model", sa.Text),
    sa.Column("action_prompt", sa.Text),
    sa.Column("action_agent", sa.Text),
    sa.Column("action_play", sa.Text),
    sa.Column("action_flow_yaml", sa.Text),
    sa.Column("action_project", sa.Text),
    sa.Column("action_cwd", sa.Text),
    sa.Column("action_extra_args", sa.JSON),
    sa.Column("action_command", sa.Text),
    sa.Column("action_command_args", sa.JSON),
    sa.Column("on_success", sa.JSON),
    sa.Column("on_fail", sa.JSON),
    sa.Column("notify", sa.JSON),
    sa.Column("last_fired_at", sa.Float),
    sa.Column("next_fire_at", sa.Float),
    sa.Column("missed_fire_policy", sa.Text, nullable=False, server_default="skip"),
    sa.Column("overlap_policy", sa.Text, nullable=False, server_default="skip"),
    sa.Column("max_runs", sa.Integer),
    sa.Column("budget_usd", sa.Float),
    sa.Column("budget_tokens", sa.Integer),
    sa.Column("project", sa.Text),
    sa.Column("threshold_config", sa.JSON),
    sa.Column("last_alert_at", sa.Float),
    sa.Column("last_healthy_poll_at", sa.Float),
    sa.Column("poller_consecutive_401", sa.Integer, nullable=False, server_default="0"),
    sa.Column("deferrals", sa.Integer, nullable=False, server_default="0"),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.CheckConstraint("enabled IN (0, 1)", name="ck_schedules_enabled"),
    sa.CheckConstraint(_in("trigger_type", TRIGGER_TYPES), name="ck_schedules_trigger"),
    sa.CheckConstraint(_in("action_kind", ACTION_KINDS), name="ck_schedules_action"),
    sa.CheckConstraint(_in("missed_fire_policy", ("skip", "run_once")), name="ck_schedules_missed"),
    sa.CheckConstraint(_in("overlap_policy", ("skip", "allow")), name="ck_schedules_overlap"),
    # The due scan (evaluation.due_query: active, next_fire_at <= now, in (next_fire_at, id) order) and the
    # tick's earliest next fire (min(next_fire_at) of the active ones) read this; without it both scanned
    # and sorted every schedule on each tick. The old (enabled, next_fire_at) index served neither query.
    sa.Index("ix_schedules_due", "next_fire_at", "id", sqlite_where=sa.text("status = 'active'"),
             postgresql_where=sa.text("status = 'active'")),
)

schedule_runs = managed_table(
    "schedule_runs",
    sa.Column("id", sa.String(32), primary_key=True),
    # No cascade: a schedule is never deleted as a row (it moves to 'deleted'), so its runs and their
    # history stay (specs/schedule.md).
    sa.Column("schedule_id", sa.String(32), sa.ForeignKey("schedules.id"), nullable=True),
    sa.Column("invocation_id", sa.Text),
    sa.Column("trigger_context", sa.JSON, nullable=False),
    sa.Column("action_kind", sa.Text, nullable=False),
    sa.Column("action_args", sa.JSON, nullable=False),
    sa.Column("exit_code", sa.Integer),
    sa.Column("chain_parent_id", sa.String(32), sa.ForeignKey("schedule_runs.id")),
    sa.Column("chain_depth", sa.Integer, nullable=False, server_default="0"),
    sa.Column("fired_at", sa.Float, nullable=False),
    sa.Column("ended_at", sa.Float),
    sa.Column("error_detail", sa.Text),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("status_evidence_refs", sa.JSON),
    sa.Column("queued_at", sa.Float),
    sa.Column("leased_by", sa.Text),
    sa.Column("lease_expires_at", sa.Float),
    sa.Column("concurrency_key", sa.Text),
    sa.Column("lease_attempts", sa.Integer, nullable=False, server_default="0"),
    sa.Column("required_capabilities", sa.JSON),
    sa.Column("execution_target", sa.Text),
    sa.Column("library_ref", sa.Text),
    sa.Column("library_content_hash", sa.Text),
    sa.Column("cost_usd", sa.Float),
    sa.Column("tokens", sa.Integer),
    sa.Column("occurrence_at", sa.Float),
    sa.Column("daemon_id", sa.Text),
    sa.Column("pid", sa.Integer),
    sa.Index("ix_schedule_runs_schedule", "schedule_id", "status"),
    sa.Index("ix_schedule_runs_status", "status"),
    sa.Index("ix_schedule_runs_parent", "chain_parent_id"),
    # The console lists runs newest first, a keyset page at a time (adapters/web/queries.py).
    sa.Index("ix_schedule_runs_created", "created_at", "id"),
)

# Coordination tables, not lifecycles (specs/scheduler.md S14): a heartbeat is renewed on every tick,
# and a fact per renewal would grow every history without bound while saying nothing about a
# schedule. What a leadership did is recorded where it matters: each run it fires carries its epoch.
scheduler_leases = sa.Table(
    "scheduler_leases",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("holder", sa.Text, nullable=False),
    sa.Column("epoch", sa.Integer, nullable=False),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("acquired_at", sa.Float, nullable=False),
)
"""one row per lease (``scheduler``): who leads, under which fencing epoch, last renewed when"""

scheduler_daemons = sa.Table(
    "scheduler_daemons",
    metadata,
    sa.Column("daemon_id", sa.Text, primary_key=True),
    sa.Column("heartbeat_at", sa.Float, nullable=False),
    sa.Column("started_at", sa.Float, nullable=False),
)
"""one row per running daemon (leader or standby), renewed every tick: runs of a stale one are reaped"""
