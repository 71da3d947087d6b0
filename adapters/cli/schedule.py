"""``statebook run`` (the daemon), ``statebook schedule ...`` and ``statebook runs ...``."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import typer

from statebook.lifecycle import Book
from statebook.lifecycle.inputs import INT32, duration, integer, number

from .app import (app, cli_registry, console, ctx_state, emit_json, fail, format_time, parse_time, print_table, run,
                  settings_file, with_book)

if TYPE_CHECKING:
    from statebook.scheduler.models import Schedule, ScheduleRun

schedule_app = typer.Typer(help="Create, inspect, pause and fire schedules.", no_args_is_help=True)
runs_app = typer.Typer(help="Inspect or cancel one run of a schedule.", no_args_is_help=True)
app.add_typer(schedule_app, name="schedule")
app.add_typer(runs_app, name="runs")

JSON_HELP = "Print JSON instead of a table."
CONFIG_HELP = "Settings file (TOML; default: the global --config, else ./statebook.toml); see examples/statebook.toml."
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def _settings(config: str | None) -> Any:
    """The settings from :func:`~.app.settings_file` (``config``: the command's own ``--config``), the
    environment and the root options."""
    from statebook.adapters.settings import load_settings

    return load_settings(settings_file(config), db=ctx_state.db_url, app=ctx_state.app)


def _settings_path(config: str | None) -> str | None:
    """The settings file's path as ``resolve_settings`` takes it ({config_dir} is its folder)."""
    path = settings_file(config)
    return None if path is None else str(path)








# -- the daemon ---------------------------------------------------------------------------------

@app.command("run")
def run_cmd(
    config: str = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    run_for: float = typer.Option(None, "--for", help="Stop after this many seconds and print a summary."),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING or ERROR (statebook's loggers)."),
    log_format: str = typer.Option("text", "--log-format", help="text (one readable line) or json (one object a line)."),
    metrics_port: int = typer.Option(None, "--metrics-port", help="Serve Prometheus /metrics on this port (0: any free one, logged)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address /metrics listens on."),
    metrics_every: float = typer.Option(5.0, "--metrics-every", help="Seconds between two reads of the metrics snapshot."),
    verify_every: float = typer.Option(3600.0, "--verify-every", help="With --metrics-port: run verify at start and every this many seconds for the verify metrics (0: never)."),
    web_port: int = typer.Option(None, "--web-port", help="Serve the web console on this port too, on [web] host (0: any free one, printed)."),
) -> None:
    """Run the scheduler daemon: fire schedules, deliver their dispatches, until SIGINT/SIGTERM."""
    from statebook.adapters.daemon import run_daemon
    from statebook.adapters.logs import FORMATS, configured

    if log_level.upper() not in LOG_LEVELS:
        raise fail(f"--log-level {log_level!r} is not a level; use {', '.join(LOG_LEVELS)}")
    if log_format not in FORMATS:
        raise fail(f"--log-format {log_format!r} is not a format; use {' or '.join(FORMATS)}")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise fail(f"--metrics-port {metrics_port} is not a port; use 0 (any free one) to 65535")
    if web_port is not None and not 0 <= web_port <= 65535:
        raise fail(f"--web-port {web_port} is not a port; use 0 (any free one) to 65535")
    if run_for is not None:
        duration("--for", run_for)
    if not 0.05 <= metrics_every <= 3600:
        raise fail(f"--metrics-every {metrics_every:g} is out of range; use 0.05 to 3600 seconds")
    if not (verify_every == 0 or 1 <= verify_every <= 7 * 86400):
        raise fail(f"--verify-every {verify_every:g} is out of range; use 0 (never) or 1 to 604800 seconds")
    with configured(log_format, log_level.upper()):
        settings = _settings(config)
        registry = cli_registry(settings.app)
        result = run(run_daemon(settings, config_path=_settings_path(config), run_for=run_for, tty=sys.stdout.isatty(),
                                registry=registry, metrics_port=metrics_port, metrics_host=metrics_host,
                                metrics_every=metrics_every, verify_every=verify_every, web_port=web_port))
    _story(result, log_format)
    if not result["verify"]["ok"]:
        raise typer.Exit(1)


def _story(result: dict[str, Any], log_format: str) -> None:
    """What this run did, the database's totals, the full history of a dispatch it delivered, then verify
    (specs/operations.md O8): text lines, or under ``--log-format json`` one JSON record like the log's."""
    from statebook.adapters.story import lines, record

    if log_format == "json":
        typer.echo(record(result))
        return
    for line in lines(result, format_time):
        console.print(line, highlight=False, soft_wrap=True, markup=False)  # never wrapped or cut


# -- schedules ----------------------------------------------------------------------------------

@schedule_app.command("add")
def add(
    name: str = typer.Argument(..., help="Unique schedule name."),
    cron: str = typer.Option(None, "--cron", help="Cron expression, read in --tz (default: scheduler.timezone)."),
    every: int = typer.Option(None, "--every", help="Interval in seconds."),
    at: str = typer.Option(None, "--at", help="One-shot time: epoch seconds or ISO-8601."),
    tz: str = typer.Option(None, "--tz", help="IANA timezone for --cron."),
    kind: str = typer.Option("command", "--kind", help="agent, flow, fanout, play, flow_yaml or command."),
    command: str = typer.Option(None, "--command", help="Executable for kind 'command'."),
    arg: list[str] = typer.Option([], "--arg", help="Argument for --command (repeatable)."),
    prompt: str = typer.Option(None, "--prompt"),
    model: str = typer.Option(None, "--model"),
    agent: str = typer.Option(None, "--agent"),
    play: str = typer.Option(None, "--play"),
    flow_yaml: typer.FileText = typer.Option(None, "--flow-yaml", help="File holding the flow YAML."),
    cwd: str = typer.Option(None, "--cwd", help="Working directory of the runs."),
    notify_kind: str = typer.Option(None, "--notify-kind", help="Dispatch kind sent when a run ends."),
    notify_to: str = typer.Option(None, "--notify-to", help="Dispatch recipient when a run ends."),
    max_runs: int = typer.Option(None, "--max-runs"),
    budget_usd: float = typer.Option(None, "--budget-usd"),
    budget_tokens: int = typer.Option(None, "--budget-tokens"),
    missed: str = typer.Option("skip", "--missed", help="Missed-fire policy: skip or run_once."),
    overlap: str = typer.Option("skip", "--overlap", help="Overlap policy: skip or allow."),
    paused: bool = typer.Option(False, "--paused", help="Create it paused."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Create a schedule (exactly one of --cron, --every, --at)."""
    from statebook.scheduler.requests import CreateScheduleRequest
    from statebook.scheduler.store import create_schedule

    triggers = [t for t, v in (("cron", cron), ("interval", every), ("at", at)) if v is not None]
    if len(triggers) != 1:
        raise fail("give exactly one trigger: --cron EXPR, --every SECONDS or --at TIME")
    if (notify_kind is None) != (notify_to is None):
        raise fail("--notify-kind and --notify-to go together")
    _check_counts(every=every, max_runs=max_runs, budget_usd=budget_usd, budget_tokens=budget_tokens)
    spec: dict[str, Any] = {
        "name": name, "trigger_type": triggers[0], "cron_expr": cron, "interval_sec": every, "timezone": tz,
        "at_time": parse_time(at, "--at") if at is not None else None, "action_kind": kind, "action_command": command,
        "action_command_args": arg, "action_prompt": prompt, "action_model": model, "action_agent": agent,
        "action_play": play, "action_flow_yaml": flow_yaml.read() if flow_yaml else None, "action_cwd": cwd,
        "notify": {"kind": notify_kind, "deliver_to": notify_to} if notify_kind else None, "max_runs": max_runs,
        "budget_usd": budget_usd, "budget_tokens": budget_tokens, "missed_fire_policy": missed,
        "overlap_policy": overlap, "enabled": not paused,
    }
    request = CreateScheduleRequest.parse(spec)  # InvalidSchedule names the field (the funnel prints it)
    zone = _settings(None).scheduler.timezone

    async def go(book: Book) -> Schedule:
        return await create_schedule(book, request, default_zone=zone)

    row = run(with_book(go, must_exist=False, create=True)())
    if as_json:
        emit_json(row.dump())
    else:
        console.print(f"created schedule {row.name} ({row.id}); next fire {format_time(row.next_fire_at)}",
                      highlight=False)


def _check_counts(*, every: int | None, max_runs: int | None, budget_usd: float | None,
                 budget_tokens: int | None) -> None:
    """The numeric options against the scheduler's ranges (specs/scheduler.md S18), named as options."""
    from statebook.scheduler.requests import BUDGET_USD, COUNTS, INTERVAL_SECONDS

    if every is not None:
        integer("--every", every, low=INTERVAL_SECONDS[0], high=INTERVAL_SECONDS[1])
    if max_runs is not None:
        integer("--max-runs", max_runs, low=COUNTS[0], high=COUNTS[1])
    if budget_tokens is not None:
        integer("--budget-tokens", budget_tokens, low=COUNTS[0], high=COUNTS[1])
    if budget_usd is not None:
        number("--budget-usd", budget_usd, low=0.0, high=BUDGET_USD)
        if budget_usd <= 0:
            raise fail(f"--budget-usd: {budget_usd:g} must be more than 0")


@schedule_app.command("ls")
def ls(
    show_all: bool = typer.Option(False, "--all", help="Include deleted schedules."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List schedules."""
    from statebook.scheduler.store import list_schedules

    async def go(book: Book) -> list[Schedule]:
        return await list_schedules(book, include_deleted=show_all)

    rows = run(with_book(go)())
    if as_json:
        emit_json([r.dump() for r in rows])
        return
    from rich.table import Column, Table

    table = Table(Column("name", no_wrap=True), "status", "trigger", "action", "next fire", "last fired",
                  Column("id", no_wrap=True, min_width=32))  # whole, so it can be copied
    for r in rows:
        trig = r.cron_expr or (f"every {r.interval_sec}s" if r.interval_sec else r.trigger_type)
        table.add_row(r.name, r.status, trig, r.action_kind, format_time(r.next_fire_at),
                      format_time(r.last_fired_at), r.id)
    print_table(table)


@schedule_app.command("show")
def show(ref: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Show one schedule (by id or name) with its latest runs."""
    from statebook.scheduler.store import get_schedule, list_runs

    async def go(book: Book) -> tuple[Schedule, list[ScheduleRun]]:
        row = await get_schedule(book, ref)
        return row, await list_runs(book, row.id, limit=5)

    row, recent = run(with_book(go)())
    if as_json:
        emit_json({**row.dump(), "recent_runs": [r.dump() for r in recent]})
        return
    for key in ("id", "name", "status", "status_reason_code", "trigger_type", "cron_expr", "interval_sec", "at_time",
                "action_kind", "action_command", "action_command_args", "notify", "max_runs", "budget_usd",
                "budget_tokens", "missed_fire_policy", "overlap_policy"):
        value = getattr(row, key)
        if value not in (None, [], ""):
            shown = format_time(value) if key == "at_time" else value
            console.print(f"{key:20} {shown}", highlight=False)
    console.print(f"{'next_fire_at':20} {format_time(row.next_fire_at)}", highlight=False)
    console.print(f"{'last_fired_at':20} {format_time(row.last_fired_at)}", highlight=False)
    for r in recent:
        console.print(f"  run {r.id} {r.status:10} {r.status_reason_code} at {format_time(r.fired_at)}",
                      highlight=False)


def _simple(action: str) -> None:
    from statebook.scheduler import store

    fn = {"enable": store.enable_schedule, "disable": store.disable_schedule, "rm": store.delete_schedule}[action]

    def command(ref: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
        async def go(book: Book) -> Schedule:
            return await fn(book, ref)

        row = run(with_book(go, writes=True)())
        if as_json:
            emit_json(row.dump())
        else:
            console.print(f"schedule {row.name} is {row.status}", highlight=False)

    command.__doc__ = {"enable": "Enable a paused (or reset an exhausted) schedule.",
                       "disable": "Pause a schedule.", "rm": "Delete a schedule (its history stays)."}[action]
    schedule_app.command(action)(command)


for _action in ("enable", "disable", "rm"):
    _simple(_action)


@schedule_app.command("fire")
def fire(
    ref: str,
    config: str = typer.Option(None, "--config", "-c", help=CONFIG_HELP),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Fire a schedule now, in this process, and wait for the run (and its follow-ups) to end."""
    from statebook.adapters.daemon import resolve_settings
    from statebook.scheduler.engine import SchedulerEngine

    settings = resolve_settings(_settings(config), _settings_path(config))

    async def go(book: Book) -> list[ScheduleRun]:
        engine = SchedulerEngine(book, settings)
        try:
            return list((await engine.fire_and_wait(ref)).runs)
        finally:
            await engine.stop()

    rows = run(with_book(go, limits=settings.book_limits(), writes=True)())
    if as_json:
        emit_json([r.dump() for r in rows])
    else:
        for r in rows:
            console.print(f"run {r.id} depth {r.chain_depth}: {r.status} ({r.status_reason_code}, "
                          f"exit {r.exit_code})", highlight=False)
    unfinished = [r for r in rows if r.status != "completed"]
    if unfinished:
        raise fail(f"run {unfinished[0].id} ended {unfinished[0].status} ({unfinished[0].status_reason_code})", 1)


@schedule_app.command("runs")
def schedule_runs_cmd(
    ref: str,
    limit: int = typer.Option(20, "--limit"),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """List a schedule's runs, newest first."""
    from statebook.scheduler.store import get_schedule, list_runs

    integer("--limit", limit, low=1, high=INT32[1])

    async def go(book: Book) -> list[ScheduleRun]:
        return await list_runs(book, (await get_schedule(book, ref)).id, limit=limit)

    rows = run(with_book(go)())
    if as_json:
        emit_json([r.dump() for r in rows])
        return
    from rich.table import Column, Table

    table = Table(Column("run", no_wrap=True, min_width=32), "status", "reason", "exit", "depth", "fired", "ended")
    for r in rows:
        table.add_row(r.id, r.status, r.status_reason_code, str(r.exit_code if r.exit_code is not None else "-"),
                      str(r.chain_depth), format_time(r.fired_at), format_time(r.ended_at))
    print_table(table)


# -- runs ---------------------------------------------------------------------------------------

@runs_app.command("show")
def runs_show(run_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Show one run and its status history."""
    from statebook.lifecycle import history
    from statebook.scheduler.store import get_run

    async def go(book: Book) -> tuple[ScheduleRun, list[dict[str, Any]]]:
        row = await get_run(book, run_id)
        facts = await history(book, "schedule_run", run_id)
        return row, [{"at": f.at, "from": f.previous_status, "to": f.status, "reason": f.reason_code,
                      "summary": f.reason_summary} for f in facts]

    row, moves = run(with_book(go)())
    if as_json:
        emit_json({**row.dump(), "history": moves})
        return
    for key in ("id", "schedule_id", "status", "status_reason_code", "status_reason_summary", "action_kind",
                "action_args", "exit_code", "chain_parent_id", "chain_depth", "pid", "cost_usd", "tokens",
                "error_detail"):
        value = getattr(row, key)
        if value not in (None, [], ""):
            console.print(f"{key:22} {value}", highlight=False)
    for h in moves:
        console.print(f"  {format_time(h['at'])} {h['from'] or '-'} -> {h['to']} {h['reason']} {h['summary']}", highlight=False)


@runs_app.command("cancel")
def runs_cancel(run_id: str, as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Cancel a run: it becomes ``cancelled`` now; its daemon kills the process group on its next tick."""
    from statebook.scheduler.runs import cancel_run

    async def go(book: Book) -> ScheduleRun:
        return await cancel_run(book, run_id)

    row = run(with_book(go, writes=True)())
    if as_json:
        emit_json(row.dump())
    else:
        console.print(f"run {row.id} is {row.status}", highlight=False)
