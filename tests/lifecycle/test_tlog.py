"""The fact log's Merkle tree (lifecycle/tlog.py, specs/audit.md "The fact log as a Merkle tree").

Published data first: the roots of Certificate Transparency's 8-leaf test tree and transparency-dev/merkle's
proof probes (tests/lifecycle/vectors/transparency_dev_proofs.json, copied unchanged with its source). Then
properties over random trees: honest proofs verify, and every tampering an attacker can make (a flipped byte,
a node dropped or added, another index or size) is False, never an exception. Then the frontier and the
checkpoint text.
"""

from __future__ import annotations

import base64
import functools
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import examples
from statebook.lifecycle.tlog import (
    EMPTY_ROOT, TreeHead, CheckpointFormatError, Frontier, checkpoint_body, consistency_proof,
    consistency_proof_from, inclusion_proof, inclusion_proof_from, leaf_hash, memory_subtrees, node_hash,
    parse_checkpoint, range_hash, root, verify_consistency, verify_inclusion)

# The leaves of RFC 6962's reference test tree (Certificate Transparency, transparency-dev/merkle testonly).
CT_LEAVES = [bytes.fromhex(h) for h in (
    "", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")]
CT_ROOTS = [bytes.fromhex(h) for h in (
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328")]
# The complete subtrees of the 8-leaf tree by height (transparency-dev/merkle testonly.NodeHashes, levels 1-2).
CT_NODES = {
    (0, 1): "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    (2, 1): "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
    (4, 1): "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
    (6, 1): "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
    (0, 2): "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    (4, 2): "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
}
CT_HASHES = [leaf_hash(x) for x in CT_LEAVES]

VECTORS = json.loads((Path(__file__).parent / "vectors" / "transparency_dev_proofs.json").read_text())
# A probe whose roots are the 12-byte placeholder "don't care 2": transparency-dev accepts equal sizes with equal
# placeholders; statebook answers False to any root that is not 32 bytes (the same probe with real roots passes).
PLACEHOLDER_ROOTS = {"consistency/additional/sizes-are-equal-one-and-proof-is-empty.json"}


def b64(value: str) -> bytes:
    return base64.b64decode(value)


def leaves(n: int) -> list[bytes]:
    """n distinct leaf hashes (distinct, so no two subtrees hash alike and a swapped index shows)."""
    return [leaf_hash(i.to_bytes(4, "big")) for i in range(n)]


# -- published vectors ------------------------------------------------------------------------


def test_the_roots_of_the_rfc6962_test_tree_for_every_size():
    assert [root(CT_HASHES[:n]) for n in range(9)] == CT_ROOTS
    assert root([]) == EMPTY_ROOT == CT_ROOTS[0]


def test_the_complete_subtrees_of_the_rfc6962_test_tree():
    subtree = memory_subtrees(CT_HASHES)
    assert {key: subtree(*key).hex() for key in CT_NODES} == CT_NODES
    assert subtree(0, 3) == CT_ROOTS[8]
    assert node_hash(CT_HASHES[0], CT_HASHES[1]) == CT_ROOTS[2]


@pytest.mark.parametrize("probe", VECTORS["inclusion"], ids=lambda p: p["file"])
def test_transparency_dev_inclusion_probes(probe):
    """Each published probe verifies or not as it says; a happy path over the test tree is also the proof
    statebook computes."""
    proof = [b64(p) for p in probe["proof"] or []]
    got = verify_inclusion(probe["leafIdx"], probe["treeSize"], b64(probe["leafHash"]), proof, b64(probe["root"]))
    assert got is not probe["wantErr"]
    size = probe["treeSize"]
    if not probe["wantErr"] and size <= 8 and root(CT_HASHES[:size]) == b64(probe["root"]):
        assert inclusion_proof(probe["leafIdx"], CT_HASHES[:size]) == proof


@pytest.mark.parametrize("probe", VECTORS["consistency"], ids=lambda p: p["file"])
def test_transparency_dev_consistency_probes(probe):
    proof = [b64(p) for p in probe["proof"] or []]
    args = (probe["size1"], probe["size2"], b64(probe["root1"]), b64(probe["root2"]), proof)
    if probe["file"] in PLACEHOLDER_ROOTS:
        assert verify_consistency(*args) is False
        assert verify_consistency(probe["size1"], probe["size2"], CT_ROOTS[1], CT_ROOTS[1], proof) is True
        return
    assert verify_consistency(*args) is not probe["wantErr"]
    size = probe["size2"]
    if not probe["wantErr"] and size <= 8 and root(CT_HASHES[:size]) == b64(probe["root2"]):
        assert consistency_proof(probe["size1"], CT_HASHES[:size]) == proof


def test_the_vector_file_holds_both_kinds_and_both_answers():
    for kind in ("inclusion", "consistency"):
        answers = {p["wantErr"] for p in VECTORS[kind]}
        assert len(VECTORS[kind]) > 90 and answers == {True, False}, kind


# -- honest proofs verify, tampered ones do not ------------------------------------------------

sizes = st.integers(min_value=1, max_value=300)


def tampered(proof: list[bytes], data: st.DataObject) -> list[list[bytes]]:
    """One flipped byte in each node, each node dropped, a node added at each end and in the middle."""
    out = []
    for i, node in enumerate(proof):
        at = data.draw(st.integers(0, 31), label="byte")
        bit = data.draw(st.integers(0, 7), label="bit")
        flipped = node[:at] + bytes([node[at] ^ (1 << bit)]) + node[at + 1:]
        out.append(proof[:i] + [flipped] + proof[i + 1:])
        out.append(proof[:i] + proof[i + 1:])
    extra = data.draw(st.binary(min_size=32, max_size=32), label="extra node")
    for at in {0, len(proof) // 2, len(proof)}:
        out.append(proof[:at] + [extra] + proof[at:])
    if proof:
        out.append(proof + [proof[-1]])
    return out


@settings(max_examples=examples(150), deadline=None)
@given(size=sizes, data=st.data())
def test_an_inclusion_proof_verifies_and_no_tampering_does(size, data):
    hashes = leaves(size)
    top = root(hashes)
    index = data.draw(st.integers(0, size - 1), label="index")
    proof = inclusion_proof(index, hashes)
    assert verify_inclusion(index, size, hashes[index], proof, top)
    assert len(proof) <= size.bit_length()
    for bad in tampered(proof, data):
        assert not verify_inclusion(index, size, hashes[index], bad, top)
    other = data.draw(st.integers(0, size + 5).filter(lambda i: i != index), label="other index")
    assert not verify_inclusion(other, size, hashes[index], proof, top)
    assert not verify_inclusion(index, size, leaf_hash(b"not the leaf"), proof, top)
    # Another size with its own root: the proof is the wrong shape or reaches the wrong root.
    smaller = data.draw(st.integers(index + 1, size + 40).filter(lambda n: n != size), label="other size")
    assert not verify_inclusion(index, smaller, hashes[index], proof, root(leaves(smaller)))


def test_every_leaf_of_small_trees_has_a_proof():
    for size in range(1, 70):
        hashes = leaves(size)
        top = root(hashes)
        for index in range(size):
            assert verify_inclusion(index, size, hashes[index], inclusion_proof(index, hashes), top), (index, size)


def test_a_proof_binds_the_size_only_with_its_root():
    """The size a proof is checked at must come with the root, from one signed checkpoint: the path of leaf 0
    in a tree of 5 leaves has the shape of the one in a tree of 6, so paired with the 5-leaf root it passes."""
    hashes = leaves(6)
    proof = inclusion_proof(0, hashes[:5])
    assert verify_inclusion(0, 6, hashes[0], proof, root(hashes[:5]))
    assert not verify_inclusion(0, 6, hashes[0], proof, root(hashes))


@settings(max_examples=examples(150), deadline=None)
@given(new_size=sizes, data=st.data())
def test_a_consistency_proof_verifies_and_no_tampering_does(new_size, data):
    hashes = leaves(new_size)
    old_size = data.draw(st.integers(0, new_size), label="old size")
    old_root, new_root = root(hashes[:old_size]), root(hashes)
    proof = consistency_proof(old_size, hashes)
    assert verify_consistency(old_size, new_size, old_root, new_root, proof)
    assert len(proof) <= 2 * new_size.bit_length()
    for bad in tampered(proof, data):
        assert not verify_consistency(old_size, new_size, old_root, new_root, bad)
    other = data.draw(st.integers(0, new_size + 3).filter(lambda m: m != old_size), label="other old size")
    if proof:  # an empty proof is every empty proof: from 0, or between equal sizes
        assert not verify_consistency(other, new_size, root(leaves(other)), new_root, proof)
        assert not verify_consistency(other, new_size, old_root, new_root, proof)
    # A history rewritten below the old size, or a different new tree, breaks it.
    forged = list(hashes)
    if old_size:
        forged[data.draw(st.integers(0, old_size - 1), label="rewritten")] = leaf_hash(b"forged")
        assert not verify_consistency(old_size, new_size, root(forged[:old_size]), new_root, proof)
        assert not verify_consistency(old_size, new_size, old_root, root(forged), proof)
        assert not verify_consistency(old_size, new_size, old_root, leaf_hash(b"another root"), proof)


def test_a_node_past_the_root_is_refused_even_with_a_root_built_to_match():
    """An attacker who appends a node and hashes it into the root they claim still fails: the path is as long
    as the tree is deep, no longer (the RFC's ``sn == 0`` checks)."""
    extra = leaf_hash(b"extra")
    for size in range(1, 40):
        hashes = leaves(size)
        top = root(hashes)
        for index in range(size):
            proof = inclusion_proof(index, hashes)
            for claimed in (node_hash(extra, top), node_hash(top, extra)):
                assert not verify_inclusion(index, size, hashes[index], [*proof, extra], claimed), (index, size)
        for old_size in range(1, size):
            proof, old_root = consistency_proof(old_size, hashes), root(hashes[:old_size])
            for new_root in (node_hash(extra, top), node_hash(top, extra)):
                for old in (old_root, node_hash(extra, old_root)):
                    assert not verify_consistency(old_size, size, old, new_root, [*proof, extra]), (old_size, size)


def test_every_pair_of_small_trees_is_consistent():
    for new_size in range(0, 50):
        hashes = leaves(new_size)
        for old_size in range(0, new_size + 1):
            proof = consistency_proof(old_size, hashes)
            assert verify_consistency(old_size, new_size, root(hashes[:old_size]), root(hashes), proof)


GARBAGE = [None, -1, 2**64, 1.0, True, "3", b"", b"\x00" * 31, b"\x00" * 33, [b"\x00" * 32], object()]


def test_malformed_arguments_are_false_never_an_error():
    hashes = leaves(5)
    top, proof = root(hashes), inclusion_proof(2, hashes)
    good = (2, 5, hashes[2], proof, top)
    assert verify_inclusion(*good)
    for position in range(5):
        for junk in GARBAGE:
            args = list(good)
            args[position] = junk
            assert verify_inclusion(*args) is False, (position, junk)
    assert verify_inclusion(2, 5, hashes[2], [*proof[:1], "x" * 32, *proof[2:]], top) is False
    assert verify_inclusion(2, 5, hashes[2], iter(proof), top) is True  # any iterable of hashes is a proof
    assert verify_inclusion(5, 5, hashes[2], proof, top) is False
    assert verify_inclusion(0, 0, hashes[0], [], EMPTY_ROOT) is False

    c_proof = consistency_proof(3, hashes)
    good_c = (3, 5, root(hashes[:3]), top, c_proof)
    assert verify_consistency(*good_c)
    for position in range(5):
        for junk in GARBAGE:
            args = list(good_c)
            args[position] = junk
            assert verify_consistency(*args) is False, (position, junk)
    assert verify_consistency(5, 3, top, root(hashes[:3]), c_proof) is False
    assert verify_consistency(3, 5, root(hashes[:3]), top, []) is False


def test_the_edges_of_consistency():
    hashes = leaves(4)
    assert verify_consistency(0, 0, EMPTY_ROOT, EMPTY_ROOT, [])
    assert verify_consistency(0, 4, EMPTY_ROOT, root(hashes), [])
    assert not verify_consistency(0, 4, root(hashes[:1]), root(hashes), [])  # size 0 has one root
    assert not verify_consistency(0, 4, EMPTY_ROOT, root(hashes), [EMPTY_ROOT])
    assert not verify_consistency(0, 0, EMPTY_ROOT, root(hashes), [])
    assert verify_consistency(4, 4, root(hashes), root(hashes), [])
    assert not verify_consistency(4, 4, root(hashes), root(hashes), [root(hashes)])
    assert not verify_consistency(4, 4, root(hashes), root(hashes[:3]), [])
    # A shrunken tree, with the one node the RFC loop would then need, is no extension.
    top = root(hashes)
    for old_size, new_size in ((2, 1), (3, 1), (5, 1), (6, 1), (4, 3), (8, 4)):
        assert not verify_consistency(old_size, new_size, top, top, [top]), (old_size, new_size)


def test_proof_arguments_outside_the_tree_are_an_error_for_the_prover():
    hashes = leaves(4)
    for bad in (-1, 4):
        with pytest.raises(ValueError, match="outside a tree of 4 leaves"):
            inclusion_proof(bad, hashes)
    with pytest.raises(ValueError, match="old size <= new size"):
        consistency_proof(5, hashes)


# -- a log too large for memory ----------------------------------------------------------------


@functools.cache
def same_leaf_subtree(height: int) -> bytes:
    """The subtree of 2**height copies of one leaf: every subtree of that height hashes alike."""
    if height == 0:
        return leaf_hash(b"fact")
    return node_hash(same_leaf_subtree(height - 1), same_leaf_subtree(height - 1))


def test_proofs_of_a_huge_log_read_only_a_few_subtree_hashes():
    calls: list[tuple[int, int]] = []

    def subtree(start: int, height: int) -> bytes:
        assert start % (1 << height) == 0
        calls.append((start, height))
        return same_leaf_subtree(height)

    old, new = 10**12 + 12345, 3 * 10**14 + 7
    new_root = Frontier.at(new, subtree).root()
    old_root = Frontier.at(old, subtree).root()
    calls.clear()
    index = 10**12 + 99
    proof = inclusion_proof_from(index, new, subtree)
    assert verify_inclusion(index, new, leaf_hash(b"fact"), proof, new_root)
    assert len(calls) <= 2 * new.bit_length()
    calls.clear()
    c_proof = consistency_proof_from(old, new, subtree)
    assert verify_consistency(old, new, old_root, new_root, c_proof)
    assert len(calls) <= 2 * new.bit_length()


@settings(max_examples=examples(100), deadline=None)
@given(size=sizes, data=st.data())
def test_range_hash_is_the_root_of_its_leaves(size, data):
    hashes = leaves(size)
    height = data.draw(st.integers(0, size.bit_length()), label="alignment")
    start = data.draw(st.integers(0, (size - 1) >> height), label="block") << height
    end = data.draw(st.integers(start, min(size, start + (1 << height))), label="end")
    assert range_hash(start, end, memory_subtrees(hashes)) == root(hashes[start:end])


# -- the frontier ------------------------------------------------------------------------------


@settings(max_examples=examples(150), deadline=None)
@given(batches=st.lists(st.integers(0, 40), max_size=12), restore_after=st.sets(st.integers(0, 11)))
def test_the_frontier_gives_the_root_after_any_batches_and_any_restore(batches, restore_after):
    hashes = leaves(sum(batches))
    frontier, done = Frontier(), 0
    for i, count in enumerate(batches):
        frontier.append(hashes[done:done + count])
        done += count
        assert frontier.size == done and frontier.root() == root(hashes[:done])
        assert len(frontier.to_bytes()) == 8 + 32 * done.bit_count()  # O(log n) hashes, no more
        if i in restore_after:
            frontier = Frontier.from_bytes(frontier.to_bytes())
            assert frontier.root() == root(hashes[:done])
        assert Frontier.at(done, memory_subtrees(hashes)).to_bytes() == frontier.to_bytes()
        subtree = memory_subtrees(hashes)
        assert [h for _, _, h in frontier.subtrees] == [subtree(s, k) for s, k, _ in frontier.subtrees]


def test_a_bad_leaf_hash_leaves_the_frontier_as_it_was():
    frontier = Frontier()
    frontier.append(leaves(5))
    saved = frontier.to_bytes()
    with pytest.raises(ValueError, match="32 bytes"):
        frontier.append([*leaves(3), b"short"])
    assert frontier.to_bytes() == saved


def test_a_saved_frontier_must_hold_one_hash_per_set_bit():
    frontier = Frontier()
    frontier.append(leaves(6))
    saved = frontier.to_bytes()
    for bad in (saved[:-1], saved + b"\x00" * 32, saved[:7], b"", (7).to_bytes(8, "big") + saved[8:]):
        with pytest.raises(ValueError, match="saved frontier"):
            Frontier.from_bytes(bad)
    assert Frontier.from_bytes(Frontier().to_bytes()).root() == EMPTY_ROOT


# -- the checkpoint text -----------------------------------------------------------------------

C2SP_EXAMPLE = b"example.com/behind-the-sofa\n20852163\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n"


def test_the_c2sp_example_checkpoint_parses_and_writes_back():
    parsed = parse_checkpoint(C2SP_EXAMPLE)
    assert (parsed.origin, parsed.size, parsed.extensions) == ("example.com/behind-the-sofa", 20852163, ())
    assert parsed.root_hash == b64("CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=")
    assert parsed.body() == C2SP_EXAMPLE


def test_a_checkpoint_body_round_trips_with_extension_lines():
    body = checkpoint_body("statebook.example/orders", 8, CT_ROOTS[8], ["chain key 1a2b", "seq 42"])
    assert body == (b"statebook.example/orders\n8\nXcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=\n"
                    b"chain key 1a2b\nseq 42\n")
    assert parse_checkpoint(body) == TreeHead("statebook.example/orders", 8, CT_ROOTS[8],
                                                ("chain key 1a2b", "seq 42"))
    assert parse_checkpoint(body.decode()) == parse_checkpoint(body)
    assert checkpoint_body("o", 0, EMPTY_ROOT) == b"o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n"


ROOT_LINE = "XcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg="
BAD_CHECKPOINTS = {
    "no final newline": f"log\n8\n{ROOT_LINE}",
    "two lines": "log\n8\n",
    "empty origin": f"\n8\n{ROOT_LINE}\n",
    "leading zero": f"log\n08\n{ROOT_LINE}\n",
    "plus sign": f"log\n+8\n{ROOT_LINE}\n",
    "minus": f"log\n-8\n{ROOT_LINE}\n",
    "space in size": f"log\n 8\n{ROOT_LINE}\n",
    "empty size": f"log\n\n{ROOT_LINE}\n",
    "underscore": f"log\n1_000\n{ROOT_LINE}\n",
    "not ascii digits": f"log\n\uff18\n{ROOT_LINE}\n",
    "above uint64": f"log\n{2**64}\n{ROOT_LINE}\n",
    "root of 31 bytes": f"log\n8\n{base64.b64encode(bytes(31)).decode()}\n",
    "root of 33 bytes": f"log\n8\n{base64.b64encode(bytes(33)).decode()}\n",
    "root not base64": "log\n8\nnot base64 at all!\n",
    "root without padding": f"log\n8\n{ROOT_LINE.rstrip('=')}\n",
    "root non-canonical": f"log\n8\n{ROOT_LINE[:-2]}R=\n",
    "empty extension line": f"log\n8\n{ROOT_LINE}\n\n",
    "carriage return": f"log\r\n8\n{ROOT_LINE}\n",
    "not utf-8": b"log\xff\n8\n" + ROOT_LINE.encode() + b"\n",
}


@pytest.mark.parametrize("case", sorted(BAD_CHECKPOINTS))
def test_a_malformed_checkpoint_is_refused_with_one_line(case):
    with pytest.raises(CheckpointFormatError) as caught:
        parse_checkpoint(BAD_CHECKPOINTS[case])
    assert "\n" not in str(caught.value)


def test_checkpoint_body_refuses_what_it_cannot_write():
    for origin, size, root_hash, extensions, words in [
            ("", 1, EMPTY_ROOT, (), "origin"), ("a\nb", 1, EMPTY_ROOT, (), "origin"),
            ("log", -1, EMPTY_ROOT, (), "tree size"), ("log", 2**64, EMPTY_ROOT, (), "tree size"),
            ("log", True, EMPTY_ROOT, (), "tree size"), ("log", 1, EMPTY_ROOT[:31], (), "root hash"),
            ("log", 1, EMPTY_ROOT, ("",), "extension"), ("log", 1, EMPTY_ROOT, ("x\ny",), "extension")]:
        with pytest.raises(CheckpointFormatError, match=words):
            checkpoint_body(origin, size, root_hash, extensions)


@settings(max_examples=examples(100), deadline=None)
@given(origin=st.text(st.characters(min_codepoint=0x20, exclude_categories=["Cs"]), min_size=1, max_size=30),
       size=st.integers(0, 2**64 - 1), root_hash=st.binary(min_size=32, max_size=32),
       extensions=st.lists(st.text(st.characters(min_codepoint=0x20, exclude_categories=["Cs"]), min_size=1,
                                   max_size=20), max_size=3))
def test_any_checkpoint_written_parses_back(origin, size, root_hash, extensions):
    body = checkpoint_body(origin, size, root_hash, extensions)
    assert parse_checkpoint(body) == TreeHead(origin, size, root_hash, tuple(extensions))


def test_a_facts_leaf_binds_its_seq_and_its_hash():
    from statebook.lifecycle import tlog

    leaf = tlog.fact_leaf(7, "ab" * 32)
    assert leaf == b"statebook fact v1\n7\n" + b"ab" * 32
    assert tlog.fact_leaf(8, "ab" * 32) != leaf and tlog.fact_leaf(7, "ac" * 32) != leaf
    for bad in (-1, True, 7.0, "7"):
        with pytest.raises(ValueError):
            tlog.fact_leaf(bad, "ab" * 32)  # type: ignore[arg-type]
