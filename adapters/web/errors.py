"""Error pages: one template, a title and one line saying what was wrong."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

TITLES = {400: "Bad request", 401: "Sign-in needed", 403: "Not allowed", 404: "Not found", 405: "Method not allowed",
          409: "Refused", 422: "Invalid input", 500: "Internal error"}


def page_error(request: Request, status: int, title: str | None = None, detail: str = "") -> HTMLResponse:
    """The error page for ``status``; ``detail`` is shown as text (escaped), never as markup."""
    from .pages import render

    return render(request, "error.html", {"status": status, "title": title or TITLES.get(status, "Error"),
                                          "detail": detail}, status=status)


async def http_error(request: Request, exc: Any) -> Response:
    """An ``HTTPException`` as the error page."""
    assert isinstance(exc, HTTPException)
    return page_error(request, exc.status_code, detail=str(exc.detail) if exc.detail else "")

