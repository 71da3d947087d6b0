"""Schedules and their runs as the scheduler's reads return them (``get_schedule``, ``list_runs``, ...)."""

from __future__ import annotations

from typing import Any

from statebook.outbox.record import Record, Time


class Schedule(Record):
    """One schedule (specs/schedule.md): its trigger, action, gates and where its cadence stands."""

    id: str
    name: str
    description: str | None = None
    enabled: bool
    trigger_type: str
    cron_expr: str | None = None
    timezone: str | None = None
    interval_sec: int | None = None
    at_time: Time | None = None
    github_repo: str | None = None
    github_filter: Any = None
    github_cursor: str | None = None
    poll_interval_sec: int | None = None
    action_kind: str
    action_model: str | None = None
    action_prompt: str | None = None
    action_agent: str | None = None
    action_play: str | None = None
    action_flow_yaml: str | None = None
    action_project: str | None = None
    action_cwd: str | None = None
    action_extra_args: Any = None
    action_command: str | None = None
    action_command_args: Any = None
    on_success: Any = None
    on_fail: Any = None
    notify: Any = None
    last_fired_at: Time | None = None
    next_fire_at: Time | None = None
    missed_fire_policy: str
    overlap_policy: str
    max_runs: int | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    project: str | None = None
    threshold_config: Any = None
    last_alert_at: Time | None = None
    last_healthy_poll_at: Time | None = None
    poller_consecutive_401: int
    deferrals: int
    created_at: Time
    status: str
    version: int
    updated_at: Time
    status_reason_code: str
    status_reason_summary: str


class ScheduleRun(Record):
    """One run of a schedule (specs/schedule_run.md): what it ran, for whom, and how it ended."""

    id: str
    schedule_id: str | None = None
    invocation_id: str | None = None
    trigger_context: Any
    action_kind: str
    action_args: Any
    exit_code: int | None = None
    chain_parent_id: str | None = None
    chain_depth: int
    fired_at: Time
    ended_at: Time | None = None
    error_detail: str | None = None
    created_at: Time
    status_evidence_refs: Any = None
    queued_at: Time | None = None
    leased_by: str | None = None
    lease_expires_at: Time | None = None
    concurrency_key: str | None = None
    lease_attempts: int
    required_capabilities: Any = None
    execution_target: str | None = None
    library_ref: str | None = None
    library_content_hash: str | None = None
    cost_usd: float | None = None
    tokens: int | None = None
    occurrence_at: Time | None = None
    daemon_id: str | None = None
    pid: int | None = None
    status: str
    version: int
    updated_at: Time
    status_reason_code: str
    status_reason_summary: str
