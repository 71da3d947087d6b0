"""Who is asking: a signed session, a trusted reverse proxy's header, or — with no sign-in configured — the
local operator on a loopback connection; and the pages that sign in and out.

Roles: ``viewer`` reads everything the console shows; ``operator`` also acts (each action a transition with
``Actor("operator", name)``). A wrong role is a 403 page; no identity is a redirect to the sign-in page on
a GET and a 401 page otherwise. Passwords are argon2 hashes in ``[web.users]``; an unknown name costs the
same hash check as a wrong password.
"""

from __future__ import annotations

import functools
import getpass
import ipaddress
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import quote, urlsplit

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from . import sessions
from .pages import root
from .state import console

if TYPE_CHECKING:
    from argon2 import PasswordHasher

Role = Literal["viewer", "operator"]
RANK = {"viewer": 1, "operator": 2}
Endpoint = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class Identity:
    """A signed-in person: the name actions are recorded under, and the role."""

    name: str
    role: Role
    via: str = "session"
    """How it was established: ``session``, ``proxy`` or ``local``."""

    def may(self, role: Role) -> bool:
        """Whether this identity holds ``role`` (an operator is also a viewer)."""
        return RANK[self.role] >= RANK[role]


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` is a loopback address (127.0.0.0/8, ::1, localhost)."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def session(request: Request) -> sessions.Session:
    """This request's session; a new anonymous one (sent back as a cookie) when it has none."""
    cached: sessions.Session | None = request.scope.setdefault("state", {}).get("statebook_session")
    if cached is not None:
        return cached
    c = console(request)
    now = c.book.clock.now()
    found = sessions.decode(request.cookies.get(sessions.COOKIE), c.session_key, now)
    if found is None:
        found = sessions.Session.anonymous(now, c.web.session_seconds)
        store(request, found)
    request.scope["state"]["statebook_session"] = found
    return found


def store(request: Request, new: sessions.Session) -> None:
    """Send ``new`` as this response's session cookie (the middleware in app.py writes the header)."""
    c = console(request)
    state = request.scope.setdefault("state", {})
    state["statebook_session"] = new
    secure = (c.web.public_url or "").startswith("https://")
    state["statebook_set_cookie"] = (
        f"{sessions.COOKIE}={sessions.encode(new, c.session_key)}; Path=/; HttpOnly; SameSite=Lax"
        f"; Max-Age={int(c.web.session_seconds)}" + ("; Secure" if secure else ""))


def identity(request: Request) -> Identity | None:
    """Who is asking, or None."""
    c = console(request)
    peer = request.client.host if request.client else None
    proxy = c.web.proxy
    if proxy is not None and peer in proxy.trusted:
        name = request.headers.get(proxy.user_header, "").strip()
        if name:
            role = request.headers.get(proxy.role_header, "").strip() if proxy.role_header else ""
            return Identity(name, role if role in RANK else proxy.default_role, "proxy")  # type: ignore[arg-type]
    if c.local:
        return Identity(_local_name(), "operator", "local") if is_loopback(peer) else None
    s = session(request)
    if s.user and s.role in RANK:
        return Identity(s.user, s.role, "session")  # type: ignore[arg-type]
    return None


@functools.cache
def _local_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def requires(role: Role) -> Callable[[Endpoint], Endpoint]:
    """Endpoint decorator: the request's identity must hold ``role`` (it is put in ``request.state.identity``)."""

    def wrap(endpoint: Endpoint) -> Endpoint:
        @functools.wraps(endpoint)
        async def guarded(request: Request) -> Response:
            who = identity(request)
            if who is None:
                if console(request).local:
                    raise HTTPException(403, "this console serves only this machine (no sign-in is configured)")
                if request.method in ("GET", "HEAD"):
                    target = request.url.path.removeprefix(root(request)) + (f"?{request.url.query}" if request.url.query else "")
                    return RedirectResponse(f"{root(request)}/sign-in?next={quote(target, safe='')}", status_code=303)
                raise HTTPException(401, "sign in first")
            if not who.may(role):
                raise HTTPException(403, f"this needs the {role} role; {who.name} is a {who.role}")
            request.state.identity = who
            return await endpoint(request)

        guarded.required_role = role  # type: ignore[attr-defined]  # read by the route/role matrix test
        return guarded

    return wrap


def safe_next(target: str | None) -> str:
    """``target`` when it is a path on this site, else ``/`` (no open redirect: ``//host``, ``/\\host``,
    a scheme, control characters are all refused)."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    if any(ch in target for ch in "\\\r\n\t") or any(ord(ch) < 32 for ch in target):
        return "/"
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        return "/"
    return target


# -- sign-in ---------------------------------------------------------------------------------------
_DUMMY: str | None = None


def _hasher() -> PasswordHasher:
    from argon2 import PasswordHasher

    return PasswordHasher()


def hash_password(password: str) -> str:
    """An argon2id hash of ``password`` for ``[web.users.NAME] password_hash``."""
    return _hasher().hash(password)


def check_password(stored: str | None, password: str) -> bool:
    """Whether ``password`` matches the argon2 hash ``stored`` (None: an unknown name, checked at the same cost)."""
    from argon2.exceptions import InvalidHashError, VerificationError

    global _DUMMY
    hasher = _hasher()
    if stored is None:  # the same work for an unknown name as for a wrong password
        _DUMMY = _DUMMY or hasher.hash("statebook-no-such-user")
        stored, password = _DUMMY, password + "\0"
    try:
        return hasher.verify(stored, password)
    except (VerificationError, InvalidHashError):
        return False


async def sign_in_page(request: Request) -> Response:
    """GET: the form; POST: check the name and password, start a signed-in session, go to ``next``."""
    from .pages import render

    c = console(request)
    if request.method == "GET":
        return render(request, "signin.html", {"next": safe_next(request.query_params.get("next")), "error": None,
                                               "configured": c.web.sign_in})
    from .csrf import form

    data = await form(request)
    name, password = str(data.get("name", "")).strip(), str(data.get("password", ""))
    target = safe_next(str(data.get("next", "")))
    user = c.web.users.get(name)
    if not name or not check_password(user.password_hash if user else None, password) or user is None:
        return render(request, "signin.html", {"next": target, "error": "unknown name or wrong password",
                                               "configured": c.web.sign_in}, status=401)
    now = c.book.clock.now()
    store(request, session(request).signed_in(name, user.role, now, c.web.session_seconds))
    return RedirectResponse(root(request) + target, status_code=303)


async def sign_out(request: Request) -> Response:
    """End the session (a new anonymous one replaces it)."""
    from .csrf import form

    await form(request)
    c = console(request)
    store(request, sessions.Session.anonymous(c.book.clock.now(), c.web.session_seconds))
    return RedirectResponse(f"{root(request)}/sign-in", status_code=303)


routes = [
    Route("/sign-in", sign_in_page, methods=["GET", "POST"], name="sign_in"),
    Route("/sign-out", sign_out, methods=["POST"], name="sign_out"),
]
