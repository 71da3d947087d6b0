"""Settings: one pydantic model, read from a TOML file and ``STATEBOOK_*`` environment variables.

Precedence: explicit values > environment (``STATEBOOK_<SECTION>__<FIELD>``, e.g.
``STATEBOOK_SCHEDULER__TICK_SECONDS=5``; ``STATEBOOK_DB`` and ``STATEBOOK_APP`` for the top-level
``db`` and ``app``) > the TOML file > defaults. Defaults are those specs/ names.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .errors import ConfigError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DispatchSettings(_Section):
    notify_template: list[str] | None = None
    """argv template; must contain an exact ``{deliver_to}`` element. None: deliveries fail visibly."""
    batch_size: int = Field(100, ge=1)
    concurrency: int = Field(8, ge=1)
    transport_timeout_seconds: float = Field(10.0, gt=0)
    """a send running longer is killed; claims lease each row for this plus 5 s (specs/outbox.md O21)"""


class RetentionSettings(_Section):
    enabled: bool = True
    delivered_days: float = Field(7, gt=0)
    """delivered and acked dispatches are purged after this many days"""
    failed_days: float = Field(30, gt=0)
    """dead_letter and expired dispatches are purged after this many days"""


class LauncherSettings(_Section):
    executable: list[str] | None = None
    """argv prefix for the agent/flow/fanout/play/flow_yaml kinds (e.g. ["li"]); None disables them"""
    cwd: str | None = None
    """fallback working directory for runs (specs/scheduler.md)"""
    stdout_log: str | None = None
    projects: dict[str, str] = {}
    """project name -> directory; a run's cwd falls back to its project's directory"""


class SchedulerSettings(_Section):
    timezone: str = "UTC"
    tick_seconds: float = Field(30, gt=0)
    lease_seconds: float = Field(90, gt=0)
    """scheduler leadership: a standby takes over once the leader's heartbeat (renewed every tick) is
    this old; runs of a daemon whose heartbeat is this old are reaped (specs/scheduler.md S14-S17)"""
    max_concurrent: int = Field(4, ge=1)
    invocation_deadline_seconds: float = Field(7200, gt=0)
    reaper_interval_seconds: float = Field(300, gt=0)
    checkpoint_interval_seconds: float = Field(3600, gt=0)
    max_chain_depth: int = Field(10, ge=0)
    deferred_record_every: int = Field(10, ge=1)
    github_api_url: str = "https://api.github.com"
    github_token: str | None = None
    schedules: list[dict[str, Any]] = []
    """schedules upserted by name when the daemon starts (``[[scheduler.schedules]]`` tables)"""

    @model_validator(mode="after")
    def _lease_outlives_a_tick(self) -> SchedulerSettings:
        if self.lease_seconds <= self.tick_seconds:
            raise ValueError(f"lease_seconds ({self.lease_seconds:g}) must be longer than tick_seconds "
                             f"({self.tick_seconds:g}), or the leader loses its lease between two renewals; "
                             "three ticks or more is a good lease")
        return self


class Settings(_Section):
    db: str | None = None
    """database URL; default sqlite:///./statebook.db"""
    app: str | None = None
    """the application's registry as ``module:attr`` (see ``--app``); default: the built-in lifecycles"""
    dispatch: DispatchSettings = DispatchSettings()
    retention: RetentionSettings = RetentionSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    launcher: LauncherSettings = LauncherSettings()

    @field_validator("db")
    @classmethod
    def _db_not_blank(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("db must be a database URL, not blank")
        return value

    @field_validator("app")
    @classmethod
    def _app_is_module_attr(cls, value: str | None) -> str | None:
        if value is not None and (":" not in value or not all(p.strip() for p in value.split(":", 1))):
            raise ValueError(f"app must be module:attr (e.g. myapp.lifecycles:registry), not {value!r}")
        return value


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith("STATEBOOK_") or key in ("STATEBOOK_DB", "STATEBOOK_APP"):
            continue
        path = key[len("STATEBOOK_"):].lower().split("__")
        if len(path) != 2 or path[0] not in Settings.model_fields:
            continue
        out.setdefault(path[0], {})[path[1]] = value
    if "STATEBOOK_DB" in environ:
        out["db"] = environ["STATEBOOK_DB"]
    if "STATEBOOK_APP" in environ:
        out["app"] = environ["STATEBOOK_APP"]
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


def load_settings(path: str | Path | None = None, *, environ: dict[str, str] | None = None, **explicit: Any) -> Settings:
    """Settings from ``path`` (TOML), the environment and explicit values; ConfigError when invalid."""
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError:
            raise ConfigError(f"settings file {file} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"settings file {file} is not valid TOML: {exc}") from None
    data = _merge(data, _env_overrides(dict(os.environ if environ is None else environ)))
    data = _merge(data, {k: v for k, v in explicit.items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"invalid setting {where}: {first['msg']}") from None
