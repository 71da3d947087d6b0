"""Checkpoints that take themselves (issue 31): sign the fact log's tree head as a C2SP checkpoint note and
publish it outside the database — a directory of append-only files, and/or a command that receives the note on
standard input — after checking that it extends the last one published.

The steps are separately callable (:func:`previous`, :func:`next_head`, :func:`publish`), and
:func:`take_checkpoint` runs them in order. The tree comes from a :class:`TreeSource` (the database's fact log
in production, a list of leaves in tests), so the consistency rule is checked here whatever the storage.

A checkpoint that does not extend its predecessor — the log shrank, or its first ``old.size`` leaves no longer
give the old root — is a :class:`CheckpointAlarm`: nothing is published, the caller logs it and raises the
alarm gauge; the sink is never re-based onto the database's new history (specs/audit.md A6).
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from statebook.lifecycle import Book, factlog, tlog

from .errors import ConfigError
from .note import NoteError, Signer, Verifier, open_note, sign_note

__all__ = ["BookLog", "CheckpointAlarm", "Checkpointer", "CommandSink", "DirectorySink", "Published", "Sink",
           "TreeSource", "checkpoint_file", "next_head", "previous", "publish", "take_checkpoint"]

log = logging.getLogger("statebook.checkpoints")

SUFFIX = ".checkpoint"


class CheckpointAlarm(Exception):
    """The log does not extend the last published checkpoint (the message says how); nothing was published."""


class TreeSource(Protocol):
    """Where the tree comes from: the settled log's size and root now, and consistency proofs within it."""

    async def head(self) -> tuple[int, bytes]:
        """The settled log's size and root now."""
        ...

    async def consistency(self, old_size: int, new_size: int) -> Sequence[bytes]:
        """The proof that the tree of ``old_size`` leaves is a prefix of the tree of ``new_size``."""
        ...


class Sink(Protocol):
    """Somewhere a checkpoint note is kept outside the database."""

    async def write(self, size: int, note: bytes) -> None:
        """Keep ``note``, the checkpoint of a tree of ``size`` leaves; raise when it could not."""
        ...


@dataclass(frozen=True)
class DirectorySink:
    """One file per checkpoint, ``<size, 20 digits>.checkpoint``: written under a temporary name, then linked into
    place, so a reader never sees half a note and an existing file is never replaced."""

    directory: Path

    def latest(self) -> Path | None:
        """The file of the largest tree size, or None when there is none yet."""
        if not self.directory.is_dir():
            return None
        found = sorted(p for p in self.directory.iterdir() if p.name.endswith(SUFFIX) and p.stem.isdigit())
        return found[-1] if found else None

    async def write(self, size: int, note: bytes) -> None:
        """Write the note's file (in a thread: the writes are synced to disk)."""
        await asyncio.to_thread(self._write, size, note)

    def _write(self, size: int, note: bytes) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{size:020d}{SUFFIX}"
        fd, temporary = tempfile.mkstemp(dir=self.directory, prefix=".incoming-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(note)
                out.flush()
                os.fsync(out.fileno())
            try:
                os.link(temporary, final)  # fails when the file exists: a published checkpoint is never replaced
            except FileExistsError:
                if final.read_bytes() != note:
                    raise CheckpointAlarm(f"{final} exists with another note for the same tree size") from None
        finally:
            os.unlink(temporary)


def checkpoint_file(path: Path) -> Path | None:
    """``path`` itself, or when it is a checkpoint directory its latest checkpoint (None: an empty directory)."""
    return DirectorySink(path).latest() if path.is_dir() else path


@dataclass(frozen=True)
class CommandSink:
    """A command (argv, no shell) run with the note on standard input, e.g. one that pushes it to object storage,
    a git repository or a witness; a non-zero exit or a run longer than ``timeout`` seconds is an error."""

    argv: tuple[str, ...]
    timeout: float = 30.0

    async def write(self, size: int, note: bytes) -> None:
        """Run the command with the note on its standard input (``$STATEBOOK_CHECKPOINT_SIZE`` names the size)."""
        process = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE, env={**os.environ, "STATEBOOK_CHECKPOINT_SIZE": str(size)})
        try:
            _, err = await asyncio.wait_for(process.communicate(note), self.timeout)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise ConfigError(f"checkpoint command {self.argv[0]} ran longer than {self.timeout:g}s; killed") from None
        if process.returncode != 0:
            last = err.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
            raise ConfigError(f"checkpoint command {self.argv[0]} exited {process.returncode}: {last[0][:200]}")


@dataclass(frozen=True)
class Published:
    """A checkpoint taken: its tree head and the note as published (None: the log had not grown)."""

    head: tlog.TreeHead
    note: bytes | None


def previous(sink: DirectorySink, verifier: Verifier, origin: str) -> tlog.TreeHead | None:
    """The last checkpoint in ``sink``, its signature and text checked (:class:`CheckpointAlarm` when it does not
    open with ``verifier`` or names another origin: a forged or foreign file is never built upon)."""
    path = sink.latest()
    if path is None:
        return None
    try:
        text, _ = open_note(path.read_bytes(), [verifier])
        head = tlog.parse_checkpoint(text)
    except (NoteError, tlog.CheckpointFormatError) as exc:
        raise CheckpointAlarm(f"the last checkpoint {path} does not verify: {exc}") from None
    if head.origin != origin:
        raise CheckpointAlarm(f"the last checkpoint {path} is of log {head.origin!r}, not {origin!r}")
    return head


async def next_head(source: TreeSource, origin: str, last: tlog.TreeHead | None) -> tlog.TreeHead:
    """The log's tree head now, after checking that it extends ``last`` (a consistency proof from the source,
    verified against the published root): :class:`CheckpointAlarm` when it does not."""
    size, root = await source.head()
    head = tlog.TreeHead(origin, size, root)
    if last is None:
        return head
    if size < last.size:
        raise CheckpointAlarm(f"the log has {size} facts, fewer than the {last.size} of the last checkpoint: "
                              "facts it covered were cut or erased")
    proof = await source.consistency(last.size, size) if size > last.size else []
    if not tlog.verify_consistency(last.size, size, last.root_hash, root, proof):
        raise CheckpointAlarm(f"the log's first {last.size} facts no longer give the last checkpoint's root: "
                              "facts it covered were changed, reordered, inserted or erased")
    return head


async def publish(head: tlog.TreeHead, signer: Signer, sinks: Sequence[Sink]) -> bytes:
    """Sign ``head`` and write the note to every sink (each sink's error is raised after the others ran)."""
    note = sign_note(head.body(), signer)
    results = await asyncio.gather(*(sink.write(head.size, note) for sink in sinks), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return note


async def take_checkpoint(source: TreeSource, signer: Signer, directory: DirectorySink,
                          more: Sequence[Sink] = (), *, origin: str | None = None) -> Published:
    """One checkpoint: the last one in ``directory``, the log's head checked against it, then signed and
    published to ``directory`` and ``more`` — unless the log has not grown since (nothing is written). The
    origin defaults to the signer's key name, as C2SP logs name their key after their origin."""
    origin = signer.name if origin is None else origin
    last = previous(directory, signer.verifier(), origin)
    head = await next_head(source, origin, last)
    if last is not None and head.size == last.size:
        return Published(head, None)
    return Published(head, await publish(head, signer, [directory, *more]))


@dataclass(frozen=True)
class BookLog:
    """The database's fact log (:mod:`statebook.lifecycle.factlog`) as a :class:`TreeSource`."""

    book: Book

    async def head(self) -> tuple[int, bytes]:
        """The tree head of every settled fact."""
        frontier = await factlog.tree_head(self.book)
        return frontier.size, frontier.root()

    async def consistency(self, old_size: int, new_size: int) -> Sequence[bytes]:
        """The consistency proof from the database's leaves."""
        return await factlog.consistency_proof_for(self.book, old_size, new_size)


class Checkpointer:
    """What the daemon runs when ``[audit] log_key`` is set: a checkpoint every ``every_seconds``, and sooner once
    the log has grown by ``every_facts``; checked with :meth:`due` each tick, taken with :meth:`take`. An alarm
    is logged at error level and kept in :attr:`alarms` (the ``statebook_checkpoint_alarms`` metric); the next
    attempt checks again against the same last checkpoint, never a new base."""

    def __init__(self, book: Book, signer: Signer, directory: DirectorySink, more: Sequence[Sink] = (), *,
                 every_seconds: float, every_facts: int, tick_seconds: float = 30.0) -> None:
        self.book, self.signer, self.directory, self.more = book, signer, directory, tuple(more)
        self.every_seconds, self.every_facts, self.tick_seconds = every_seconds, every_facts, tick_seconds
        self._stop = asyncio.Event()
        self.last_at: float | None = None
        self.published = 0  # the size of the last checkpoint this process published or found
        self.alarms = 0
        self.taken = 0

    async def due(self) -> bool:
        """Whether a checkpoint is due: none taken by this process yet, the interval passed, or enough new facts."""
        if self.last_at is None or self.book.clock.now() - self.last_at >= self.every_seconds:
            return True
        return await factlog.log_size(self.book) - self.published >= self.every_facts

    async def take(self) -> Published | None:
        """Take one checkpoint now (None after an alarm or a sink's error, both logged)."""
        try:
            done = await take_checkpoint(BookLog(self.book), self.signer, self.directory, self.more)
        except CheckpointAlarm as alarm:
            self.alarms += 1
            log.error("checkpoint alarm: %s; nothing was published", alarm)
            return None
        except (ConfigError, OSError) as exc:
            log.error("checkpoint not published: %s", exc)
            return None
        self.last_at, self.published = self.book.clock.now(), done.head.size
        if done.note is not None:
            self.taken += 1
            log.info("checkpoint of %d facts published (root %s)", done.head.size, done.head.root_hash.hex()[:16])
        return done

    async def run_until_stopped(self) -> None:
        """Check every tick whether a checkpoint is due and take it, until :meth:`stop`; one more on the way out,
        so the facts of the run's last moments are anchored too."""
        while not self._stop.is_set():
            try:
                if await self.due():
                    await self.take()
            except Exception:  # noqa: BLE001 - a database hiccup: logged, tried again next tick
                log.exception("checkpoint check failed; trying again in %gs", self.tick_seconds)
            try:
                await asyncio.wait_for(self._stop.wait(), self.tick_seconds)
            except TimeoutError:
                pass
        await self.take()

    def stop(self) -> None:
        """End :meth:`run_until_stopped` after its current step."""
        self._stop.set()

    def counters(self) -> dict[str, int]:
        """For /metrics: checkpoints published and alarms raised by this process."""
        return {"taken": self.taken, "alarms": self.alarms}
