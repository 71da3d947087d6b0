"""Serve statebook's console under /ops of your own FastAPI application (docs/console.md).

    uvicorn examples.fastapi_console:app        # STATEBOOK_DB names the database (default ./statebook.db)
"""

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from statebook.adapters.db import open_book
from statebook.adapters.settings import load_settings
from statebook.adapters.web import create_app


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = load_settings()  # STATEBOOK_* environment variables; pass a TOML path to read a file too
    book = await open_book(settings.db, limits=settings.book_limits(), chain_key=settings.audit.key())
    console = create_app(book, settings)
    app.mount("/ops", console)
    async with console.router.lifespan_context(console):  # the console's live-update hub
        yield
    await book.engine.dispose()


app = FastAPI(lifespan=lifespan)


@app.get("/")
async def home() -> dict[str, str]:
    return {"console": "/ops/"}
