"""``CreateScheduleRequest``: the validated shape of a new schedule (specs/scheduler.md S2).

One action vocabulary from creation to launch: agent, flow, fanout, play, flow_yaml, command.
The ``playbook`` spelling is refused with a pointer to ``play`` instead of being stored (S2). The
``github_filter`` check lives here too (:func:`check_filter`); the poll reads the checked form (S13).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import yaml
from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .schema import ACTION_KINDS

TriggerType = Literal["cron", "interval", "github_poll", "at"]
ActionKind = Literal["agent", "flow", "fanout", "play", "flow_yaml", "command"]
THRESHOLD_METRICS = ("failed_runs", "total_cost", "p95_duration", "dead_letters")
THRESHOLD_OPS = ("gt", "gte")
NOTIFY_ON = ("completed", "failed", "timed_out", "cancelled")
FILTER_KEYS = ("types", "actions", "labels")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


class CreateScheduleRequest(BaseModel):
    """A schedule to create. Errors name the field and what a valid value looks like."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str | None = None
    trigger_type: TriggerType
    cron_expr: str | None = None
    timezone: str | None = None
    interval_sec: int | None = None
    at_time: float | None = None
    github_repo: str | None = None
    github_filter: dict[str, Any] | None = None
    poll_interval_sec: int | None = Field(None, gt=0)
    action_kind: str
    action_model: str | None = None
    action_prompt: str | None = None
    action_agent: str | None = None
    action_play: str | None = None
    action_flow_yaml: str | None = None
    action_project: str | None = None
    action_cwd: str | None = None
    action_extra_args: list[str] | None = None
    action_command: str | None = None
    action_command_args: list[str] | None = None
    on_success: dict[str, Any] | None = None
    on_fail: dict[str, Any] | None = None
    notify: dict[str, Any] | None = None
    missed_fire_policy: Literal["skip", "run_once"] = "skip"
    overlap_policy: Literal["skip", "allow"] = "skip"
    max_runs: int | None = None
    budget_usd: float | None = None
    budget_tokens: int | None = None
    project: str | None = None
    threshold_config: dict[str, Any] | None = None
    enabled: bool = True

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                f"name {value!r} must start with a letter or digit and use only letters, digits, '_', '.', ':'"
                " or '-' (at most 128 characters)"
            )
        return value

    @field_validator("action_kind")
    @classmethod
    def _kind(cls, value: str) -> str:
        if value == "playbook":
            raise ValueError("action kind 'playbook' is not stored; use 'play' (the one vocabulary)")
        if value not in ACTION_KINDS:
            raise ValueError(f"action kind {value!r} is unknown; use one of {', '.join(ACTION_KINDS)}")
        return value

    @field_validator("max_runs", "budget_tokens")
    @classmethod
    def _positive_int(cls, value: int | None) -> int | None:
        if value is not None and value <= 0:
            raise ValueError(f"must be a positive integer when given, got {value}")
        return value

    @field_validator("budget_usd")
    @classmethod
    def _positive_float(cls, value: float | None) -> float | None:
        if value is not None and not value > 0:
            raise ValueError(f"must be positive when given, got {value}")
        return value

    @model_validator(mode="after")
    def _trigger_and_action(self) -> CreateScheduleRequest:
        self._check_trigger()
        self._check_action()
        for key in ("on_success", "on_fail"):
            overlay = getattr(self, key)
            if overlay is not None:
                check_overlay(overlay, key)
        if self.notify is not None:
            check_notify(self.notify)
        return self

    def _check_trigger(self) -> None:
        t = self.trigger_type
        if t == "cron":
            if not self.cron_expr or not croniter.is_valid(self.cron_expr):
                raise ValueError(f"cron trigger needs a valid cron_expr such as '*/5 * * * *', got {self.cron_expr!r}")
        elif t == "interval":
            if self.interval_sec is None or self.interval_sec <= 0:
                raise ValueError(f"interval trigger needs interval_sec, a positive integer; got {self.interval_sec!r}")
        elif t == "at":
            if self.at_time is None:
                raise ValueError("at trigger needs at_time (a UTC epoch or an ISO-8601 time on the CLI)")
        elif t == "github_poll":
            if not self.github_repo or not _REPO.match(self.github_repo):
                raise ValueError(f"github_poll trigger needs github_repo as 'owner/name', got {self.github_repo!r}")
            check_filter(self.github_filter)
        if self.threshold_config is not None:
            if t not in ("cron", "interval"):
                raise ValueError("threshold_config applies to cron or interval triggers only")
            check_threshold(self.threshold_config)

    def _check_action(self) -> None:
        k = self.action_kind
        if k == "command" and not (self.action_command and self.action_command.strip()):
            raise ValueError("action kind 'command' needs action_command (an executable path or name)")
        if k == "flow_yaml":
            if not (self.action_flow_yaml and self.action_flow_yaml.strip()):
                raise ValueError("action kind 'flow_yaml' needs non-empty action_flow_yaml")
            try:
                yaml.safe_load(self.action_flow_yaml)
            except yaml.YAMLError as exc:
                raise ValueError(f"action_flow_yaml is not valid YAML: {exc}") from None
        if k == "play" and not self.action_play:
            raise ValueError("action kind 'play' needs action_play (the play's name)")
        if k in ("agent", "flow", "fanout") and not self.action_prompt:
            raise ValueError(f"action kind {k!r} needs action_prompt")

    def to_values(self) -> dict[str, Any]:
        """Column values for the ``schedules`` row (without id, timestamps and cadence)."""
        data = self.model_dump(exclude={"enabled"})
        data["enabled"] = 1 if self.enabled else 0
        data["action_extra_args"] = list(self.action_extra_args or [])
        data["action_command_args"] = list(self.action_command_args or [])
        return data


def check_threshold(cfg: dict[str, Any]) -> None:
    metric, op = cfg.get("metric"), cfg.get("op", "gt")
    if metric not in THRESHOLD_METRICS:
        raise ValueError(f"threshold metric {metric!r} is unknown; use one of {', '.join(THRESHOLD_METRICS)}")
    if op not in THRESHOLD_OPS:
        raise ValueError(f"threshold op {op!r} is unknown; use 'gt' or 'gte'")
    if not isinstance(cfg.get("value"), int | float):
        raise ValueError("threshold needs a numeric 'value'")
    window = cfg.get("window_minutes")
    if not isinstance(window, int | float) or window <= 0:
        raise ValueError("threshold needs 'window_minutes', a positive number (it is also the cooldown)")


def check_overlay(overlay: dict[str, Any], key: str) -> None:
    kind = overlay.get("kind", overlay.get("action_kind"))
    if kind == "playbook":
        raise ValueError(f"{key}: action kind 'playbook' is not stored; use 'play'")
    if kind is not None and kind not in ACTION_KINDS:
        raise ValueError(f"{key}: action kind {kind!r} is unknown; use one of {', '.join(ACTION_KINDS)}")


def check_notify(notify: dict[str, Any]) -> None:
    unknown = sorted(set(notify) - {"kind", "deliver_to", "on"})
    if unknown:
        raise ValueError(f"notify has unknown keys {', '.join(unknown)}; use kind, deliver_to and optionally on")
    if not notify.get("kind") or not notify.get("deliver_to"):
        raise ValueError("notify needs 'kind' and 'deliver_to', e.g. {'kind': 'run_ended', 'deliver_to': 'ops'}")
    on = notify.get("on")
    if on is not None and (not isinstance(on, list) or any(s not in NOTIFY_ON for s in on)):
        raise ValueError(f"notify 'on' must be a list of terminal run statuses among {', '.join(NOTIFY_ON)}")


def check_filter(flt: Mapping[str, Any] | None) -> dict[str, frozenset[str]]:
    """Validate ``github_filter``; e.g. ``{"types": ["IssuesEvent"], "actions": ["opened"], "labels": ["bug"]}``.

    Every key is optional; an event must match each key given (any of its values).
    """
    if flt is None:
        return {}
    if not isinstance(flt, Mapping):
        raise ValueError(f"github_filter must be an object with keys {', '.join(FILTER_KEYS)}, got {flt!r}")
    unknown = sorted(set(flt) - set(FILTER_KEYS))
    if unknown:
        raise ValueError(f"github_filter has unknown keys {', '.join(unknown)}; use {', '.join(FILTER_KEYS)}")
    out: dict[str, frozenset[str]] = {}
    for key, values in flt.items():
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise ValueError(f"github_filter {key!r} must be a non-empty list of strings, got {values!r}")
        out[key] = frozenset(values)
    return out
