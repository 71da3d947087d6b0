"""Rendering: one Jinja2 environment with autoescaping on, the filters every page uses, and :func:`render`."""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from statebook.adapters.masking import mask

TEMPLATES = Path(__file__).resolve().parent / "templates"


def when(value: float | datetime | None) -> str:
    """A time as ``2026-12-05 19:30:12 UTC`` (empty for None)."""
    if value is None:
        return ""
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(float(value), timezone.utc)
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(value: float | datetime | None) -> str:
    """A time for a ``datetime`` attribute."""
    if value is None:
        return ""
    moment = value if isinstance(value, datetime) else datetime.fromtimestamp(float(value), timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="seconds")


def ago(seconds: float | None) -> str:
    """A duration as a person says it: ``42 s``, ``3 min``, ``5 h``, ``2 d``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return ""
    s = abs(float(seconds))
    for limit, div, unit in ((120, 1, "s"), (7200, 60, "min"), (172800, 3600, "h")):
        if s < limit:
            return f"{s / div:.0f} {unit}"
    return f"{s / 86400:.0f} d"


def path_part(value: object) -> str:
    """``value`` quoted as ONE path segment (a ``/`` in an id stays inside its segment)."""
    return quote(str(value), safe="")


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(when=when, iso=iso, ago=ago, masked=mask, path=path_part)
    return env


def root(request: Request) -> str:
    """The path the console is mounted at ('' at the top of its own server): every link starts with it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def flash_query(request: Request, message: str) -> str:
    """``flash=...&fs=...``: a message for the page a redirect lands on, signed so that a crafted link cannot
    put words of its own in the console's status box."""
    from .state import console

    text = message[:300]
    mac = hmac.new(console(request).session_key, b"statebook-flash-v1." + text.encode(), hashlib.sha256).hexdigest()
    return urlencode({"flash": text, "fs": mac[:32]})


def flash_of(request: Request) -> str:
    """The flash message of this request when its signature holds, else ''."""
    from .state import console

    text, mac = request.query_params.get("flash", ""), request.query_params.get("fs", "")
    if not text or len(text) > 300:
        return ""
    good = hmac.new(console(request).session_key, b"statebook-flash-v1." + text.encode(), hashlib.sha256).hexdigest()
    return text if hmac.compare_digest(mac.encode(), good[:32].encode()) else ""


def render(request: Request, name: str, context: dict[str, Any] | None = None, status: int = 200,
           headers: dict[str, str] | None = None) -> HTMLResponse:
    """``name`` rendered with ``context`` plus what every page gets (see /work/web-design.md)."""
    from .auth import identity
    from .csrf import token
    from .state import console

    c = console(request)
    base = {"request": request, "user": identity(request), "csrf_token": token(request), "console": c,
            "root": root(request),
            "url": request.url_for, "now": c.book.clock.now(),
            "flash": flash_of(request)}
    html = environment().get_template(name).render({**base, **(context or {})})
    return HTMLResponse(html, status_code=status, headers=headers)
