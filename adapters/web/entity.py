"""An entity's page (``/e/{entity_type}/{entity_id}``): its row, its history as a timeline with hashes, the
row as of a time (``?as_of=``), the verify of this one entity, and a notification's or a schedule's parts.

``/e/{entity_type}/{entity_id}/verify`` checks the entity again: an htmx request gets the result as a
fragment, any other the whole page with it. The id is a path (``{entity_id:path}``): a bucket's id holds a
``/`` when its scope does.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from statebook.lifecycle import EntityNotFound
from statebook.lifecycle.errors import InvalidArgument, UnknownEntityType

from .auth import requires
from .entity_queries import EntityView, check, entity
from .errors import page_error
from .pages import render
from .queries import parse_time, time_columns
from .state import console


async def _page(request: Request, *, verified: bool) -> Response:
    book = console(request).book
    entity_type, entity_id = request.path_params["entity_type"], request.path_params["entity_id"]
    raw_as_of = request.query_params.get("as_of", "")
    try:
        lc = book.policy(entity_type)
        view: EntityView = await entity(book, entity_type, entity_id, as_of=parse_time("as_of", raw_as_of))
    except UnknownEntityType:
        return page_error(request, 404, detail=f"no lifecycle {entity_type!r} is registered")
    except EntityNotFound:
        return page_error(request, 404, detail=f"no {entity_type} {entity_id!r}: no row and no history")
    except InvalidArgument as exc:
        return page_error(request, 400, detail=str(exc))
    return render(request, "browse/entity.html", {
        "view": view, "lc": lc, "times": time_columns(lc.table), "raw_as_of": raw_as_of, "verified": verified,
        "check": view.check})


@requires("viewer")
async def entity_page(request: Request) -> Response:
    """The entity's page."""
    return await _page(request, verified=False)


@requires("viewer")
async def verify_entity(request: Request) -> Response:
    """Verify this entity now: a fragment for htmx, else the whole page with the result."""
    if request.headers.get("HX-Request") != "true":
        return await _page(request, verified=True)
    book = console(request).book
    entity_type, entity_id = request.path_params["entity_type"], request.path_params["entity_id"]
    try:
        found = await check(book, entity_type, entity_id)
    except (UnknownEntityType, EntityNotFound):
        return page_error(request, 404, detail=f"no {entity_type} {entity_id!r}")
    return render(request, "browse/verify.html", {"check": found, "verified": True})


routes: list[BaseRoute] = [
    Route("/e/{entity_type}/{entity_id:path}/verify", verify_entity, name="verify_entity"),
    Route("/e/{entity_type}/{entity_id:path}", entity_page, name="entity"),
]
