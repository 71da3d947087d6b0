"""The browser tests' own machinery: a server on a loop of its own that the browser reads and that stops
cleanly, and the policy for a machine without Chromium (skip, or fail under STATEBOOK_REQUIRE_BROWSER / CI)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from .chromium import Browser, need_browser, required
from .live import ServerLoop, reserve


def tiny_app():
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def page(request):
        return HTMLResponse("<h1>served</h1><p id=events>0</p><script src=/watch.js></script>")

    async def watch(request):
        return Response("new EventSource('/live').onmessage = () => { document.getElementById('events').textContent++ };",
                        media_type="text/javascript")

    async def forever(request):  # a stream that never ends by itself, like the console's /live
        async def events():
            while True:
                yield b"data: tick\n\n"
                await asyncio.sleep(0.2)
        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/", page), Route("/watch.js", watch), Route("/live", forever)])


@pytest.mark.browser
def test_the_browser_reads_a_page_served_on_the_server_loop_and_closing_stops_it(browser: Browser):
    before = threading.active_count()
    loop = ServerLoop()
    try:
        sock, url = reserve()
        loop.run(loop.serve(tiny_app(), sock))
        browser.base = url
        browser.open("/")
        assert browser.text("h1") == "served"
        browser.wait(lambda: int(browser.text("#events")) >= 2, "two server-sent events")
    finally:
        browser.reset()
        loop.close()
    assert threading.active_count() == before, "the server's thread outlived close()"
    assert loop.loop.is_closed()


@pytest.mark.parametrize("environ, require", [({}, False), ({"CI": "false"}, False), ({"STATEBOOK_REQUIRE_BROWSER": "0"}, False),
                                             ({"STATEBOOK_REQUIRE_BROWSER": "1"}, True), ({"CI": "true"}, True)])
def test_a_missing_browser_skips_locally_and_fails_in_ci(environ, require):
    assert required(environ) is require
    problem = "browser tests need Chromium and its driver: missing /usr/bin/chromium"
    with pytest.raises(pytest.fail.Exception if require else pytest.skip.Exception, match="missing /usr/bin/chromium"):
        need_browser(problem, require=require)
    need_browser(None, require=require)  # nothing missing: nothing to say


def test_ci_fails_the_run_without_chromium(tmp_path):
    """End to end, as .ci/run runs it: the browser named by STATEBOOK_CHROMIUM is absent, the run fails and
    says what to install."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_XDIST_WORKER")}
    env.update(STATEBOOK_REQUIRE_BROWSER="1", STATEBOOK_CHROMIUM=str(tmp_path / "no-chromium"))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         f"{Path(__file__).name}::test_the_browser_reads_a_page_served_on_the_server_loop_and_closing_stops_it"],
        cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "apt-get install chromium chromium-driver" in proc.stdout and "no-chromium" in proc.stdout, proc.stdout
