"""A help desk's HTTP API on statebook, with the delivery worker in the same process (docs/how-to/fastapi.md).

    STATEBOOK_DB=sqlite:///./helpdesk.db uvicorn examples.fastapi_helpdesk:app
"""

import json

import sqlalchemy as sa
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

from statebook.adapters.asgi import BookDep, TransactionDep, lifespan
from statebook.adapters.registry import builtin_registry
from statebook.lifecycle import Actor, Lifecycle, Reason, create, edges, history, managed_table
from statebook.outbox import CallableTransport, enqueue_dispatch

tickets = managed_table(
    "helpdesk_tickets",
    sa.Column("id", sa.String(32), primary_key=True),
    sa.Column("title", sa.Text, nullable=False),
    meta=sa.MetaData(),  # the application's own tables
)
TICKET = Lifecycle(
    entity_type="ticket", table=tickets, statuses=("open", "closed"), initial={"open"}, terminal={"closed"},
    edges=edges("open", "closed"), reason_prefixes={"ticket"}, reasons={"ticket.open.filed", "ticket.closed.fixed"},
)
registry = builtin_registry(seal=False)
registry.register(TICKET)
registry.seal()

PAGED: list[dict[str, object]] = []  # what the on-call pager received; a real one would call its provider


async def page(deliver_to: str, payload: str) -> None:
    PAGED.append(json.loads(payload)["body"])


# Opens the book at start (STATEBOOK_DB, default ./statebook.db), delivers dispatches in this process while the
# application runs (routes starting "pager:" through page()), and stops and closes everything at shutdown.
app = FastAPI(lifespan=lifespan(registry=registry, delivery=True, transports={"pager:": CallableTransport(page)}))


class NewTicket(BaseModel):
    title: str


@app.post("/tickets/{ticket_id}", status_code=201)
async def file_ticket(ticket_id: str, ticket: NewTicket, tx: TransactionDep) -> dict[str, str]:
    # One transaction: the ticket, its first fact and the page commit together when this returns.
    await create(tx, "ticket", entity_id=ticket_id, values={"title": ticket.title}, status="open",
                 reason=Reason("ticket.open.filed"), actor=Actor("user", "api"))
    await enqueue_dispatch(tx, kind="ticket.filed", deliver_to="pager:oncall", body={"ticket": ticket_id},
                           dedup_key=f"ticket.filed:{ticket_id}")
    if ticket.title.lower().startswith("test"):
        raise HTTPException(422, "test tickets are refused")  # after the writes: they are rolled back
    return {"ticket": ticket_id, "status": "open"}


@app.get("/tickets/{ticket_id}/history")
async def ticket_history(ticket_id: str, book: BookDep) -> list[dict[str, object]]:
    facts = await history(book, "ticket", ticket_id)
    if not facts:
        raise HTTPException(404, f"no ticket {ticket_id}")
    return [{"version": f.version, "status": f.status, "reason": f.reason_code} for f in facts]
