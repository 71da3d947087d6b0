"""``GET /lifecycles/{entity_type}/graph``: a lifecycle drawn — its statuses in layers, its edges labelled
with who may take them — and the same edges as a table, for readers without the picture.

:func:`layout` is pure (a lifecycle in, coordinates out) and :func:`render` turns it into SVG text with
every name escaped; the route only looks the lifecycle up and renders the page.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from math import hypot

from markupsafe import Markup
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from statebook.lifecycle import Lifecycle
from statebook.lifecycle.diagram import accepted_edges, is_implicit, requirements

from .auth import requires
from .pages import render as render_page
from .state import console
from .svg import escape

__all__ = ["Arrow", "Layout", "Node", "graph_page", "layers", "layout", "render", "routes"]

COLUMN_GAP = 120.0
ROW_GAP = 36.0
NODE_HEIGHT = 30.0
CHAR_WIDTH = 7.5
MARGIN = 30.0
BEND = 0.18
"""How far an edge's curve bows from the straight line, as a share of its length: a pair of opposite edges
bows to opposite sides, so the two never lie on each other."""


@dataclass(frozen=True)
class Node:
    """A status placed in its layer: the centre of its box, and what kind of status it is."""

    status: str
    layer: int
    x: float
    y: float
    width: float
    initial: bool
    terminal: bool


@dataclass(frozen=True)
class Arrow:
    """An edge: who may take it, what it requires, and its path (SVG ``d``) with its label's anchor."""

    source: str
    target: str
    actors: tuple[str, ...]
    requires: str
    implicit: bool
    path: str
    label_x: float
    label_y: float

    @property
    def who(self) -> str:
        """The actor types that may take the edge, or ``any actor``."""
        return ", ".join(self.actors) if self.actors else "any actor"


@dataclass(frozen=True)
class Layout:
    """A lifecycle's statuses and edges with coordinates, and the picture's size."""

    entity_type: str
    nodes: tuple[Node, ...]
    arrows: tuple[Arrow, ...]
    width: float
    height: float


def layers(lc: Lifecycle) -> dict[str, int]:
    """Each status's layer: initial statuses 0, then the fewest moves from one; terminal statuses last.

    A status that is both initial and terminal goes last (it is drawn with its start mark); one that no
    move reaches shares layer 0 with the initial statuses.
    """
    depth: dict[str, int] = {s: 0 for s in lc.statuses if s in lc.initial}
    queue = deque(depth)
    while queue:
        status = queue.popleft()
        for edge in lc.edges:
            if edge.source == status and edge.target not in depth:
                depth[edge.target] = depth[status] + 1
                queue.append(edge.target)
    inner = [depth.get(s, 0) for s in lc.statuses if s not in lc.terminal]
    last = max(inner, default=-1) + 1
    return {s: last if s in lc.terminal else depth.get(s, 0) for s in lc.statuses}


def _ordered(lc: Lifecycle, layer_of: dict[str, int]) -> dict[int, list[str]]:
    """The statuses of each layer, top to bottom: layer 0 in declared order, each next one by the mean row of
    the statuses its edges come from (fewer crossings), ties in declared order."""
    columns: dict[int, list[str]] = {}
    for status in lc.statuses:
        columns.setdefault(layer_of[status], []).append(status)
    row: dict[str, float] = {}
    for layer in sorted(columns):
        def weight(status: str) -> float:
            sources = [row[e.source] for e in lc.edges if e.target == status and e.source in row]
            return sum(sources) / len(sources) if sources else float("inf")

        declared = {s: i for i, s in enumerate(columns[layer])}
        if layer:
            columns[layer].sort(key=lambda s: (weight(s), declared[s]))
        row.update({s: float(i) for i, s in enumerate(columns[layer])})
    return columns


def _box_exit(cx: float, cy: float, half_w: float, half_h: float, tx: float, ty: float) -> tuple[float, float]:
    """Where the line from a box's centre towards (tx, ty) leaves the box."""
    dx, dy = tx - cx, ty - cy
    if dx == 0 and dy == 0:
        return cx, cy
    t = min(half_w / abs(dx) if dx else float("inf"), half_h / abs(dy) if dy else float("inf"))
    return cx + dx * t, cy + dy * t


def _curve(a: Node, b: Node) -> tuple[str, float, float]:
    """A quadratic curve from box ``a`` to box ``b``, bowed to the left of its direction; its label point."""
    dx, dy = b.x - a.x, b.y - a.y
    length = hypot(dx, dy) or 1.0
    cx, cy = (a.x + b.x) / 2 + dy / length * BEND * length, (a.y + b.y) / 2 - dx / length * BEND * length
    x0, y0 = _box_exit(a.x, a.y, a.width / 2, NODE_HEIGHT / 2, cx, cy)
    x1, y1 = _box_exit(b.x, b.y, b.width / 2 + 3, NODE_HEIGHT / 2 + 3, cx, cy)
    lx, ly = 0.25 * x0 + 0.5 * cx + 0.25 * x1, 0.25 * y0 + 0.5 * cy + 0.25 * y1
    return f"M{x0:.1f},{y0:.1f} Q{cx:.1f},{cy:.1f} {x1:.1f},{y1:.1f}", lx, ly


def _loop(a: Node) -> tuple[str, float, float]:
    """A loop over the top of a box, for an edge from a status to itself."""
    x0, x1, y = a.x - 10, a.x + 10, a.y - NODE_HEIGHT / 2
    return f"M{x0:.1f},{y:.1f} C{x0 - 18:.1f},{y - 34:.1f} {x1 + 18:.1f},{y - 34:.1f} {x1:.1f},{y - 3:.1f}", a.x, y - 30


def layout(lc: Lifecycle) -> Layout:
    """Place every status of ``lc`` and route every edge it accepts (implicit same-status moves included)."""
    layer_of = layers(lc)
    columns = _ordered(lc, layer_of)
    widths = {s: max(80.0, CHAR_WIDTH * len(s) + 24) for s in lc.statuses}
    tallest = max((len(c) for c in columns.values()), default=1)
    height = 2 * MARGIN + 40 + tallest * (NODE_HEIGHT + ROW_GAP)
    nodes: dict[str, Node] = {}
    x = MARGIN + 24  # room for the start marks of layer 0
    for layer in sorted(columns):
        column = columns[layer]
        width = max(widths[s] for s in column)
        top = MARGIN + 40 + (tallest - len(column)) * (NODE_HEIGHT + ROW_GAP) / 2
        for row, status in enumerate(column):
            y = top + row * (NODE_HEIGHT + ROW_GAP) + NODE_HEIGHT / 2
            nodes[status] = Node(status, layer, x + width / 2, y, widths[status], status in lc.initial,
                                 status in lc.terminal)
        x += width + COLUMN_GAP
    arrows = []
    for edge in accepted_edges(lc):
        a, b = nodes[edge.source], nodes[edge.target]
        path, lx, ly = _loop(a) if a is b else _curve(a, b)
        implicit = is_implicit(lc, edge)
        # Who may take it is its own column: the requirements say what the command must carry.
        needs = "same status (patch only)" if implicit else requirements(replace(edge, actors=frozenset()))
        arrows.append(Arrow(edge.source, edge.target, tuple(sorted(edge.actors)), needs, implicit, path, lx, ly))
    return Layout(lc.entity_type, tuple(nodes[s] for s in lc.statuses), tuple(arrows),
                  x - COLUMN_GAP + MARGIN, height)


def render(found: Layout) -> str:
    """The layout as an SVG string: boxes, curved arrows, labels naming who may take each edge.

    An edge only some actor types may take is labelled with them; one any actor may take is not labelled.
    Implicit same-status moves are listed in the table, not drawn (one loop on every status says nothing).
    """
    title = f"lifecycle {found.entity_type}: statuses and edges"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="graph" viewBox="0 0 {found.width:.0f} {found.height:.0f}" '
        f'width="{found.width:.0f}" height="{found.height:.0f}" role="img" aria-label="{escape(title)}">',
        f"<title>{escape(title)}</title>",
        '<defs><marker id="graph-arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
    ]
    for arrow in found.arrows:
        if arrow.implicit:
            continue
        what = f"{arrow.source} to {arrow.target}: {arrow.who}" + (f"; {arrow.requires}" if arrow.requires else "")
        out.append(f'<g class="edge"><title>{escape(what)}</title>'
                   f'<path d="{arrow.path}" fill="none" stroke="#555" marker-end="url(#graph-arrow)"/>')
        if arrow.actors:  # an edge any actor may take goes unlabelled (the caption says so)
            out.append(f'<text x="{arrow.label_x:.1f}" y="{arrow.label_y:.1f}" font-size="10" text-anchor="middle" '
                       f'fill="#1a237e" stroke="#fff" stroke-width="3" paint-order="stroke">{escape(arrow.who)}</text>')
        out.append("</g>")
    for node in found.nodes:
        left, top = node.x - node.width / 2, node.y - NODE_HEIGHT / 2
        kind = " ".join(k for k, on in (("initial", node.initial), ("terminal", node.terminal)) if on)
        out.append(f'<g class="status" data-status="{escape(node.status)}"><title>{escape(node.status)}'
                   f'{escape(f" ({kind})") if kind else ""}</title>')
        out.append(f'<rect x="{left:.1f}" y="{top:.1f}" width="{node.width:.1f}" height="{NODE_HEIGHT:g}" rx="6" '
                   f'fill="#fff" stroke="#333"/>')
        if node.terminal:
            out.append(f'<rect x="{left + 3:.1f}" y="{top + 3:.1f}" width="{node.width - 6:.1f}" '
                       f'height="{NODE_HEIGHT - 6:g}" rx="4" fill="none" stroke="#333"/>')
        if node.initial:
            out.append(f'<circle cx="{left - 18:.1f}" cy="{node.y:.1f}" r="5" fill="#333"/>'
                       f'<path d="M{left - 13:.1f},{node.y:.1f} L{left - 2:.1f},{node.y:.1f}" stroke="#333" '
                       'marker-end="url(#graph-arrow)"/>')
        out.append(f'<text x="{node.x:.1f}" y="{node.y + 4:.1f}" font-size="12" text-anchor="middle" fill="#111">'
                   f"{escape(node.status)}</text></g>")
    out.append("</svg>")
    return "".join(out)


@requires("viewer")
async def graph_page(request: Request) -> Response:
    """``GET /lifecycles/{entity_type}/graph``: the picture, the edges as a table, the statuses."""
    c = console(request)
    entity_type = request.path_params["entity_type"]
    if entity_type not in c.book.registry:
        raise HTTPException(404, f"no lifecycle is registered for {entity_type[:60]!r}; known: "
                                 f"{', '.join(lc.entity_type for lc in c.book.registry)}")
    lc = c.book.policy(entity_type)
    found = layout(lc)
    # render() escapes every name; the markup is ours, not the data's.
    return render_page(request, "graph/graph.html", {
        "lifecycle": lc, "layout": found, "svg": Markup(render(found)),
        "others": [other.entity_type for other in c.book.registry if other.entity_type != entity_type]})


routes = [Route("/lifecycles/{entity_type}/graph", graph_page, name="lifecycle_graph")]
