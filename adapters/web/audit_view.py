"""``GET /audit``: the chain's key id, the checkpoints, and whether the database verifies.

The key is shown by its id only (``ChainKey.id``), never its bytes. statebook records no checkpoint in the
database (``statebook checkpoint`` writes a file) and no verify result: the page shows the chain's
switch-over record (the one pin the database holds, when the chain is keyed), the last checkpoint file
given to this console, and runs ``verify`` — against that checkpoint when one is given — as a task of the
console's process, showing its progress and, when it ends, its findings. What it found lives in the
process's memory only (the overview shows it too) and is gone with the process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from starlette.datastructures import UploadFile
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from statebook.lifecycle import Book, StatebookError, verify
from statebook.lifecycle.chain import checkpoint_problems, read_switch
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.replay import Report

from .auth import requires
from .csrf import form
from .errors import page_error
from .pages import render, root
from .state import Console, console

__all__ = ["CHECKPOINT_BYTES", "SHOWN_FINDINGS", "Auditor", "Checkpoint", "LogCheckpoint", "VerifyRun", "audit_page",
           "auditor", "log_checkpoint", "read_document", "routes", "run_verify", "shutdown", "startup", "top_seq"]

log = logging.getLogger("statebook.adapters.web.audit")

CHECKPOINT_BYTES = 64 * 1024 * 1024
"""The largest checkpoint file the page accepts (a checkpoint lists every entity's head: ~150 bytes each)."""
SHOWN_FINDINGS = 200
"""Findings listed on the page; the rest are counted (``statebook verify --json`` lists them all)."""


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint file given to the console: its body (heads left out of the summary), what is wrong with it,
    and what could not be checked."""

    body: dict[str, Any] | None
    problems: list[str]
    notes: list[str]
    name: str

    @property
    def summary(self) -> dict[str, Any]:
        """The checkpoint's fields without its heads (what a page shows)."""
        return {k: v for k, v in (self.body or {}).items() if k != "heads"}


def _check_signature(body: dict[str, Any], signature: Any, public_key: bytes | None) -> list[str]:
    """The signature's problems against an uploaded public key (PEM); the audit extra does the checking."""
    from statebook.adapters.audit import signature_problems

    fd, name = tempfile.mkstemp(suffix=".pub")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(public_key or b"")
        return signature_problems(body, signature, Path(name), "checkpoint")
    finally:
        os.unlink(name)


def read_document(data: bytes, name: str, public_key: bytes | None = None) -> Checkpoint:
    """A checkpoint file's JSON checked as ``statebook verify --checkpoint`` checks it: its heads against its
    root and, given the signer's public key (PEM), its signature."""
    try:
        document = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return Checkpoint(None, [f"{name} is not JSON"], [], name)
    body = document.get("checkpoint") if isinstance(document, dict) else None
    problems = checkpoint_problems(body)
    if problems:
        return Checkpoint(None, problems, [], name)
    signature = document.get("signature")
    assert isinstance(body, dict)  # checkpoint_problems refuses anything else
    if public_key:
        try:
            problems = _check_signature(body, signature, public_key)
        except StatebookError as exc:
            problems = [str(exc)]
        notes: list[str] = []
    else:
        notes = ["the checkpoint's signature was not checked: give the signer's public key" if signature else
                 "the checkpoint is not signed: it was checked against its own root only"]
    return Checkpoint(body, problems, notes, name)


@dataclass(frozen=True)
class LogCheckpoint:
    """The last checkpoint of the fact log in ``[audit] checkpoint_dir``: its tree head when its note opens with the
    log's key (derived from ``[audit] log_key``, never shown), the names on its other signature lines (witnesses'
    cosignatures, listed as found), and what is wrong with it."""

    name: str
    head: Any = None
    cosigners: tuple[str, ...] = ()
    problem: str | None = None


def log_checkpoint(settings: Any) -> LogCheckpoint | None:
    """The fact log's last published checkpoint (None when the settings name no checkpoint directory or it is
    empty). Read from the directory at each page view: a checkpoint the daemon published a moment ago shows."""
    from statebook.adapters.checkpoints import DirectorySink
    from statebook.adapters.errors import ConfigError
    from statebook.adapters.note import NoteError, open_note, signature_names
    from statebook.lifecycle import tlog

    audit: Any = getattr(settings, "audit", None)
    folder = getattr(audit, "checkpoint_dir", None)
    path = None if folder is None else DirectorySink(Path(folder)).latest()
    if path is None or audit is None:
        return None
    try:
        note = path.read_bytes()
        signer = audit.log_signer()
        if signer is None:
            return LogCheckpoint(path.name, problem="[audit] log_key is not set here, so its signature is not checked")
        text, _ = open_note(note, [signer.verifier()])
        head = tlog.parse_checkpoint(text)
    except (OSError, ConfigError, NoteError, tlog.CheckpointFormatError) as exc:
        return LogCheckpoint(path.name, problem=f"it does not verify: {exc}")
    return LogCheckpoint(path.name, head, tuple(n for n in signature_names(note) if n != head.origin))


@dataclass
class VerifyRun:
    """One ``verify`` run by the console: who asked, its progress, and its report once it ends."""

    by: str
    started_at: float
    checkpoint: Checkpoint | None = None
    tree_head: Any = None
    done: int = 0
    total: int = 0
    ended_at: float | None = None
    report: Report | None = None
    error: str | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def running(self) -> bool:
        """True until the run ended (with a report or an error)."""
        return self.ended_at is None

    @property
    def percent(self) -> int:
        """How far the sweep has got, 0 to 100."""
        return 100 if not self.running else int(100 * self.done / self.total) if self.total else 0

    @property
    def ok(self) -> bool:
        """True when the run ended with a report that found nothing."""
        return self.report is not None and self.report.ok and self.error is None


class Auditor:
    """The console's verify runs (one at a time) and the last checkpoint it was given."""

    def __init__(self) -> None:
        self.run: VerifyRun | None = None
        self.checkpoint: Checkpoint | None = None

    def start(self, book: Book, *, by: str, checkpoint: Checkpoint | None = None, tree_head: Any = None) -> VerifyRun:
        """Start ``verify`` over the whole book (against ``checkpoint`` when it is usable, and the fact log against
        ``tree_head``); the running one when a run is still going (a second would only read everything twice)."""
        if self.run is not None and self.run.running:
            return self.run
        if checkpoint is not None:
            self.checkpoint = checkpoint
        run = VerifyRun(by=by, started_at=book.clock.now(), checkpoint=checkpoint, tree_head=tree_head)
        usable = checkpoint.body if checkpoint is not None and not checkpoint.problems else None

        def progress(done: int, total: int) -> None:
            run.done, run.total = done, total

        async def go() -> None:
            try:
                run.report = await verify(book, progress=progress, checkpoint=usable, tree_head=tree_head)
            except asyncio.CancelledError:
                run.error = "the console stopped before verify ended"
                raise
            except Exception as exc:  # noqa: BLE001 - shown on the page; the console keeps serving
                log.warning("verify from the console failed (%s: %s)", type(exc).__name__, exc)
                run.error = f"{type(exc).__name__}: {exc}" if isinstance(exc, StatebookError) else (
                    f"verify could not finish ({type(exc).__name__}); the console's log has the details")
            finally:
                run.ended_at = book.clock.now()

        run.task = asyncio.create_task(go(), name="statebook-console-verify")
        self.run = run
        return run

    async def close(self) -> None:
        """Stop a run still going (the app's shutdown)."""
        if self.run is not None and self.run.task is not None and not self.run.task.done():
            self.run.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.run.task


def auditor(c: Console) -> Auditor:
    """The :class:`Auditor` of a console (made on first use)."""
    found = c.extras.get("auditor")
    if found is None:
        found = c.extras["auditor"] = Auditor()
    return found


async def startup(c: Console) -> None:
    """The app's start: the console's auditor."""
    auditor(c)


async def shutdown(c: Console) -> None:
    """The app's end: a verify still running is stopped."""
    await auditor(c).close()


async def top_seq(book: Book) -> int:
    """The fact log's highest seq: about how many facts a verify reads (one probe of the primary key)."""
    async with book.read() as conn:
        return int((await conn.execute(sa.select(sa.func.coalesce(sa.func.max(facts_table.c.seq), 0)))).scalar_one())


# -- the pages ------------------------------------------------------------------------------------

REFRESH_SECONDS = 2
"""While a verify runs, the page asks the browser to reload it this often (the ``Refresh`` header: no script)."""


@requires("viewer")
async def audit_page(request: Request) -> Response:
    """``GET /audit``: the chain's key id, the checkpoints, the verify form and the last run's findings."""
    c = console(request)
    book = c.book
    found = auditor(c)
    run = found.run
    context = {
        "switch": await read_switch(book), "key_id": None if book.chain_key is None else book.chain_key.id,
        "checkpoint": found.checkpoint, "run": run, "top": await top_seq(book), "shown": SHOWN_FINDINGS,
        "log_checkpoint": log_checkpoint(c.settings),
    }
    headers = {"Refresh": str(REFRESH_SECONDS)} if run is not None and run.running else None
    return render(request, "audit/page.html", context, headers=headers)


async def _upload(value: Any) -> bytes | None:
    """An uploaded file's bytes (None when no file was chosen); at most :data:`CHECKPOINT_BYTES`."""
    if not isinstance(value, UploadFile) or not value.filename:
        return None
    data = await value.read(CHECKPOINT_BYTES + 1)
    if len(data) > CHECKPOINT_BYTES:
        raise StatebookError(f"{value.filename} is larger than {CHECKPOINT_BYTES // (1024 * 1024)} MB")
    return data


@requires("viewer")
async def run_verify(request: Request) -> Response:
    """``POST /audit/verify`` (a viewer may: it reads and writes nothing): start verify, against the uploaded
    checkpoint when one is given (checked with the uploaded public key, when given); back to ``/audit``."""
    c = console(request)
    data = await form(request, files=2, max_bytes=CHECKPOINT_BYTES + 1024 * 1024)
    try:
        document = await _upload(data.get("checkpoint"))
        public_key = await _upload(data.get("public_key"))
    except StatebookError as exc:
        return page_error(request, 413, detail=str(exc))
    checkpoint = None
    if document is not None:
        name = getattr(data.get("checkpoint"), "filename", "checkpoint")
        checkpoint = read_document(document, str(name)[:200], public_key)
    published = log_checkpoint(c.settings)
    auditor(c).start(c.book, by=request.state.identity.name, checkpoint=checkpoint,
                     tree_head=None if published is None else published.head)
    return RedirectResponse(f"{root(request)}/audit#verify", status_code=303)


routes = [Route("/audit", audit_page, name="audit"),
          Route("/audit/verify", run_verify, methods=["POST"], name="audit_verify")]
