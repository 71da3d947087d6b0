"""The audit view (docs/console.md, "Audit view"): the chain's key id (never the key), checkpoints given to the
console, and verify run from the page, on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from statebook.adapters.audit import checkpoint_document, keygen
from statebook.adapters.db import open_book, reset_schema
from statebook.adapters.web.audit_view import auditor, log_checkpoint
from statebook.lifecycle import Book
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.chain import checkpoint
from statebook.outbox import dispatch_outbox, enqueue_dispatch

SECRET = b"the-chain-key-secret-0123456789abcdef"


async def verified(client: httpx.AsyncClient, app: Any, token: str, files: dict[str, Any] | None = None) -> str:
    """POST the verify form (with ``files``), wait for the run, and return the audit page."""
    answer = await client.post("/audit/verify", data={"csrf_token": token}, files=files or {})
    assert answer.status_code == 303 and answer.headers["location"] == "/audit#verify", answer.text
    run = auditor(app.state.console).run
    assert run is not None and run.task is not None
    await run.task
    page = await client.get("/audit")
    assert page.status_code == 200 and "Refresh" not in page.headers
    return page.text


async def test_the_page_of_a_plain_chain(client: httpx.AsyncClient, sign_in: Any) -> None:
    assert (await client.get("/audit")).status_code == 303
    await sign_in("viewer")
    html = (await client.get("/audit")).text
    assert "The chain is not keyed" in html
    assert "No checkpoint has been given to this console" in html
    assert "Verify reads every fact and every row" in html  # said before the button, not after
    assert "No verify has run in this console" in html


async def test_verify_from_the_page_and_its_findings(app: Any, client: httpx.AsyncClient, sign_in: Any,
                                                     book: Book) -> None:
    ids = [await enqueue_dispatch(book, kind="k", deliver_to="ok", body={"i": i}) for i in range(3)]
    token = await sign_in("viewer")  # verify reads and writes nothing: a viewer may run it
    assert (await client.post("/audit/verify", data={})).status_code == 403  # no CSRF token
    assert (await client.post("/audit/verify", data={"csrf_token": "forged"})).status_code == 403
    assert auditor(app.state.console).run is None
    html = await verified(client, app, token)
    assert re.search(r'data-figure="verify">ok<', html) and "3 entities, 3 facts checked" in html
    assert re.search(r'data-figure="verify">ok<', (await client.get("/")).text)  # the overview shows it too

    async with book.store.begin() as conn:  # a row edited behind the engine's back
        await conn.execute(dispatch_outbox.update().where(dispatch_outbox.c.id == ids[1]).values(deliver_to="evil"))
    html = await verified(client, app, token)
    assert re.search(r'data-figure="verify">1 finding\(s\)<', html)
    assert f'<a href="/e/dispatch/{ids[1]}">{ids[1]}</a>' in html


async def test_a_running_verify_says_how_far_it_got(app: Any, client: httpx.AsyncClient, sign_in: Any,
                                                    book: Book) -> None:
    await enqueue_dispatch(book, kind="k", deliver_to="ok")
    token = await sign_in("viewer")
    found = auditor(app.state.console)
    found.start(book, by="someone")
    page = await client.get("/audit")
    assert page.headers.get("refresh") == "2" and "running" in page.text and "<progress" in page.text
    assert (await client.post("/audit/verify", data={"csrf_token": token})).status_code == 303
    assert found.run is not None and found.run.by == "someone"  # one run at a time
    await found.run.task  # type: ignore[misc]


async def test_verify_against_a_checkpoint_file(app: Any, client: httpx.AsyncClient, sign_in: Any,
                                                book: Book, tmp_path: Path) -> None:
    for i in range(2):
        await enqueue_dispatch(book, kind="k", deliver_to="ok", body={"i": i})
    body = await checkpoint(book)
    token = await sign_in("viewer")
    good = json.dumps(checkpoint_document(body, None)).encode()
    html = await verified(client, app, token, {"checkpoint": ("cp.json", good, "application/json")})
    assert "against the checkpoint cp.json" in html and re.search(r'data-figure="verify">ok<', html)
    assert body["root"] in html and "the checkpoint is not signed" in html

    edited = json.loads(good)
    edited["checkpoint"]["heads"][0][3] = "0" * 64
    html = await verified(client, app, token, {"checkpoint": ("edited.json", json.dumps(edited).encode(), "text/plain")})
    assert "the checkpoint&#39;s heads do not give its root: it was edited" in html
    assert "against the checkpoint" not in html  # a broken checkpoint is not verified against
    html = await verified(client, app, token, {"checkpoint": ("junk.json", b"{not json", "text/plain")})
    assert "junk.json is not JSON" in html


async def test_a_signed_checkpoint_is_checked_with_the_uploaded_public_key(app: Any, client: httpx.AsyncClient,
                                                                          sign_in: Any, book: Book,
                                                                          tmp_path: Path) -> None:
    await enqueue_dispatch(book, kind="k", deliver_to="ok")
    public = keygen(tmp_path / "signer")
    other = keygen(tmp_path / "other")
    document = json.dumps(checkpoint_document(await checkpoint(book), tmp_path / "signer")).encode()
    token = await sign_in("viewer")
    html = await verified(client, app, token, {"checkpoint": ("cp.json", document, "application/json"),
                                               "public_key": ("signer.pub", public.read_bytes(), "text/plain")})
    assert "against the checkpoint cp.json" in html and "not checked" not in html
    html = await verified(client, app, token, {"checkpoint": ("cp.json", document, "application/json"),
                                               "public_key": ("other.pub", other.read_bytes(), "text/plain")})
    assert "signature does not verify" in html and "against the checkpoint" not in html


class TestKeyedChain:
    """A book whose chain is keyed: the page names the key by its id, and never shows the key."""

    @pytest.fixture
    async def book(self, db_url: str, backend: str, clock: Any) -> Any:
        if backend == "postgres":
            plain = await open_book(db_url, clock=clock)
            await reset_schema(plain.engine)
            await plain.engine.dispose()
        keyed = await open_book(db_url, clock=clock, chain_key=ChainKey(SECRET))
        yield keyed
        await keyed.engine.dispose()
        if backend == "postgres":  # the switch-over record goes with the rest
            plain = await open_book(db_url, clock=clock, chain_key=ChainKey(SECRET))
            await reset_schema(plain.engine)
            await plain.engine.dispose()

    async def test_the_key_id_is_shown_never_the_key(self, app: Any, client: httpx.AsyncClient, sign_in: Any,
                                                     book: Book) -> None:
        await enqueue_dispatch(book, kind="k", deliver_to="ok")
        token = await sign_in("viewer")
        key_id = ChainKey(SECRET).id
        pages = [(await client.get("/audit")).text, await verified(client, app, token), (await client.get("/")).text]
        assert f'<code data-figure="chain-key-id">{key_id}</code>' in pages[0]
        assert f"This console holds the key whose id is <code>{key_id}</code>" in pages[0]
        assert re.search(r'data-figure="verify">ok<', pages[1])
        for html in pages:
            for form in (SECRET, SECRET.hex().encode(), base64.b64encode(SECRET), SECRET[:16]):
                assert form.decode() not in html


async def test_the_fact_logs_last_checkpoint_and_verify_against_it(book: Book, tmp_path: Path) -> None:
    """Issue 31: the page shows the fact log's last checkpoint from [audit] checkpoint_dir (size, root, signed by
    the log's key, the witnesses its note names) and verify checks the database against it: a fact moved below it
    is a tree_head_mismatch finding. A note another key signed is shown as not verifying."""
    from .conftest import web_settings

    from statebook.adapters.checkpoints import BookLog, DirectorySink, take_checkpoint
    from statebook.adapters.note import COSIGNATURE_V1, Signer, cosign
    from statebook.adapters.web import create_app
    from statebook.lifecycle.facts import facts_table

    pytest.importorskip("cryptography")
    signer = Signer.generate("example.test/log")
    (tmp_path / "log.key").write_text(signer.skey)
    folder = tmp_path / "checkpoints"
    settings = type(web_settings())(web=web_settings().web,
                                    audit={"log_key": {"file": str(tmp_path / "log.key")}, "checkpoint_dir": folder})
    for i in range(3):
        await enqueue_dispatch(book, kind="k", deliver_to="ok", body={"i": i})
    done = await take_checkpoint(BookLog(book), signer, DirectorySink(folder))
    witness = Signer.generate("witness.test/w1", COSIGNATURE_V1)
    path = folder / f"{done.head.size:020d}.checkpoint"
    path.write_bytes(cosign(path.read_bytes(), witness, 1_700_000_000))
    app = create_app(book, settings)
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            from .conftest import PASSWORDS, csrf_of

            token = await csrf_of(client)
            signed = await client.post("/sign-in", data={"name": "vic", "password": PASSWORDS["vic"], "next": "/",
                                                         "csrf_token": token})
            assert signed.status_code == 303, signed.text
            html = (await client.get("/audit")).text
            assert 'data-figure="log-checkpoint-size">3<' in html, html
            assert 'data-figure="cosigners">witness.test/w1' in html and signer.skey not in html
            token = await csrf_of(client, "/sign-in")
            html = await verified(client, app, token)
            assert re.search(r'data-figure="verify">ok<', html) and "against its checkpoint of 3 facts" in html
            async with book.store.begin() as conn:  # a fact renumbered below the checkpoint's size
                low = (await conn.execute(sa.select(sa.func.min(facts_table.c.seq)))).scalar_one()
                await conn.execute(facts_table.update().where(facts_table.c.seq == low).values(seq=low + 10_000))
            html = await verified(client, app, token)
            assert "tree_head_mismatch" in html
    path.write_bytes(path.read_bytes().replace(b"example.test/log\n3", b"example.test/log\n2"))
    found = log_checkpoint(settings)
    assert found is not None and found.head is None and "does not verify" in (found.problem or "")
