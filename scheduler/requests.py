"""``CreateScheduleRequest``: the validated shape of a new schedule (specs/scheduler.md S2).

One action vocabulary from creation to launch: agent, flow, fanout, play, flow_yaml, command.
The ``playbook`` spelling is refused with a pointer to ``play`` instead of being stored (S2). The
``github_filter`` check lives here too (:func:`check_filter`); the poll reads the checked form (S13).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator, model_validator

from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.inputs import INT32, KEY_CHARS, Limits, integer, json_value, number, shown, text, timestamp

from .errors import InvalidSchedule
from .schema import ACTION_KINDS
from .triggers import CRON_CHARS, check_cron, check_zone

TriggerType = Literal["cron", "interval", "github_poll", "at"]
ActionKind = Literal["agent", "flow", "fanout", "play", "flow_yaml", "command"]
THRESHOLD_METRICS = ("failed_runs", "total_cost", "p95_duration", "dead_letters")
THRESHOLD_OPS = ("gt", "gte")
THRESHOLD_KEYS = ("metric", "op", "value", "window_minutes")
NOTIFY_ON = ("completed", "failed", "timed_out", "cancelled")
FILTER_KEYS = ("types", "actions", "labels")
_REPO = re.compile(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")

# The ranges of a schedule's numbers (S18): the same on both backends, each inside its column.
INTERVAL_SECONDS = (1, 10 * 366 * 86400)
"""``interval_sec`` and ``poll_interval_sec``: one second to ten years"""
COUNTS = (1, INT32[1])
"""``max_runs`` and ``budget_tokens``: a positive 32-bit integer"""
BUDGET_USD = 1e12
"""``budget_usd``: more than 0, at most a trillion"""
THRESHOLD_VALUE = 1e15
"""``threshold_config.value``: finite, at most this in magnitude"""
WINDOW_MINUTES = 366 * 24 * 60
"""``threshold_config.window_minutes`` (also the cooldown): more than 0, at most a year"""
_STRUCTURE = Limits(json_depth=200, json_bytes=2**30)
"""the request checks JSON's shape (at most 200 levels: serialising recurses); the book's own ``Limits``
bound it further in ``create_schedule``"""

NAMED_TEXT = ("action_model", "action_agent", "action_play", "action_project", "project")
"""text fields that hold a name: valid text of at most KEY_CHARS characters"""
FREE_TEXT = ("description", "action_prompt", "action_flow_yaml", "action_cwd", "action_command")
"""text fields of any length (valid text: UTF-8, no NUL)"""
JSON_FIELDS = ("github_filter", "on_success", "on_fail", "notify", "threshold_config")
LIST_FIELDS = ("action_extra_args", "action_command_args")


def _refuse(argument: str, rule: str, message: str) -> InvalidSchedule:
    return InvalidSchedule(f"{argument}: {message}", argument=argument, rule=rule)


def _as_schedule_error(exc: InvalidArgument) -> InvalidSchedule:
    if isinstance(exc, InvalidSchedule):
        return exc
    return InvalidSchedule(str(exc), argument=exc.argument, rule=exc.rule)



class CreateScheduleRequest(BaseModel):
    """A schedule to create. Errors name the field and what a valid value looks like.

    Building one (``CreateScheduleRequest(...)``, ``model_validate``, :meth:`parse`) refuses with one
    :class:`InvalidSchedule` naming the first field that is wrong, never pydantic's ``ValidationError``.
    """

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str | None = None
    trigger_type: TriggerType
    cron_expr: str | None = None
    timezone: str | None = None
    interval_sec: int | None = None
    at_time: datetime | float | None = None
    """an ``at`` trigger's time: an aware ``datetime`` or POSIX seconds, kept as seconds once checked"""
    github_repo: str | None = None
    github_filter: dict[str, Any] | None = None
    poll_interval_sec: int | None = None
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

    @classmethod
    def parse(cls, data: Any) -> CreateScheduleRequest:
        """A checked request from a mapping of fields (or a request, checked again), else
        :class:`InvalidSchedule` naming the first field that is wrong (S18)."""
        if isinstance(data, CreateScheduleRequest):
            data = dict(data)
        if not isinstance(data, Mapping):
            raise _refuse("request", "type", f"expected a CreateScheduleRequest or a mapping of its fields, "
                                             f"got {type(data).__name__}")
        return cls.model_validate(dict(data))

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise refusal(exc) from None

    @classmethod
    def model_validate(cls, obj: Any, **kwargs: Any) -> CreateScheduleRequest:
        """pydantic's ``model_validate``, refusing with one :class:`InvalidSchedule` (not a ``ValidationError``)."""
        try:
            return super().model_validate(obj, **kwargs)
        except ValidationError as exc:
            raise refusal(exc) from None

    # -- one field at a time, before pydantic converts anything -------------------------------
    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, value: Any) -> Any:
        text("name", value, max_chars=KEY_CHARS)
        if not _NAME.fullmatch(value):
            raise _refuse("name", "pattern", f"{shown(value)} must start with a letter or digit and use only "
                          "letters, digits, '_', '.', ':' or '-' (at most 128 characters)")
        return value

    @field_validator(*NAMED_TEXT, mode="before")
    @classmethod
    def _named_text(cls, value: Any, info: Any) -> Any:
        return value if value is None else text(info.field_name, value, max_chars=KEY_CHARS)

    @field_validator(*FREE_TEXT, mode="before")
    @classmethod
    def _free_text(cls, value: Any, info: Any) -> Any:
        return value if value is None else text(info.field_name, value)

    @field_validator("cron_expr", mode="before")
    @classmethod
    def _cron_text(cls, value: Any) -> Any:
        return value if value is None else text("cron_expr", value, max_chars=CRON_CHARS)

    @field_validator("timezone", mode="before")
    @classmethod
    def _zone(cls, value: Any) -> Any:
        return value if value is None else check_zone("timezone", value)

    @field_validator("github_repo", mode="before")
    @classmethod
    def _repo(cls, value: Any) -> Any:
        if value is not None:
            text("github_repo", value, max_chars=KEY_CHARS)
            if not _REPO.fullmatch(value):
                raise _refuse("github_repo", "pattern", f"{shown(value)} is not 'owner/name'")
        return value

    @field_validator("interval_sec", "poll_interval_sec", mode="before")
    @classmethod
    def _interval(cls, value: Any, info: Any) -> Any:
        if value is not None:
            integer(info.field_name, value, low=INTERVAL_SECONDS[0], high=INTERVAL_SECONDS[1])
        return value

    @field_validator("max_runs", "budget_tokens", mode="before")
    @classmethod
    def _count(cls, value: Any, info: Any) -> Any:
        return value if value is None else integer(info.field_name, value, low=COUNTS[0], high=COUNTS[1])

    @field_validator("budget_usd", mode="before")
    @classmethod
    def _budget(cls, value: Any) -> Any:
        if value is not None:
            number("budget_usd", value, high=BUDGET_USD)
            if not value > 0:
                raise _refuse("budget_usd", "range", f"must be positive when given, got {value}")
        return value

    @field_validator("at_time", mode="before")
    @classmethod
    def _at(cls, value: Any) -> Any:
        return value if value is None else timestamp("at_time", value)

    @field_validator(*LIST_FIELDS, mode="before")
    @classmethod
    def _args(cls, value: Any, info: Any) -> Any:
        if value is not None:
            if not isinstance(value, list | tuple):
                raise _refuse(info.field_name, "type", f"expected a list of text, got {type(value).__name__}")
            for i, item in enumerate(value):
                text(f"{info.field_name}[{i}]", item)
        return value

    @field_validator(*JSON_FIELDS, mode="before")
    @classmethod
    def _json(cls, value: Any, info: Any) -> Any:
        if value is not None:
            json_value(info.field_name, value, _STRUCTURE)
            if not isinstance(value, Mapping):
                raise _refuse(info.field_name, "type", f"expected an object, got {type(value).__name__}")
        return value

    @field_validator("action_kind", mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        text("action_kind", value, max_chars=KEY_CHARS)
        if value == "playbook":
            raise _refuse("action_kind", "vocabulary", "'playbook' is not stored; use 'play' (the one vocabulary)")
        if value not in ACTION_KINDS:
            raise _refuse("action_kind", "vocabulary", f"{shown(value)} is unknown; use one of {', '.join(ACTION_KINDS)}")
        return value

    # -- the fields together ------------------------------------------------------------------
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
            if not self.cron_expr:
                raise _refuse("cron_expr", "required", "a cron trigger needs cron_expr, such as '*/5 * * * *'")
            check_cron("cron_expr", self.cron_expr)
        elif t == "interval":
            if self.interval_sec is None:
                raise _refuse("interval_sec", "required", "an interval trigger needs interval_sec, a positive "
                              "integer of seconds")
        elif t == "at":
            if self.at_time is None:
                raise _refuse("at_time", "required", "an at trigger needs at_time (a UTC epoch, or an ISO-8601 "
                              "time on the CLI)")
        elif t == "github_poll":
            if not self.github_repo:
                raise _refuse("github_repo", "required", "a github_poll trigger needs github_repo as 'owner/name'")
            check_filter(self.github_filter)
        if self.threshold_config is not None:
            if t not in ("cron", "interval"):
                raise _refuse("threshold_config", "trigger", "applies to cron or interval triggers only")
            check_threshold(self.threshold_config)

    def _check_action(self) -> None:
        k = self.action_kind
        if k == "command" and not (self.action_command and self.action_command.strip()):
            raise _refuse("action_command", "required", "action kind 'command' needs action_command (an "
                          "executable path or name)")
        if k == "flow_yaml":
            if not (self.action_flow_yaml and self.action_flow_yaml.strip()):
                raise _refuse("action_flow_yaml", "required", "action kind 'flow_yaml' needs non-empty "
                              "action_flow_yaml")
            import yaml  # only a flow_yaml action needs it: importing the scheduler stays without it

            try:
                yaml.safe_load(self.action_flow_yaml)
            except Exception as exc:  # noqa: BLE001 - a YAML error, or a RecursionError on deep nesting
                why = str(exc).splitlines()[0][:200] if isinstance(exc, yaml.YAMLError) else "nested too deeply"
                raise _refuse("action_flow_yaml", "yaml", f"is not valid YAML: {why}") from None
        if k == "play" and not self.action_play:
            raise _refuse("action_play", "required", "action kind 'play' needs action_play (the play's name)")
        if k in ("agent", "flow", "fanout") and not self.action_prompt:
            raise _refuse("action_prompt", "required", f"action kind {k!r} needs action_prompt")

    def to_values(self) -> dict[str, Any]:
        """Column values for the ``schedules`` row (without id, timestamps and cadence)."""
        data = self.model_dump(exclude={"enabled"})
        data["enabled"] = 1 if self.enabled else 0
        data["action_extra_args"] = list(self.action_extra_args or [])
        data["action_command_args"] = list(self.action_command_args or [])
        return data


def check_threshold(cfg: Mapping[str, Any]) -> None:
    """``{"metric": "failed_runs", "op": "gte", "value": 3, "window_minutes": 60}`` (``op`` defaults to gt)."""
    unknown = sorted(str(k) for k in set(cfg) - set(THRESHOLD_KEYS))
    if unknown:
        raise _refuse("threshold_config", "unknown_key", f"has unknown keys {', '.join(unknown)}; use "
                      f"{', '.join(THRESHOLD_KEYS)}")
    metric, op = cfg.get("metric"), cfg.get("op", "gt")
    if metric not in THRESHOLD_METRICS:
        raise _refuse("threshold_config.metric", "vocabulary", f"{shown(metric)} is unknown; use one of "
                      f"{', '.join(THRESHOLD_METRICS)}")
    if op not in THRESHOLD_OPS:
        raise _refuse("threshold_config.op", "vocabulary", f"{shown(op)} is unknown; use 'gt' or 'gte'")
    if "value" not in cfg:
        raise _refuse("threshold_config.value", "required", "a threshold needs a numeric 'value'")
    number("threshold_config.value", cfg["value"], low=-THRESHOLD_VALUE, high=THRESHOLD_VALUE)
    window = cfg.get("window_minutes")
    if window is None:
        raise _refuse("threshold_config.window_minutes", "required",
                      "a threshold needs 'window_minutes', a positive number (it is also the cooldown)")
    number("threshold_config.window_minutes", window, high=WINDOW_MINUTES)
    if not window > 0:
        raise _refuse("threshold_config.window_minutes", "range", f"must be more than 0 minutes, got {window}")


_OVERLAY_TEXT = ("model", "prompt", "agent", "play", "flow_yaml", "command", "cwd", "project")
_OVERLAY_ARGS = ("args", "command_args", "extra_args")


def check_overlay(overlay: Mapping[str, Any], key: str) -> None:
    """A follow-up (``on_success``/``on_fail``): a known action kind and launchable values, nested too."""
    pending = [(overlay, key)]
    while pending:
        current, where = pending.pop()
        if not isinstance(current, Mapping):
            raise _refuse(where, "type", f"expected an object, got {type(current).__name__}")
        kind = current.get("kind", current.get("action_kind"))
        if kind == "playbook":
            raise _refuse(where, "vocabulary", "action kind 'playbook' is not stored; use 'play'")
        if kind is not None and kind not in ACTION_KINDS:
            raise _refuse(where, "vocabulary", f"action kind {shown(kind)} is unknown; use one of "
                          f"{', '.join(ACTION_KINDS)}")
        for name, value in current.items():
            field = name.removeprefix("action_")
            if value is None:
                continue
            if field in _OVERLAY_TEXT:
                text(f"{where}.{name}", value)
            elif field in _OVERLAY_ARGS:
                if not isinstance(value, list):
                    raise _refuse(f"{where}.{name}", "type", f"expected a list of text, got {type(value).__name__}")
                for i, item in enumerate(value):
                    text(f"{where}.{name}[{i}]", item)
            elif name in ("on_success", "on_fail"):
                pending.append((value, f"{where}.{name}"))


def check_notify(notify: Mapping[str, Any]) -> None:
    """Check a schedule's ``notify`` table (``kind``, ``deliver_to``, optional ``on``); raises ``InvalidArgument``
    naming the bad key.
    """
    unknown = sorted(str(k) for k in set(notify) - {"kind", "deliver_to", "on"})
    if unknown:
        raise _refuse("notify", "unknown_key", f"has unknown keys {', '.join(unknown)}; use kind, deliver_to "
                      "and optionally on")
    if not notify.get("kind") or not notify.get("deliver_to"):
        raise _refuse("notify", "required", "needs 'kind' and 'deliver_to', e.g. {'kind': 'run_ended', "
                      "'deliver_to': 'ops'}")
    text("notify.kind", notify["kind"], max_chars=KEY_CHARS)
    text("notify.deliver_to", notify["deliver_to"], max_chars=KEY_CHARS)
    on = notify.get("on")
    if on is not None and (not isinstance(on, list) or any(s not in NOTIFY_ON for s in on)):
        raise _refuse("notify.on", "vocabulary", f"must be a list of terminal run statuses among "
                      f"{', '.join(NOTIFY_ON)}")


def check_filter(flt: Mapping[str, Any] | None) -> dict[str, frozenset[str]]:
    """Validate ``github_filter``; e.g. ``{"types": ["IssuesEvent"], "actions": ["opened"], "labels": ["bug"]}``.

    Every key is optional; an event must match each key given (any of its values).
    """
    if flt is None:
        return {}
    if not isinstance(flt, Mapping):
        raise _refuse("github_filter", "type", f"must be an object with keys {', '.join(FILTER_KEYS)}, got "
                      f"{type(flt).__name__}")
    unknown = sorted(str(k) for k in set(flt) - set(FILTER_KEYS))
    if unknown:
        raise _refuse("github_filter", "unknown_key", f"has unknown keys {', '.join(unknown)}; use "
                      f"{', '.join(FILTER_KEYS)}")
    out: dict[str, frozenset[str]] = {}
    for key, values in flt.items():
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v for v in values):
            raise _refuse(f"github_filter.{key}", "type", f"must be a non-empty list of text, got {shown(values)}")
        for v in values:
            text(f"github_filter.{key}", v, max_chars=KEY_CHARS)
        out[key] = frozenset(values)
    return out


def refusal(exc: ValidationError) -> InvalidSchedule:
    """The first error of a request's ``ValidationError`` as one :class:`InvalidSchedule` naming its field."""
    first = exc.errors(include_url=False)[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidArgument):
        return _as_schedule_error(cause)
    field = ".".join(str(part) for part in first["loc"]) or "request"
    if not field.isprintable():
        field = repr(field)[1:-1]  # a key with a NUL or a lone surrogate, shown escaped
    if first["type"] == "extra_forbidden":
        near = difflib.get_close_matches(str(first["loc"][0]), CreateScheduleRequest.model_fields, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        return _refuse(field[:KEY_CHARS], "unknown_field", f"is not a schedule field{hint}")
    message = str(cause) if cause is not None else first["msg"]
    return _refuse(field[:KEY_CHARS], first["type"], message)
