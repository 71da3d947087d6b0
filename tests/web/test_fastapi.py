"""The FastAPI example of docs/console.md runs: the console mounted under /ops of a FastAPI app, its links
under the mount, and the docs show exactly the example's code."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent.parent
EXAMPLE = ROOT / "examples" / "fastapi_console.py"


def test_the_docs_show_the_example_as_it_is() -> None:
    docs = (ROOT / "docs" / "console.md").read_text()
    code = EXAMPLE.read_text()
    body = code[code.index("from fastapi"):]
    blocks = re.findall(r"```python\n(.*?)```", docs, re.S)
    assert body in blocks, "docs/console.md must show examples/fastapi_console.py from its first import on"


async def test_the_fastapi_example_serves_the_console_under_ops(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setenv("STATEBOOK_DB", f"sqlite:///{tmp_path / 'app.db'}")
    spec = importlib.util.spec_from_file_location("fastapi_console_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    app = module.app
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://app.test") as client:
            assert (await client.get("/")).json() == {"console": "/ops/"}
            overview = await client.get("/ops/")
            assert overview.status_code == 200 and "Overview" in overview.text
            assert 'href="/ops/static/console.css"' in overview.text and 'href="/ops/lifecycles"' in overview.text
            assert (await client.get("/ops/lifecycles/dispatch")).status_code == 200
