"""verify's first pass: read facts and rows as stored and pass every entity that is certainly intact.

An entity passes when every fact links to its predecessor, comes after it in seq, hashes to its
stored hash, moves along an edge the current policy allows, and the fold of its facts equals its
row — the checks of ``replay.check_entity``, done on the driver's tuples without building a
``Fact`` per fact. The hash is computed over the stored text of the JSON columns
(``facts.fact_hash`` is defined over that text); a patch is decoded only after its fact's hash
matched. Anything unexpected — a finding, JSON stored in another spelling, a value of an odd type —
fails the screen and the entity gets the full check, which decides. So the screen may be stricter
than the full check, never more lenient.

This module imports only the standard library and ``codec``, so it also runs as a script: a
worker process that screens ranges of a database file for ``verify`` (see :func:`serve`) starts in
milliseconds, without SQLAlchemy. The backend names the function it runs (``FileScreen.worker``).
"""

from __future__ import annotations

import hashlib
import hmac
import importlib
import json
import pickle
import sys
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, BinaryIO

if __package__ or TYPE_CHECKING:
    from .codec import dumps_tree
else:  # run as a worker script: the package (and SQLAlchemy) is never imported
    from codec import dumps_tree

BATCH = 4000
"""Rows fetched per round trip."""

PROJECTION = (
    ("status", "status"), ("version", "version"), ("updated_at", "at"), ("status_reason_code", "reason_code"),
    ("status_reason_summary", "reason_summary"), ("last_fact_id", "id"), ("chain_hash", "hash"),
)
"""Row column <- fact field, for the columns every fact projects onto its row (fold applies them last)."""

Suspect = tuple[str, list[Sequence[Any]], Sequence[Any] | None]
"""An entity that failed the screen: its id, its facts and its row as read (the row may be None)."""

_sha256 = hashlib.sha256
_hmac = hmac.digest
# scan_once is set by JSONDecoder.__init__ (the C scanner); typeshed does not declare it.
_scan: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


class Screen:
    """What screening one lifecycle's entities needs, worked out once (plain data, so it pickles).

    ``fields`` names the fact columns in the order they are read: first the scalar fields
    ``fact_hash`` encodes as one JSON array (``scalars`` of them), then the three JSON fields,
    ``prev_hash`` and ``hash``. ``moves`` maps each (previous, status) the current policy
    (``fingerprint``) allows to the actor types that may take it (empty: any). ``defaults``: the
    value of each data column no fact sets (L7). ``earlier``: fingerprint -> (moves, initial) of each
    accepted earlier policy; ``strict``: a fact under any other fingerprint fails (L12c), else the
    current policy judges it.
    """

    def __init__(
        self,
        entity_type: str,
        fields: Sequence[str],
        scalars: int,
        columns: Sequence[str],
        json_columns: Collection[str],
        moves: Mapping[tuple[str, str], frozenset[str]],
        initial: Collection[str],
        defaults: Mapping[str, Any] | None = None,
        fingerprint: str = "",
        earlier: Mapping[str, tuple[Mapping[tuple[str, str], frozenset[str]], Collection[str]]] | None = None,
        strict: bool = False,
        key: bytes | None = None,
        keyed_after: int | None = None,
    ) -> None:
        self.spec = (entity_type, tuple(fields), scalars, tuple(columns), tuple(json_columns), dict(moves),
                     tuple(initial), dict(defaults or {}), fingerprint, dict(earlier or {}), strict, key, keyed_after)
        """The arguments again, as plain data: how a worker process gets the screen."""
        self.entity_type = entity_type
        self.fields = tuple(fields)
        self.scalars = scalars
        self.columns = tuple(columns)
        self.json_columns = frozenset(json_columns)
        self.moves = dict(moves)
        self.initial = frozenset(initial)
        self.fingerprint = fingerprint
        self.strict = strict
        self.key = key
        """The chain key (``chain.Rule``): facts with ``seq > keyed_after`` carry an HMAC under it (None: unchecked)."""
        self.keyed_after = keyed_after
        self.policies = {fp: (dict(m), frozenset(i)) for fp, (m, i) in (earlier or {}).items()}
        self.policies[fingerprint] = (self.moves, self.initial)
        at = {name: i for i, name in enumerate(self.fields)}
        self.entity_at = at["entity_id"]
        if self.fields[scalars:scalars + 5] != ("evidence_refs", "patch", "metadata", "prev_hash", "hash") or (
                self.fields[scalars + 5:] not in ((), ("seq",))):
            raise ValueError(f"unexpected fact field order {self.fields}")
        if keyed_after is not None and self.fields[-1] != "seq":
            raise ValueError("a keyed chain is screened with each fact's seq (the last field)")
        index = {name: i for i, name in enumerate(self.columns)}
        self.id_index = index["id"]
        self.projection = tuple((index[col], at[field]) for col, field in PROJECTION if col in index)
        projected = {col for col, _ in PROJECTION}
        self.data = {name: (i, name in self.json_columns) for name, i in index.items() if name not in projected}
        # Each data column with a known default: (its index, the stored values that equal it).
        self.defaults = {
            name: (index[name], (dumps_tree(value), *((None,) if value is None else ())) if name in self.json_columns
                   else (value,))
            for name, value in (defaults or {}).items() if name in self.data}
        self._default_names = frozenset(self.defaults)
        self._at = (at["id"], at["prev_fact_id"], at["previous_status"], at["status"], at["version"],
                    at["actor_type"], at["policy_fingerprint"])
        self.has_seq = self.fields[-1] == "seq"
        """Facts are read with their seq, which must rise with the version (L12d)."""
        self._allowed: dict[tuple[Any, Any, Any, Any], bool] = {}

    def allowed(self, previous: str | None, status: str | None, actor: str, fingerprint: str | None = None) -> bool:
        """The move's verdict under the policy it was written with, as ``check_entity`` gives it (memoised)."""
        fingerprint = self.fingerprint if fingerprint is None else fingerprint
        key = (fingerprint, previous, status, actor)
        found = self._allowed.get(key)
        if found is None:
            policy = self.policies.get(fingerprint)
            if policy is None and not self.strict:
                policy = self.policies[self.fingerprint]
            if policy is None:
                found = False  # neither the current policy nor an accepted one
            elif previous is None:
                found = status in policy[1]
            elif status is None:
                found = True  # a tombstone may follow any status
            else:
                actors = policy[0].get((previous, status))
                found = actors is not None and (not actors or actor in actors)
            self._allowed[key] = found
        return found

    def passes(self, facts: Sequence[Sequence[Any]], row: Sequence[Any] | None) -> bool:
        """True when the entity is certainly intact; False sends it to the full check."""
        ID, PREV_ID, PREVIOUS, STATUS, VERSION, ACTOR, POLICY = self._at
        n = self.scalars
        evidence, patch_at, metadata, prev_hash_at, hash_at, seq_at = n, n + 1, n + 2, n + 3, n + 4, n + 5
        allowed = self._allowed
        key, keyed_after, has_seq = self.key, self.keyed_after, self.has_seq
        last_seq: int | float = float("-inf")
        prev_id = prev_hash = ""
        prev_status: str | None = None
        version = 0
        state: dict[str, Any] | None = None
        try:
            for f in facts:
                if f[PREV_ID] != prev_id or f[prev_hash_at] != prev_hash or f[PREVIOUS] != prev_status:
                    return False
                if f[VERSION] != version + 1:
                    return False
                if has_seq:
                    seq = f[seq_at]
                    if type(seq) is not int or seq <= last_seq:
                        return False
                    last_seq = seq
                # facts.fact_hash, over the stored text of the JSON columns.
                text = f"{prev_hash}\x1f{dumps_tree(f[:n])}\x1f{f[evidence]}\x1f{f[patch_at]}\x1f{f[metadata]}\x1f"
                if keyed_after is None or f[seq_at] <= keyed_after:
                    if _sha256(text.encode()).hexdigest() != f[hash_at]:
                        return False
                elif key is not None:  # chain.Rule: keyed after the switch-over (without the key: unchecked)
                    if _hmac(key, text.encode(), "sha256").hex() != f[hash_at]:
                        return False
                status = f[STATUS]
                verdict = allowed.get((f[POLICY], prev_status, status, f[ACTOR]))
                if verdict is None:
                    verdict = self.allowed(prev_status, status, f[ACTOR], f[POLICY])
                if not verdict:
                    return False
                if status is None:
                    state = None
                else:
                    # The hash matched, so this is the canonical text written with the fact.
                    patch = _scan(f[patch_at], 0)[0]
                    if type(patch) is not dict:
                        return False
                    if state is None:
                        state = patch
                    else:
                        state.update(patch)
                prev_id, prev_hash, prev_status, version = f[ID], f[hash_at], status, f[VERSION]
        except (TypeError, ValueError, IndexError, StopIteration):
            return False  # a value of an unexpected type or spelling: the full check explains it
        if row is None or state is None:
            return row is None and state is None and bool(facts)
        last = facts[-1]
        for i, field in self.projection:
            if row[i] != last[field]:
                return False
        data = self.data
        for name, value in state.items():
            found = data.get(name)
            if found is None:
                continue  # a lifecycle column (the projection decides it) or not a column of the row
            i, is_json = found
            stored = row[i]
            if is_json:
                if type(stored) is not str or stored != dumps_tree(value):
                    return False
            elif stored != value:
                return False
        # A column no fact set holds its declared default (L7: every column).
        defaults = self.defaults
        for name in self._default_names - state.keys():
            i, same = defaults[name]
            if row[i] not in same:
                return False
        return True


class Merge:
    """Screens one range of one lifecycle: facts (grouped by entity) beside rows, both in id order.

    Feed rows ahead of facts (:meth:`wants_rows`), then facts in batches; :meth:`end_facts` when
    the facts are done and :meth:`add_rows` with the rows left. Entities that fail the screen
    collect in ``suspects``; a row no fact mentions is one (with no facts).
    """

    def __init__(self, screen: Screen, key: Callable[[Any], Any] | None = None) -> None:
        self.screen = screen
        self._key = key or _key
        self.entities = 0
        self.facts = 0
        self.suspects: list[Suspect] = []
        self._rows: Sequence[Sequence[Any]] = []
        self._next = 0
        self._rows_done = False
        self._facts_done = False
        self._current: Any = None
        self._bucket: list[Sequence[Any]] = []

    def wants_rows(self, last_entity: Any) -> bool:
        """Whether more rows must be read before facts up to ``last_entity`` can be screened."""
        rows = self._rows
        return not self._rows_done and (
            self._next == len(rows) or self._key(rows[-1][self.screen.id_index]) < self._key(last_entity))

    def add_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """The next rows (empty: there are no more). After :meth:`end_facts`, all are orphans."""
        if not rows:
            self._rows_done = True
            return
        self._rows = [*self._rows[self._next:], *rows] if self._next < len(self._rows) else rows
        self._next = 0
        if self._facts_done:
            self._orphans(None)

    def add_facts(self, facts: Sequence[Sequence[Any]]) -> None:
        """Take the next batch of fact rows (in entity order) and screen each entity they complete."""
        entity_at, key = self.screen.entity_at, self._key
        current, bucket = self._current, self._bucket
        for f in facts:
            if f[entity_at] != current:
                entity = key(f[entity_at])
                if entity == current:  # a damaged id that is not text (L12b), still the same entity
                    bucket.append(f)
                    continue
                if current is not None:
                    if entity < current:
                        # Matching rows to facts by position needs the database's order to be Python's.
                        raise ValueError(f"the database orders entity id {f[entity_at]!r} after {current!r}")
                    self._close(current, bucket)
                    bucket = self._bucket = []
                current = self._current = entity
            bucket.append(f)

    def end_facts(self) -> None:
        """Say no more facts come: screen the last entity and report the rows left without facts."""
        if self._current is not None:
            self._close(self._current, self._bucket)
            self._current, self._bucket = None, []
        self._orphans(None)
        self._facts_done = True

    def _close(self, entity: Any, facts: list[Sequence[Any]]) -> None:
        self._orphans(entity)
        rows, i, row = self._rows, self._next, None
        if i < len(rows) and self._key(rows[i][self.screen.id_index]) == entity:
            row = rows[i]
            self._next = i + 1
        self.entities += 1
        self.facts += len(facts)
        if not self.screen.passes(facts, row):
            self.suspects.append((facts[0][self.screen.entity_at], facts, row))

    def _orphans(self, before: Any) -> None:
        """Rows (with ids before ``before``, or all left) that no fact mentions."""
        rows, i, id_at = self._rows, self._next, self.screen.id_index
        while i < len(rows) and (before is None or self._key(rows[i][id_at]) < before):
            self.entities += 1
            self.suspects.append((rows[i][id_at], [], rows[i]))
            i += 1
        self._next = i


_AFTER_TEXT = "\U0010ffff"


def _key(entity_id: Any) -> str:
    """An entity id as Merge orders it: text as is; anything else (only damage stores a blob in a
    text column, L12b) after all text, as SQLite orders blobs, and among blobs in byte order."""
    if type(entity_id) is str:
        return entity_id
    return _AFTER_TEXT + (entity_id.hex() if isinstance(entity_id, bytes) else repr(entity_id))


def serve(requests: BinaryIO, replies: BinaryIO, run: Callable[..., Any]) -> None:
    """Worker loop: read pickled arguments of ``run``, reply (True, result) or (False, error).

    Each message is an 8-byte big-endian length and a pickle; the loop ends when ``requests`` does.
    """
    while len(size := requests.read(8)) == 8:
        request = requests.read(int.from_bytes(size, "big"))
        try:
            reply: tuple[bool, Any] = (True, run(*pickle.loads(request)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which then screens the range itself
            reply = (False, f"{type(exc).__name__}: {exc}")
        data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        replies.write(len(data).to_bytes(8, "big") + data)
        replies.flush()


def imported(target: str) -> Callable[..., Any]:
    """The function ``"module:name"`` names, imported with importlib."""
    module, _, name = target.partition(":")
    found: Callable[..., Any] = getattr(importlib.import_module(module), name)
    return found


class WorkerError(Exception):
    """A worker process could not screen a range (the message says why)."""


class Worker:
    """A worker process running :func:`serve` (this file as a script) on a backend's function, and its pipes."""

    def __init__(self, process: Any) -> None:
        self.process = process

    @classmethod
    @asynccontextmanager
    async def started(cls, target: str, path: Sequence[str] = ()) -> AsyncIterator[Worker]:
        """A worker that calls ``target`` (``"module:function"``, importable from ``path``) per message."""
        import asyncio  # here, so the worker script does not import it

        # Run by path, without site packages or environment: it needs only the standard library.
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-B", "-E", "-S", __file__, target, *path,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )
        try:
            yield cls(process)
        except BaseException:
            cls(process).kill()
            await process.wait()
            raise
        assert process.stdin is not None  # stdin=PIPE
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5)
        except TimeoutError:
            process.kill()
            await process.wait()

    def send(self, args: tuple[Any, ...]) -> None:
        """Queue one call of the worker's function (a few kB: the pipe takes it without waiting)."""
        data = pickle.dumps(args, protocol=pickle.HIGHEST_PROTOCOL)
        self.process.stdin.write(len(data).to_bytes(8, "big") + data)

    def kill(self) -> None:
        """Kill the screening process if it still runs."""
        if self.process.returncode is None:
            self.process.kill()

    async def reply(self) -> Any:
        """The result of the oldest call sent (raises :class:`WorkerError` if it failed)."""
        size = int.from_bytes(await self.process.stdout.readexactly(8), "big")
        ok, value = pickle.loads(await self.process.stdout.readexactly(size))
        if not ok:
            raise WorkerError(value)
        return value


if __name__ == "__main__":
    _target, *_path = sys.argv[1:]
    sys.path.extend(_path)  # after the standard library, so no module there can shadow it
    serve(sys.stdin.buffer, sys.stdout.buffer, imported(_target))


def byte_key(entity_id: Any) -> tuple[int, Any]:
    """An entity id in SQLite's own order (BINARY collation): text by its UTF-8 bytes, before every blob. For
    text read leniently (only damage stores text that is not UTF-8, L12b): code-point order, which :func:`_key`
    uses, is not byte order once a value is not UTF-8, so such a value carries the bytes it was stored with
    as ``raw``."""
    if isinstance(entity_id, str):
        raw = getattr(entity_id, "raw", None)
        return (0, raw if isinstance(raw, bytes) else entity_id.encode("utf-8", "surrogatepass"))
    return (1, entity_id.hex() if isinstance(entity_id, bytes) else repr(entity_id))
