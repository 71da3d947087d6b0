"""The lifecycle browser: every registered lifecycle with its counts (``/lifecycles``) and one lifecycle's
entities a keyset page at a time, filtered by status, time and text (``/lifecycles/{entity_type}``).

Routes read their inputs, call :mod:`.queries` and render ``templates/browse/``; the entity pages are
:mod:`.entity`'s routes, served from here (this module is the part ``app.py`` loads).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from statebook.lifecycle.errors import InvalidArgument, UnknownEntityType

from . import entity
from .auth import requires
from .errors import page_error
from .pages import path_part, render, root
from .queries import MAX_LIMIT, TEXT_COLUMNS, Page, browse, counts, order_of, parse_time
from .state import console

DEFAULT_LIMIT = 50
SUMMARY_COLUMNS = ("status_reason_summary", "updated_at")


@requires("viewer")
async def lifecycles(request: Request) -> Response:
    """Every registered lifecycle, the application's own included, with its entities per status."""
    return render(request, "browse/lifecycles.html", {"lifecycles": await counts(console(request).book)})


def _limit(raw: str | None) -> int:
    if raw is None or raw == "":
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidArgument(f"limit: expected a whole number from 1 to {MAX_LIMIT}, got {raw[:20]!r}",
                              argument="limit", rule="range")
    return int(raw)


def shown_columns(page: Page) -> list[str]:
    """The columns a list shows (the entity page shows them all): id, status, the searched ones, the order's
    time, the last move's summary and time."""
    wanted = ["id", "status", *(c for c in TEXT_COLUMNS if c != "id"), page.order, *SUMMARY_COLUMNS]
    return [c for i, c in enumerate(wanted) if c in page.columns and c not in wanted[:i]]


def page_link(request: Request, page: Page, **cursor: str) -> str:
    """The address of the page ``cursor`` names (``after=`` or ``before=``) under the same filters."""
    params = {**page.filters.params(), **({"limit": str(page.limit)} if page.limit != DEFAULT_LIMIT else {}), **cursor}
    return f"{root(request)}/lifecycles/{path_part(page.entity_type)}?{urlencode(params)}"


@requires("viewer")
async def lifecycle(request: Request) -> Response:
    """One lifecycle's entities, newest first, a page at a time; the filters are the form's GET parameters."""
    book = console(request).book
    entity_type = request.path_params["entity_type"]
    q = request.query_params
    try:
        lc = book.policy(entity_type)
        page = await browse(
            book, entity_type, status=q.get("status") or None, since=parse_time("since", q.get("since")),
            until=parse_time("until", q.get("until")), text=q.get("text") or None, after=q.get("after") or None,
            before=q.get("before") or None, limit=_limit(q.get("limit")))
    except UnknownEntityType:
        return page_error(request, 404, detail=f"no lifecycle {entity_type!r} is registered")
    except InvalidArgument as exc:
        return page_error(request, 400, detail=str(exc))
    context: dict[str, Any] = {
        "lc": lc, "page": page, "shown": shown_columns(page), "order": order_of(lc).name,
        "raw": {k: q.get(k, "") for k in ("status", "since", "until", "text")},
        "next_url": page_link(request, page, after=page.next) if page.next else None,
        "prev_url": page_link(request, page, before=page.prev) if page.prev else None,
    }
    return render(request, "browse/lifecycle.html", context)


routes: list[BaseRoute] = [
    Route("/lifecycles", lifecycles, name="lifecycles"),
    Route("/lifecycles/{entity_type}", lifecycle, name="lifecycle"),
    *entity.routes,
]
