"""Proofs for one fact (issue 31, C2SP tlog-proof): `check_proof` confirms one fact is in the log a signed
checkpoint states, offline, from the fact, the proof and the log's public key.

Attacker: database write access (it may edit a fact and re-hash it with the plain hashing), no signing key, no
chain key; it hands the auditor a fact, a proof and a checkpoint of its choosing."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conformance.lifecycle.support import new_task, start, task_registry

from statebook.adapters.db import open_book
from statebook.adapters.note import COSIGNATURE_V1, Signer, cosign, sign_note
from statebook.adapters.proofs import ProofRefused, check_proof, proof_text
from statebook.lifecycle import history, tlog
from statebook.lifecycle.chainkey import ChainKey
from statebook.lifecycle.facts import Fact, fact_hash

pytest.importorskip("cryptography")
ORIGIN = "statebook.test/log"
KEY = ChainKey(b"k" * 32)


async def facts_in_seq_order(url: str, key: ChainKey | None) -> list[dict[str, Any]]:
    book = await open_book(url, registry=task_registry(), chain_key=key)
    try:
        for name in ("a", "b", "c"):
            await new_task(book, name)
            await start(book, name)
        found = [f for name in ("a", "b", "c") for f in await history(book, "task", name)]
    finally:
        await book.engine.dispose()
    return [f.to_json() for f in sorted(found, key=lambda f: f.seq or 0)]


@pytest.fixture(params=["plain", "keyed"])
def log(request, tmp_path) -> tuple[list[dict[str, Any]], ChainKey | None]:
    key = KEY if request.param == "keyed" else None
    return asyncio.run(facts_in_seq_order(f"sqlite:///{tmp_path / 'p.db'}", key)), key


def proofs(facts: list[dict[str, Any]], signer: Signer) -> tuple[bytes, list[bytes]]:
    leaves = [tlog.leaf_hash(tlog.fact_leaf(f["seq"], f["hash"])) for f in facts]
    note = sign_note(tlog.checkpoint_body(ORIGIN, len(leaves), tlog.root(leaves)), signer)
    return note, [proof_text(i, tlog.inclusion_proof(i, leaves), note) for i in range(len(leaves))]


def test_every_fact_proves_against_the_checkpoint_and_an_edited_one_does_not(log):
    facts, key = log
    signer = Signer.generate(ORIGIN)
    note, texts = proofs(facts, signer)
    secret = None if key is None else key.secret
    for i, (fact, text) in enumerate(zip(facts, texts, strict=True)):
        checked = check_proof(text, fact, [signer.verifier()], chain_key=secret)
        assert (checked.index, checked.head.size) == (i, len(facts))
    fact, text = facts[2], texts[2]
    # Edited content, hash kept: the content check fails (plain or keyed).
    with pytest.raises(ProofRefused, match="does not give its hash"):
        check_proof(text, {**fact, "reason_summary": "rewritten"}, [signer.verifier()], chain_key=secret)
    # Edited and re-hashed with the plain hashing (what write access allows): its leaf is not in the tree.
    edited = {**fact, "reason_summary": "rewritten"}
    edited["hash"] = fact_hash(Fact(**{k: edited[k] for k in Fact.__dataclass_fields__ if k in edited}).content(),
                               fact["prev_hash"])
    with pytest.raises(ProofRefused, match="does not lead from this fact"):
        check_proof(text, edited, [signer.verifier()])
    # Another fact's proof, another index, another seq.
    with pytest.raises(ProofRefused, match="does not lead"):
        check_proof(texts[3], fact, [signer.verifier()], chain_key=secret)
    with pytest.raises(ProofRefused, match="does not lead"):
        check_proof(text, {**fact, "seq": fact["seq"] + 100}, [signer.verifier()], chain_key=secret)


@pytest.mark.parametrize("log", ["keyed"], indirect=True)
def test_a_keyed_chains_fact_needs_the_chain_key(log):
    facts, _ = log
    signer = Signer.generate(ORIGIN)
    _, texts = proofs(facts, signer)
    with pytest.raises(ProofRefused, match="give the chain key"):
        check_proof(texts[0], facts[0], [signer.verifier()])
    with pytest.raises(ProofRefused, match="under the chain key"):
        check_proof(texts[0], facts[0], [signer.verifier()], chain_key=b"o" * 32)


def test_a_checkpoint_the_log_did_not_sign_or_too_few_witnesses_is_refused(log):
    facts, key = log
    secret = None if key is None else key.secret
    signer, forger = Signer.generate(ORIGIN), Signer.generate(ORIGIN)
    _, forged = proofs(facts, forger)
    with pytest.raises(ProofRefused, match="checkpoint does not verify"):
        check_proof(forged[0], facts[0], [signer.verifier()], chain_key=secret)
    note, texts = proofs(facts, signer)
    w1, w2 = Signer.generate("w1.test", COSIGNATURE_V1), Signer.generate("w2.test", COSIGNATURE_V1)
    witnessed_note = cosign(note, w1, 1_700_000_000)
    witnessed = texts[0].replace(note, witnessed_note)
    checked = check_proof(witnessed, facts[0], [signer.verifier()], witnesses=[w1.verifier(), w2.verifier()], k=1,
                          chain_key=secret)
    assert checked.witnesses == ("w1.test",)
    with pytest.raises(ProofRefused, match="checkpoint does not verify"):
        check_proof(witnessed, facts[0], [signer.verifier()], witnesses=[w1.verifier(), w2.verifier()], k=2,
                    chain_key=secret)


@pytest.mark.parametrize("mangle", [
    lambda t: t.replace(b"c2sp.org/tlog-proof@v1", b"c2sp.org/tlog-proof@v2"),
    lambda t: t.replace(b"index 2", b"index 02"),
    lambda t: t.replace(b"index 2", b"index two"),
    lambda t: t.replace(b"\n\n", b"\n", 1),
    lambda t: t.split(b"\n")[0] + b"\n" + b"index 2\n" + b"AAAA\n\n" + t.split(b"\n\n", 1)[1],
])
def test_a_malformed_proof_is_refused(log, mangle):
    facts, key = log
    signer = Signer.generate(ORIGIN)
    _, texts = proofs(facts, signer)
    with pytest.raises(ProofRefused):
        check_proof(mangle(texts[2]), facts[2], [signer.verifier()], chain_key=None if key is None else key.secret)
