"""Serve statebook's console under /ops of your own FastAPI application (docs/console.md).

    uvicorn examples.fastapi_console:app        # STATEBOOK_DB names the database (default ./statebook.db)
"""

from fastapi import FastAPI

from statebook.adapters.asgi import lifespan

# At start: the book from the settings (STATEBOOK_* variables; lifespan(config="statebook.toml") reads a file
# too), the console mounted under /ops and its live-update hub started; at shutdown all of it stopped and closed.
app = FastAPI(lifespan=lifespan(console="/ops"))


@app.get("/")
async def home() -> dict[str, str]:
    return {"console": "/ops/"}
