"""CSRF: every POST of a signed-in page carries its session's token, in the form or an ``X-CSRF-Token``
header (htmx). A missing or wrong token is a 403 page and nothing runs. Responders' pages and the
providers' hooks are authorised by their signed link or signature instead."""

from __future__ import annotations

import hashlib
import hmac

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request

from .auth import identity, session
from .state import console

FIELD = "csrf_token"
HEADER = "X-CSRF-Token"
MAX_FORM_BYTES = 1_000_000


def token(request: Request) -> str:
    """The CSRF token of this request's session (for a proxy-authenticated user: derived from the name)."""
    c = console(request)
    who = identity(request)
    secret = (f"proxy:{who.name}" if who is not None and who.via == "proxy" else f"session:{session(request).csrf}")
    return hmac.new(c.session_key, b"statebook-csrf-v1." + secret.encode(), hashlib.sha256).hexdigest()


async def form(request: Request, *, files: int = 0, max_bytes: int = MAX_FORM_BYTES) -> FormData:
    """The POSTed form, after its CSRF token was checked (403 when it is missing or wrong). ``files``: how many
    uploaded files it may carry (a multipart form), ``max_bytes``: its largest size."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > max_bytes:
        raise HTTPException(413, "the form is too large")
    data = await request.form(max_files=files, max_fields=2000)
    given = request.headers.get(HEADER) or data.get(FIELD)
    if not isinstance(given, str) or not given:
        raise HTTPException(403, "the form has no CSRF token: reload the page and try again")
    if not hmac.compare_digest(given.encode(), token(request).encode()):
        raise HTTPException(403, "the form's CSRF token does not match this session: reload the page and try again")
    return data
