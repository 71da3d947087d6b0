"""``GitHubPoller``: the HTTP edge of the github_poll trigger (S13), on urllib in a worker thread.

Endpoint: ``GET {api_url}/repos/{owner}/{repo}/events?per_page=100`` (newest first). The first page
is conditional (``If-None-Match``: a 304 means nothing changed); further pages follow the
``Link: <...>; rel="next"`` header until a page reaches the cursor, up to ``max_pages``. Neither a
``Link`` nor a redirect is followed to another origin, so the token never leaves the API host.

    poller = GitHubPoller("https://api.github.com", token)
    result = await poller.fetch("octo/repo", etag=None, cursor="41234567890")
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from statebook.scheduler.polling import PollResult, event_number

_NEXT = re.compile(r'<([^>]+)>\s*;\s*rel="?next"?')
DETAIL_LIMIT = 300


def next_link(header: str | None) -> str | None:
    """The ``rel="next"`` URL of a ``Link`` header, if any."""
    if not header:
        return None
    for part in header.split(","):
        found = _NEXT.search(part)
        if found:
            return found.group(1).strip()
    return None


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme.lower(), parts.netloc.lower()


class _SameOriginRedirects(urllib.request.HTTPRedirectHandler):
    """urllib keeps the Authorization header across redirects: refuse any that leaves the origin."""

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if _origin(newurl) != _origin(req.full_url):
            raise urllib.error.HTTPError(newurl, code, f"refusing a redirect to another origin ({newurl})", headers, fp)
        return super().redirect_request(req, fp, code, msg, headers, newurl)


class GitHubPoller:
    """Implements ``statebook.scheduler.polling.Poller`` against the GitHub REST API (or a stand-in)."""

    def __init__(self, api_url: str = "https://api.github.com", token: str | None = None, *, timeout: float = 10.0,
                 per_page: int = 100, max_pages: int = 10, proxies: Mapping[str, str] | None = None,
                 user_agent: str = "statebook-scheduler") -> None:
        self.api_url = api_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.per_page = per_page
        self.max_pages = max_pages
        self.user_agent = user_agent
        handlers: list[Any] = [_SameOriginRedirects()]
        if proxies is not None:  # None: the environment's proxies; {} disables them
            handlers.append(urllib.request.ProxyHandler(dict(proxies)))
        self._opener = urllib.request.build_opener(*handlers)

    @classmethod
    def from_settings(cls, scheduler: Any) -> GitHubPoller:
        """A poller built from the scheduler settings' GitHub API URL and token (read now; ConfigError naming where
        it was looked for)."""
        from .channels.secrets import SecretError
        from .errors import ConfigError

        try:
            token = None if scheduler.github_token is None else scheduler.github_token.reveal()
        except SecretError as exc:
            raise ConfigError(f"scheduler.github_token: {exc}") from None
        return cls(scheduler.github_api_url, token)

    async def fetch(self, repo: str, *, etag: str | None, cursor: str | None) -> PollResult:
        """Fetch ``repo``'s events newer than ``cursor`` (conditional on ``etag``) in a worker thread; see
        :class:`~statebook.scheduler.polling.Poller`.
        """
        return await asyncio.to_thread(self._fetch, repo, etag, cursor)

    def _headers(self, etag: str | None) -> dict[str, str]:
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28",
                   "User-Agent": self.user_agent}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        if etag:
            headers["If-None-Match"] = etag
        return headers

    def _fetch(self, repo: str, etag: str | None, cursor: str | None) -> PollResult:
        owner, _, name = repo.partition("/")
        url = (f"{self.api_url}/repos/{urllib.parse.quote(owner, safe='')}/{urllib.parse.quote(name, safe='')}"
               f"/events?per_page={self.per_page}")
        origin = _origin(url)
        floor = int(cursor) if cursor is not None else None
        events: list[Mapping[str, Any]] = []
        first_etag: str | None = None
        pages = 0
        while pages < self.max_pages:
            request = urllib.request.Request(url, headers=self._headers(etag if pages == 0 else None))
            try:
                with self._opener.open(request, timeout=self.timeout) as resp:
                    body, link = resp.read(), resp.headers.get("Link")
                    if pages == 0:
                        first_etag = resp.headers.get("ETag")
            except urllib.error.HTTPError as exc:
                return _refusal(exc, url, pages)
            except (urllib.error.URLError, OSError, ValueError) as exc:
                return PollResult("failed", detail=f"GET {url}: {exc}"[:DETAIL_LIMIT])
            pages += 1
            try:
                page = json.loads(body)
            except ValueError:
                return PollResult("failed", detail=f"GET {url}: the body is not JSON")
            if not isinstance(page, list):
                return PollResult("failed", detail=f"GET {url}: expected a JSON array of events")
            events.extend(e for e in page if isinstance(e, Mapping))
            numbers = [event_number(e) for e in page if isinstance(e, Mapping)]
            if floor is not None and any(n is not None and n <= floor for n in numbers):
                break  # newest first: everything further is at or below the cursor
            nxt = next_link(link)
            if nxt is None:
                break
            if _origin(nxt) != origin:
                detail = f"refusing to follow a Link to another origin ({nxt})"
                return PollResult("failed", detail=detail[:DETAIL_LIMIT])
            url = nxt
        return PollResult("ok", events=tuple(events), etag=first_etag, pages=pages)


def _refusal(exc: urllib.error.HTTPError, url: str, pages: int) -> PollResult:
    if exc.code == 304 and pages == 0:
        return PollResult("not_modified", etag=exc.headers.get("ETag") if exc.headers else None)
    message = ""
    try:
        message = json.loads(exc.read() or b"{}").get("message", "")
    except (ValueError, AttributeError, OSError):
        pass
    detail = f"HTTP {exc.code} for GET {url}" + (f": {message}" if message else "")
    if exc.code == 401:
        return PollResult("unauthorized", detail=detail[:DETAIL_LIMIT])
    if exc.headers is not None and exc.headers.get("X-RateLimit-Remaining") == "0":
        detail += f" (rate limited until epoch {exc.headers.get('X-RateLimit-Reset')})"
    return PollResult("failed", detail=detail[:DETAIL_LIMIT])
