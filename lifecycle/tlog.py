"""The fact log as a Merkle tree (RFC 6962, RFC 9162 section 2.1): hashes, proofs, the frontier, checkpoint text.

Leaves are byte strings, hashed ``SHA-256(0x00 || data)``; a node is ``SHA-256(0x01 || left || right)``; the
tree over n leaves splits at the largest power of two below n, so a log that only grows keeps every old tree as
a prefix. A **subtree** here is always a complete one: the ``2**height`` leaves from ``start``, with ``start`` a
multiple of ``2**height``. Proofs are computed from a :data:`SubtreeHash` callable, so a log too large for memory
reads the few subtree hashes a proof needs (about ``2 * log2(size)``) from wherever it keeps them;
:func:`inclusion_proof` and :func:`consistency_proof` are that over a list in memory.

Verifiers take what an attacker sends and answer True or False: any malformed input (a hash that is not 32
bytes, an index outside the tree, a node too many or too few) is False, never an exception.

Imports only the standard library (specs/audit.md, "The fact log as a Merkle tree").
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import StatebookError

__all__ = [
    "EMPTY_ROOT", "HASH_SIZE", "MAX_SIZE", "CheckpointFormatError", "Frontier", "SubtreeHash", "TreeHead",
    "checkpoint_body", "fact_leaf", "consistency_proof", "consistency_proof_from", "inclusion_proof", "inclusion_proof_from",
    "leaf_hash", "memory_subtrees", "node_hash", "parse_checkpoint", "range_hash", "root", "verify_consistency",
    "verify_inclusion"]

HASH_SIZE = 32
EMPTY_ROOT = hashlib.sha256(b"").digest()
"""The root of the tree of no leaves: SHA-256 of the empty string."""
MAX_SIZE = 2**64 - 1
"""The largest tree size a checkpoint or a proof may name (a uint64, as in RFC 9162)."""

SubtreeHash = Callable[[int, int], bytes]
"""``subtree(start, height)``: the hash of the complete subtree of the leaves ``[start, start + 2**height)``."""


class CheckpointFormatError(StatebookError, ValueError):
    """A checkpoint's text breaks the C2SP tlog-checkpoint format; the message names the line and the rule."""


def leaf_hash(data: bytes) -> bytes:
    """The hash of one leaf: ``SHA-256(0x00 || data)``."""
    return hashlib.sha256(b"\x00" + data).digest()


FACT_LEAF_PREFIX = b"statebook fact v1\n"


def fact_leaf(seq: int, fact_hash: str) -> bytes:
    """The leaf data of one fact: its ``seq`` and its stored hash (which covers the entity, the version, the
    previous hash and every recorded column: specs/lifecycle.md L12). The log's leaves are the facts in ``seq``
    order, so a leaf's index is the number of facts before it; binding the ``seq`` too makes a renumbered fact a
    different leaf even where the order stays."""
    if type(seq) is not int or seq < 0:
        raise ValueError(f"a fact's seq is a non-negative integer, not {seq!r}")
    return FACT_LEAF_PREFIX + str(seq).encode("ascii") + b"\n" + fact_hash.encode("utf-8")


def node_hash(left: bytes, right: bytes) -> bytes:
    """The hash of an inner node: ``SHA-256(0x01 || left || right)``."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two strictly below ``n`` (n >= 2): where the tree over n leaves splits."""
    return 1 << ((n - 1).bit_length() - 1)


def root(leaf_hashes: Sequence[bytes]) -> bytes:
    """The root (Merkle tree hash) over ``leaf_hashes``, in order; :data:`EMPTY_ROOT` of none."""
    if not leaf_hashes:
        return EMPTY_ROOT
    frontier = Frontier()
    frontier.append(leaf_hashes)
    return frontier.root()


def memory_subtrees(leaf_hashes: Sequence[bytes]) -> SubtreeHash:
    """A :data:`SubtreeHash` over leaf hashes held in memory (each call hashes its subtree anew)."""
    def subtree(start: int, height: int) -> bytes:
        end = start + (1 << height)
        if start < 0 or start % (1 << height) or end > len(leaf_hashes):
            raise ValueError(f"[{start}, {end}) is no complete subtree of a tree of {len(leaf_hashes)} leaves")
        level = list(leaf_hashes[start:end])
        while len(level) > 1:
            level = [node_hash(level[i], level[i + 1]) for i in range(0, len(level), 2)]
        return level[0]
    return subtree


def range_hash(start: int, end: int, subtree: SubtreeHash) -> bytes:
    """The root of the leaves ``[start, end)`` where the tree puts them under one node (``start`` a multiple of
    a power of two at least ``end - start``): the complete subtrees it splits into, largest first, folded from
    the right. Every sibling in a proof is such a range."""
    parts: list[bytes] = []
    at = start
    while at < end:
        height = (end - at).bit_length() - 1
        parts.append(subtree(at, height))
        at += 1 << height
    if not parts:
        return EMPTY_ROOT
    acc = parts.pop()
    while parts:
        acc = node_hash(parts.pop(), acc)
    return acc


def inclusion_proof_from(index: int, size: int, subtree: SubtreeHash) -> list[bytes]:
    """The audit path of leaf ``index`` in the tree of ``size`` leaves (RFC 9162 2.1.3.1), leaf's sibling first."""
    if not 0 <= index < size:
        raise ValueError(f"leaf index {index} is outside a tree of {size} leaves (0 <= index < size)")
    path: list[bytes] = []
    lo, hi = 0, size
    while hi - lo > 1:
        mid = lo + _split(hi - lo)
        if index < mid:
            path.append(range_hash(mid, hi, subtree))
            hi = mid
        else:
            path.append(range_hash(lo, mid, subtree))
            lo = mid
    path.reverse()
    return path


def consistency_proof_from(old_size: int, new_size: int, subtree: SubtreeHash) -> list[bytes]:
    """The nodes proving the tree of ``old_size`` leaves a prefix of the one of ``new_size`` (RFC 9162
    2.1.4.1), deepest first; empty when either size is 0 or they are equal."""
    if not 0 <= old_size <= new_size:
        raise ValueError(f"a consistency proof needs 0 <= old size <= new size, not {old_size} and {new_size}")
    if old_size in (0, new_size):
        return []
    path: list[bytes] = []
    lo, hi, whole = 0, new_size, True
    while old_size != hi:
        k = _split(hi - lo)
        if old_size - lo <= k:
            path.append(range_hash(lo + k, hi, subtree))
            hi = lo + k
        else:
            path.append(range_hash(lo, lo + k, subtree))
            lo, whole = lo + k, False
    if not whole:
        path.append(range_hash(lo, hi, subtree))
    path.reverse()
    return path


def inclusion_proof(index: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """:func:`inclusion_proof_from` over the leaf hashes in memory."""
    return inclusion_proof_from(index, len(leaf_hashes), memory_subtrees(leaf_hashes))


def consistency_proof(old_size: int, leaf_hashes: Sequence[bytes]) -> list[bytes]:
    """:func:`consistency_proof_from` from ``old_size`` to ``len(leaf_hashes)`` over the leaf hashes in memory."""
    return consistency_proof_from(old_size, len(leaf_hashes), memory_subtrees(leaf_hashes))


# -- verification: whatever comes in, True or False ---------------------------------------------


def _is_hash(value: Any) -> bool:
    return type(value) is bytes and len(value) == HASH_SIZE


def _is_size(value: Any) -> bool:
    return type(value) is int and 0 <= value <= MAX_SIZE


def _hashes(proof: Any) -> list[bytes] | None:
    if isinstance(proof, (str, bytes, bytearray)) or not isinstance(proof, Iterable):
        return None
    try:
        nodes = list(proof)
    except Exception:  # an attacker's iterable may raise anything; it is no proof
        return None
    return nodes if all(_is_hash(p) for p in nodes) and len(nodes) <= 2 * 64 else None


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root_hash: bytes) -> bool:
    """Whether ``proof`` shows the leaf hash ``leaf`` at ``index`` in the tree of ``size`` leaves whose root is
    ``root_hash`` (RFC 9162 2.1.3.2)."""
    nodes = _hashes(proof)
    if nodes is None or not (_is_size(index) and _is_size(size) and _is_hash(leaf) and _is_hash(root_hash)):
        return False
    if index >= size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in nodes:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and hmac.compare_digest(r, root_hash)


def verify_consistency(old_size: int, new_size: int, old_root: bytes, new_root: bytes,
                       proof: Sequence[bytes]) -> bool:
    """Whether ``proof`` shows the tree of ``old_size`` leaves with root ``old_root`` a prefix of the tree of
    ``new_size`` leaves with root ``new_root`` (RFC 9162 2.1.4.2). Equal sizes need equal roots and no
    proof; an empty old tree (its root :data:`EMPTY_ROOT`) is a prefix of every tree, with no proof."""
    nodes = _hashes(proof)
    if nodes is None or not (_is_size(old_size) and _is_size(new_size) and _is_hash(old_root) and _is_hash(new_root)):
        return False
    if old_size > new_size:
        return False
    if old_size == 0:
        return not nodes and hmac.compare_digest(old_root, EMPTY_ROOT) and (
            new_size > 0 or hmac.compare_digest(new_root, EMPTY_ROOT))
    if old_size == new_size:
        return not nodes and hmac.compare_digest(old_root, new_root)
    if not nodes:
        return False
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is itself a node of the new tree
        nodes = [old_root, *nodes]
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = nodes[0]
    for c in nodes[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and hmac.compare_digest(fr, old_root) and hmac.compare_digest(sr, new_root)


# -- the frontier: a growing tree in O(log n) hashes --------------------------------------------


class Frontier:
    """The right-hand edge of a growing tree: one subtree hash per set bit of its size, largest first.

    Appending costs about one node hash per leaf; the root of the current size folds the O(log n) hashes kept.
    A checkpointer saves :meth:`to_bytes` and resumes with :meth:`from_bytes` at the same size without reading
    the leaves again.

    >>> f = Frontier(); f.append([leaf_hash(b"a"), leaf_hash(b"b")]); f.size
    2
    """

    __slots__ = ("_hashes", "_size")

    def __init__(self) -> None:
        self._size = 0
        self._hashes: list[bytes] = []

    @property
    def size(self) -> int:
        """How many leaves the tree holds."""
        return self._size

    @property
    def subtrees(self) -> list[tuple[int, int, bytes]]:
        """(start, height, hash) of each subtree on the edge, leftmost (largest) first."""
        out: list[tuple[int, int, bytes]] = []
        start = 0
        for height in range(self._size.bit_length() - 1, -1, -1):
            if self._size >> height & 1:
                out.append((start, height, self._hashes[len(out)]))
                start += 1 << height
        return out

    def append(self, leaf_hashes: Iterable[bytes]) -> None:
        """Add leaves (their hashes) at the end, in order."""
        # A copy, so a bad hash midway leaves the frontier as it was.
        hashes, size = list(self._hashes), self._size
        for h in leaf_hashes:
            if not _is_hash(h):
                raise ValueError(f"a leaf hash is {HASH_SIZE} bytes, not {h!r:.40}")
            if size >= MAX_SIZE:
                raise ValueError(f"a tree holds at most {MAX_SIZE} leaves")
            # Each trailing one bit of the old size is a complete subtree of the new leaf's height: merge it.
            carry, bits = h, size
            while bits & 1:
                carry = node_hash(hashes.pop(), carry)
                bits >>= 1
            hashes.append(carry)
            size += 1
        self._hashes, self._size = hashes, size

    def root(self) -> bytes:
        """The root of the tree of :attr:`size` leaves."""
        if not self._hashes:
            return EMPTY_ROOT
        acc = self._hashes[-1]
        for h in reversed(self._hashes[:-1]):
            acc = node_hash(h, acc)
        return acc

    def to_bytes(self) -> bytes:
        """The size (8 bytes, big-endian) and the edge's hashes, largest subtree first."""
        return self._size.to_bytes(8, "big") + b"".join(self._hashes)

    @classmethod
    def from_bytes(cls, data: bytes) -> Frontier:
        """The frontier :meth:`to_bytes` wrote; ValueError unless ``data`` has exactly one hash per set bit."""
        if type(data) is not bytes or len(data) < 8:
            raise ValueError("a saved frontier starts with its size in 8 bytes")
        size = int.from_bytes(data[:8], "big")
        want = 8 + HASH_SIZE * size.bit_count()
        if len(data) != want:
            raise ValueError(f"a saved frontier of size {size} is {want} bytes long, not {len(data)}")
        frontier = cls()
        frontier._size = size
        frontier._hashes = [data[i:i + HASH_SIZE] for i in range(8, len(data), HASH_SIZE)]
        return frontier

    @classmethod
    def at(cls, size: int, subtree: SubtreeHash) -> Frontier:
        """The frontier of the tree of ``size`` leaves, from the subtree hashes of its edge."""
        if not _is_size(size):
            raise ValueError(f"a tree size is an integer from 0 to {MAX_SIZE}, not {size!r}")
        frontier = cls()
        start = 0
        for height in range(size.bit_length() - 1, -1, -1):
            if size >> height & 1:
                frontier._hashes.append(subtree(start, height))
                start += 1 << height
        frontier._size = size
        return frontier

    def __repr__(self) -> str:
        return f"Frontier(size={self._size}, root={self.root().hex()[:16]}...)"


# -- the checkpoint body (C2SP tlog-checkpoint) --------------------------------------------------


@dataclass(frozen=True)
class TreeHead:
    """What a C2SP checkpoint states: the log's origin, the tree size, the root hash, any extension lines."""

    origin: str
    size: int
    root_hash: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> bytes:
        """Its checkpoint text (:func:`checkpoint_body`), the text a checkpoint note signs."""
        return checkpoint_body(self.origin, self.size, self.root_hash, self.extensions)


def _line_problem(line: Any, what: str) -> str | None:
    if type(line) is not str or not line:
        return f"the {what} must be a non-empty text"
    if "\n" in line:
        return f"the {what} must be one line (it contains a newline)"
    if any(ord(c) < 0x20 for c in line):
        return f"the {what} must not contain control characters"
    return None


def checkpoint_body(origin: str, size: int, root_hash: bytes, extensions: Iterable[str] = ()) -> bytes:
    """The note text of a checkpoint: ``origin``, ``size`` in decimal and the root in base64, one line each,
    then the extension lines, every line ending in a newline.

    >>> checkpoint_body("example.com/log", 0, EMPTY_ROOT)
    b'example.com/log\\n0\\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\\n'
    """
    extensions = tuple(extensions)
    problem = _line_problem(origin, "origin") or next(
        (p for e in extensions if (p := _line_problem(e, "extension line")) is not None), None)
    if problem is None and not _is_size(size):
        problem = f"the tree size must be an integer from 0 to {MAX_SIZE}, not {size!r}"
    if problem is None and not _is_hash(root_hash):
        problem = f"the root hash must be {HASH_SIZE} bytes"
    if problem is not None:
        raise CheckpointFormatError(f"cannot write the checkpoint: {problem}")
    lines = [origin, str(size), base64.b64encode(root_hash).decode("ascii"), *extensions]
    return "".join(f"{line}\n" for line in lines).encode("utf-8")


def parse_checkpoint(text: bytes | str) -> TreeHead:
    """The :class:`TreeHead` a note text states; :class:`CheckpointFormatError` naming the first rule it
    breaks (a newline-ended text, an origin, a decimal size without leading zeros, a 32-byte base64 root,
    non-empty extension lines)."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointFormatError("a checkpoint is UTF-8 text") from None
    if type(text) is not str or not text.endswith("\n"):
        raise CheckpointFormatError("a checkpoint's text ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3:
        raise CheckpointFormatError(f"a checkpoint has at least 3 lines (origin, size, root hash), not {len(lines)}")
    origin, size_text, root_text, *extensions = lines
    for i, line in enumerate(lines):
        problem = _line_problem(line, "origin" if i == 0 else f"line {i + 1}")
        if problem is not None:
            raise CheckpointFormatError(f"bad checkpoint: {problem}")
    if not (size_text.isascii() and size_text.isdigit()) or (len(size_text) > 1 and size_text[0] == "0"):
        raise CheckpointFormatError(
            f"bad checkpoint: the size line must be a decimal number without leading zeros, not {size_text[:30]!r}")
    size = int(size_text)
    if size > MAX_SIZE:
        raise CheckpointFormatError(f"bad checkpoint: the tree size {size_text[:30]} is above {MAX_SIZE}")
    try:
        root_hash = base64.b64decode(root_text, validate=True)
    except (binascii.Error, ValueError):
        root_hash = b""
    if len(root_hash) != HASH_SIZE or base64.b64encode(root_hash).decode("ascii") != root_text:
        raise CheckpointFormatError(
            f"bad checkpoint: the root hash line must be the base64 of {HASH_SIZE} bytes, not {root_text[:60]!r}")
    return TreeHead(origin, size, root_hash, tuple(extensions))
