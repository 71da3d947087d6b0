"""Lifecycle graphs (docs/console.md, "Lifecycle graphs"): the pure layout, its SVG, and the page."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from statebook.adapters.db import open_book

from statebook.adapters.registry import builtin_registry
from statebook.adapters.web.graph import layers, layout, render
from statebook.lifecycle import Lifecycle, edges, managed_table
from statebook.lifecycle.diagram import accepted_edges

EVIL = "<script>alert(1)</script>"


EVIL_THING = Lifecycle(
    entity_type="evil_thing",
    table=managed_table("evil_things", sa.Column("id", sa.String(32), primary_key=True), meta=sa.MetaData()),
    statuses=("open", EVIL, "closed"), initial={"open"}, terminal={"closed"}, reason_prefixes={"evil_thing"},
    edges=(*edges("open", EVIL, actors=EVIL), *edges(EVIL, "closed"), *edges("open", "closed")))


@pytest.mark.parametrize("lc", list(builtin_registry()), ids=lambda lc: lc.entity_type)
def test_every_status_is_placed_initial_left_terminal_right(lc: Lifecycle) -> None:
    found = layout(lc)
    nodes = {n.status: n for n in found.nodes}
    assert set(nodes) == set(lc.statuses)
    only_terminal = [nodes[s] for s in lc.terminal if s not in lc.initial]
    inner = [n for n in found.nodes if not n.terminal]
    for node in found.nodes:
        assert 0 < node.x < found.width and 0 < node.y < found.height
        if node.initial and not node.terminal:
            assert node.layer == 0
    if only_terminal and inner:
        assert min(n.x for n in only_terminal) > max(n.x for n in inner)
    # No two boxes overlap.
    boxes = sorted(found.nodes, key=lambda n: (n.x, n.y))
    for a in boxes:
        for b in boxes:
            if a is not b and a.x == b.x:
                assert abs(a.y - b.y) >= 30


@pytest.mark.parametrize("lc", list(builtin_registry()), ids=lambda lc: lc.entity_type)
def test_every_accepted_edge_has_an_arrow_naming_who_may_take_it(lc: Lifecycle) -> None:
    found = layout(lc)
    assert [(a.source, a.target) for a in found.arrows] == [(e.source, e.target) for e in accepted_edges(lc)]
    for arrow, edge in zip(found.arrows, accepted_edges(lc)):
        assert set(arrow.actors) == set(edge.actors)
        assert arrow.who == (", ".join(sorted(edge.actors)) if edge.actors else "any actor")
        assert arrow.path.startswith("M")
        assert arrow.implicit or " only" not in arrow.requires  # who may take it is its own column
        for name in (*edge.requires_patch, *edge.requires_guard):
            assert name in arrow.requires
    svg = render(found)
    ET.fromstring(svg)  # well-formed
    for arrow in found.arrows:
        if arrow.actors and not arrow.implicit:
            assert f">{arrow.who}</text>" in svg


def test_layers_count_moves_from_an_initial_status() -> None:
    lc = EVIL_THING
    assert layers(lc) == {"open": 0, EVIL: 1, "closed": 2}


def test_a_status_or_actor_named_script_is_escaped_in_the_svg() -> None:
    svg = render(layout(EVIL_THING))
    assert "<script" not in svg
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in svg
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert EVIL in texts  # the name is shown, as text


def test_the_layout_is_a_pure_function_of_the_lifecycle() -> None:
    lc = EVIL_THING
    assert layout(lc) == layout(lc)


# -- the page -------------------------------------------------------------------------------------

async def test_the_graph_page_draws_and_tabulates_every_edge(client: httpx.AsyncClient, sign_in: Any) -> None:
    assert (await client.get("/lifecycles/dispatch/graph")).status_code == 303
    await sign_in("viewer")
    page = await client.get("/lifecycles/dispatch/graph")
    assert page.status_code == 200
    html = page.text
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="graph"' in html
    lc = builtin_registry().get("dispatch")
    rows = re.findall(r"<tr><td>([^<]*)</td><td>([^<]*)</td><td>([^<]*)</td>", html.split('id="edges"')[1].split('id="statuses"')[0])
    assert [(a, b) for a, b, _ in rows] == [(e.source, e.target) for e in accepted_edges(lc)]
    assert ("dead_letter", "pending", "operator") in rows
    assert "<script>" not in html
    assert (await client.get("/lifecycles/nosuchtype/graph")).status_code == 404


class TestNamesRenderInert:
    """A lifecycle whose status and actor are named ``<script>...``: the page shows them as text."""

    @pytest.fixture
    async def book(self, tmp_path: Any) -> Any:
        registry = builtin_registry(seal=False)
        registry.register(EVIL_THING)
        registry.seal()
        book = await open_book(f"sqlite:///{tmp_path / 'evil.db'}", registry=registry)
        yield book
        await book.engine.dispose()

    async def test_a_status_named_script_renders_inert_on_the_page(self, client: httpx.AsyncClient,
                                                                  sign_in: Any) -> None:
        await sign_in("viewer")
        html = (await client.get("/lifecycles/evil_thing/graph")).text
        assert EVIL not in html and "<script>" not in html
        assert re.findall(r"<script\b[^>]*>", html) == ['<script src="/static/htmx.min.js" defer>',
                                                         '<script src="/static/console.js" defer>']
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
        overview = (await client.get("/")).text
        assert EVIL not in overview and "evil_thing" in overview
