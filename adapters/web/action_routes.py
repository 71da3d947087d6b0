"""The HTTP side of the operator's actions (:mod:`.actions` holds the table and its execution).

``POST /e/{entity_type}/{entity_id}/act/{action}`` takes one action on one entity, then goes back to its page
saying what was done (an htmx request gets a fragment); a refusal is the API's message on a 409 page.
``/lifecycles/{entity_type}/bulk/{action}`` takes the browse page's filter: GET counts what it selects and
asks why, POST re-selects by the same filter (at most :data:`~.actions.BULK_MAX`) and reports each entity.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from statebook.lifecycle import Actor, Lifecycle
from statebook.lifecycle.errors import InvalidArgument, UnknownEntityType

from .actions import (BULK_MAX, OPERATOR, Action, ActionRefused, Result, actions_of, available, find, one_line,
                      perform)
from .auth import requires
from .csrf import form
from .errors import page_error
from .pages import environment, flash_query, path_part, render, root
from .queries import check_filters, page_query, parse_time
from .state import console

FILTERS = ("status", "since", "until", "text")
"""The browse page's filters (``/lifecycles/{entity_type}?status=...``) a bulk action re-selects by."""


def _offered(entity_type: str, row: Any, policy: Lifecycle) -> list[Action]:
    return [] if row is None else available(entity_type, row, policy=policy)


environment().globals["operator_actions"] = _offered  # templates/actions/*.html ask it what to show
environment().globals["bulk_actions"] = lambda policy, status=None: [
    a for a in actions_of(policy.entity_type) if a.bulk and a.sources(policy) and status in (None, *a.sources(policy))]


def _entity_url(request: Request, entity_type: str, entity_id: str) -> str:
    return f"{root(request)}/e/{path_part(entity_type)}/{path_part(entity_id)}"


def _htmx(request: Request) -> bool:
    return request.headers.get("HX-Request") == "true"


def _chosen(request: Request) -> tuple[Lifecycle, Action]:
    book = console(request).book
    entity_type, name = request.path_params["entity_type"], request.path_params["action"]
    try:
        policy = book.policy(entity_type)
    except UnknownEntityType:
        raise ActionRefused(f"no lifecycle {entity_type[:60]!r} is registered") from None
    return policy, find(entity_type, name)


@requires("operator")
async def act(request: Request) -> Response:
    """POST: the action on one entity; 303 back to its page with what was done, else the refusal (409)."""
    data = await form(request)  # the CSRF check comes before anything else is read
    c, who = console(request), request.state.identity
    entity_type, entity_id = request.path_params["entity_type"], request.path_params["entity_id"]
    back = _entity_url(request, entity_type, entity_id)
    try:
        policy, action = _chosen(request)
    except ActionRefused as exc:
        return page_error(request, 404, detail=str(exc))
    fields = {name: str(data.get(name, "")) for name in action.fields}
    try:
        [result] = await perform(c.book, entity_type, action, [entity_id], Actor(OPERATOR, who.name),
                                 str(data.get("reason", "")), fields=fields, settings=c.settings)
    except ActionRefused as exc:
        result, status = Result(entity_id, False, one_line(exc)), 400
    else:
        status = 200 if result.done else 409
    context = {"action": action, "result": result, "back": back, "entity_type": entity_type}
    if _htmx(request):
        return render(request, "actions/answer.html", context)
    if result.done:
        return RedirectResponse(f"{back}?{flash_query(request, result.message)}", status_code=303)
    return render(request, "actions/result.html", context, status=status)


async def _selection(request: Request, policy: Lifecycle, action: Action, params: Mapping[str, str]
                     ) -> tuple[dict[str, str], int, int, sa.Select[Any]]:
    """The browse filter in ``params`` (checked as the browse page checks it), how many entities it selects,
    how many of them the action applies to, and the select of those (newest first, at most BULK_MAX)."""
    filters = check_filters(policy, params.get("status") or None, parse_time("since", params.get("since")),
                            parse_time("until", params.get("until")), params.get("text") or None)
    t = policy.table
    everything = page_query(policy, filters, BULK_MAX)  # the browse page's select: its filter and its order
    chosen = everything.where(t.c.status.in_(action.sources(policy)))
    if action.where is not None:
        chosen = chosen.where(action.where(t))

    def count(query: sa.Select[Any]) -> sa.Select[Any]:
        return sa.select(sa.func.count()).select_from(query.order_by(None).limit(None).with_only_columns(t.c.id)
                                                      .subquery())

    async with console(request).book.read() as conn:
        total = (await conn.execute(count(everything))).scalar_one()
        applicable = (await conn.execute(count(chosen))).scalar_one()
    picked = chosen.with_only_columns(t.c.id)
    return filters.params(), total, applicable, picked


@requires("operator")
async def bulk(request: Request) -> Response:
    """GET: what the action would do over the browse filter (counted here) and a form asking why;
    POST: the action on those entities, re-selected by the same filter (at most BULK_MAX), and the tally."""
    c = console(request)
    data = await form(request) if request.method == "POST" else None
    params = {k: str((data or request.query_params).get(k, "")) for k in FILTERS}
    try:
        policy, action = _chosen(request)
        if not action.bulk:
            raise ActionRefused(f"{action.name} acts on one {policy.entity_type} at a time (from its page)")
    except ActionRefused as exc:
        return page_error(request, 404, detail=str(exc))
    try:
        kept, total, applicable, picked = await _selection(request, policy, action, params)
    except InvalidArgument as exc:
        return page_error(request, 400, detail=str(exc))
    context: dict[str, Any] = {"lc": policy, "action": action, "filters": kept, "total": total,
                               "applicable": applicable, "most": BULK_MAX, "sources": action.sources(policy),
                               "results": None, "error": None}
    if data is None:
        return render(request, "actions/bulk_confirm.html", context)
    async with c.book.read() as conn:
        ids = [r.id for r in await conn.execute(picked)]
    try:
        results = await perform(c.book, policy.entity_type, action, ids, Actor(OPERATOR, request.state.identity.name),
                                str(data.get("reason", "")), settings=c.settings)
    except ActionRefused as exc:
        return render(request, "actions/bulk_confirm.html", {**context, "error": one_line(exc)}, status=400)
    return render(request, "actions/bulk_done.html", {**context, "results": results,
                                                      "done": sum(r.done for r in results)})


routes: list[BaseRoute] = [
    Route("/e/{entity_type}/{entity_id:path}/act/{action}", act, methods=["POST"], name="act"),
    Route("/lifecycles/{entity_type}/bulk/{action}", bulk, methods=["GET", "POST"], name="bulk"),
]
