"""Settings say what they mean (specs/cli.md C17): a secret written as a value is refused in our words for every
secret setting, and a fallback ``order`` names only the persistent channels that are configured."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from statebook.adapters.channels.configure import BUILTINS, config_model
from statebook.adapters.channels.secrets import SecretRef
from statebook.adapters.cli import app
from statebook.adapters.errors import ConfigError
from statebook.adapters.extras import MissingExtra
from statebook.adapters.settings import SECTIONS, _model_of, load_settings

SECRETS = [
    "audit.chain_key", "audit.log_key", "scheduler.github_token", "web.link_key", "web.session_key", "web.slack_signing_secret",
    "web.pagerduty_signing_secret", "notifications.slack.webhook_url", "notifications.slack.bot_token",
    "notifications.email.password", "notifications.pagerduty.routing_key", "notifications.webhook.url",
    "notifications.webhook.secret", "notifications.websocket.tokens", "notifications.apprise.urls",
]
"""Every setting that holds a secret."""

PLAIN = "s3cr3t-written-in-the-file"


def _secret_fields(model, where: str) -> list[str]:
    found = []
    for name, field in model.model_fields.items():
        inner = _model_of(field.annotation)
        if inner is not None and issubclass(inner, SecretRef):
            found.append(f"{where}.{name}")
        elif inner is not None:
            found += _secret_fields(inner, f"{where}.{name}")
    return found


def test_the_list_names_every_secret_setting():
    """C17: SECRETS is every SecretRef field of the sections and of the built-in channels' models: a new secret
    setting is tested below once it is added here."""
    found = [f for name, model in SECTIONS.items() for f in _secret_fields(model, name)]
    found += [f for name in BUILTINS for f in _secret_fields(config_model(name), f"notifications.{name}")]
    assert sorted(found) == sorted(SECRETS)


def _toml(path: str, value: str) -> str:
    *table, key = path.split(".")
    return f"[{'.'.join(table)}]\n{key} = {value}\n"


@pytest.mark.parametrize("path", SECRETS)
@pytest.mark.parametrize("value", [json.dumps(PLAIN), "42"])
def test_a_secret_written_as_a_value_is_refused_in_one_line_naming_the_setting_not_the_value(tmp_path, path, value):
    """C17: `notifications.webhook.url = "https://..."` is refused with `notifications.webhook.url is a secret: write
    { env = "VAR" } or { file = "path" }` and where it was written; the value is never repeated."""
    toml = tmp_path / "s.toml"
    toml.write_text(_toml(path, value))
    try:
        config_model(path.split(".")[1]) if path.startswith("notifications.") else None
    except MissingExtra:
        pytest.skip("the channel's extra is not installed")
    with pytest.raises(ConfigError) as caught:
        load_settings(toml, environ={})
    assert str(caught.value) == f'{path} is a secret: write {{ env = "VAR" }} or {{ file = "path" }} (in {toml})'
    assert PLAIN not in str(caught.value)


def test_a_secret_as_a_json_string_in_the_environment_is_refused_likewise():
    """C17: the environment's JSON form of a secret setting is held to the same rule."""
    with pytest.raises(ConfigError) as caught:
        load_settings(environ={"STATEBOOK_AUDIT__CHAIN_KEY": json.dumps(PLAIN)})
    assert str(caught.value) == ('audit.chain_key is a secret: write { env = "VAR" } or { file = "path" } '
                                 "(from the environment)")


def test_the_command_line_shows_the_refusal_as_its_one_line(tmp_path):
    """C17: through the CLI the refusal is the command's one error line, exit 2, without the value."""
    toml = tmp_path / "s.toml"
    toml.write_text(_toml("notifications.webhook.url", json.dumps(PLAIN)) + 'secret = { env = "HOOK_SECRET" }\n')
    result = CliRunner().invoke(app, ["channels", "ls", "--config", str(toml)], env={"STATEBOOK_CONFIG": None})
    assert result.exit_code == 2 and PLAIN not in result.output
    assert result.stderr.strip().splitlines() == [
        f'error: notifications.webhook.url is a secret: write {{ env = "VAR" }} or {{ file = "path" }} (in {toml})']


SLACK = '[notifications.slack]\nwebhook_url = { env = "SLACK_URL" }\n'
WEBHOOK = '[notifications.webhook]\nurl = { env = "HOOK_URL" }\nsecret = { env = "HOOK_SECRET" }\n'


@pytest.mark.parametrize("order, sections, message", [
    ('["email", "slack"]', SLACK + WEBHOOK,
     "notifications.order names 'email', which is not configured; the configured persistent channels are: slack, "
     "webhook"),
    ('["slack", "sms"]', SLACK,
     "notifications.order names 'sms', which is not a persistent channel (slack, email, pagerduty, webhook, "
     "apprise); the configured persistent channels are: slack"),
    ('["websocket"]', SLACK,
     "notifications.order names 'websocket', which is not a persistent channel (slack, email, pagerduty, webhook, "
     "apprise); the configured persistent channels are: slack"),
    ('["slack", "slack"]', SLACK, "notifications.order names 'slack' twice; the configured persistent channels are: "
     "slack"),
    ('["slack"]', "", "notifications.order names 'slack', which is not configured; the configured persistent "
     "channels are: none"),
])
def test_an_order_names_only_configured_persistent_channels(tmp_path, order, sections, message):
    """C17, N40: an unknown, best-effort, unconfigured or repeated channel in `order` is one line naming it and
    listing the configured persistent channels."""
    toml = tmp_path / "s.toml"
    toml.write_text(f"[notifications]\norder = {order}\n{sections}")
    with pytest.raises(ConfigError) as caught:
        load_settings(toml, environ={})
    assert str(caught.value) == f"{message} (in {toml})"


def test_an_order_of_configured_channels_runs_them_first_then_the_rest_in_the_default_order(tmp_path):
    """C17, N40: `fallback_order` names every persistent channel once (what delivery takes): the configured ones as
    written, the others after them; a custom adapter in `channels` counts as configured; a dump validates again."""
    toml = tmp_path / "s.toml"
    toml.write_text('[notifications]\norder = ["webhook", "email", "slack"]\nchannels = { email = "mine:email" }\n'
                    + SLACK + WEBHOOK)
    loaded = load_settings(toml, environ={})
    assert loaded.notifications.fallback_order == ("webhook", "email", "slack", "pagerduty", "apprise")
    assert load_settings(environ={}).notifications.fallback_order == ("slack", "email", "pagerduty", "webhook", "apprise")
    again = type(loaded).model_validate(loaded.model_dump())  # the daemon re-validates a dump (resolve_settings)
    assert again.notifications.fallback_order == loaded.notifications.fallback_order
