"""The fact log's proofs without a database (lifecycle/factlog.py, specs/audit.md A6): the subtree hashes a proof
names, taken while the leaves stream by in batches, are the hashes of those subtrees, at any size and depth.

The conformance cases (tests/conformance/lifecycle/cases_factlog.py) check the same on the backends, over logs
of a few facts; this reaches trees deep enough for every height of the merge to matter.
"""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st

from profiles import examples
from statebook.lifecycle import tlog
from statebook.lifecycle.factlog import _Subtrees


def leaves(n: int) -> list[bytes]:
    return [hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(n)]


@settings(max_examples=examples(200), deadline=None)
@given(st.integers(1, 3000), st.data())
def test_proofs_from_streamed_subtrees_are_tlogs_proofs(size: int, data: st.DataObject):
    """A6: one pass in batches of any size gives every subtree an inclusion or a consistency proof reads, so the
    proof is tlog's over the leaves in memory."""
    index = data.draw(st.integers(0, size - 1))
    old = data.draw(st.integers(0, size))
    batch = data.draw(st.integers(1, 700))
    hashes = leaves(size)
    wanted: set[tuple[int, int]] = set()

    def note(start: int, height: int) -> bytes:
        wanted.add((start, height))
        return bytes(32)

    tlog.inclusion_proof_from(index, size, note)
    tlog.consistency_proof_from(old, size, note)
    found = _Subtrees(wanted)
    for lo in range(0, size, batch):
        found.add(hashes[lo:lo + batch])
    assert set(found.hashes) == wanted
    subtree = tlog.memory_subtrees(hashes)
    assert all(found.hashes[w] == subtree(*w) for w in wanted)
    streamed = lambda start, height: found.hashes[(start, height)]  # noqa: E731
    assert tlog.inclusion_proof_from(index, size, streamed) == tlog.inclusion_proof(index, hashes)
    assert tlog.consistency_proof_from(old, size, streamed) == tlog.consistency_proof(old, hashes)
    assert tlog.Frontier.from_bytes(size.to_bytes(8, "big") + b"".join(found.edge)).root() == tlog.root(hashes)
