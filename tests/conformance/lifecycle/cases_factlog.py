"""Conformance cases for the fact log as a Merkle tree (specs/audit.md A6): the tree head and the proofs the
database gives, against leaves computed here from its rows, and verify against a tree head."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

import pytest
import sqlalchemy as sa

import statebook.lifecycle.factlog as factlog
from statebook.lifecycle import Book, NewEntity, create_many, purge, transition, verify
from statebook.lifecycle.chain import against_checkpoint, checkpoint, key_chain
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.errors import InvalidArgument
from statebook.lifecycle.facts import facts_table
from statebook.lifecycle.factlog import (
    LogFrontier,
    NotInLog,
    against_tree_head,
    consistency_proof_for,
    inclusion_proof_for,
    log_size,
    tree_head,
)
from statebook.lifecycle.testing.cases import walked
from statebook.lifecycle import tlog

from .cases_audit import swap_seq
from .forgeries import cut_tail, erased, facts_of, forged_rehashed, inserted, reordered, sql
from .support import CREATED, FINISHED, OPERATOR, PURGED, SYSTEM, execute, new_task, start, task_values

ORIGIN = "conformance.example/log"


async def log_rows(book: Book) -> list[tuple[int, str]]:
    """(seq, hash) of every fact in seq order, read with plain SQL."""
    t = facts_table
    async with book.engine.connect() as conn:
        return [tuple(r) for r in await conn.execute(sa.select(t.c.seq, t.c.hash).order_by(t.c.seq))]


def leaves_of(rows: list[tuple[int, str]]) -> list[bytes]:
    """The leaf hashes spelled out from A6, not through tlog.fact_leaf: SHA-256 of 0x00, ``statebook fact v1``, a
    newline, the seq in decimal, a newline and the stored hash."""
    return [hashlib.sha256(b"\x00statebook fact v1\n" + f"{seq}\n{h}".encode()).digest() for seq, h in rows]


async def leaves(book: Book) -> list[bytes]:
    return leaves_of(await log_rows(book))


async def leaves_in(tx: Book) -> list[bytes]:
    """The leaves as a bound book's transaction sees them."""
    t = facts_table
    assert tx.conn is not None
    return leaves_of([tuple(r) for r in await tx.conn.execute(sa.select(t.c.seq, t.c.hash).order_by(t.c.seq))])


def head_of(frontier: LogFrontier) -> tlog.TreeHead:
    """The tree head a checkpoint would state, through its text: what a verifier parses."""
    return tlog.parse_checkpoint(tlog.checkpoint_body(ORIGIN, frontier.size, frontier.root()))


async def history_of_every_kind(book: Book) -> None:
    """Facts of several entities interleaved: single writes, a batch, a purge."""
    await walked(book, "t1")
    await new_task(book, "t2")
    await create_many(book, "task", [NewEntity(task_values(f"batch {n}"), "open", CREATED, SYSTEM) for n in range(3)])
    await transition(book, "task", "t1", "done", expected="working", reason=FINISHED, actor=SYSTEM)
    await purge(book, "task", "t1", reason=PURGED, actor=OPERATOR)
    await walked(book, "t3")


class FactLogCases:
    """A6: the database's facts up to the settled seq, in seq order, are the leaves of an RFC 6962 tree."""

    async def test_the_tree_head_is_the_root_of_the_facts_in_seq_order(self, book: Book):
        """A6: the root of every settled fact, and of each first ``size`` of them, is ``tlog.root`` over leaves
        computed here from the rows (``log_size`` counts them); the empty log's is ``EMPTY_ROOT``; a bound book's
        includes its own writes."""
        assert (await tree_head(book)).root() == tlog.EMPTY_ROOT
        await history_of_every_kind(book)
        expected = await leaves(book)
        whole = await tree_head(book)
        assert (whole.size, whole.root()) == (len(expected), tlog.root(expected)) and whole.size == 14
        assert await log_size(book) == 14
        for size in range(len(expected) + 1):
            assert (await tree_head(book, size=size)).root() == tlog.root(expected[:size]), size
        async with book.begin() as tx:
            await new_task(tx, "uncommitted")
            inside = await tree_head(tx)  # a bound book reads its own transaction as it stands
            assert (inside.size, inside.root()) == (15, tlog.root(await leaves_in(tx)))
            assert await against_tree_head(tx, head_of(whole)) == []

    async def test_a_frontier_resumes_and_reads_only_the_facts_after_it(self, book: Book, monkeypatch):
        """A6: ``tree_head(since=f)`` hashes only the facts after f and gives the whole tree's root and last seq,
        from a saved log frontier (its bytes) or a bare ``tlog.Frontier`` alike; f is not changed."""
        await walked(book, "t1")
        saved = LogFrontier.from_bytes((await tree_head(book)).to_bytes())
        assert (saved.size, saved.last_seq) == (4, (await log_rows(book))[3][0])
        await walked(book, "t2")
        await new_task(book, "t3")
        rows = await log_rows(book)
        expected = leaves_of(rows)
        real = factlog.leaf_of
        for since in (saved, saved.frontier):
            hashed: list[int] = []
            monkeypatch.setattr(factlog, "leaf_of", lambda seq, h: hashed.append(seq) or real(seq, h))
            resumed = await tree_head(book, since=since)
            assert (resumed.size, resumed.root(), resumed.last_seq) == (9, tlog.root(expected), rows[-1][0])
            assert hashed == [seq for seq, _ in rows[4:]], "only the five new facts are read"
            assert since.size == 4, "the frontier given is not changed"
            assert (await tree_head(book, size=6, since=since)).root() == tlog.root(expected[:6])
            again = await tree_head(book, since=resumed)
            assert (again.size, again.root(), again.last_seq) == (9, resumed.root(), resumed.last_seq)
        empty = await tree_head(book, size=0)
        assert (empty.last_seq, LogFrontier.from_bytes(empty.to_bytes()).root()) == (0, tlog.EMPTY_ROOT)
        for bad in (b"", saved.to_bytes()[:-1], bytes(8) + saved.frontier.to_bytes(), (5).to_bytes(8, "big") + bytes(8)):
            with pytest.raises(ValueError):
                LogFrontier.from_bytes(bad)

    async def test_sizes_beyond_the_log_are_refused(self, book: Book):
        """A6: a tree larger than the log's settled facts, a frontier larger than the log (facts it covered were
        removed), or a fact outside the tree is :class:`NotInLog`, saying how many facts there are."""
        await walked(book, "t1")
        with pytest.raises(NotInLog, match="has 4 settled fact"):
            await tree_head(book, size=5)
        with pytest.raises(NotInLog, match="has 4 settled fact"):
            await consistency_proof_for(book, 2, 5)
        frontier = await tree_head(book)
        await execute(book, sa.delete(facts_table).where(facts_table.c.seq == frontier.last_seq))
        with pytest.raises(NotInLog, match=f"no settled fact at seq {frontier.last_seq}, the last leaf of the frontier"):
            await tree_head(book, since=frontier)
        with pytest.raises(NotInLog, match="fewer than the 4 of the frontier"):
            await tree_head(book, since=frontier.frontier)
        huge = tlog.Frontier.from_bytes(tlog.MAX_SIZE.to_bytes(8, "big") + bytes(32) * 64)
        with pytest.raises(NotInLog, match="fewer than the 18446744073709551615 of the frontier"):
            await tree_head(book, since=huge)
        with pytest.raises(NotInLog, match="the log has 3 settled fact"):
            await consistency_proof_for(book, 0, tlog.MAX_SIZE)
        last = (await book_fact_ids(book))[-1]
        with pytest.raises(NotInLog, match="leaf 2 of the log, outside the tree of 2"):
            await inclusion_proof_for(book, last, 2)
        with pytest.raises(NotInLog, match="no fact with id"):
            await inclusion_proof_for(book, "0" * 32, 3)
        with pytest.raises(InvalidArgument):
            await tree_head(book, size=1, since=frontier)  # below the frontier's size
        with pytest.raises(InvalidArgument):
            await consistency_proof_for(book, 3, 2)

    async def test_inclusion_proofs_verify_for_every_fact_and_size(self, book: Book, monkeypatch):
        """A6: each fact's proof in every tree that holds it is tlog's proof over the leaves computed here and
        verifies against that tree's root; read in batches smaller than the tree, the same."""
        await history_of_every_kind(book)
        monkeypatch.setattr(factlog, "BATCH", 4)
        expected = await leaves(book)
        ids = await book_fact_ids(book)
        for index, fact_id in enumerate(ids):
            for size in range(index + 1, len(ids) + 1, 3):
                got, proof = await inclusion_proof_for(book, fact_id, size)
                assert got == index and proof == tlog.inclusion_proof(index, expected[:size]), (index, size)
                assert tlog.verify_inclusion(index, size, expected[index], proof, tlog.root(expected[:size]))

    async def test_consistency_proofs_verify_between_sizes(self, book: Book, monkeypatch):
        """A6: the proof from each older size to each newer one is tlog's over the leaves computed here and
        verifies against the two roots; read in batches smaller than the tree, the same."""
        await history_of_every_kind(book)
        monkeypatch.setattr(factlog, "BATCH", 4)
        expected = await leaves(book)
        for old in range(len(expected) + 1):
            for new in range(old, len(expected) + 1, 2):
                proof = await consistency_proof_for(book, old, new)
                assert proof == tlog.consistency_proof(old, expected[:new]), (old, new)
                assert tlog.verify_consistency(old, new, tlog.root(expected[:old]), tlog.root(expected[:new]), proof)

    async def test_verify_against_a_tree_head_is_a_finding_of_its_own(self, book: Book):
        """A6: ``verify(tree_head=...)`` passes on the honest log and after growth, whatever type it narrows to; a
        log that no longer gives the root is one ``tree_head_mismatch`` (besides what the chain check finds), a
        tree head that is none is ``bad_tree_head``, and one of any size is checked without an error."""
        await walked(book, "t1")
        await walked(book, "t2")
        head = head_of(await tree_head(book))
        assert (await verify(book, tree_head=head)).ok
        await new_task(book, "t3")
        assert (await verify(book, "task", tree_head=head)).ok
        rows = await log_rows(book)
        await execute(book, sa.update(facts_table).where(facts_table.c.seq == rows[2][0]).values(hash="0" * 64))
        for narrowed in (None, "dispatch"):
            found = [(f.kind, f.entity_id) for f in (await verify(book, narrowed, tree_head=head)).findings]
            assert ("tree_head_mismatch", "") in found and found.count(("tree_head_mismatch", "")) == 1, found
        (finding,) = [f for f in (await verify(book, tree_head=head)).findings if f.kind == "tree_head_mismatch"]
        assert "the first 8 of the database's 9 fact(s)" in finding.detail and "re-hashed" in finding.detail
        broken = tlog.TreeHead(ORIGIN, 8, b"short")
        assert [f.kind for f in (await verify(book, "dispatch", tree_head=broken)).findings] == ["bad_tree_head"]
        huge = tlog.TreeHead(ORIGIN, tlog.MAX_SIZE, bytes(32))  # a size no database's LIMIT takes
        (finding,) = (await verify(book, "dispatch", tree_head=huge)).findings
        assert finding.kind == "tree_head_mismatch" and "fewer than the 18446744073709551615" in finding.detail

    async def test_damage_is_a_finding_never_a_crash(self, book: Book, backend: str):
        """A6 / L12b: a stored hash that is not text, or not UTF-8, or a negative seq, still gives the log a root
        (no honest one) and is a tree_head_mismatch against the head taken before."""
        await walked(book, "t1")
        head = head_of(await tree_head(book))
        seq = (await log_rows(book))[1][0]
        values = [sa.text("CAST(X'80ff' AS TEXT)"), sa.text("X'00'")] if backend == "sqlite" else ["\x7f"]
        for value in values:
            await execute(book, sa.update(facts_table).where(facts_table.c.seq == seq).values(hash=value))
            assert (await tree_head(book)).root() != head.root_hash
            assert [p[0] for p in await against_tree_head(book, head)] == ["tree_head_mismatch"]
        await execute(book, sa.update(facts_table).where(facts_table.c.seq == seq).values(seq=-seq))
        assert (await tree_head(book)).root() != head.root_hash
        assert [p[0] for p in await against_tree_head(book, head)] == ["tree_head_mismatch"]


async def book_fact_ids(book: Book) -> list[str]:
    t = facts_table
    async with book.engine.connect() as conn:
        return list((await conn.execute(sa.select(t.c.id).order_by(t.c.seq))).scalars())


# -- the adversarial suite --------------------------------------------------------------------------------------

KEY = ChainKey(b"k" * 32)
KEYED = pytest.mark.parametrize("keyed", [False, True], ids=["plain", "keyed"])
"""Each attack on a database with plain facts (the plain chain, a heads checkpoint, a tree head), and on one
keyed from its first fact (the keyed chain)."""


async def swapped_across(book: Book) -> None:
    """The victim's last fact and the next fact in seq, another entity's first, trade seqs (hashes untouched):
    each entity's seq still rises with its versions, but a tail or an export reads them in another order."""
    last = (await facts_of(book, "victim"))[-1]
    t = facts_table
    async with book.engine.connect() as conn:
        after = (await conn.execute(sa.select(sa.func.min(t.c.seq)).where(t.c.seq > last.seq))).scalar_one()
    await swap_seq(book, last.seq, after)


async def renumbered(book: Book) -> None:
    """The victim's facts and every later one move 1000 up in seq, in the same order (hashes untouched)."""
    first = (await facts_of(book, "victim"))[0]
    await sql(book, "UPDATE status_transitions SET seq = seq + 1000 WHERE seq >= :s", s=first.seq)


async def attack(book: Book, keyed: bool, forge: Callable[[Book], Awaitable[None]], *, after: bool
                 ) -> dict[str, set[str]]:
    """The finding kinds of each anchor once ``forge`` has run: ``keyed chain`` (verify with the key) on a keyed
    database; on a plain one ``plain chain`` (verify), ``heads checkpoint`` (against_checkpoint) and ``tree
    head`` (against_tree_head), both taken before the victim's facts when ``after``, and then ``next tree head``:
    one taken after them, before the forgery, whose consistency with the first is checked first.

    The tasks a1 and z9 (and the victim, unless ``after``) have two facts each when the anchors are taken; then
    one more entity is written (two facts, after the victim's when ``after``), so the log grows past the size."""
    if keyed:
        book = book.with_chain_key(KEY)
        await key_chain(book)
    for entity_id in ("a1", "z9") if after else ("a1", "victim", "z9"):
        await new_task(book, entity_id)
        await start(book, entity_id)
    body = await checkpoint(book)
    head = head_of(await tree_head(book))
    for entity_id in ("victim", "zz") if after else ("zz",):
        await new_task(book, entity_id)
        await start(book, entity_id)
    later = head_of(await tree_head(book))
    assert tlog.verify_consistency(head.size, later.size, head.root_hash, later.root_hash,
                                   await consistency_proof_for(book, head.size, later.size))
    clean = (await verify(book, checkpoint=body, tree_head=head)).findings + (await verify(book, tree_head=later)).findings
    assert not clean, clean
    await forge(book)
    if keyed:
        return {"keyed chain": {f.kind for f in (await verify(book)).findings}}
    found = {"plain chain": {f.kind for f in (await verify(book)).findings},
             "heads checkpoint": {p[0] for p in await against_checkpoint(book, body)},
             "tree head": {p[0] for p in await against_tree_head(book, head)}}
    if after:
        found["next tree head"] = {p[0] for p in await against_tree_head(book, later)}
    return found


def expect(keyed: bool, *, plain: set[str], keyed_chain: set[str], checkpoint: set[str], tree: set[str],
           after: bool) -> dict[str, set[str]]:
    if keyed:
        return {"keyed chain": keyed_chain}
    found = {"plain chain": plain, "heads checkpoint": checkpoint, "tree head": tree}
    if after:
        found["next tree head"] = {"tree_head_mismatch"}
    return found


MISMATCH = {"tree_head_mismatch"}
NONE: set[str] = set()


class FactLogAttackCases:
    """A6's table: each attack up to a tree head's size and after it, by an attacker with write access to the
    database (raw SQL) who knows the plain hashing (``facts.fact_hash``, the leaf format) but holds neither the
    signing key of the tree heads and checkpoints nor the chain key. Every cell of the table is asserted, the
    "not detected" ones too."""

    @KEYED
    async def test_a_seq_swap_within_an_entity_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's two facts trade seqs
        (hashes untouched), below the size: the chain's seq order (L12d) and the tree head find it."""
        got = await attack(book, keyed, reordered, after=False)
        assert got == expect(keyed, plain={"seq_out_of_order"}, keyed_chain={"seq_out_of_order"}, checkpoint=NONE,
                             tree=MISMATCH, after=False)

    @KEYED
    async def test_a_seq_swap_within_an_entity_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same swap after the size: the chain's
        seq order finds it; the tree head does not (those leaves are not in it), the next one does."""
        got = await attack(book, keyed, reordered, after=True)
        assert got == expect(keyed, plain={"seq_out_of_order"}, keyed_chain={"seq_out_of_order"}, checkpoint=NONE,
                             tree=NONE, after=True)

    @KEYED
    async def test_a_seq_swap_across_entities_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's last fact and the next
        entity's first trade seqs, below the size: every chain still rises in seq and every head is the same, so
        only the tree head finds it."""
        got = await attack(book, keyed, swapped_across, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint=NONE, tree=MISMATCH, after=False)

    @KEYED
    async def test_a_seq_swap_across_entities_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same swap after the size: no anchor
        taken before it finds it; the next tree head does."""
        got = await attack(book, keyed, swapped_across, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint=NONE, tree=NONE, after=True)

    @KEYED
    async def test_a_cut_tail_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's last fact deleted and its
        row rewritten, below the size: the heads checkpoint and the tree head find it, no chain does."""
        got = await attack(book, keyed, cut_tail, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint={"truncated", "fact_count"},
                             tree=MISMATCH, after=False)

    @KEYED
    async def test_a_cut_tail_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same cut after the size: nothing
        taken before it finds it; the next tree head does."""
        got = await attack(book, keyed, cut_tail, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint=NONE, tree=NONE, after=True)

    @KEYED
    async def test_an_inserted_fact_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. A fact inserted into the victim's
        history below the size, its successor moved after it in seq and the chain re-hashed: the keyed chain, the
        heads checkpoint and the tree head find it."""
        got = await attack(book, keyed, inserted, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain={"hash_mismatch"}, checkpoint={"truncated", "fact_count"},
                             tree=MISMATCH, after=False)

    @KEYED
    async def test_an_inserted_fact_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same insertion after the size: the
        keyed chain finds it; of the anchors taken before, none; the next tree head does."""
        got = await attack(book, keyed, inserted, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain={"hash_mismatch"}, checkpoint=NONE, tree=NONE, after=True)

    @KEYED
    async def test_an_erased_entity_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's facts and row deleted, below
        the size: the heads checkpoint and the tree head find it, no chain does."""
        got = await attack(book, keyed, erased, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint={"erased", "fact_count"}, tree=MISMATCH,
                             after=False)

    @KEYED
    async def test_an_erased_entity_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same erasure after the size: nothing
        taken before it finds it; the next tree head does."""
        got = await attack(book, keyed, erased, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint=NONE, tree=NONE, after=True)

    @KEYED
    async def test_a_rehashed_fact_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's second fact edited and it and
        everything after it in its chain re-hashed (the row too), below the size: the keyed chain, the heads
        checkpoint and the tree head find it."""
        got = await attack(book, keyed, forged_rehashed, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain={"hash_mismatch"}, checkpoint={"rewritten"},
                             tree=MISMATCH, after=False)

    @KEYED
    async def test_a_rehashed_fact_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same re-hash after the size: the
        keyed chain finds it; of the anchors taken before, none; the next tree head does."""
        got = await attack(book, keyed, forged_rehashed, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain={"hash_mismatch"}, checkpoint=NONE, tree=NONE,
                             after=True)

    @KEYED
    async def test_renumbered_facts_up_to_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The victim's facts and every later one
        moved up in seq, order kept, from below the size: the heads checkpoint (they left its seq range) and the
        tree head (a leaf binds its seq) find it, no chain does."""
        got = await attack(book, keyed, renumbered, after=False)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint={"erased", "fact_count"}, tree=MISMATCH,
                             after=False)

    @KEYED
    async def test_renumbered_facts_after_the_tree_head(self, book: Book, keyed: bool):
        """Attacker: raw SQL, the plain hashing, no signing or chain key. The same renumbering after the size:
        nothing taken before it finds it; the next tree head does."""
        got = await attack(book, keyed, renumbered, after=True)
        assert got == expect(keyed, plain=NONE, keyed_chain=NONE, checkpoint=NONE, tree=NONE, after=True)
