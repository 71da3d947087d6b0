"""Settings through pydantic-settings: sources, precedence, refusals with the nearest name (specs/cli.md C1, C2)."""

from __future__ import annotations

import asyncio

import pytest

from statebook.adapters.db import open_book
from statebook.adapters.errors import ConfigError
from statebook.adapters.settings import Settings, load_settings
from statebook.lifecycle.inputs import Limits


def test_precedence_is_explicit_then_environment_then_file_then_defaults(tmp_path):
    """C1: explicit > environment > file > defaults, field by field inside a section."""
    toml = tmp_path / "s.toml"
    toml.write_text('db = "sqlite:///file.db"\n[scheduler]\ntick_seconds = 3\nmax_concurrent = 7\n')
    env = {"STATEBOOK_DB": "sqlite:///env.db", "STATEBOOK_SCHEDULER__TICK_SECONDS": "5"}
    s = load_settings(toml, environ=env)
    assert (s.db, s.scheduler.tick_seconds, s.scheduler.max_concurrent, s.scheduler.lease_seconds) == \
        ("sqlite:///env.db", 5.0, 7, 90.0)
    assert load_settings(toml, environ=env, db="sqlite:///given.db").db == "sqlite:///given.db"
    assert load_settings(toml, environ={}).db == "sqlite:///file.db"
    assert load_settings(environ={}).db is None
    assert Settings().scheduler.tick_seconds == 30  # a Settings built directly reads nothing


def test_list_settings_take_json_through_the_environment():
    """C1: a list setting is JSON in the environment; a value that is not JSON says so."""
    env = {"STATEBOOK_DISPATCH__NOTIFY_TEMPLATE": '["/bin/echo", "{deliver_to}"]'}
    assert load_settings(environ=env).dispatch.notify_template == ["/bin/echo", "{deliver_to}"]
    with pytest.raises(ConfigError, match="takes JSON"):
        load_settings(environ={"STATEBOOK_DISPATCH__NOTIFY_TEMPLATE": "/bin/echo {deliver_to}"})


@pytest.mark.parametrize("env, fragment", [
    ({"STATEBOOK_SCHEDULERX__TICK_SECONDS": "5"}, "unknown setting section 'schedulerx' "
                                                  "(STATEBOOK_SCHEDULERX__TICK_SECONDS); did you mean 'scheduler'?"),
    ({"STATEBOOK_SCHEDULER__TICK_SECOND": "5"}, "unknown setting 'scheduler.tick_second'"),
    ({"STATEBOOK_DB__URL": "x"}, "'db' is a setting, not a section"),
    ({"STATEBOOK_SCHEDULER__TICK_SECONDS": "abc"}, "scheduler.tick_seconds (from the environment)"),
    ({"STATEBOOK_SCHEDULER__TICK_SECONDS": "nan"}, "finite"),
])
def test_the_environment_is_checked_name_by_name(env, fragment):
    """C2: a typo in a section or field name is refused with the nearest valid name, not ignored."""
    with pytest.raises(ConfigError) as caught:
        load_settings(environ=env)
    assert fragment in str(caught.value) and "\n" not in str(caught.value)


def test_the_chain_key_is_read_from_the_environment_by_its_source(tmp_path, monkeypatch):
    """C1 / C15: ``STATEBOOK_AUDIT__CHAIN_KEY__FILE`` (or ``__ENV``) names where the chain key is, as
    ``chain_key = {file = ...}`` does in the file, and replaces the file's whole reference (a key comes from one
    place); the JSON form works too. A name below a setting that has no fields is refused with the nearest one."""
    key_file = tmp_path / "chain.key"
    key_file.write_text("a chain key of forty bytes, for the tests\n")
    monkeypatch.setenv("CHAIN_SECRET", "another chain key, from a variable")
    toml = tmp_path / "s.toml"
    toml.write_text('[audit]\nchain_key = { env = "CHAIN_SECRET" }\n')
    by_file = load_settings(toml, environ={"STATEBOOK_AUDIT__CHAIN_KEY__FILE": str(key_file)}).audit
    assert by_file.chain_key is not None and by_file.chain_key.file == key_file and by_file.chain_key.env is None
    assert by_file.key().secret == b"a chain key of forty bytes, for the tests"
    by_env = load_settings(environ={"STATEBOOK_AUDIT__CHAIN_KEY__ENV": "CHAIN_SECRET"}).audit.key()
    assert by_env is not None and by_env.secret == b"another chain key, from a variable"
    as_json = load_settings(environ={"STATEBOOK_AUDIT__CHAIN_KEY": f'{{"file": "{key_file}"}}'}).audit.key()
    assert as_json == by_file.key()
    with pytest.raises(ConfigError, match="unknown setting 'audit.chain_key.path'.*valid: env, file"):
        load_settings(environ={"STATEBOOK_AUDIT__CHAIN_KEY__PATH": str(key_file)})
    with pytest.raises(ConfigError, match="unknown setting 'scheduler.tick_seconds.x'"):
        load_settings(environ={"STATEBOOK_SCHEDULER__TICK_SECONDS__X": "1"})


def test_other_statebook_variables_are_left_alone():
    """C2: names without `__` that are not settings belong to other uses (STATEBOOK_DEBUG, a run's STATEBOOK_RUN_ID)."""
    assert load_settings(environ={"STATEBOOK_DEBUG": "1", "STATEBOOK_RUN_ID": "r1"}).db is None


@pytest.mark.parametrize("body, fragment", [
    ("[schedulerx]\ntick_seconds = 5\n", "unknown setting section 'schedulerx' in settings file"),
    ("[scheduler]\ntick_secs = 5\n", "did you mean 'tick_seconds'?"),
    ("dbb = 'x'\n", "unknown setting 'dbb'"),
    ("[scheduler]\ntick_seconds = 0\n", "scheduler.tick_seconds"),
    ("[limits]\njson_depth = 0\n", "limits.json_depth"),
    ("[dispatch]\nnotify_template = [\"a\\u0000\"]\n", "NUL"),
    ("[scheduler\n", "is not valid TOML"),
    ("[notifications]\ndeadline_seconds = 60\n", "must be shorter than notifications.lease_seconds"),
    ("[notifications]\nlease_seconds = 5\n", "must be shorter than notifications.lease_seconds"),
    ("[notifications]\norder = [\"slack\", \"email\"]\n",
     "notifications.order names 'slack', which is not configured; the configured persistent channels are: none"),
    ("[notifications]\norder = [\"slack\", \"email\", \"pagerduty\", \"webhook\", \"websocket\"]\n",
     "notifications.order names 'slack', which is not configured"),
    ("[notifications.rate_limits]\nsms = { capacity = 1, refill_per_second = 1 }\n", "unknown channel 'sms'"),
    ("[notifications.rate_limits]\nslack = { capacity = 0, refill_per_second = 1 }\n", "capacity"),
])
def test_the_file_is_checked(tmp_path, body, fragment):
    """C2: unknown keys and sections, bad values and invalid TOML are one-line ConfigErrors."""
    toml = tmp_path / "s.toml"
    toml.write_text(body)
    with pytest.raises(ConfigError) as caught:
        load_settings(toml, environ={})
    assert fragment in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "missing.toml", environ={})


def test_limits_reach_the_book(tmp_path):
    """C9: `[limits]` gives json_depth/json_bytes (defaults 32 and 1 MiB); open_book(limits=) puts them on the Book."""
    assert load_settings(environ={}).limits.to_limits() == Limits()
    assert load_settings(environ={}).dispatch.max_payload_bytes is None
    toml = tmp_path / "s.toml"
    toml.write_text("[limits]\njson_depth = 4\njson_bytes = 4096\n[dispatch]\nmax_payload_bytes = 2048\n")
    s = load_settings(toml, environ={})
    assert s.dispatch.max_payload_bytes == 2048

    async def go() -> Limits:
        book = await open_book(f"sqlite:///{tmp_path / 'l.db'}", limits=s.limits.to_limits())
        try:
            return book.limits
        finally:
            await book.engine.dispose()

    assert asyncio.run(go()) == Limits(json_depth=4, json_bytes=4096)


def test_the_fallback_order_and_rate_limits_are_read():
    """N40, N8: the order defaults to Slack, email, PagerDuty, webhook, Apprise and is the settings' when set (the
    configured channels it names first, then the others in the default order)."""
    assert load_settings(environ={}).notifications.fallback_order == ("slack", "email", "pagerduty", "webhook", "apprise")
    n = load_settings(environ={"STATEBOOK_NOTIFICATIONS__ORDER": '["webhook", "pagerduty"]',
                               "STATEBOOK_NOTIFICATIONS__WEBHOOK": '{"url": {"env": "U"}, "secret": {"env": "S"}}',
                               "STATEBOOK_NOTIFICATIONS__PAGERDUTY": '{"routing_key": {"env": "K"}}',
                               "STATEBOOK_NOTIFICATIONS__RATE_LIMITS": '{"slack": {"capacity": 5, "refill_per_second": 0.5}}'}
                      ).notifications
    assert n.fallback_order == ("webhook", "pagerduty", "slack", "email", "apprise") and n.rate_limits["slack"].capacity == 5.0


def test_notification_budgets_default_to_the_seed_s_and_are_read():
    """N3: the lease is 60 s and the adapter deadline 10 s unless the settings say otherwise."""
    n = load_settings(environ={}).notifications
    assert (n.lease_seconds, n.deadline_seconds) == (60.0, 10.0)
    other = load_settings(environ={"STATEBOOK_NOTIFICATIONS__DEADLINE_SECONDS": "30"}).notifications
    assert other.deadline_seconds == 30.0
