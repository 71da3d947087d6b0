"""The github_poll trigger (S13) against a local HTTP server that behaves like the GitHub events API.

The server pages events (``Link: rel="next"``), answers 304 to a matching ``If-None-Match``, and
401 when told to. The engine is driven tick by tick on a FakeClock; the poller is the real adapter.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from statebook.adapters.github import GitHubPoller, next_link
from statebook.lifecycle import Reason, history, verify
from statebook.scheduler.engine import SchedulerEngine
from statebook.scheduler.models import Schedule
from statebook.scheduler.runs import finalize_run, open_run
from statebook.scheduler.store import get_schedule, schedule_row

from .support import FakeSpawner, make, runs_of, settings

TICK = 5
POLL = 60


class FakeGitHub:
    """State of the stand-in API; the handler reads it on every request (from the server's thread)."""

    def __init__(self, page_size: int = 2) -> None:
        self.page_size = page_size
        self.events: list[dict[str, Any]] = []  # newest first, like the API
        self.unauthorized = False
        self.fail_status: int | None = None
        self.foreign_next = False
        self.salt = 0
        self.next_id = 40_000_000_000
        self.log: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.url = ""

    def add(self, clock: Any, type: str = "IssuesEvent", *, labels: tuple[str, ...] = (), action: str = "opened",
            title: str = "a title") -> str:
        self.next_id += 7
        at = datetime.fromtimestamp(clock.now(), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        payload: dict[str, Any] = {"action": action}
        if type == "IssuesEvent":
            payload["issue"] = {"number": len(self.events) + 1, "title": title, "html_url": "https://example/1",
                                "labels": [{"name": n} for n in labels]}
        elif type == "PushEvent":
            payload = {"ref": "refs/heads/main", "head": "abc123"}
        event = {"id": str(self.next_id), "type": type, "created_at": at, "actor": {"login": "octocat"},
                 "repo": {"name": "octo/repo"}, "payload": payload}
        with self.lock:
            self.events.insert(0, event)
        return event["id"]

    def etag(self) -> str:
        ids = ",".join(e["id"] for e in self.events)
        return '"' + hashlib.sha1(f"{ids}|{self.salt}".encode()).hexdigest() + '"'

    def statuses(self) -> list[int]:
        return [r["status"] for r in self.log]


def _handler(api: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # keep test output quiet
            pass

        def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
            api.log.append({"path": self.path, "status": status, "if_none_match": self.headers.get("If-None-Match"),
                            "authorization": self.headers.get("Authorization")})
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(status)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            if status != 304:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if status != 304:
                self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parts = urllib.parse.urlsplit(self.path)
            if parts.path != "/repos/octo/repo/events":
                return self._send(404, {"message": "Not Found"})
            if api.unauthorized:
                return self._send(401, {"message": "Bad credentials"})
            if api.fail_status is not None:
                return self._send(api.fail_status, {"message": "Server Error"})
            page = int(urllib.parse.parse_qs(parts.query).get("page", ["1"])[0])
            with api.lock:
                etag, events = api.etag(), list(api.events)
            if page == 1 and self.headers.get("If-None-Match") == etag:
                return self._send(304, headers={"ETag": etag})
            start = (page - 1) * api.page_size
            headers = {"ETag": etag} if page == 1 else {}
            if start + api.page_size < len(events):
                host = "http://elsewhere.invalid" if api.foreign_next else api.url
                headers["Link"] = f'<{host}/repos/octo/repo/events?per_page=100&page={page + 1}>; rel="next"'
            return self._send(200, events[start:start + api.page_size], headers)

    return Handler


def poller_for(api: FakeGitHub) -> GitHubPoller:
    return GitHubPoller(api.url, "t0ken", proxies={}, timeout=5)


async def engine_for(book, clock, api: FakeGitHub | None, spawner=None, poller: Any = "real", **cfg) -> SchedulerEngine:
    cfg.setdefault("tick_seconds", TICK)
    eng = SchedulerEngine(book, settings(**cfg), clock=clock, launcher=spawner or FakeSpawner(),
                          poller=poller_for(api) if poller == "real" else poller)
    await eng.start(loop=False)
    return eng


async def make_poll(book, name: str = "gh", **over: Any) -> Schedule:
    spec = {"trigger_type": "github_poll", "github_repo": "octo/repo", "interval_sec": None,
            "poll_interval_sec": POLL, "overlap_policy": "allow", **over}
    return await make(book, name, **spec)


def fired_ids(runs: list[dict[str, Any]]) -> list[str]:
    return sorted(r["trigger_context"]["event_id"] for r in runs if r["status"] != "skipped")


class GithubPollCases:
    """This module's cases: mixed into SchedulerConformance, so each backend runs them (tests/conformance)."""

    @pytest.fixture
    def github(self):
        api = FakeGitHub()
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(api))
        api.url = f"http://127.0.0.1:{server.server_address[1]}"
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield api
        finally:
            server.shutdown()
            server.server_close()
            thread.join()

    async def test_new_events_fire_once_each_across_pages(self, book, clock, github):
        """S13: every event newer than the schedule fires once (two pages followed by Link), oldest first;
        the cursor is the newest fired event; the poll is healthy and the cadence moves by poll_interval_sec."""
        github.add(clock)  # older than the schedule: history, never fires
        clock.advance(5)
        s = await make_poll(book)
        ids = [github.add(clock, title=f"issue {i}") for i in range(3)]
        eng = await engine_for(book, clock, github)
        assert await eng.consider(await schedule_row(book, s.id), clock.now()) == "fired"
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert fired_ids(runs) == ids and {r["status"] for r in runs} == {"completed"}
        ctx = next(r["trigger_context"] for r in runs if r["trigger_context"]["event_id"] == ids[0])
        assert ctx["trigger"] == "github_poll" and ctx["repo"] == "octo/repo" and ctx["event_type"] == "IssuesEvent"
        assert ctx["event"]["title"] == "issue 0" and ctx["event"]["actor"] == "octocat"
        row = await get_schedule(book, s.id)
        assert row.github_cursor == ids[-1]
        assert row.last_healthy_poll_at.timestamp() == clock.now() and row.poller_consecutive_401 == 0
        assert row.next_fire_at.timestamp() == s.next_fire_at.timestamp() + POLL and row.status_reason_code == "schedule.active.poll"
        # One cursor fact per event, in event order, then the cadence fact.
        facts = [f for f in await history(book, "schedule", s.id) if f.reason_code.startswith("schedule.active.poll")]
        assert [f.patch.get("github_cursor") for f in facts[:-1]] == ids
        assert facts[-1].reason_code == "schedule.active.poll"
        pages = [urllib.parse.parse_qs(urllib.parse.urlsplit(r["path"]).query).get("page") for r in github.log]
        assert pages == [None, ["2"]]  # four events, two per page
        assert {r["authorization"] for r in github.log} == {"Bearer t0ken"}
        await eng.stop()
        assert (await verify(book)).ok

    async def test_not_modified_is_a_healthy_poll_without_fires(self, book, clock, github):
        """S13: the next poll sends the ETag; a 304 fires nothing, stamps last_healthy_poll_at and advances."""
        s = await make_poll(book)
        github.add(clock)
        eng = await engine_for(book, clock, github)
        await eng.tick()
        await eng.wait_idle()
        clock.advance(POLL)
        await eng.tick()
        assert github.statuses()[-1] == 304 and github.log[-1]["if_none_match"] == github.etag()
        assert len(await runs_of(book, s.id)) == 1
        row = await get_schedule(book, s.id)
        assert row.status_reason_code == "schedule.active.poll" and "304" in row.status_reason_summary
        assert row.last_healthy_poll_at.timestamp() == clock.now()
        assert row.next_fire_at.timestamp() == s.next_fire_at.timestamp() + 2 * POLL
        await eng.stop()

    async def test_events_at_or_below_the_cursor_never_fire_twice(self, book, clock, github):
        """S13, S1: a changed ETag over the same events fires nothing; only the new event fires; an engine
        holding a stale view of the schedule loses the cursor compare-and-set and opens no run."""
        s = await make_poll(book)
        first = [github.add(clock), github.add(clock)]
        eng = await engine_for(book, clock, github)
        stale = await schedule_row(book, s.id)
        await eng.tick()
        await eng.wait_idle()
        github.salt += 1  # same events, new ETag: a full 200 answer
        clock.advance(POLL)
        await eng.tick()
        assert github.statuses()[-1] == 200
        assert fired_ids(await runs_of(book, s.id)) == first
        new = github.add(clock)
        clock.advance(POLL)
        await eng.tick()
        await eng.wait_idle()
        assert fired_ids(await runs_of(book, s.id)) == sorted([*first, new])
        other = await engine_for(book, clock, github)
        assert await other.consider(stale, clock.now()) == "conflict"
        await other.wait_idle()
        assert fired_ids(await runs_of(book, s.id)) == sorted([*first, new])
        assert (await get_schedule(book, s.id)).github_cursor == new
        await other.stop()
        await eng.stop()
        assert (await verify(book)).ok

    async def test_unauthorized_counts_in_health_columns_and_resets_after_success(self, book, clock, github):
        """S13: each 401 increments poller_consecutive_401 (no fire, no healthy stamp, cadence advances);
        the next 200 resets it to 0 and stamps last_healthy_poll_at."""
        s = await make_poll(book)
        event = github.add(clock)
        github.unauthorized = True
        eng = await engine_for(book, clock, github)
        for expected in (1, 2):
            await eng.tick()
            row = await get_schedule(book, s.id)
            assert row.poller_consecutive_401 == expected
            assert row.status_reason_code == "schedule.active.poll_unauthorized"
            assert row.last_healthy_poll_at is None and row.github_cursor is None
            clock.advance(POLL)
        assert await runs_of(book, s.id) == []
        github.unauthorized = False
        await eng.tick()
        await eng.wait_idle()
        row = await get_schedule(book, s.id)
        assert row.poller_consecutive_401 == 0 and row.last_healthy_poll_at.timestamp() == clock.now()
        assert row.github_cursor == event and fired_ids(await runs_of(book, s.id)) == [event]
        await eng.stop()

    async def test_failed_poll_leaves_health_and_cursor_alone(self, book, clock, github):
        """S13: a 5xx answer is a failed poll: visible reason, cadence advances, health columns unchanged."""
        s = await make_poll(book)
        github.add(clock)
        github.fail_status = 502
        eng = await engine_for(book, clock, github)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert row.status_reason_code == "schedule.active.poll_failed" and "502" in row.status_reason_summary
        assert row.last_healthy_poll_at is None and row.poller_consecutive_401 == 0
        assert row.github_cursor is None and row.next_fire_at.timestamp() == s.next_fire_at.timestamp() + POLL
        assert await runs_of(book, s.id) == []
        await eng.stop()

    async def test_capacity_exhausted_keeps_the_cursor_below_events_that_did_not_fire(self, book, clock, github):
        """S13, S5: capacity is reserved before the cursor moves; an event without a slot stays above the
        cursor (a deferred_capacity record, the poll comes back next tick, no ETag reuse) and fires later, once."""
        s = await make_poll(book)
        ids = [github.add(clock) for _ in range(3)]
        spawner = FakeSpawner()
        spawner.hold()
        eng = await engine_for(book, clock, github, spawner, max_concurrent=1)
        assert await eng.consider(await schedule_row(book, s.id), clock.now()) == "fired"
        row = await get_schedule(book, s.id)
        assert row.github_cursor == ids[0] and row.status_reason_code == "schedule.active.poll_deferred"
        assert row.next_fire_at.timestamp() == clock.now() + TICK
        runs = await runs_of(book, s.id)
        assert [r["status"] for r in runs] == ["running", "skipped"]
        assert runs[1]["status_reason_code"] == "schedule_run.skipped.deferred_capacity"
        assert runs[1]["trigger_context"]["event_id"] == ids[1]
        spawner.release()
        await eng.wait_idle()
        for _ in range(6):
            clock.advance(TICK)
            await eng.tick()
            fired = fired_ids(await runs_of(book, s.id))
            cursor = (await get_schedule(book, s.id)).github_cursor
            assert cursor == max(fired, key=int)  # never past an event that did not fire
            await eng.wait_idle()
        assert fired_ids(await runs_of(book, s.id)) == ids
        assert all(r["if_none_match"] is None for r in github.log[:2])  # events waited: no conditional request
        await eng.stop()
        assert (await verify(book)).ok

    async def test_overlap_skip_serialises_events_without_losing_one(self, book, clock, github):
        """S13: with overlap_policy=skip an event waits above the cursor while a run is running, then fires."""
        s = await make_poll(book, overlap_policy="skip")
        ids = [github.add(clock), github.add(clock)]
        spawner = FakeSpawner()
        spawner.hold()
        eng = await engine_for(book, clock, github, spawner)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert row.github_cursor == ids[0] and "still running" in row.status_reason_summary
        assert [r["status"] for r in await runs_of(book, s.id)] == ["running"]
        spawner.release()
        await eng.wait_idle()
        clock.advance(TICK)
        await eng.tick()
        await eng.wait_idle()
        assert fired_ids(await runs_of(book, s.id)) == ids
        assert (await get_schedule(book, s.id)).github_cursor == ids[1]
        await eng.stop()

    async def test_max_runs_exhausts_without_moving_the_cursor_past_the_refused_event(self, book, clock, github):
        """S13, S5: max_runs reached mid-poll exhausts the schedule; the cursor stays at the last fired event."""
        s = await make_poll(book, max_runs=1)
        ids = [github.add(clock), github.add(clock)]
        eng = await engine_for(book, clock, github)
        await eng.tick()
        await eng.wait_idle()
        row = await get_schedule(book, s.id)
        assert row.status == "exhausted" and row.status_reason_code == "schedule.exhausted.max_runs"
        assert row.github_cursor == ids[0] and fired_ids(await runs_of(book, s.id)) == ids[:1]
        await eng.stop()

    async def test_an_event_passes_the_gates_in_s5_order(self, book, clock, github):
        """S13, S5: an event of a schedule both overlapping (a run still running) and over budget waits
        (overlap, gate 2) and the schedule stays active; once the run ended, budget (gate 3) exhausts it.
        The cursor never moves past the event that did not fire."""
        s = await make_poll(book, overlap_policy="skip", budget_usd=0.5)
        earlier = await open_run(book, await schedule_row(book, s.id), context={"trigger": "manual"}, daemon_id="elsewhere:1:x",
                                 reason=Reason("schedule_run.running.manual", "an earlier fire"))
        await finalize_run(book, earlier, "completed", reason=Reason("schedule_run.completed.exit_zero"),
                           patch={"exit_code": 0, "cost_usd": 1.0})
        held = await open_run(book, await schedule_row(book, s.id), context={"trigger": "manual"}, daemon_id="elsewhere:1:x",
                              reason=Reason("schedule_run.running.manual", "held by another daemon"))
        github.add(clock)
        eng = await engine_for(book, clock, github)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert (row.status, row.status_reason_code) == ("active", "schedule.active.poll_deferred")
        assert "still running" in row.status_reason_summary and row.github_cursor is None
        await finalize_run(book, held, "completed", reason=Reason("schedule_run.completed.exit_zero"), patch={"exit_code": 0})
        clock.advance(TICK)
        await eng.tick()
        row = await get_schedule(book, s.id)
        assert (row.status, row.status_reason_code) == ("exhausted", "schedule.exhausted.budget")
        assert row.github_cursor is None and len(await runs_of(book, s.id)) == 2
        await eng.stop()
        assert (await verify(book)).ok

    async def test_filter_by_type_and_label_and_event_in_argv(self, book, clock, github):
        """S13: github_filter selects by event type and label; the run's argv template gets {event_id}."""
        s = await make_poll(book, github_filter={"types": ["IssuesEvent"], "labels": ["bug"]},
                            action_command_args=["-c", "pass", "{event_id}"])
        github.add(clock, "PushEvent")
        bug = github.add(clock, labels=("bug", "p1"))
        github.add(clock, labels=("docs",))
        spawner = FakeSpawner()
        eng = await engine_for(book, clock, github, spawner)
        await eng.tick()
        await eng.wait_idle()
        runs = await runs_of(book, s.id)
        assert fired_ids(runs) == [bug] and runs[0]["trigger_context"]["event"]["labels"] == ["bug", "p1"]
        assert spawner.launches[0][1].argv[-1] == bug
        assert (await get_schedule(book, s.id)).github_cursor == bug
        await eng.stop()

    async def test_without_a_poller_cadence_advances_and_one_warning(self, book, clock, caplog):
        """S13: no poller injected — github_poll schedules only advance their cadence; the warning is logged once."""
        a = await make_poll(book, "a")
        await make_poll(book, "b")
        eng = await engine_for(book, clock, None, poller=None)
        with caplog.at_level(logging.WARNING, logger="statebook.scheduler"):
            await eng.tick()
        assert sum("no GitHub poller" in r.getMessage() for r in caplog.records) == 1
        row = await get_schedule(book, a.id)
        assert row.status_reason_code == "schedule.active.poll_unconfigured"
        assert row.next_fire_at.timestamp() == a.next_fire_at.timestamp() + POLL and await runs_of(book) == []
        await eng.stop()

    async def test_missed_polls_at_start_write_no_skipped_run(self, book, clock, github):
        """S13: downtime needs no missed-fire record for github_poll — the first tick polls from the cursor."""
        s = await make_poll(book, missed_fire_policy="skip")
        clock.advance(10 * POLL)
        event = github.add(clock)
        eng = await engine_for(book, clock, github)
        assert await runs_of(book, s.id) == []
        await eng.tick()
        await eng.wait_idle()
        assert fired_ids(await runs_of(book, s.id)) == [event]
        await eng.stop()

    async def test_adapter_stops_paging_at_the_cursor_and_refuses_foreign_links(self, github, clock):
        """S13: the adapter stops once a page reaches the cursor and never follows a Link to another origin."""
        ids = [github.add(clock) for _ in range(5)]
        poller = poller_for(github)
        result = await poller.fetch("octo/repo", etag=None, cursor=ids[2])
        assert result.status == "ok" and result.pages == 2 and result.etag == github.etag()
        assert [e["id"] for e in result.events] == ids[::-1][:4]
        assert (await poller.fetch("octo/repo", etag=result.etag, cursor=ids[2])).status == "not_modified"
        github.foreign_next = True
        refused = await poller.fetch("octo/repo", etag=None, cursor=None)
        assert refused.status == "failed" and "another origin" in refused.detail
        assert next_link('<https://a/x?page=2>; rel="next", <https://a/x?page=9>; rel="last"') == "https://a/x?page=2"
