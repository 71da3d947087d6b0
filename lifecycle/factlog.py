"""The database's fact log as a Merkle tree (specs/audit.md A6): its tree head, proofs, and a check against one.

The log's leaves are the facts in ``seq`` order, leaf i the i-th fact's :func:`leaf_of` (``tlog.fact_leaf`` of
its seq and stored hash): a leaf's index is the number of facts before it. The log is the facts up to the
settled seq (``chain.settled_seq``, L12d): on PostgreSQL a writer may still commit a fact below the highest seq,
so what a tree head pins is read only once no running writer can. Every read streams (seq, hash) in batches
from one snapshot and keeps O(log n) hashes: the root through a :class:`~.tlog.Frontier`, a proof through the
few complete subtrees it names (about two per bit of the size), each hashed as the leaves go by.

Imports only the standard library, SQLAlchemy and this package.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa

from . import tlog
from .chain import MAX_BIGINT, Problem, settled_seq
from .errors import StatebookError
from .facts import facts_table
from .inputs import integer, text

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from .book import Book

__all__ = ["BATCH", "LogFrontier", "NotInLog", "against_tree_head", "consistency_proof_for", "inclusion_proof_for",
           "leaf_of", "log_size", "tree_head"]

BATCH = 5000
"""Facts read per batch: a batch's rows are the only rows held in memory."""

T = TypeVar("T")
Subtree = tuple[int, int]
"""(start, height) of a complete subtree: the ``2**height`` leaves from ``start``."""


class NotInLog(StatebookError, LookupError):
    """A tree size beyond the log's settled facts, or a fact that is not among a tree's leaves; the message says
    how many facts the log has, or where the fact is."""


@dataclass(frozen=True)
class LogFrontier:
    """The fact log's tree at one size, as a checkpointer keeps it to go on from there: the tree's frontier and
    the seq of its last leaf (0 for the empty tree). :meth:`to_bytes` is that seq in 8 bytes big-endian followed
    by the frontier's own bytes (``tlog.Frontier.to_bytes``)."""

    frontier: tlog.Frontier
    last_seq: int

    @property
    def size(self) -> int:
        """How many leaves the tree holds."""
        return self.frontier.size

    def root(self) -> bytes:
        """The tree's root hash."""
        return self.frontier.root()

    def to_bytes(self) -> bytes:
        """The last seq and the frontier, to save."""
        return self.last_seq.to_bytes(8, "big") + self.frontier.to_bytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> LogFrontier:
        """What :meth:`to_bytes` wrote; ValueError for anything else."""
        if type(data) is not bytes or len(data) < 16:
            raise ValueError("a saved log frontier is its last seq in 8 bytes, then a saved tlog.Frontier")
        frontier = tlog.Frontier.from_bytes(data[8:])
        last_seq = int.from_bytes(data[:8], "big")
        if (last_seq == 0) != (frontier.size == 0) or last_seq > MAX_BIGINT:
            raise ValueError(f"a saved log frontier of {frontier.size} leaves cannot end at seq {last_seq}")
        return cls(frontier, last_seq)


def leaf_of(seq: int, fact_hash: Any) -> bytes:
    """The leaf hash of a stored fact: ``tlog.leaf_hash(tlog.fact_leaf(seq, fact_hash))``. Damage (L12b) still
    gives a leaf, and no honest fact's: a hash that is not text (a blob in SQLite's text column) is taken as its
    repr, a negative seq (raw SQL) goes into the hash's place beside it."""
    if type(seq) is not int or seq < 0:
        return tlog.leaf_hash(tlog.fact_leaf(0, f"damaged: seq {seq!r}, hash {fact_hash!r}"))
    return tlog.leaf_hash(tlog.fact_leaf(seq, fact_hash if isinstance(fact_hash, str) else repr(fact_hash)))


async def tree_head(book: Book, *, size: int | None = None, since: LogFrontier | tlog.Frontier | None = None
                    ) -> LogFrontier:
    """The log's tree (of every settled fact, or of the first ``size``): its ``size``, its ``root()``, and
    ``to_bytes()`` to save. ``since``: what an earlier call gave (or a bare ``tlog.Frontier`` of this log); only
    the facts after it are read and hashed, from its last seq on (a bare frontier: the database first steps over
    the facts before it in its index, O(size)). It is trusted: facts changed below its size are not read, so the
    tree extends it whatever they are now (check the database against the tree head it gave,
    :func:`against_tree_head`, to see them).

    >>> head = await tree_head(book)                              # doctest: +SKIP
    >>> later = await tree_head(book, since=head)                 # doctest: +SKIP

    Raises :class:`NotInLog` when the log has fewer settled facts than ``size``, or no longer holds the last
    leaf of ``since`` (facts it covered were removed: :func:`against_tree_head` of its tree head says more)."""
    start = tlog.Frontier() if since is None else _copy(since.frontier if isinstance(since, LogFrontier) else since)
    if size is not None:
        integer("size", size, low=start.size, high=tlog.MAX_SIZE)
    top = await settled_seq(book)

    async def read(conn: AsyncConnection) -> LogFrontier:
        after = await _last_seq(conn, top, since) if start.size else None
        frontier, last = _copy(start), after or 0
        async for rows in _rows(book, conn, top, after=after, limit=None if size is None else size - start.size):
            frontier.append(leaf_of(seq, hash_) for seq, hash_ in rows)
            last = rows[-1][0]
        _enough(frontier.size, size)
        return LogFrontier(frontier, last)

    return await _on_snapshot(book, read)


async def log_size(book: Book) -> int:
    """How many facts the log has: the size :func:`tree_head` of the whole log would give, counted without
    reading a leaf (what a checkpointer asks to see whether enough facts were written since its last tree head)."""
    top = await settled_seq(book)
    async with book.read() as conn:
        return await _count(conn, top)


async def inclusion_proof_for(book: Book, fact_id: str, size: int) -> tuple[int, list[bytes]]:
    """The fact's leaf index and its inclusion proof in the log's tree of ``size`` leaves (``tlog``'s order:
    the leaf's sibling first). Check it with ``tlog.verify_inclusion(index, size, leaf_of(seq, hash), proof,
    root)`` against the root of a tree head of that size. :class:`NotInLog` when the log has fewer settled
    facts than ``size``, or the fact is not among the first ``size``."""
    text("fact_id", fact_id, max_chars=32)
    integer("size", size, low=1, high=tlog.MAX_SIZE)
    top = await settled_seq(book)
    t = facts_table

    async def read(conn: AsyncConnection) -> tuple[int, list[bytes]]:
        query = sa.select(sa.func.min(t.c.seq)).where(t.c.id == fact_id)
        seq = (await conn.execute(query if top is None else query.where(t.c.seq <= top))).scalar()
        if seq is None:
            raise NotInLog(f"no fact with id {fact_id!r} among the log's settled facts")
        index = await _count(conn, seq - 1)
        if index >= size:
            raise NotInLog(f"fact {fact_id} is leaf {index} of the log, outside the tree of {size} leaves: ask for a "
                           f"size above {index}")
        proof = await _proof(book, conn, top, size, lambda subtree: tlog.inclusion_proof_from(index, size, subtree))
        return index, proof

    return await _on_snapshot(book, read)


async def consistency_proof_for(book: Book, old_size: int, new_size: int) -> list[bytes]:
    """The proof that the log's tree of ``old_size`` leaves is a prefix of its tree of ``new_size`` (``tlog``'s
    order: deepest first); check it with ``tlog.verify_consistency`` against two tree heads' roots.
    :class:`NotInLog` when the log has fewer settled facts than ``new_size``."""
    integer("new_size", new_size, low=0, high=tlog.MAX_SIZE)
    integer("old_size", old_size, low=0, high=new_size)
    top = await settled_seq(book)

    async def read(conn: AsyncConnection) -> list[bytes]:
        return await _proof(book, conn, top, new_size,
                            lambda subtree: tlog.consistency_proof_from(old_size, new_size, subtree))

    return await _on_snapshot(book, read)


async def against_tree_head(book: Book, head: tlog.TreeHead) -> list[Problem]:
    """Findings of the database against a tree head (its signature already checked by the caller): the first
    ``head.size`` facts in seq order must give ``head.root_hash``. Fewer facts: some up to it were cut or
    erased; another root: one was reordered, inserted, removed, re-hashed or renumbered. Facts after the size
    are growth, and no finding here: a later tree head covers them, and its consistency with this one
    (:func:`consistency_proof_for`) is what shows they only grew. Reads no more than the first ``head.size``
    facts and does not settle: an honest writer draws a seq above every fact a tree head covered."""
    problem = _bad_head(head)
    if problem is not None:
        return [("bad_tree_head", "", "", problem)]

    async def read(conn: AsyncConnection) -> tuple[tlog.Frontier, int]:
        frontier = tlog.Frontier()
        async for leaves in _leaves(book, conn, None, after=None, limit=head.size):
            frontier.append(leaves)
        return frontier, await _count(conn, None)

    frontier, total = await _on_snapshot(book, read)
    if frontier.size < head.size:
        return [("tree_head_mismatch", "", "", (
            f"the database has {total} fact(s), fewer than the {head.size} the tree head covers: facts up to it were "
            "cut or erased"))]
    root = frontier.root()
    if root == head.root_hash:
        return []
    return [("tree_head_mismatch", "", "", (
        f"the first {head.size} of the database's {total} fact(s) in seq order give the root {root.hex()[:16]}..., "
        f"the tree head says {head.root_hash.hex()[:16]}...: a fact up to it was reordered, inserted, removed, "
        "re-hashed or renumbered"))]


# -- reading --------------------------------------------------------------------------------------


def _bad_head(head: Any) -> str | None:
    if not isinstance(head, tlog.TreeHead):
        return f"not a tree head (a {type(head).__name__}): parse the checkpoint text with tlog.parse_checkpoint"
    if type(head.size) is not int or not 0 <= head.size <= tlog.MAX_SIZE:
        return f"the tree head's size is {head.size!r}, not an integer from 0 to {tlog.MAX_SIZE}"
    if type(head.root_hash) is not bytes or len(head.root_hash) != tlog.HASH_SIZE:
        return f"the tree head's root hash is not {tlog.HASH_SIZE} bytes"
    return None


def _copy(frontier: tlog.Frontier) -> tlog.Frontier:
    if not isinstance(frontier, tlog.Frontier):
        raise TypeError(f"since is a LogFrontier or a tlog.Frontier, not {type(frontier).__name__}")
    return tlog.Frontier.from_bytes(frontier.to_bytes())


async def _last_seq(conn: AsyncConnection, top: int | None, since: LogFrontier | tlog.Frontier | None) -> int:
    """The seq of the last leaf of ``since`` (not empty), which the log must still hold."""
    if isinstance(since, LogFrontier):
        query = sa.select(facts_table.c.seq).where(facts_table.c.seq == since.last_seq)
        if top is not None:
            query = query.where(facts_table.c.seq <= top)
        if (await conn.execute(query)).first() is not None:
            return since.last_seq
        raise NotInLog(f"the log holds no settled fact at seq {since.last_seq}, the last leaf of the frontier given: "
                       "facts it covered were removed (check the database against its tree head)")
    assert since is not None
    seq = await _seq_at(conn, top, since.size - 1)
    if seq is None:
        raise NotInLog(f"the log has {await _count(conn, top)} settled fact(s), fewer than the {since.size} of the "
                       "frontier given: facts it covered were removed (check the database against its tree head)")
    return seq


async def _on_snapshot(book: Book, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    """``read`` on one snapshot (a bound book: its transaction as it stands); read again leniently when stored
    text is not UTF-8 (damage, L12b)."""
    async with book.read() as conn:
        if conn.in_transaction():
            return await _leniently(book, conn, read)
        async with book.reads.snapshot(conn):
            return await _leniently(book, conn, read)


async def _leniently(book: Book, conn: AsyncConnection, read: Callable[[AsyncConnection], Awaitable[T]]) -> T:
    try:
        return await read(conn)
    except Exception as exc:
        if not book.reads.undecodable(exc):
            raise
    async with book.reads.lenient(conn):
        return await read(conn)


async def _count(conn: AsyncConnection, top: int | None) -> int:
    """How many facts have ``seq <= top`` (None: all)."""
    query = sa.select(sa.func.count()).select_from(facts_table)
    if top is not None:
        query = query.where(facts_table.c.seq <= top)
    return int((await conn.execute(query)).scalar() or 0)


async def _seq_at(conn: AsyncConnection, top: int | None, index: int) -> int | None:
    """The seq of the fact at ``index`` (from 0) in seq order among those with ``seq <= top``; None past the end."""
    if index > MAX_BIGINT:
        return None  # past any database's end, and no OFFSET takes it
    query = sa.select(facts_table.c.seq).order_by(facts_table.c.seq).offset(index).limit(1)
    if top is not None:
        query = query.where(facts_table.c.seq <= top)
    seq = (await conn.execute(query)).scalar()
    return None if seq is None else int(seq)


def _enough(have: int, size: int | None) -> None:
    """A read of at most ``size`` leaves that gave ``have`` (all the log holds when fewer) must have them all."""
    if size is not None and have < size:
        raise NotInLog(f"a tree of {size} leaves needs {size} facts; the log has {have} settled fact(s)")


async def _rows(book: Book, conn: AsyncConnection, top: int | None, *, after: int | None, limit: int | None
                ) -> AsyncIterator[Sequence[Sequence[Any]]]:
    """(seq, hash) of the facts with ``after < seq <= top`` in seq order, at most ``limit``, in batches."""
    t = facts_table
    query = sa.select(t.c.seq, t.c.hash).order_by(t.c.seq)
    if top is not None:
        query = query.where(t.c.seq <= top)
    if after is not None:
        query = query.where(t.c.seq > after)
    if limit is not None:
        query = query.limit(min(limit, MAX_BIGINT))  # no database holds more facts; a larger LIMIT overflows
    async with aclosing(book.reads.batches(conn, query, BATCH)) as batches:
        async for batch in batches:
            yield batch


async def _leaves(book: Book, conn: AsyncConnection, top: int | None, *, after: int | None, limit: int | None
                  ) -> AsyncIterator[list[bytes]]:
    """The leaf hashes of :func:`_rows`."""
    async for rows in _rows(book, conn, top, after=after, limit=limit):
        yield [leaf_of(seq, hash_) for seq, hash_ in rows]


async def _proof(book: Book, conn: AsyncConnection, top: int | None, size: int,
                 prove: Callable[[tlog.SubtreeHash], list[bytes]]) -> list[bytes]:
    """``prove(subtree)`` over the log's first ``size`` leaves: once to learn which subtrees it reads, then over
    the hashes of just those, taken from one pass over the leaves."""
    wanted: set[Subtree] = set()

    def note(start: int, height: int) -> bytes:
        wanted.add((start, height))
        return bytes(tlog.HASH_SIZE)

    prove(note)
    found = _Subtrees(wanted)
    async for leaves in _leaves(book, conn, top, after=None, limit=size):
        found.add(leaves)
    _enough(found.size, size)
    return prove(lambda start, height: found.hashes[(start, height)])


class _Subtrees:
    """The hashes of the wanted complete subtrees, taken while leaves stream by: the frontier's merges (one node
    hash per leaf) pass every complete subtree once, at the leaf that ends it."""

    def __init__(self, wanted: set[Subtree]) -> None:
        self.ends: dict[int, set[int]] = {}
        for start, height in wanted:
            self.ends.setdefault(start + (1 << height), set()).add(height)
        self.hashes: dict[Subtree, bytes] = {}
        self.edge: list[bytes] = []
        self.size = 0

    def add(self, leaves: Iterable[bytes]) -> None:
        node_hash, edge, ends = tlog.node_hash, self.edge, self.ends
        for node in leaves:
            size = self.size + 1
            heights = ends.get(size)
            if heights is not None and 0 in heights:
                self.hashes[(size - 1, 0)] = node
            height, bits = 0, self.size
            while bits & 1:
                node = node_hash(edge.pop(), node)
                height += 1
                bits >>= 1
                if heights is not None and height in heights:
                    self.hashes[(size - (1 << height), height)] = node
            edge.append(node)
            self.size = size
