"""``statebook channels``: the configured notification channels, and one real test send.

``channels ls`` shows each channel — where its adapter comes from, whether it is persistent, its place in
the fallback order, what it guards, its rate-limit bucket — with every secret shown only by where it is
read from and whether it is there. ``channels test NAME --to RECIPIENT`` makes one real send through the
adapter and prints the observation; it writes nothing to the database and draws no token.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import typer

from .app import app, console, ctx_state, emit_json, fail, print_table, run
from .schedule import CONFIG_HELP, _settings

channels_app = typer.Typer(help="Notification channels: list the configured ones, test one with a real send.",
                           no_args_is_help=True)
app.add_typer(channels_app, name="channels")


def _shown(value: Any) -> Any:
    """A settings value as shown: a secret by its source and whether it can be read, never its value."""
    from statebook.adapters.channels.secrets import SecretError, SecretRef

    if isinstance(value, SecretRef):
        try:
            value.reveal()
            state = "set"
        except SecretError:
            state = "missing"
        return f"{value} ({state})"
    if isinstance(value, dict):
        return {k: _shown(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_shown(v) for v in value]
    return value


def _configured(settings: Any) -> dict[str, dict[str, Any]]:
    """Per configured channel: its source, its settings as shown, and its adapter (or the error building it)."""
    from statebook.adapters.channels.configure import BUILTINS, check_sections
    from statebook.adapters.daemon import load_channels
    from statebook.adapters.errors import ConfigError

    n = settings.notifications
    out: dict[str, dict[str, Any]] = {}
    for name, config in check_sections(n).items():
        entry: dict[str, Any] = {"source": f"built-in ({BUILTINS[name][0]})",
                                 "settings": {k: _shown(getattr(config, k)) for k in type(config).model_fields}}
        try:
            made = config.build()  # type: ignore[attr-defined]
            entry["adapter"] = made[1] if isinstance(made, tuple) else made
        except Exception as exc:  # a missing secret, an unreadable file: shown in the row
            entry["error"] = str(exc)
        out[name] = entry
    for name, spec in n.channels.items():
        entry = {"source": spec, "settings": {}}
        try:
            entry["adapter"] = load_channels({name: spec})[name]
        except ConfigError as exc:
            entry["error"] = str(exc)
        out[name] = entry
    return out


async def _buckets(names: list[str]) -> dict[str, dict[str, Any]] | str:
    """The channels' buckets (scope ``all``) refilled to now, or why there is no database to read."""
    import sqlalchemy as sa

    from statebook.adapters.db import open_book
    from statebook.outbox.notifications.buckets import refilled
    from statebook.outbox.notifications.schema import rate_buckets

    try:
        book = await open_book(ctx_state.db_url, must_exist=True, create=False)
    except Exception as exc:  # noqa: BLE001 - ls shows configuration even without a database
        return f"no database ({type(exc).__name__})"
    try:
        async with book.read() as conn:
            rows = (await conn.execute(sa.select(rate_buckets).where(
                rate_buckets.c.id.in_([f"{n}:all" for n in names])))).all()
        now = book.clock.now()
        out = {}
        for r in rows:
            row = dict(r._mapping)
            tokens, at = refilled(row, now)
            out[row["channel"]] = {"status": row["status"], "tokens": round(tokens, 3), "capacity": row["capacity"],
                                   "refill_per_second": row["refill_per_second"],
                                   "held_for_seconds": round(max(0.0, at - now), 3)}
        return out
    finally:
        await book.engine.dispose()


@channels_app.command("ls")
def ls_cmd(
    config: str = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every channel: configured or not, persistent or not, fallback position, guards, bucket."""
    from statebook.outbox.notifications.channels import CHANNEL_NAMES

    settings = _settings(config)
    found = _configured(settings)
    if ctx_state.db_url is None and settings.db is not None:
        ctx_state.db_url = settings.db
    buckets = run(_buckets(list(CHANNEL_NAMES)))
    order = settings.notifications.fallback_order
    limits = settings.notifications.rate_limits
    rows = []
    for name in CHANNEL_NAMES:
        entry = found.get(name, {})
        adapter = entry.get("adapter")
        bucket: dict[str, Any] | str | None = buckets.get(name) if isinstance(buckets, dict) else None
        rows.append({
            "channel": name, "configured": name in found, "source": entry.get("source"),
            "persistent": name in order, "position": order.index(name) + 1 if name in order else None,
            "reports_admission": getattr(adapter, "reports_admission", None),
            "guards_provider_attempts": getattr(adapter, "guards_provider_attempts", None),
            "rate_limit": limits[name].model_dump() if name in limits else None, "bucket": bucket,
            "settings": entry.get("settings", {}), "error": entry.get("error"),
        })
    if as_json:
        emit_json({"channels": rows, "buckets": buckets if isinstance(buckets, str) else "read"})
        return
    from rich.markup import escape
    from rich.table import Column, Table

    table = Table(Column("channel", no_wrap=True), "configured", "kind", "order", "guards", "bucket", "settings")
    for r in rows:
        kind = "persistent" if r["persistent"] else "best effort"
        guards = ("-" if r["reports_admission"] is None else
                  ("admission" if r["reports_admission"] else "entry") + (", retries" if r["guards_provider_attempts"] else ""))
        if r["bucket"]:
            b = r["bucket"]
            bucket = f"{b['tokens']:g}/{b['capacity']:g} (+{b['refill_per_second']:g}/s)" + (
                f", held {b['held_for_seconds']:g}s" if b["held_for_seconds"] else "")
        elif r["rate_limit"]:
            bucket = "configured, not created yet"
        else:
            bucket = "no limit" if isinstance(buckets, dict) else "-"
        # Settings and errors are text, never markup: "statebook[apprise]" must print as written.
        shown = r["error"] and f"[red]{escape(r['error'])}[/red]" or escape(", ".join(
            f"{k}={v}" for k, v in r["settings"].items() if v is not None))
        table.add_row(r["channel"], "yes" if r["configured"] else "no", kind, str(r["position"] or "-"), guards,
                      bucket, shown)
    print_table(table)
    if isinstance(buckets, str):
        console.print(f"buckets: {buckets}; they are created by `statebook run` from notifications.rate_limits",
                      highlight=False)


class _TestGuard:
    """The guard of a test send: no claim, no token, no fact; it notes what the adapter asked."""

    def __init__(self, deadline: float) -> None:
        self.end = time.monotonic() + deadline
        self.admitted = False
        self.retries = 0

    def remaining(self) -> float:
        """Seconds left before the test send's deadline."""
        return max(0.0, self.end - time.monotonic())

    async def admit(self) -> None:
        """Note that the adapter asked to start the send."""
        self.admitted = True

    async def guard_provider_attempt(self) -> None:
        """Count a provider-side retry the adapter asked for."""
        self.retries += 1


@channels_app.command("test")
def test_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="The channel (slack, email, pagerduty, webhook, apprise)."),
    to: str = typer.Option(..., "--to", metavar="RECIPIENT", help="Who receives the test message."),
    text: str = typer.Option("statebook channel test", "--text", help="The message text."),
    deadline: float = typer.Option(10.0, "--deadline", min=0.1, max=300, help="Seconds the send may take."),
    config: str = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print the observation as JSON."),
) -> None:
    """Send one real message through a configured channel and print the observation (exit 1 unless it
    succeeded). Nothing is written to the database and no rate-limit token is drawn."""
    from statebook.lifecycle.codec import new_id
    from statebook.outbox.notifications import Delivery, ProviderOutcome
    from statebook.outbox.notifications.channels import CHANNEL_NAMES

    if name not in CHANNEL_NAMES:
        raise fail(f"unknown channel {name!r}; channels are {', '.join(CHANNEL_NAMES)}")
    if name == "websocket":
        raise fail("the websocket channel is served by `statebook run`: connect a subscriber to the running daemon")
    found = _configured(_settings(config))
    entry = found.get(name)
    if entry is None:
        raise fail(f"channel {name!r} is not configured: add [notifications.{name}] to the settings "
                   "(`statebook channels ls` shows what is)")
    if "error" in entry:
        raise fail(entry["error"])
    adapter = entry["adapter"]
    delivery = Delivery(new_id(), to, {"title": "statebook", "text": text, "body": text}, cycle=1, attempt=1,
                        channel=name)
    guard = _TestGuard(deadline)

    async def send() -> Any:
        try:
            async with asyncio.timeout(deadline):
                return await adapter.send(delivery, guard)
        except TimeoutError:
            return None
        finally:
            if callable(getattr(adapter, "aclose", None)):
                await adapter.aclose()

    started = time.monotonic()
    observed = run(send())
    took = time.monotonic() - started
    if observed is None:
        outcome = ProviderOutcome.UNKNOWN if guard.admitted else ProviderOutcome.NOT_STARTED
        result: dict[str, Any] = {"outcome": outcome.value, "detail": f"no answer within {deadline:g}s",
                                  "retries": guard.retries,
                  "retry_after": None}
    else:
        result = {"outcome": observed.outcome.value, "detail": observed.detail, "retries": observed.retries,
                  "retry_after": observed.retry_after}
    result |= {"channel": name, "recipient": to, "admitted": guard.admitted, "seconds": round(took, 3)}
    if as_json:
        emit_json(result)
    else:
        console.print(f"{name} -> {to}: [bold]{result['outcome']}[/bold] in {took:.2f}s"
                      + (f" ({result['detail']})" if result["detail"] else "")
                      + (f", {result['retries']} provider retries" if result["retries"] else "")
                      + (f", retry after {result['retry_after']:g}s" if result["retry_after"] else ""),
                      highlight=False, soft_wrap=True)
    if result["outcome"] != ProviderOutcome.SUCCESS.value:
        raise typer.Exit(1)
