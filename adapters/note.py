"""Signed notes (C2SP signed-note) with Ed25519, and witness cosignatures (C2SP tlog-cosignature/v1).

A note is a text ending in a newline, a blank line, then one signature line per key::

    example.com/log               <- the text (here a checkpoint: statebook.lifecycle.tlog.checkpoint_body)
    8
    XcnaeacGWamtVZy3Ad7ZoqudgjqtL0lgz+Nw7/RgQyg=

    — example.com/log base64(key id || Ed25519 signature of the text)
    — witness.example/w1 base64(key id || 8-byte time || Ed25519 signature of the cosigned message)

A key is named; its id is the first 4 bytes of ``SHA-256(name || 0x0A || type || public key)``, type 0x01 for a
note signature and 0x04 for a cosignature. A verifier is configured from its *vkey* text
``name+hex(key id)+base64(type || public key)``; a signer from ``PRIVATE+KEY+name+hex(key id)+base64(type ||
seed)`` (the form of Go's golang.org/x/mod/sumdb/note). Opening a note ignores signatures of unknown keys,
refuses the note when a known key's signature does not verify, and requires at least one that does.

Needs the ``audit`` extra (cryptography), imported when a key is used, never at import.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from statebook.lifecycle import StatebookError

from .extras import require

__all__ = [
    "COSIGNATURE_V1", "ED25519", "BadSignature", "Cosignature", "MalformedNote", "NoteError", "NoteKeyError",
    "Signer", "TooFewWitnesses", "UnverifiedNote", "Verifier", "Witnessed", "cosign", "cosigned_message", "key_id",
    "open_note", "open_witnessed", "sign_note", "signature_names"]

ED25519 = 0x01
"""The signature type of an Ed25519 note signature over the text."""
COSIGNATURE_V1 = 0x04
"""The signature type of a timestamped Ed25519 cosignature (tlog-cosignature, ``cosignature/v1``)."""
MAX_SIGNATURES = 100
"""Signature lines a note may carry (the spec asks for at least 16; Go's reader allows 100)."""
MAX_TIME = 2**63 - 1
DASH = "\u2014 "


class NoteError(StatebookError, ValueError):
    """A signed note, a key or a cosignature that is malformed or does not verify; the message says which."""


class MalformedNote(NoteError):
    """The bytes are not a signed note (C2SP signed-note): nothing in it was trusted."""


class NoteKeyError(NoteError):
    """A signer or verifier key text is not one (name, key id, type, key), or its key id does not match."""


class BadSignature(NoteError):
    """A signature by a configured key does not verify: the note was altered or signed by another key."""


class UnverifiedNote(NoteError):
    """No signature on the note is by a configured key (or not by the key the caller requires)."""


class TooFewWitnesses(NoteError):
    """Fewer configured witnesses cosigned the note than the policy requires."""


def _crypto() -> Any:
    return require("cryptography.hazmat.primitives.asymmetric.ed25519", extra="audit",
                   feature="signed notes and cosignatures")


def _name_problem(name: Any) -> str | None:
    if type(name) is not str or not name:
        return "a key name is a non-empty text"
    if "+" in name or any(c.isspace() for c in name):
        return f"a key name has no spaces and no '+': {name[:60]!r}"
    if any(ord(c) < 0x20 for c in name):
        return f"a key name has no control characters: {name[:60]!r}"
    return None


def key_id(name: str, kind: int, public_key: bytes) -> bytes:
    """The 4-byte key id: ``SHA-256(name || 0x0A || kind || public_key)[:4]``."""
    return hashlib.sha256(name.encode("utf-8") + b"\n" + bytes([kind]) + public_key).digest()[:4]


def _b64(text: str) -> bytes | None:
    """Strict base64 (padding and canonical trailing bits), or None."""
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    return raw if base64.b64encode(raw).decode("ascii") == text else None


def _key_parts(text: Any, what: str) -> tuple[str, bytes, int, bytes]:
    """(name, key id, type, key bytes) of ``name+hex8+base64(type || key)``."""
    parts = text.split("+", 2) if type(text) is str else []  # base64 may hold a "+", the name and id never
    if len(parts) != 3:
        raise NoteKeyError(f"a {what} is name+keyid+key (three parts joined by '+'), not {len(parts)} part(s)")
    name, hex_id, encoded = parts
    # A malformed signer key may be cut anywhere in its secret: its errors quote none of it.
    public = what != "signer key"
    problem = _name_problem(name)
    if problem is not None:
        raise NoteKeyError(f"bad {what}: {problem if public else 'a key name has no spaces and no +'}")
    label = f"{what} {name}" if public else what
    if len(hex_id) != 8 or any(c not in "0123456789abcdef" for c in hex_id):
        raise NoteKeyError(f"bad {label}: its key id is 8 lowercase hex digits"
                           + (f", not {hex_id[:20]!r}" if public else ""))
    raw = _b64(encoded)
    if raw is None or len(raw) != 33 or raw[0] not in (ED25519, COSIGNATURE_V1):
        raise NoteKeyError(f"bad {label}: its key is base64 of a type byte (0x01 or 0x04) and 32 bytes")
    return name, bytes.fromhex(hex_id), raw[0], raw[1:]


@dataclass(frozen=True)
class Verifier:
    """A public key that may sign notes (``kind`` :data:`ED25519`) or cosign checkpoints (:data:`COSIGNATURE_V1`)."""

    name: str
    kind: int
    public_key: bytes

    def __post_init__(self) -> None:
        problem = _name_problem(self.name)
        if problem is not None:
            raise NoteKeyError(problem)
        if (self.kind not in (ED25519, COSIGNATURE_V1) or type(self.public_key) is not bytes
                or len(self.public_key) != 32):
            raise NoteKeyError(f"key {self.name}: an Ed25519 key is 32 bytes of type 0x01 or 0x04")

    @property
    def key_id(self) -> bytes:
        """The 4 bytes that start each of this key's signatures."""
        return key_id(self.name, self.kind, self.public_key)

    @property
    def vkey(self) -> str:
        """The vkey text: ``name+hex(key id)+base64(kind || public key)``."""
        encoded = base64.b64encode(bytes([self.kind]) + self.public_key).decode("ascii")
        return f"{self.name}+{self.key_id.hex()}+{encoded}"

    @classmethod
    def from_vkey(cls, text: str) -> Verifier:
        """The verifier a vkey text names; :class:`NoteKeyError` unless the key id in it is the key's."""
        name, stated, kind, public = _key_parts(text, "verifier key")
        verifier = cls(name, kind, public)
        if verifier.key_id != stated:
            raise NoteKeyError(f"bad verifier key {name}: it says key id {stated.hex()}, its key gives "
                               f"{verifier.key_id.hex()}")
        return verifier

    def _check(self, message: bytes, signature: bytes) -> bool:
        ed25519 = _crypto()
        from cryptography.exceptions import InvalidSignature  # present: _crypto needed cryptography
        try:
            ed25519.Ed25519PublicKey.from_public_bytes(self.public_key).verify(signature, message)
        except (InvalidSignature, ValueError):
            return False
        return True

    def verify(self, text: bytes, signature: bytes) -> int | None:
        """None unless ``signature`` (the bytes after the key id) is this key's over the note ``text``; else the
        cosignature's time, or 0 for a plain note signature."""
        if self.kind == ED25519:
            return 0 if len(signature) == 64 and self._check(text, signature) else None
        if len(signature) != 72:
            return None
        time = int.from_bytes(signature[:8], "big")
        if time > MAX_TIME or not self._check(cosigned_message(text, time), signature[8:]):
            return None
        return time


@dataclass(frozen=True)
class Signer:
    """A private key that signs notes or cosigns checkpoints; ``repr`` and errors never show the seed."""

    name: str
    kind: int
    seed: bytes = field(repr=False)

    def __post_init__(self) -> None:
        problem = _name_problem(self.name)
        if problem is not None:
            raise NoteKeyError(problem)
        if self.kind not in (ED25519, COSIGNATURE_V1) or type(self.seed) is not bytes or len(self.seed) != 32:
            raise NoteKeyError(f"key {self.name}: an Ed25519 private key is a 32-byte seed of type 0x01 or 0x04")

    @classmethod
    def generate(cls, name: str, kind: int = ED25519) -> Signer:
        """A new random key named ``name``."""
        ed25519 = _crypto()
        from cryptography.hazmat.primitives import serialization  # present: _crypto needed cryptography
        key = ed25519.Ed25519PrivateKey.generate()
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
        return cls(name, kind, raw)

    @classmethod
    def from_skey(cls, text: str) -> Signer:
        """The signer a ``PRIVATE+KEY+name+hex(key id)+base64(kind || seed)`` text names."""
        if type(text) is not str or not text.startswith("PRIVATE+KEY+"):
            raise NoteKeyError("a signer key text starts with PRIVATE+KEY+")
        name, stated, kind, seed = _key_parts(text[len("PRIVATE+KEY+"):], "signer key")
        signer = cls(name, kind, seed)
        if signer.verifier().key_id != stated:
            raise NoteKeyError("bad signer key: the key id it states is not its key's")
        return signer

    @property
    def skey(self) -> str:
        """The private key text (a secret: keep it out of logs, facts and errors)."""
        encoded = base64.b64encode(bytes([self.kind]) + self.seed).decode("ascii")
        return f"PRIVATE+KEY+{self.name}+{self.verifier().key_id.hex()}+{encoded}"

    def as_kind(self, kind: int) -> Signer:
        """The same key for another signature type (its key id differs)."""
        return Signer(self.name, kind, self.seed)

    def verifier(self) -> Verifier:
        """The public half."""
        ed25519 = _crypto()
        from cryptography.hazmat.primitives import serialization  # present: _crypto needed cryptography
        public = ed25519.Ed25519PrivateKey.from_private_bytes(self.seed).public_key()
        return Verifier(self.name, self.kind, public.public_bytes(serialization.Encoding.Raw,
                                                                  serialization.PublicFormat.Raw))

    def signature_line(self, text: bytes, time: int | None = None) -> str:
        """``— name base64(key id || signature)`` (and a newline) over the note ``text``; a cosigner needs
        ``time``, the Unix seconds the cosignature states (from the caller's clock)."""
        if self.kind == COSIGNATURE_V1:
            if type(time) is not int or not 0 <= time <= MAX_TIME:
                raise NoteError(f"a cosignature states its time in whole Unix seconds from 0 to {MAX_TIME}")
            message, prefix = cosigned_message(text, time), time.to_bytes(8, "big")
        elif time is not None:
            raise NoteError("a note signature (type 0x01) states no time; only a cosigner's does")
        else:
            message, prefix = text, b""
        signature = _crypto().Ed25519PrivateKey.from_private_bytes(self.seed).sign(message)
        encoded = base64.b64encode(self.verifier().key_id + prefix + signature).decode("ascii")
        return f"{DASH}{self.name} {encoded}\n"


def cosigned_message(text: bytes, time: int) -> bytes:
    """What a cosignature/v1 signs: ``cosignature/v1``, ``time <seconds>``, then the note text."""
    return b"cosignature/v1\ntime %d\n" % time + text


def _text_problem(text: bytes) -> str | None:
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        return "a note is UTF-8"
    if any(ord(c) < 0x20 and c != "\n" for c in decoded):
        return "a note has no control characters but newlines"
    return None


def _as_bytes(text: bytes | str) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else bytes(text)


def sign_note(text: bytes | str, *signers: Signer, time: int | None = None) -> bytes:
    """The note of ``text`` (ending in a newline) signed by each signer in turn (cosigners at ``time``)."""
    raw = _as_bytes(text)
    problem = _text_problem(raw) or (None if raw.endswith(b"\n") else "a note's text ends with a newline")
    if problem is not None:
        raise MalformedNote(f"cannot sign: {problem}")
    if not signers:
        raise NoteError("a note needs at least one signer")
    lines = [s.signature_line(raw, time if s.kind == COSIGNATURE_V1 else None) for s in signers]
    return raw + b"\n" + "".join(lines).encode("utf-8")


@dataclass(frozen=True)
class _Line:
    name: str
    key_id: bytes
    signature: bytes
    raw: str


def _split(note: bytes) -> tuple[bytes, list[_Line]]:
    problem = _text_problem(note)
    if problem is not None:
        raise MalformedNote(problem)
    at = note.rfind(b"\n\n")
    if at < 0:
        raise MalformedNote("a note has a blank line before its signatures; this one has none")
    text, block = note[:at + 1], note[at + 2:]
    if not block or not block.endswith(b"\n"):
        raise MalformedNote("a note ends with signature lines, each ending in a newline")
    lines = block[:-1].decode("utf-8").split("\n")
    if len(lines) > MAX_SIGNATURES:
        raise MalformedNote(f"a note carries at most {MAX_SIGNATURES} signatures, this one {len(lines)}")
    parsed = []
    for number, line in enumerate(lines, 1):
        if not line.startswith(DASH):
            raise MalformedNote(f"signature line {number} does not start with an em dash and a space")
        name, _, encoded = line[len(DASH):].partition(" ")
        raw = _b64(encoded)
        if _name_problem(name) is not None or raw is None or len(raw) < 5:
            raise MalformedNote(f"signature line {number} is not '— name base64(key id || signature)'")
        parsed.append(_Line(name, raw[:4], raw[4:], line))
    return text, parsed


def signature_names(note: bytes | str) -> list[str]:
    """The key names on the note's signature lines, in order, none of them checked (:class:`MalformedNote` for
    bytes that are no note): what a page may list beside what :func:`open_note` verified."""
    return [line.name for line in _split(_as_bytes(note))[1]]


def _keyring(verifiers: Iterable[Verifier]) -> dict[tuple[str, bytes], Verifier]:
    ring: dict[tuple[str, bytes], Verifier] = {}
    for v in verifiers:
        if not isinstance(v, Verifier):
            raise NoteKeyError(f"a verifier is a Verifier (Verifier.from_vkey), not {type(v).__name__}")
        known = ring.setdefault((v.name, v.key_id), v)
        if known != v:
            raise NoteKeyError(f"two configured keys share the name {v.name} and the key id {v.key_id.hex()}: "
                               "which one signed cannot be told; configure one")
    return ring


def _verified(note: bytes | str, verifiers: Iterable[Verifier]) -> tuple[bytes, list[tuple[Verifier, int]]]:
    """The text and each configured key whose signature verified (once, in note order), with its time."""
    text, lines = _split(_as_bytes(note))
    ring = _keyring(verifiers)
    found: list[tuple[Verifier, int]] = []
    for line in lines:
        verifier = ring.get((line.name, line.key_id))
        if verifier is None:  # unknown keys are ignored, even when they share a name or an id with a known one
            continue
        time = verifier.verify(text, line.signature)
        if time is None:
            raise BadSignature(f"the signature of {line.name} (key id {line.key_id.hex()}) does not verify: the "
                               "note was changed after signing, or another key signed it under that name")
        if all(v != verifier for v, _ in found):
            found.append((verifier, time))
    if not found:
        names = ", ".join(sorted({line.name for line in lines}))
        raise UnverifiedNote(f"no signature on the note is by a configured key (it is signed by {names})")
    return text, found


def open_note(note: bytes | str, verifiers: Iterable[Verifier]) -> tuple[str, list[str]]:
    """The note's text and the names of the configured keys whose signatures verified, in note order.

    :class:`MalformedNote` for bytes that are no note, :class:`BadSignature` when a configured key's signature
    fails, :class:`UnverifiedNote` when none is by a configured key."""
    text, found = _verified(note, verifiers)
    return text.decode("utf-8"), [v.name for v, _ in found]


def cosign(note: bytes | str, cosigner: Signer, time: int) -> bytes:
    """``note`` with ``cosigner``'s cosignature/v1 line added, stating ``time``. The caller has verified the
    log's signature and the consistency with what it cosigned before (the cosignature says so)."""
    if cosigner.kind != COSIGNATURE_V1:
        raise NoteKeyError(f"key {cosigner.name} is a note key (type 0x01); a cosigner's is type 0x04 "
                           "(Signer.as_kind(COSIGNATURE_V1))")
    raw = _as_bytes(note)
    text, lines = _split(raw)
    if len(lines) >= MAX_SIGNATURES:
        raise MalformedNote(f"the note already carries {len(lines)} signatures, the most a note may")
    return raw + cosigner.signature_line(text, time).encode("utf-8")


@dataclass(frozen=True)
class Cosignature:
    """A verified cosignature: the witness key's name and the time it states."""

    name: str
    time: int


@dataclass(frozen=True)
class Witnessed:
    """A note its log signed and enough witnesses cosigned: the text, the log key's name, the cosignatures."""

    text: str
    log: str
    cosignatures: tuple[Cosignature, ...]


def open_witnessed(note: bytes | str, log: Iterable[Verifier], witnesses: Iterable[Verifier], k: int) -> Witnessed:
    """Open ``note`` requiring a signature by one of the ``log`` keys and valid cosignatures by at least ``k``
    of the ``witnesses`` (type 0x04 keys); any configured key's bad signature fails it (:class:`BadSignature`)."""
    log_keys, witness_keys = list(log), list(witnesses)
    if any(w.kind != COSIGNATURE_V1 for w in witness_keys):
        raise NoteKeyError("a witness key is a cosignature/v1 key (type 0x04)")
    if any(v.kind != ED25519 for v in log_keys):
        raise NoteKeyError("a log key is a note key (type 0x01)")
    if type(k) is not int or not 0 <= k <= len(set(witness_keys)):
        raise NoteKeyError(f"a policy asks for 0 to {len(set(witness_keys))} of the witnesses configured, not {k!r}")
    text, found = _verified(note, [*log_keys, *witness_keys])
    signed_by = [v.name for v, _ in found if v in log_keys]
    if not signed_by:
        raise UnverifiedNote("the note is not signed by the log's key (only by witnesses)")
    cosignatures = tuple(Cosignature(v.name, time) for v, time in found if v in witness_keys)
    if len(cosignatures) < k:
        raise TooFewWitnesses(f"{len(cosignatures)} of the configured witnesses cosigned the note "
                              f"({', '.join(c.name for c in cosignatures) or 'none'}); the policy needs {k}")
    return Witnessed(text.decode("utf-8"), signed_by[0], cosignatures)
