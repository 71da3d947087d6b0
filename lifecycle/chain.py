"""History an auditor can check: the keyed chain's switch-over, chain heads and their Merkle root, checkpoints.

Three defences against someone who can write the database and knows the hashing (specs/audit.md):

- **A keyed chain.** With a :class:`~.chainkey.ChainKey` on the book, each fact's hash is the HMAC-SHA256 of
  the bytes ``facts.fact_hash`` hashes; a forger without the key cannot make a fact that verifies. A database
  with plain facts turns keyed at a *switch-over* (:func:`key_chain`), recorded in ``statebook_chain``: the
  highest ``seq`` S at that moment, the count of facts, the Merkle root of every entity's chain head and the
  key's id, all under an HMAC with the key. While the key is configured, verify requires that record: every
  fact with ``seq > S`` must be keyed, and the facts with ``seq <= S`` must give the recorded root again — so
  no one can downgrade (write a plain fact, move S, delete the record, backdate a fact below S) without the
  key, and the plain history before S is pinned too.
- **Checkpoints** (:func:`checkpoint`): the Merkle root over (entity_type, entity_id, version, head hash) of
  every entity, the fact count, the highest seq and the time, with the heads themselves. Verify against one
  (:func:`against_checkpoint`): the heads of the facts with ``seq <= max_seq`` must be the checkpoint's — an
  entity erased, a tail cut, a chain re-hashed or a fact backdated all change them; facts after it are growth.
  Signing (Ed25519) is the adapters' part: this module defines the bytes that are signed (:func:`signed_bytes`).
- **The chain check of facts alone** (:func:`chain_findings`), for audit bundles checked offline.

Imports only the standard library and this package.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from .codec import dumps, keyed_digest
from .errors import StatebookError
from .facts import GENESIS, Fact, fact_hash, facts_table, legacy_fact_hash
from .schema import metadata

if TYPE_CHECKING:
    from .book import Book

CHECKPOINT_FORMAT = "statebook-checkpoint/1"
SETTLE_SECONDS = 30.0
"""How long a checkpoint or the switch-over waits for writers still holding a seq below the highest committed one."""
MAX_BIGINT = 2**63 - 1
"""The highest seq a database holds: a checkpoint's counts above it are no counts (and no query parameter)."""

chain_table = sa.Table(
    "statebook_chain",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("keyed_after", sa.BigInteger, nullable=False),
    sa.Column("facts", sa.BigInteger, nullable=False),
    sa.Column("root", sa.String(64), nullable=False),
    sa.Column("key_id", sa.String(16), nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("mac", sa.String(64), nullable=False),
)
"""The switch-over of a keyed chain: one row (id 1)."""


class ChainKeyMismatch(StatebookError):
    """The configured chain key is not the key this database's chain was keyed with."""


class ChainKeyRequired(StatebookError):
    """A write to a database whose chain is keyed, by a book without the chain key: its facts would carry plain
    hashes, which verify reports as forgeries. Nothing was written."""


def write_refusal(keyed_with: str, key_id: str | None) -> StatebookError:
    """Why a book holding the key ``key_id`` (None: no key) must not write to a chain keyed with ``keyed_with``."""
    if key_id is None:
        return ChainKeyRequired(
            f"this database's fact chain is keyed (key id {keyed_with}): a book without the chain key cannot write "
            "to it (its facts would be plain, and verify would report them as forged); open it with the key "
            "(open_book(chain_key=...)); nothing was written")
    return ChainKeyMismatch(
        f"this database's chain was keyed with the key whose id is {keyed_with}; the configured chain key's id is "
        f"{key_id}: configure the key the chain was keyed with; nothing was written")


@dataclass(frozen=True)
class Switch:
    """The recorded switch-over: facts with ``seq > keyed_after`` are keyed with the key ``key_id`` names."""

    keyed_after: int
    facts: int
    root: str
    key_id: str
    at: float
    mac: str

    def expected_mac(self, key: bytes) -> str:
        """The HMAC the switch-over record must carry under ``key``, over its position, count, root, key id and
        time.
        """
        return keyed_digest(key, "statebook chain switch-over", str(self.keyed_after), str(self.facts), self.root,
                            self.key_id, repr(float(self.at)))


@dataclass(frozen=True)
class Rule:
    """How verify hashes a fact: plain up to ``keyed_after`` (None: every fact), keyed after it with
    ``key`` (None: the keyed facts' hashes cannot be checked here, only their links)."""

    key: bytes | None = None
    keyed_after: int | None = None

    def keyed(self, fact: Fact) -> bool:
        """Whether ``fact`` must carry a keyed hash (a damaged, non-integer seq: yes, so it fails)."""
        if self.keyed_after is None:
            return False
        return not (type(fact.seq) is int and fact.seq <= self.keyed_after)

    def intact(self, fact: Fact) -> bool | None:
        """Whether the fact's hash is the one its content gives: None when it is keyed and there is no key."""
        try:
            if self.keyed(fact):
                if self.key is None:
                    return None
                return hmac.compare_digest(str(fact.hash), fact_hash(fact.content(), fact.prev_hash, self.key))
            # Facts written before the stored-text hash carry the earlier definition.
            return fact.hash in (fact_hash(fact.content(), fact.prev_hash), legacy_fact_hash(fact.content(), fact.prev_hash))
        except (TypeError, ValueError, OverflowError):  # a value no fact could have been hashed with
            return False


# -- heads and their Merkle root ------------------------------------------------------------------

Head = tuple[str, str, int, str]
"""(entity_type, entity_id, version, hash) of an entity's last fact."""


def _leaf(head: Sequence[Any]) -> bytes:
    return hashlib.sha256(b"\x00" + dumps(list(head)).encode()).digest()


def merkle_root(heads: Iterable[Sequence[Any]]) -> str:
    """The Merkle root (hex) over heads in the order given (sorted by (type, id)): leaves are
    SHA-256 of ``0x00 || canonical JSON``, nodes SHA-256 of ``0x01 || left || right``, an odd node
    goes up as it is. Of no heads: SHA-256 of nothing."""
    level = [_leaf(h) for h in heads]
    if not level:
        return hashlib.sha256(b"").hexdigest()
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


@dataclass(frozen=True)
class ChainHeads:
    """Every entity's chain head among the facts read, in (type, id) order; their count and highest seq."""

    heads: list[Head]
    facts: int
    max_seq: int

    @property
    def root(self) -> str:
        """The Merkle root of the chain heads."""
        return merkle_root(self.heads)


def heads_of(rows: Iterable[Sequence[Any]]) -> ChainHeads:
    """:class:`ChainHeads` of (entity_type, entity_id, version, hash, seq) rows in any order."""
    last: dict[tuple[str, str], tuple[int, str]] = {}
    facts = max_seq = 0
    for entity_type, entity_id, version, hash_, seq in rows:
        facts += 1
        if type(seq) is int and seq > max_seq:
            max_seq = seq
        key = (entity_type, entity_id)
        found = last.get(key)
        if found is None or _order(version) > _order(found[0]):
            last[key] = (version, hash_)
    heads = [(t, i, v, h) for (t, i), (v, h) in sorted(last.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1])))]
    return ChainHeads(heads, facts, max_seq)


def _order(version: Any) -> float:
    return version if type(version) is int else float("inf")  # damage sorts last (and then fails a check)


async def heads(book: Book, *, up_to_seq: int | None = None, entity_type: str | None = None) -> ChainHeads:
    """The chain heads of the facts with ``seq <= up_to_seq`` (None: all), of one type or all, from one
    snapshot. Reads five narrow columns in seq order (the primary key), about a second per million facts."""
    async with book.read() as conn:
        if conn.in_transaction():
            return await _heads(conn, up_to_seq, entity_type)
        async with book.reads.snapshot(conn):
            return await _heads(conn, up_to_seq, entity_type)


async def settled_seq(book: Book) -> int | None:
    """The highest seq committed now, once the facts up to it are final: on PostgreSQL a writer may still hold a
    lower seq and commit after (L12d), so this waits for it (``Reads.settle``). What pins the facts up to a seq
    (a checkpoint, an export's) reads only those. None for a bound book: it reads its own transaction as it
    stands (waiting there could wait for itself)."""
    if book.conn is not None:
        return None
    async with book.read() as conn:
        top = await _top_seq(conn)
    await book.reads.settle(SETTLE_SECONDS)
    return top


async def settled_heads(book: Book, *, entity_type: str | None = None) -> ChainHeads:
    """:func:`heads` of the facts up to :func:`settled_seq` (a bound book: all it sees)."""
    return await heads(book, up_to_seq=await settled_seq(book), entity_type=entity_type)


async def _top_seq(conn: Any) -> int:
    """The highest seq committed (0 with no facts)."""
    return int((await conn.execute(sa.select(sa.func.coalesce(sa.func.max(facts_table.c.seq), 0)))).scalar())


async def _heads(conn: Any, up_to_seq: int | None, entity_type: str | None) -> ChainHeads:
    t = facts_table
    query = sa.select(t.c.entity_type, t.c.entity_id, t.c.version, t.c.hash, t.c.seq)
    if up_to_seq is not None:
        query = query.where(t.c.seq <= up_to_seq)
    if entity_type is not None:
        query = query.where(t.c.entity_type == entity_type)
    result = await conn.stream(query.order_by(t.c.seq).execution_options(yield_per=5000))
    rows = [tuple(r) async for r in result]
    return heads_of(rows)


# -- the switch-over -------------------------------------------------------------------------------


async def read_switch(book: Book) -> Switch | None:
    """The recorded switch-over, or None when the chain was never keyed."""
    async with book.read() as conn:
        row = (await conn.execute(sa.select(chain_table).where(chain_table.c.id == 1))).first()
    if row is None:
        return None
    m = row._mapping
    return Switch(int(m["keyed_after"]), int(m["facts"]), m["root"], m["key_id"], float(m["at"]), m["mac"])


async def key_chain(book: Book) -> Switch:
    """Record the switch-over to ``book.chain_key`` when the database has none; the recorded one otherwise.

    Raises :class:`ChainKeyMismatch` when the database was keyed with another key (nothing is written).
    Run it before the book writes (``open_book`` does, given a key) and while no writer without the key
    runs: a plain fact committed after the record with a lower seq would be a finding."""
    key = book.chain_key
    if key is None:
        raise ChainKeyMismatch("key_chain needs a book with a chain key (Book.with_chain_key)")
    found = await read_switch(book)
    if found is None:
        async with book.store.begin() as conn:
            row = (await conn.execute(sa.select(chain_table.c.id).where(chain_table.c.id == 1))).first()
            if row is None:
                # The facts up to S must be final before their root is recorded (Reads.settle, L12d).
                top = await _top_seq(conn)
                await book.reads.settle(SETTLE_SECONDS)
                now = await _heads(conn, top, None)
                draft = Switch(top, now.facts, now.root, key.id, float(book.clock.now()), "")
                record = {**draft.__dict__, "mac": draft.expected_mac(key.secret)}
                await conn.execute(sa.insert(chain_table).values(id=1, **record))
        found = await read_switch(book)
        assert found is not None
    if found.key_id != key.id:
        raise write_refusal(found.key_id, key.id)
    return found


Problem = tuple[str, str, str, str]
"""(kind, entity_type, entity_id, detail): what verify turns into a Finding."""


async def chain_rule(book: Book) -> tuple[Rule | None, list[Problem], list[str], Switch | None]:
    """How verify hashes facts on this database with this book's key: (rule, problems, notes, switch).

    A rule of None means verify must stop at the problems (a wrong or missing key, a forged record):
    every keyed fact would otherwise be reported once more."""
    switch = await read_switch(book)
    key = book.chain_key
    if switch is None:
        if key is None:
            return Rule(), [], [], None
        return None, [("chain_not_keyed", "", "", (
            f"a chain key (id {key.id}) is configured but this database has no switch-over record: it was never "
            "keyed, or the record was deleted. Open it with the key to key it (open_book records the switch-over) "
            "or verify without the key"))], [], None
    if key is None:
        return Rule(None, switch.keyed_after), [], [(
            f"the chain is keyed (key id {switch.key_id}) from seq {switch.keyed_after + 1}: without the chain key "
            "those facts' hashes were not checked, only their links")], switch
    if switch.key_id != key.id:
        return None, [("wrong_chain_key", "", "", (
            f"the configured chain key has id {key.id}, but this database's chain was keyed with the key whose id "
            f"is {switch.key_id}: verify with that key"))], [], switch
    if not hmac.compare_digest(str(switch.mac), switch.expected_mac(key.secret)):
        return None, [("switch_forged", "", "", (
            "the switch-over record (statebook_chain) does not match its HMAC under the configured key: it was "
            "edited (a moved switch-over would pass plain facts as old ones)"))], [], switch
    return Rule(key.secret, switch.keyed_after), [], [], switch


async def switch_problems(book: Book, switch: Switch) -> list[Problem]:
    """The facts up to the switch-over must give its recorded count and root (they are pinned by it)."""
    before = await heads(book, up_to_seq=switch.keyed_after)
    if before.facts == switch.facts and before.root == switch.root:
        return []
    return [("switch_root_mismatch", "", "", (
        f"the facts written before the chain was keyed (seq <= {switch.keyed_after}) are not those recorded at the "
        f"switch-over: {before.facts} fact(s) with root {before.root[:16]}..., recorded {switch.facts} with root "
        f"{switch.root[:16]}... (a fact before the switch-over was changed, removed or backdated)"))]


# -- checkpoints -----------------------------------------------------------------------------------


async def checkpoint(book: Book, entity_type: str | None = None) -> dict[str, Any]:
    """A checkpoint of every entity's chain head (of one type, or all) as a JSON-ready dict.

    >>> body = await checkpoint(book)            # doctest: +SKIP
    >>> body["root"], body["facts"], body["max_seq"]  # doctest: +SKIP
    """
    if entity_type is not None:
        book.policy(entity_type)
    found = await settled_heads(book, entity_type=entity_type)
    return checkpoint_body(found, at=float(book.clock.now()), entity_type=entity_type,
                           chain_key_id=None if book.chain_key is None else book.chain_key.id)


def checkpoint_body(found: ChainHeads, *, at: float, entity_type: str | None = None, chain_key_id: str | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The JSON of a checkpoint over ``found``."""
    return {
        "format": CHECKPOINT_FORMAT, "at": at, "entity_type": entity_type, "facts": found.facts,
        "max_seq": found.max_seq, "entities": len(found.heads), "root": found.root, "chain_key_id": chain_key_id,
        **(extra or {}), "heads": [list(h) for h in found.heads],
    }


def signed_bytes(body: Mapping[str, Any]) -> bytes:
    """The bytes a checkpoint's signature covers: its canonical JSON (heads included)."""
    return dumps(dict(body)).encode()


def checkpoint_problems(body: Any) -> list[str]:
    """What makes ``body`` no checkpoint, or one that contradicts itself (heads that do not give its root)."""
    if not isinstance(body, dict) or body.get("format") != CHECKPOINT_FORMAT:
        return [f"not a statebook checkpoint (format {CHECKPOINT_FORMAT!r} expected)"]
    try:
        heads_ = [tuple(h) for h in body["heads"]]
        shaped = all(len(h) == 4 and [type(x) for x in h] == [str, str, int, str] for h in heads_)
        counts = all(type(body[k]) is int and 0 <= body[k] <= MAX_BIGINT for k in ("facts", "max_seq", "entities"))
        if not shaped or not counts or not (body.get("entity_type") is None or type(body["entity_type"]) is str):
            return ["the checkpoint's fields do not have their types"]
    except (KeyError, TypeError):
        return ["the checkpoint lacks a field (heads, facts, max_seq, entities, root)"]
    problems = []
    if merkle_root(heads_) != body.get("root"):
        problems.append("the checkpoint's heads do not give its root: it was edited")
    if len(heads_) != body["entities"]:
        problems.append(f"the checkpoint lists {len(heads_)} heads but says {body['entities']} entities")
    return problems


def compare_heads(body: Mapping[str, Any], now: ChainHeads) -> list[Problem]:
    """Findings of ``now`` (the heads of facts with ``seq <= body['max_seq']``) against a checkpoint."""
    found: list[Problem] = []
    expected = {(h[0], h[1]): (h[2], h[3]) for h in body["heads"]}
    current = {(h[0], h[1]): (h[2], h[3]) for h in now.heads}
    for (entity_type, entity_id), (version, hash_) in expected.items():
        got = current.get((entity_type, entity_id))
        if got is None:
            found.append(("erased", entity_type, entity_id,
                          f"in the checkpoint at version {version}, but none of its facts up to seq {body['max_seq']} exists"))
        elif _order(got[0]) < version:
            found.append(("truncated", entity_type, entity_id,
                          f"its history up to seq {body['max_seq']} ends at version {got[0]}, below the checkpoint's {version}"))
        elif got[0] != version:
            found.append(("rewritten", entity_type, entity_id,
                          f"its history up to seq {body['max_seq']} reaches version {got[0]}, the checkpoint says {version} "
                          "(a fact was inserted or backdated)"))
        elif got[1] != hash_:
            found.append(("rewritten", entity_type, entity_id,
                          f"its head at version {version} hashes to {str(got[1])[:16]}..., the checkpoint says {hash_[:16]}... "
                          "(its history was re-hashed)"))
    for entity_type, entity_id in current.keys() - expected.keys():
        found.append(("not_in_checkpoint", entity_type, entity_id,
                      f"facts with seq <= {body['max_seq']} that the checkpoint does not list (backdated)"))
    if now.facts != body["facts"]:
        found.append(("fact_count", body.get("entity_type") or "", "",
                      f"{now.facts} fact(s) with seq <= {body['max_seq']}, the checkpoint counted {body['facts']}"))
    return found


async def against_checkpoint(book: Book, body: Mapping[str, Any]) -> list[Problem]:
    """Findings of the database against a checkpoint (see the module docstring); facts after it are growth."""
    problems = checkpoint_problems(body)
    if problems:
        return [("bad_checkpoint", "", "", p) for p in problems]
    now = await heads(book, up_to_seq=body["max_seq"], entity_type=body.get("entity_type"))
    return compare_heads(body, now)


# -- a chain from its facts alone ----------------------------------------------------------------


def out_of_seq(fact: Fact, top: tuple[int, Any] | None) -> str | None:
    """Why ``fact`` breaks its entity's seq order (L12d), or None. ``top``: the highest (seq, version) among
    the entity's earlier facts. Within one entity every writer holds the row (SQLite's single writer, a row
    lock on PostgreSQL) from before its seq is drawn until it commits, so an honest seq rises with the
    version; across entities seq may commit in any order, which is no finding."""
    if top is None or type(fact.seq) is not int or fact.seq > top[0]:
        return None
    return (f"fact {fact.id} (version {fact.version!r}) has seq {fact.seq}, not above the seq {top[0]} of version "
            f"{top[1]!r}: read in seq order (a tail, an export, a projection) the history runs backwards")


def seq_top(fact: Fact, top: tuple[int, Any] | None) -> tuple[int, Any] | None:
    """``top`` after ``fact`` (see :func:`out_of_seq`); a fact without an integer seq leaves it as it is."""
    if type(fact.seq) is int and (top is None or fact.seq > top[0]):
        return fact.seq, fact.version
    return top


def chain_findings(facts: Sequence[Fact], rule: Rule = Rule()) -> list[tuple[str, str, str | None]]:
    """(kind, detail, fact id) for each break in one entity's facts (oldest first): links, versions,
    hashes under ``rule``, the status carried from one fact to the next, seq rising with the version. No
    policy and no row: what an audit bundle can check offline."""
    found: list[tuple[str, str, str | None]] = []
    prev_id, prev_hash, prev_status, version = GENESIS, GENESIS, None, 0
    top: tuple[int, Any] | None = None
    for f in facts:
        if f.prev_fact_id != prev_id or f.prev_hash != prev_hash:
            found.append(("broken_chain", f"fact {f.id} links to {f.prev_fact_id or 'genesis'!r}, expected "
                          f"{prev_id or 'genesis'!r} (a fact is missing or reordered)", f.id))
        if rule.intact(f) is False:
            found.append(("hash_mismatch", f"fact {f.id} does not match its hash", f.id))
        if f.previous_status != prev_status:
            found.append(("status_discontinuity", f"fact {f.id} starts from {f.previous_status!r}, the entity was "
                          f"{prev_status!r}", f.id))
        if f.version != version + 1:
            found.append(("version_gap", f"fact {f.id} has version {f.version!r}, expected {version + 1}", f.id))
        reordered = out_of_seq(f, top)
        if reordered is not None:
            found.append(("seq_out_of_order", reordered, f.id))
        top = seq_top(f, top)
        prev_id, prev_hash, prev_status = f.id, f.hash, f.status
        version = f.version if type(f.version) is int else version + 1
    return found
