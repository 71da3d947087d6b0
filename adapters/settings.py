"""Settings: one pydantic-settings model, read from a TOML file and ``STATEBOOK_*`` environment variables.

Precedence: explicit values > environment > the TOML file > defaults (specs/cli.md C1). The environment
names a field of a section as ``STATEBOOK_<SECTION>__<FIELD>`` (``STATEBOOK_SCHEDULER__TICK_SECONDS=5``),
a top-level key as ``STATEBOOK_DB`` / ``STATEBOOK_APP``; a list or table setting takes JSON there
(``STATEBOOK_DISPATCH__NOTIFY_TEMPLATE='["/bin/echo", "{deliver_to}"]'``). An unknown key or section, in
the file or in a ``STATEBOOK_<SECTION>__...`` name, is refused with the nearest valid name (C2).
"""

from __future__ import annotations

import difflib
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.sources import InitSettingsSource, TomlConfigSettingsSource

from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.codec import loads_checked
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.inputs import Limits, text
from statebook.outbox.dispatch.bounds import dispatch_limits

from .channels.secrets import SecretError, SecretRef
from .errors import ConfigError

CENTURY_SECONDS = 100 * 366 * 86400.0
CENTURY_DAYS = 100 * 366.0
ENV_PREFIX = "STATEBOOK_"


def _storable_field(value: Any, info: ValidationInfo) -> Any:
    try:
        _storable(value, str(info.field_name))
    except InvalidArgument as exc:
        raise ValueError(str(exc).split(": ", 1)[-1]) from None
    return value


def _storable(value: Any, where: str) -> None:
    """Every string of a setting is text the database and argv can carry (no NUL, no lone surrogate)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            text(where, item)
        elif isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _text_is_storable(cls, value: Any, info: ValidationInfo) -> Any:
        return _storable_field(value, info)


class DispatchSettings(_Section):
    """``[dispatch]``: how the daemon delivers dispatches (the argv transport, batch size, retries)."""
    notify_template: list[str] | None = None
    """argv template; must contain an exact ``{deliver_to}`` element. None: deliveries fail visibly."""
    batch_size: int = Field(default=100, ge=1, le=10_000)
    concurrency: int = Field(default=8, ge=1, le=1_000)
    transport_timeout_seconds: float = Field(default=10.0, gt=0, le=CENTURY_SECONDS)
    """a send running longer is killed; claims lease each row for this plus 5 s (specs/outbox.md O21)"""
    max_payload_bytes: int | None = Field(default=None, ge=1, le=2**30)
    """the largest payload enqueue accepts; None: sized to what the template's transport can carry"""


class RetentionSettings(_Section):
    """``[retention]``: after how many days settled dispatches are purged (a tombstone fact each)."""
    enabled: bool = True
    delivered_days: float = Field(default=7, gt=0, le=CENTURY_DAYS)
    """delivered and acked dispatches are purged after this many days"""
    failed_days: float = Field(default=30, gt=0, le=CENTURY_DAYS)
    """dead_letter and expired dispatches are purged after this many days"""


class LauncherSettings(_Section):
    """``[launcher]``: how schedule runs start their child processes (argv prefix, working directory, limits)."""
    executable: list[str] | None = None
    """argv prefix for the agent/flow/fanout/play/flow_yaml kinds (e.g. ["li"]); None disables them"""
    cwd: str | None = None
    """fallback working directory for runs (specs/scheduler.md)"""
    stdout_log: str | None = None
    projects: dict[str, str] = {}
    """project name -> directory; a run's cwd falls back to its project's directory"""


class SchedulerSettings(_Section):
    """``[scheduler]``: the tick, the leadership lease, the slots, and the schedules to create at start."""
    timezone: str = "UTC"
    tick_seconds: float = Field(default=30, gt=0, le=CENTURY_SECONDS)
    lease_seconds: float = Field(default=90, gt=0, le=CENTURY_SECONDS)
    """scheduler leadership: a standby takes over once the leader's heartbeat (renewed every tick) is
    this old; runs of a daemon whose heartbeat is this old are reaped (specs/scheduler.md S14-S17)"""
    max_concurrent: int = Field(default=4, ge=1, le=1_000)
    invocation_deadline_seconds: float = Field(default=7200, gt=0, le=CENTURY_SECONDS)
    reaper_interval_seconds: float = Field(default=300, gt=0, le=CENTURY_SECONDS)
    checkpoint_interval_seconds: float = Field(default=3600, gt=0, le=CENTURY_SECONDS)
    max_chain_depth: int = Field(default=10, ge=0, le=1_000)
    deferred_record_every: int = Field(default=10, ge=1, le=1_000_000)
    github_api_url: str = "https://api.github.com"
    github_token: SecretRef | None = None
    """the token GitHub polls send, ``{ env = "VAR" }`` or ``{ file = "path" }``"""
    schedules: list[dict[str, Any]] = []
    """schedules upserted by name when the daemon starts (``[[scheduler.schedules]]`` tables)"""

    @model_validator(mode="after")
    def _lease_outlives_a_tick(self) -> SchedulerSettings:
        if self.lease_seconds <= self.tick_seconds:
            raise ValueError(f"lease_seconds ({self.lease_seconds:g}) must be longer than tick_seconds "
                             f"({self.tick_seconds:g}), or the leader loses its lease between two renewals; "
                             "three ticks or more is a good lease")
        return self


class RateLimit(_Section):
    """A fleet-wide token bucket of one channel (specs/notifications.md N8): created or resized by
    ``statebook run`` at start."""

    capacity: float = Field(gt=0, le=1e9)
    """tokens the bucket holds at most (a burst)"""
    refill_per_second: float = Field(gt=0, le=1e9)


class NotificationSettings(_Section):
    """How notifications are delivered (specs/notifications.md N3, N40-N45)."""

    lease_seconds: float = Field(default=60.0, gt=0, le=CENTURY_SECONDS)
    """how long a claim owns its notification"""
    deadline_seconds: float = Field(default=10.0, gt=0, le=CENTURY_SECONDS)
    """how long one channel call may take, provider-local retries included; shorter than the lease"""
    batch_size: int = Field(default=100, ge=1, le=10_000)
    concurrency: int = Field(default=8, ge=1, le=1_000)
    channels: dict[str, str] = {}
    """channel name (slack, email, pagerduty, websocket) -> ``module:attr`` naming its adapter (a Channel, or
    a callable returning one); ``statebook run`` delivers notifications only when at least one is named"""

    order: list[str] | None = None
    """the fallback order as written: configured persistent channels, each once; None: the default order
    (:attr:`fallback_order` is what delivery runs)"""
    rate_limits: dict[str, RateLimit] = {}
    """channel name -> its bucket, e.g. ``slack = { capacity = 20, refill_per_second = 1 }``"""
    slack: dict[str, Any] | None = None
    """the built-in Slack channel's settings (statebook.adapters.channels.slack), e.g. ``webhook_url = { env = "..." }``"""
    email: dict[str, Any] | None = None
    """the built-in SMTP channel's settings (statebook.adapters.channels.email)"""
    pagerduty: dict[str, Any] | None = None
    """the built-in PagerDuty Events API v2 channel's settings (statebook.adapters.channels.pagerduty)"""
    webhook: dict[str, Any] | None = None
    """the built-in signed-webhook channel's settings (statebook.adapters.channels.webhook)"""
    websocket: dict[str, Any] | None = None
    """the built-in WebSocket endpoint's settings (statebook.adapters.channels.websocket)"""
    apprise: dict[str, Any] | None = None
    """the Apprise channel's settings (statebook.adapters.channels.apprise; needs ``statebook[apprise]``)"""

    callbacks: dict[str, str] = {}
    """timeout callback name -> ``module:attr`` naming the host's ``async def (event)``: registered by
    ``statebook run`` before anything runs (specs/notifications.md N36-N38)"""

    @field_validator("callbacks")
    @classmethod
    def _callbacks_are_named(cls, value: dict[str, str]) -> dict[str, str]:
        for name, spec in value.items():
            if not name.strip():
                raise ValueError("a timeout callback needs a name")
            if ":" not in spec or not all(p.strip() for p in spec.split(":", 1)):
                raise ValueError(f"callback {name!r}: expected module:attr naming an async def, not {spec!r}")
        return value

    @field_validator("channels")
    @classmethod
    def _channels_are_named_adapters(cls, value: dict[str, str]) -> dict[str, str]:
        from statebook.outbox.notifications.channels import CHANNEL_NAMES

        for name, spec in value.items():
            if name not in CHANNEL_NAMES:
                raise ValueError(f"unknown channel {name!r}; channels are {', '.join(CHANNEL_NAMES)}")
            if ":" not in spec or not all(p.strip() for p in spec.split(":", 1)):
                raise ValueError(f"channel {name!r}: expected module:attr naming its adapter, not {spec!r}")
        return value

    @model_validator(mode="after")
    def _order_names_configured_channels(self) -> NotificationSettings:
        from statebook.outbox.notifications.channels import PERSISTENT_ORDER

        if self.order is None:
            return self
        configured = [name for name in PERSISTENT_ORDER if name in self.channels or getattr(self, name) is not None]
        listed = f"the configured persistent channels are: {', '.join(configured) or 'none'}"
        for at, name in enumerate(self.order):
            if name not in PERSISTENT_ORDER:
                raise ValueError(f"notifications.order names {name!r}, which is not a persistent channel "
                                 f"({', '.join(PERSISTENT_ORDER)}); {listed}")
            if name not in configured:
                raise ValueError(f"notifications.order names {name!r}, which is not configured; {listed}")
            if name in self.order[:at]:
                raise ValueError(f"notifications.order names {name!r} twice; {listed}")
        return self

    @property
    def fallback_order(self) -> tuple[str, ...]:
        """Every persistent channel once, as delivery takes it (N40): :attr:`order`'s channels first, then the others
        (unconfigured ones never run) in the default order."""
        from statebook.outbox.notifications.channels import PERSISTENT_ORDER, check_order

        written = self.order or []
        return check_order([*written, *(name for name in PERSISTENT_ORDER if name not in written)])

    @field_validator("rate_limits")
    @classmethod
    def _limits_name_channels(cls, value: dict[str, RateLimit]) -> dict[str, RateLimit]:
        from statebook.outbox.notifications.channels import CHANNEL_NAMES

        for name in value:
            if name not in CHANNEL_NAMES:
                raise ValueError(f"unknown channel {name!r}; channels are {', '.join(CHANNEL_NAMES)}")
        return value

    @model_validator(mode="after")
    def _builtin_sections_are_valid(self) -> NotificationSettings:
        from .channels.configure import check_sections

        # each section against its adapter's model; a channel named twice is refused; a missing extra is refused
        # where the channel is used (run, channels ls|test), so a command that sends nothing still runs
        check_sections(self, missing_ok=True)
        return self

    @model_validator(mode="after")
    def _deadline_fits_the_lease(self) -> NotificationSettings:
        if self.deadline_seconds >= self.lease_seconds:
            raise ValueError(f"notifications.deadline_seconds ({self.deadline_seconds:g}) must be shorter than "
                             f"notifications.lease_seconds ({self.lease_seconds:g}): a channel call must end "
                             "inside the lease that authorised it")
        return self


class LimitsSettings(_Section):
    """Bounds on the JSON a command may store; the book enforces them (lifecycle/inputs.py)."""

    json_depth: int = Field(default=Limits.json_depth, ge=1, le=1000)
    json_bytes: int = Field(default=Limits.json_bytes, ge=2, le=2**30)

    def to_limits(self) -> Limits:
        """The :class:`~statebook.lifecycle.inputs.Limits` these settings give."""
        return Limits(json_depth=self.json_depth, json_bytes=self.json_bytes)


class AuditSettings(_Section):
    """History an auditor can check (specs/audit.md): ``chain_key = {env = "VAR"}`` or ``{file = "/path"}``
    keys the fact chain with HMAC-SHA256; the key lives outside the database and never in this file."""

    chain_key: SecretRef | None = None
    log_key: SecretRef | None = None
    """the private key that signs the fact log's checkpoints (a ``PRIVATE+KEY+...`` text: ``statebook checkpoint
    keygen --note NAME``); when set, ``statebook run`` takes checkpoints by itself (specs/audit.md A7)"""
    checkpoint_dir: Path | None = None
    """where each checkpoint is written, one file per checkpoint (required with ``log_key``)"""
    checkpoint_command: list[str] | None = None
    """a command (argv) run with each checkpoint note on standard input, e.g. to push it to object storage"""
    checkpoint_every_seconds: float = Field(default=3600, gt=0, le=CENTURY_SECONDS)
    checkpoint_every_facts: int = Field(default=10_000, ge=1, le=10**12)

    @model_validator(mode="after")
    def _log_key_needs_a_directory(self) -> AuditSettings:
        if self.log_key is not None and self.checkpoint_dir is None:
            raise ValueError("audit.log_key is set, so checkpoints are taken: set audit.checkpoint_dir too")
        if self.checkpoint_command is not None and not self.checkpoint_command:
            raise ValueError("audit.checkpoint_command is an argv list with at least the program")
        return self

    def log_signer(self) -> Any:
        """The checkpoints' signer (:class:`~statebook.adapters.note.Signer`) the settings name, read now, or None
        (:class:`ConfigError` naming where, never the value)."""
        if self.log_key is None:
            return None
        from .note import NoteError, Signer

        try:
            return Signer.from_skey(self.log_key.reveal())
        except SecretError as exc:
            raise ConfigError(f"[audit] log_key: {exc}") from None
        except NoteError as exc:
            raise ConfigError(f"[audit] log_key: not a signer key ({exc})") from None

    def key(self) -> ChainKey | None:
        """The chain key it names, read now (:class:`ConfigError` naming where, never the value)."""
        if self.chain_key is None:
            return None
        try:
            return ChainKey(self.chain_key.reveal().encode())
        except SecretError as exc:  # a ValueError, not ours: the CLI would call it an internal error
            raise ConfigError(f"[audit] chain_key: {exc}") from None


class WebUser(_Section):
    """One person who may sign in to the console: an argon2 hash of their password (``statebook web
    hash-password`` prints one) and their role."""

    password_hash: str = Field(min_length=1)
    role: Literal["viewer", "operator"] = "viewer"

    @field_validator("password_hash")
    @classmethod
    def _is_argon2(cls, value: str) -> str:
        if not value.startswith("$argon2"):
            raise ValueError("password_hash must be an argon2 hash (statebook web hash-password prints one), "
                             "never the password itself")
        return value


class ProxySettings(_Section):
    """Sign-in trusted from a reverse proxy: the user (and optionally role) header it sets, honoured only
    on requests whose peer address is one of ``trusted``."""

    user_header: str = "X-Forwarded-User"
    role_header: str | None = None
    default_role: Literal["viewer", "operator"] = "viewer"
    trusted: list[str] = Field(min_length=1)


class TracingSettings(_Section):
    """OpenTelemetry spans (the ``otel`` extra, docs/how-to/tracing.md)."""

    enabled: bool = False
    """``statebook run`` sends spans to OpenTelemetry's global tracer provider"""


class WebSettings(_Section):
    """The web console and the responders' pages (``statebook web``, docs/console.md)."""

    host: str = "127.0.0.1"
    port: int = Field(default=8780, ge=0, le=65535)
    public_url: str | None = None
    """the console's address as responders reach it (https://...); links in notifications start with it"""
    link_key: SecretRef | None = None
    """HMAC key that signs responders' links; required with public_url"""
    link_ttl_seconds: float = Field(default=7 * 86400.0, gt=0, le=CENTURY_SECONDS)
    session_key: SecretRef | None = None
    """signs session cookies; when unset, a random key per process (sign-ins end at a restart)"""
    session_seconds: float = Field(default=8 * 3600.0, gt=0, le=CENTURY_SECONDS)
    users: dict[str, WebUser] = {}
    proxy: ProxySettings | None = None
    slack_signing_secret: SecretRef | None = None
    pagerduty_signing_secret: SecretRef | None = None
    replay_window_seconds: float = Field(default=300.0, gt=0, le=86400.0)

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is not None and not (value.startswith("http://") or value.startswith("https://")):
            raise ValueError("public_url must start with http:// or https://")
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _links_need_a_key(self) -> WebSettings:
        if self.public_url is not None and self.link_key is None:
            raise ValueError("public_url is set, so responders' links are signed: set link_key = { env = \"VAR\" } "
                             "or { file = \"path\" }")
        return self

    @property
    def sign_in(self) -> bool:
        """Whether anyone can sign in (users, or a trusted proxy)."""
        return bool(self.users) or self.proxy is not None


class Settings(BaseSettings):
    """All of statebook's settings: a TOML file (``--config``), then ``STATEBOOK_*`` environment variables."""
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", allow_inf_nan=False,
    )

    db: str | None = None
    """database URL; default sqlite:///./statebook.db"""
    app: str | None = None
    """the application's registry as ``module:attr`` (see ``--app``); default: the built-in lifecycles"""
    dispatch: DispatchSettings = DispatchSettings()
    retention: RetentionSettings = RetentionSettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    launcher: LauncherSettings = LauncherSettings()
    limits: LimitsSettings = LimitsSettings()
    notifications: NotificationSettings = NotificationSettings()
    audit: AuditSettings = AuditSettings()
    web: WebSettings = WebSettings()
    tracing: TracingSettings = TracingSettings()

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   *_: Any, **__: Any) -> tuple[PydanticBaseSettingsSource, ...]:
        # ``Settings(...)`` is exactly its arguments; load_settings() names the file and the environment.
        return (init_settings,)

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

    def book_limits(self) -> Limits:
        """The book's bounds: ``[limits]`` and what the delivery template can carry (the payload bound
        and whether a route may start with ``-``, specs/outbox.md O22), so an enqueue refuses what the
        daemon could never deliver."""
        return dispatch_limits(self.dispatch.notify_template, self.limits.to_limits(),
                               payload_bytes=self.dispatch.max_payload_bytes)

    @model_validator(mode="after")
    def _deliverable_payload_bound(self) -> Settings:
        try:
            self.book_limits()
        except InvalidArgument as exc:
            raise ValueError(f"dispatch.max_payload_bytes: {exc}") from None
        return self

    @field_validator("db", "app")
    @classmethod
    def _top_text_is_storable(cls, value: Any, info: ValidationInfo) -> Any:
        return _storable_field(value, info)


SECTIONS: dict[str, type[_Section]] = {
    name: field.annotation for name, field in Settings.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, _Section)
}


class EnvironmentSource(PydanticBaseSettingsSource):
    """``STATEBOOK_*`` variables of a given mapping (``os.environ`` by default) as settings data.

    A custom source through pydantic-settings' public source interface: ``STATEBOOK_DB`` and
    ``STATEBOOK_APP`` set the top-level keys, ``STATEBOOK_<SECTION>__<FIELD>`` a section's field (the
    names are checked first, :func:`_check_environment`); a list or table field takes JSON."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        name = f"{ENV_PREFIX}{field_name.upper()}"
        return self.environ.get(name), name, self.field_is_complex(field)

    def __call__(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for name, value in self.environ.items():
            if not name.upper().startswith(ENV_PREFIX):
                continue
            rest = name[len(ENV_PREFIX):].lower()
            if "__" in rest:
                section, *path = rest.split("__")
                self._put(data.setdefault(section, {}), SECTIONS[section], path, value, name)
            elif rest in Settings.model_fields and rest not in SECTIONS:
                data[rest] = value
        return data

    def _put(self, node: dict[str, Any], model: type[BaseModel], path: list[str], value: str, name: str) -> None:
        """``value`` at ``path`` below ``model``: a field, or a field of a model-typed field
        (``STATEBOOK_AUDIT__CHAIN_KEY__FILE``). A secret's source replaces the other one: it comes from one place."""
        field = model.model_fields[path[0]]
        if len(path) == 1:
            node[path[0]] = self._decoded(field, value, name)
            return
        inner = _model_of(field.annotation)
        assert inner is not None  # _check_environment refused any other name
        child = node.get(path[0])
        if not isinstance(child, dict):
            child = node[path[0]] = dict.fromkeys(inner.model_fields) if issubclass(inner, SecretRef) else {}
        self._put(child, inner, path[1:], value, name)

    def _decoded(self, field: Any, value: str, name: str) -> Any:
        if not _structured(field.annotation):
            return value
        try:
            return loads_checked(value)  # statebook's JSON rules: 64-bit integers, finite numbers
        except ValueError as exc:
            raise ConfigError(f"invalid setting in the environment: {name} takes JSON, e.g. "
                              f"'[\"a\", \"b\"]' or '{{\"key\": \"value\"}}' ({exc})") from None


def _structured(annotation: Any) -> bool:
    """A list, table or model annotation (optional or not): its environment value is JSON."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_structured(a) for a in args)
    origin = typing.get_origin(annotation) or annotation
    return origin in (list, dict, tuple, set) or (isinstance(origin, type) and issubclass(origin, BaseModel))


def _nearest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1)
    return f"did you mean {close[0]!r}?" if close else f"valid: {', '.join(sorted(choices))}"


def _check_names(data: Mapping[str, Any], where: str) -> None:
    """ConfigError naming the first unknown section or key of a file's tables."""
    for key, value in data.items():
        if key in SECTIONS:
            if isinstance(value, Mapping):
                known = list(SECTIONS[key].model_fields)
                for field in value:
                    if field not in known:
                        raise ConfigError(f"unknown setting '{key}.{field}' in {where}; {_nearest(field, known)}")
        elif key not in Settings.model_fields:
            what = "setting section" if isinstance(value, Mapping) else "setting"
            raise ConfigError(f"unknown {what} {key!r} in {where}; {_nearest(key, list(Settings.model_fields))}")


def _check_environment(environ: Mapping[str, str]) -> None:
    """Every ``STATEBOOK_<SECTION>__<FIELD>`` name must address a setting.

    Names without ``__`` other than the top-level keys are left alone: they belong to other uses
    (``STATEBOOK_DEBUG``, the ``STATEBOOK_RUN_ID`` a run's process gets, the test suite's)."""
    for name in environ:
        if not name.upper().startswith(ENV_PREFIX) or "__" not in name:
            continue
        section, *path = name[len(ENV_PREFIX):].lower().split("__")
        if section in Settings.model_fields and section not in SECTIONS:
            raise ConfigError(f"{name}: {section!r} is a setting, not a section; name it {ENV_PREFIX}{section.upper()}")
        if section not in SECTIONS:
            raise ConfigError(f"unknown setting section {section!r} ({name}); {_nearest(section, list(SECTIONS))}")
        model: type[BaseModel] | None = SECTIONS[section]
        where = section
        for part in path:
            known = list(model.model_fields) if model is not None else []
            if part not in known:
                hint = _nearest(part, known) if known else f"{where} has no settings below it"
                raise ConfigError(f"unknown setting '{where}.{part}' ({name}); {hint}")
            assert model is not None  # without one nothing is known, and the check above refused the part
            model, where = _model_of(model.model_fields[part].annotation), f"{where}.{part}"


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation names (``SecretRef | None``: SecretRef), or None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _read_file(file: Path) -> TomlConfigSettingsSource:
    if not file.is_file():
        raise ConfigError(f"settings file {file} does not exist" if not file.exists() else f"settings file {file} is not a file")
    try:
        return TomlConfigSettingsSource(Settings, toml_file=file)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"settings file {file} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"settings file {file} is not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"settings file {file} cannot be read: {exc.strerror or exc}") from None


def _deep_merge(low: dict[str, Any], high: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(low)
    for key, value in high.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(dict(merged[key]), value)
        else:
            merged[key] = value
    return merged


def _origin(loc: tuple[Any, ...], layers: list[tuple[str, Mapping[str, Any]]]) -> str:
    """Which source gave the value at ``loc`` (the highest that has it)."""
    for label, data in layers:
        node: Any = data
        for part in loc:
            if not isinstance(node, Mapping) or part not in node:
                break
            node = node[part]
        else:
            return f" ({label})"
    return ""


def load_settings(path: str | Path | None = None, *, environ: Mapping[str, str] | None = None,
                  **explicit: Any) -> Settings:
    """Settings from ``path`` (TOML), the environment and explicit values; ConfigError (one line) when invalid."""
    environ = dict(os.environ if environ is None else environ)
    layers: list[tuple[str, Mapping[str, Any]]] = []  # highest precedence first
    explicit = {k: v for k, v in explicit.items() if v is not None}
    layers.append(("given explicitly", InitSettingsSource(Settings, explicit)()))
    _check_environment(environ)
    layers.append(("from the environment", EnvironmentSource(Settings, environ)()))
    if path is not None:
        file = Path(path)
        data = _read_file(file)()
        _check_names(data, f"settings file {file}")
        layers.append((f"in {file}", data))
    merged: dict[str, Any] = {}
    for _label, data in reversed(layers):
        merged = _deep_merge(merged, data)
    _check_secrets(merged, layers)
    try:
        return Settings(**merged)
    except ValidationError as exc:
        raise ConfigError(_first_problem(exc, layers)) from None


def _first_problem(exc: ValidationError, layers: list[tuple[str, Mapping[str, Any]]]) -> str:
    errors = exc.errors()
    first = errors[0]
    loc = tuple(first["loc"])
    where = ".".join(str(p) for p in loc) or "settings"
    if not loc:  # a rule across sections (a model validator): its message names the settings
        return f"invalid settings: {first['msg'].removeprefix('Value error, ')}"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    if first["type"] == "extra_forbidden":
        section = SECTIONS.get(str(loc[0])) if len(loc) == 2 else None
        known = list(section.model_fields) if section else list(Settings.model_fields)
        return f"unknown setting {where!r}{_origin(loc, layers)}; {_nearest(str(loc[-1]), known)}{more}"
    message = first["msg"].removeprefix("Value error, ")
    origin = _origin(loc, layers)
    if message.startswith(f"{where}."):  # the rule names its setting itself (notifications.order ...)
        return f"{message}{origin}{more}"
    if first["type"] in ("list_type", "dict_type") and "environment" in origin:
        message += " (the environment takes JSON here, e.g. '[\"a\", \"b\"]' or '{\"key\": \"value\"}')"
    return f"invalid setting {where}{origin}: {message}{more}"


def _check_secrets(data: Mapping[str, Any], layers: list[tuple[str, Mapping[str, Any]]]) -> None:
    """A secret written as a value (a string, a number) instead of where to read it is refused in our words, naming
    the setting and never the value: every ``SecretRef`` field of the sections and of the built-in channels'."""
    from .channels.configure import BUILTINS, config_model
    from .extras import MissingExtra

    places: list[tuple[type[BaseModel], Any, tuple[str, ...]]] = [
        (model, data.get(name), (name,)) for name, model in SECTIONS.items()]
    notifications = data.get("notifications")
    if not isinstance(notifications, Mapping):
        notifications = {}
    for name in BUILTINS if notifications else ():
        try:
            places.append((config_model(name), notifications.get(name), ("notifications", name)))
        except MissingExtra:  # its section is checked where the channel is used
            continue
    while places:
        model, node, loc = places.pop()
        if not isinstance(node, Mapping):
            continue
        for field_name, field in model.model_fields.items():
            value, inner = node.get(field_name), _model_of(field.annotation)
            if inner is None or value is None:
                continue
            if not issubclass(inner, SecretRef):
                places.append((inner, value, (*loc, field_name)))
            elif not isinstance(value, (Mapping, SecretRef)):
                where = (*loc, field_name)
                raise ConfigError(f"{'.'.join(where)} is a secret: write {{ env = \"VAR\" }} or {{ file = \"path\" }}"
                                  f"{_origin(where, layers)}")
