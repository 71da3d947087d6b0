"""``statebook stats [--json]``: the database's operating figures (adapters/stats.py), one query per part."""

from __future__ import annotations

from typing import Any

import typer

from statebook.lifecycle import Book

from .app import app, emit_json, print_table, run, with_book

def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.1f}s"


@app.command("stats")
def stats_cmd(as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables.")) -> None:
    """Print entities by status, the due backlogs, deliveries, attempt latency, scheduler decisions and runs."""
    from rich.table import Column, Table

    from statebook.adapters.stats import collect_stats

    async def go(book: Book) -> Any:
        return await collect_stats(book)

    stats = run(with_book(go)())
    if as_json:
        emit_json(stats.as_json())
        return

    def table(title: str, *columns: str) -> Table:
        return Table(*(Column(c, no_wrap=True) for c in columns), title=title, title_justify="left")

    entities = table("entities", "lifecycle", "status", "count")
    for lifecycle, by_status in sorted(stats.entities.items()):
        for status, n in sorted(by_status.items()) or [("-", 0)]:
            entities.add_row(lifecycle, status, str(n))
    print_table(entities)

    due = table("due backlog", "lifecycle", "due now", "oldest due for")
    for lifecycle, d in sorted(stats.due.items()):
        due.add_row(lifecycle, str(d.count), _age(d.oldest_age_seconds))
    print_table(due)

    deliveries = table("deliveries", "lifecycle", "outcome", "count")
    for lifecycle, by_outcome in sorted(stats.deliveries.items()):
        deliveries.add_row(lifecycle, "(attempts started)", str(stats.attempts.get(lifecycle, 0)))
        for outcome, n in sorted(by_outcome.items()):
            deliveries.add_row(lifecycle, outcome, str(n))
    print_table(deliveries)

    if stats.latency:
        latency = table("channel attempt latency", "channel", "attempts", "mean", "<= 0.1s", "<= 1s", "<= 10s")
        for channel, lat in sorted(stats.latency.items()):
            mean = f"{lat.sum_seconds / lat.count:.3f}s" if lat.count else "-"
            latency.add_row(channel, str(lat.count), mean, str(lat.buckets.get("0.1", 0)),
                            str(lat.buckets.get("1.0", 0)), str(lat.buckets.get("10.0", 0)))
        print_table(latency)

    other = table("observations and decisions", "what", "count")
    for outcome, n in sorted(stats.channel_observations.items()):
        other.add_row(f"channel observation {outcome}", str(n))
    other.add_row("rate-limit waits", str(stats.rate_limit_waits))
    for decision, n in sorted(stats.scheduler.items()):
        other.add_row(f"scheduler {decision}", str(n))
    for status, n in sorted(stats.runs.items()):
        other.add_row(f"runs {status}", str(n))
    print_table(other)
    typer.echo("verify findings are not recorded in the database: run `statebook verify`")
