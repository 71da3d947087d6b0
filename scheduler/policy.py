"""The built-in ``schedule_run`` and ``schedule`` lifecycles (specs/schedule_run.md, specs/schedule.md)."""

from __future__ import annotations

from statebook.lifecycle import Lifecycle, edges

from .schema import RUN_STATUSES, SCHEDULE_STATUSES, schedule_runs, schedules

OPERATOR = "operator"

RUN_REASONS = frozenset(
    {
        "schedule_run.running.fired",
        "schedule_run.running.manual",
        "schedule_run.running.follow_up",
        "schedule_run.running.recovery",
        "schedule_run.running.relaunched",
        "schedule_run.queued.created",
        "schedule_run.queued.requeued",
        "schedule_run.waiting_dependency.blocked",
        "schedule_run.retry_wait.backoff",
        "schedule_run.completed.exit_zero",
        "schedule_run.failed.nonzero_exit",
        "schedule_run.failed.missing_cwd",
        "schedule_run.failed.invalid_action",
        "schedule_run.failed.launch_error",
        "schedule_run.failed.internal_error",
        "schedule_run.failed.daemon_died",
        "schedule_run.timed_out.deadline",
        "schedule_run.cancelled.shutdown",
        "schedule_run.cancelled.operator",
        "schedule_run.skipped.overlap",
        "schedule_run.skipped.missed_fire",
        "schedule_run.skipped.deferred_capacity",
        "schedule_run.purged.operator",
    }
)

SCHEDULE_RUN = Lifecycle(
    entity_type="schedule_run",
    table=schedule_runs,
    statuses=RUN_STATUSES,
    initial={"queued", "running", "failed", "skipped"},
    terminal={"completed", "failed", "timed_out", "skipped", "cancelled"},
    edges=(
        *edges("queued", "waiting_dependency", "running", "skipped", "cancelled"),
        *edges("waiting_dependency", "queued", "cancelled"),
        *edges("running", "completed", "failed", "timed_out", "retry_wait", "queued", "cancelled"),
        *edges("retry_wait", "queued", "cancelled"),
    ),
    patch_fields={
        "exit_code", "ended_at", "error_detail", "status_evidence_refs", "invocation_id", "action_args",
        "queued_at", "leased_by", "lease_expires_at", "lease_attempts", "cost_usd", "tokens", "daemon_id", "pid",
    },
    reason_prefixes={"schedule_run"},
    reasons=RUN_REASONS,
    same_status="edge",
    description="One execution of a schedule's action (or an inline follow-up of one).",
)

SCHEDULE_REASONS = frozenset(
    {
        "schedule.active.created",
        "schedule.paused.created",
        "schedule.active.enabled",
        "schedule.paused.disabled",
        "schedule.active.fire_claimed",
        "schedule.active.manual_fire",
        "schedule.paused.manual_fire",
        "schedule.active.threshold_ok",
        "schedule.active.threshold_cooldown",
        "schedule.active.skipped_overlap",
        "schedule.active.recomputed",
        "schedule.active.cadence_advanced",
        "schedule.active.missed_fire",
        "schedule.active.deferred",
        "schedule.active.poll",
        "schedule.active.poll_event",
        "schedule.active.poll_deferred",
        "schedule.active.poll_unauthorized",
        "schedule.active.poll_failed",
        "schedule.active.poll_unconfigured",
        "schedule.active.alerted",
        "schedule.active.updated",
        "schedule.paused.updated",
        "schedule.exhausted.max_runs",
        "schedule.exhausted.budget",
        "schedule.exhausted.one_shot",
        "schedule.active.operator_reset",
        "schedule.deleted.operator",
    }
)

SCHEDULE = Lifecycle(
    entity_type="schedule",
    table=schedules,
    statuses=SCHEDULE_STATUSES,
    initial={"active", "paused"},
    terminal={"exhausted", "deleted"},
    edges=(
        *edges("active", "paused", "exhausted", "deleted", patch="enabled"),
        *edges("paused", "active", "deleted", patch="enabled"),
        *edges("exhausted", "active", actors=OPERATOR, patch=("enabled", "next_fire_at")),
        *edges("exhausted", "deleted", actors=OPERATOR),
    ),
    patch_fields={
        "enabled", "next_fire_at", "last_fired_at", "github_cursor", "last_alert_at", "last_healthy_poll_at",
        "poller_consecutive_401", "deferrals", "poll_interval_sec", "timezone", "description", "max_runs",
        "budget_usd", "budget_tokens",
        "on_success", "on_fail", "notify", "cron_expr", "interval_sec", "at_time",
    },
    reason_prefixes={"schedule"},
    reasons=SCHEDULE_REASONS,
    same_status="allow",
    description="A trigger and its action; cadence, budget and exhaustion are audited transitions.",
)
