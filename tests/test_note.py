"""Signed notes and cosignatures (adapters/note.py; C2SP signed-note, tlog-checkpoint, tlog-cosignature).

Interoperability is checked three ways: published notes made by other implementations open (Go's
golang.org/x/mod/sumdb/note test note, the C2SP example, a checkpoint of a real log cosigned by a real witness);
statebook's own signature of Go's test note is Go's byte for byte (Ed25519 is deterministic); and a verifier
written here from the C2SP text alone, sharing no code with statebook, accepts statebook's notes and
cosignatures. Then every forgery the specs name fails with its own error.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cryptography")  # the audit extra (installed in the dev venv and CI)
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey  # noqa: E402

from profiles import examples  # noqa: E402
from statebook.adapters.note import (  # noqa: E402
    COSIGNATURE_V1, ED25519, BadSignature, MalformedNote, NoteError, NoteKeyError, Signer, TooFewWitnesses,
    UnverifiedNote, Verifier, cosign, cosigned_message, key_id, open_note, open_witnessed, sign_note)
from statebook.lifecycle.tlog import checkpoint_body, leaf_hash, parse_checkpoint, root  # noqa: E402

# golang.org/x/mod/sumdb/note, note_test.go: Peter Neumann's and Enoch Root's test keys and their signatures.
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
GO_TEXT = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n"
PETER_SIG = ("\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6Ryy"
             "BwJnAM=\n")
ENOCH_SIG = ("\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oOTGwnWLox33WWd1R"
             "vMc+QQ=\n")

# c2sp.org/signed-note, "Example".
C2SP_VKEY = "example.com/foo+530d903a+AekyeRrm56hApGFkyQR4ZCbV54Id2LKaANYcrnKv3U2k"
C2SP_NOTE = ("This is an example message.\n\n\u2014 example.com/foo Uw2QOkn8srV1yJGh2VYRlL1Tnagv1YEq6TfXppzi2ONncAlTgK7"
             "Ztg1ERYNZXsYjOBH3mFXmRKuwHjG1Yu72IneyaQM=\n")

# A checkpoint of the CT log arche2025h1.staging.ct.transparency.dev, cosigned by witnesses (kept as test data by
# github.com/florolf/tlog-scales); the log's Ed25519 note key and the remora.n621.de witness's cosignature key.
ARCHE_VKEY = "arche2025h1.staging.ct.transparency.dev+ba2f06c0+AU0vHmlGCS/PdN8b2OaGmKprLI8HKM+dJ472xgFYh15f"
REMORA_VKEY = "remora.n621.de+da77ade7+BOvN63jn/bLvkieywe8R6UYAtVtNbZpXh34x7onlmtw2"
ARCHE_CHECKPOINT = "\n".join([
    "arche2025h1.staging.ct.transparency.dev",
    "1432088532",
    "U7WM79jrzyhGZ5/GUBTpM7NzwdyfFx61t3RovgcC4Ro=",
    "",
    "\u2014 arche2025h1.staging.ct.transparency.dev zTM8sQAAAZ5W0WdjBAMARjBEAiBjW5IQf9pvsYLfQFX6hoGREPMHbdQ3urbllzalA"
    "pkptQIgIpwtEroeW2BXaHAI4kJXFbon5Ch9MNL5zRNZ55lvGt0=",
    "\u2014 arche2025h1.staging.ct.transparency.dev ui8GwCF1+kWqZrxGdhj4aX3gcw7XUlXQQabg/27lefwhUkzbC3NygNI75MdhL1bfT"
    "W9g8Ei59RA23oHP7Ry1k3ZFWwQ=",
    "\u2014 transparency.dev/DEV:witness-little-garden 2AQqhwAAAABqEiEgzgFIqqhbUoDwjMWE6UP8nd8/KYTzwZ2rhIgcqoXHAwVkjZr4"
    "AscylP3v7sEodkRAErumC2q44vdgJY096st5BQ==",
    "\u2014 witness1.smartit.nu/witness1 pIyCDwAAAABqEiEghIp82KWebrw7/oHQwlTAm3g2RKS4+eebl8eO0WH+/iEcxZ75W3u5hNI7TOQtmJ"
    "bqmNWVuE0tgh0XwzdZsDsUAQ==",
    "\u2014 remora.n621.de 2net5wAAAABqEiEgPlfF3V06o0Y+fHM+J5J9s27wgxxcOVSpZ/2g/KSiXCg9DEZI+aVCIobWX9sXTynk5XeU/zZ0WBx"
    "tqB0DrAWfBw==",
    "\u2014 witness.stagemole.eu Z/euoAAAAABqEiEgw0i+7g2ENfDAWHmtRzCfKTHSDwYDJA2NmKeGi9Y8FtEyOUvVr+AJmIY/2TUFucgKi7lI7"
    "cUiOvKFYe/TmN9DAg==",
    ""])


# -- an independent verifier, from the C2SP text alone ------------------------------------------


def c2sp_verify(note: bytes, vkeys: list[str]) -> list[tuple[str, int | None]]:
    """(name, cosignature time or None) of each verified signature; AssertionError or InvalidSignature otherwise.

    signed-note: UTF-8, no control characters but newline; the text ends at the last blank line, keeps its final
    newline; each signature line is em dash, space, name, space, base64(key id || signature), newline. A vkey is
    name+hex(id)+base64(type || key) with id = SHA-256(name || 0x0A || type || key)[:4]. tlog-cosignature: type
    0x04 signs "cosignature/v1\\ntime <t>\\n" + the text; its signature is id || u64 big-endian t || Ed25519.
    """
    decoded = note.decode("utf-8")
    assert all(c == "\n" or ord(c) >= 0x20 for c in decoded)
    cut = decoded.rindex("\n\n")
    text, block = decoded[:cut + 1], decoded[cut + 2:]
    assert text.endswith("\n") and block.endswith("\n")
    keys = {}
    for vkey in vkeys:
        name, hex_id, material = vkey.split("+", 2)
        raw_key = base64.b64decode(material)
        assert hashlib.sha256(name.encode() + b"\x0a" + raw_key[:1] + raw_key[1:]).digest()[:4].hex() == hex_id
        keys[(name, bytes.fromhex(hex_id))] = (raw_key[0], Ed25519PublicKey.from_public_bytes(raw_key[1:]))
    verified: list[tuple[str, int | None]] = []
    for line in block[:-1].split("\n"):
        assert line[:2] == "\u2014 "
        name, encoded = line[2:].split(" ")
        raw = base64.b64decode(encoded, validate=True)
        if (name, raw[:4]) not in keys:
            continue
        kind, public = keys[(name, raw[:4])]
        if kind == 0x01:
            public.verify(raw[4:], text.encode())
            verified.append((name, None))
        else:
            assert kind == 0x04 and len(raw) == 4 + 8 + 64
            (seconds,) = struct.unpack(">Q", raw[4:12])
            public.verify(raw[12:], b"cosignature/v1\ntime " + str(seconds).encode() + b"\n" + text.encode())
            verified.append((name, seconds))
    assert verified
    return verified


LOG = Signer.from_skey(PETER_SKEY)
WITNESSES = [Signer.generate(f"witness{i}.example/w", COSIGNATURE_V1) for i in range(3)]
BODY = checkpoint_body("statebook.example/orders", 3, root([leaf_hash(b"a"), leaf_hash(b"b"), leaf_hash(b"c")]))


def cosigned(note: bytes, *witnesses: Signer, time: int = 1_790_000_000) -> bytes:
    for w in witnesses:
        note = cosign(note, w, time)
    return note


def without_line(note: bytes, index: int) -> bytes:
    """``note`` without its signature line number ``index`` (0: the first)."""
    text, _, block = note.rpartition(b"\n\n")
    lines = block.splitlines(keepends=True)
    return text + b"\n\n" + b"".join(lines[:index] + lines[index + 1:])


# -- published vectors -------------------------------------------------------------------------


def test_statebook_signs_gos_test_note_byte_for_byte():
    assert LOG.verifier().vkey == PETER_VKEY and LOG.skey == PETER_SKEY
    assert sign_note(GO_TEXT, LOG) == (GO_TEXT + "\n" + PETER_SIG).encode()


def test_gos_test_note_opens_with_either_or_both_keys():
    note = GO_TEXT + "\n" + PETER_SIG + ENOCH_SIG
    peter, enoch = Verifier.from_vkey(PETER_VKEY), Verifier.from_vkey(ENOCH_VKEY)
    assert open_note(note, [peter]) == (GO_TEXT, ["PeterNeumann"])
    assert open_note(note, [enoch, peter]) == (GO_TEXT, ["PeterNeumann", "EnochRoot"])
    with pytest.raises(UnverifiedNote, match="PeterNeumann"):
        open_note(note, [])
    with pytest.raises(BadSignature, match="PeterNeumann"):  # Go's "invalid signature" case
        open_note(GO_TEXT + "\n" + PETER_SIG[:60] + "ABCD" + PETER_SIG[60:], [peter])


@pytest.mark.parametrize("note", [
    GO_TEXT, GO_TEXT + "\n", GO_TEXT + "\n" + PETER_SIG[:-1], "\x01" + GO_TEXT + "\n" + PETER_SIG,
    GO_TEXT + "\n" + PETER_SIG.replace("PeterNeumann", "Bad Name"), GO_TEXT + "\n" + PETER_SIG + "Unexpected line.\n",
    GO_TEXT + "\n" + PETER_SIG * 101], ids=["no block", "blank only", "no final newline", "control character",
                                            "space in name", "a line after", "too many signatures"])
def test_gos_malformed_notes_are_malformed(note):
    with pytest.raises(MalformedNote):
        open_note(note, [Verifier.from_vkey(PETER_VKEY)])
    with pytest.raises(MalformedNote):
        open_note(b"\xff" + GO_TEXT.encode() + b"\n" + PETER_SIG.encode(), [Verifier.from_vkey(PETER_VKEY)])


def test_every_mangling_of_gos_vkey_is_refused():
    """Go's TestNewVerifier: each proper substring and each byte raised by one is no key."""
    raw = PETER_VKEY.encode()
    manglings = {raw[i:j] for i in range(len(raw) + 1) for j in range(i + 1, len(raw) + 1) if (i, j) != (0, len(raw))}
    manglings |= {raw[:i] + bytes([raw[i] + 1]) + raw[i + 1:] for i in range(len(raw))}
    for bad in manglings:
        with pytest.raises(NoteKeyError):
            Verifier.from_vkey(bad.decode())
    for bad in ("PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
                "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"):
        with pytest.raises(NoteKeyError):
            Verifier.from_vkey(bad)


def test_the_c2sp_example_note_opens():
    assert open_note(C2SP_NOTE, [Verifier.from_vkey(C2SP_VKEY)]) == ("This is an example message.\n",
                                                                    ["example.com/foo"])


def test_a_real_logs_checkpoint_and_a_real_witness_cosignature_verify():
    log, remora = Verifier.from_vkey(ARCHE_VKEY), Verifier.from_vkey(REMORA_VKEY)
    assert remora.kind == COSIGNATURE_V1 and log.kind == ED25519
    witnessed = open_witnessed(ARCHE_CHECKPOINT, [log], [remora], 1)
    assert witnessed.log == "arche2025h1.staging.ct.transparency.dev"
    assert [(c.name, c.time) for c in witnessed.cosignatures] == [("remora.n621.de", 1779573024)]
    assert parse_checkpoint(witnessed.text).size == 1432088532
    assert c2sp_verify(ARCHE_CHECKPOINT.encode(), [ARCHE_VKEY, REMORA_VKEY]) == [
        ("arche2025h1.staging.ct.transparency.dev", None), ("remora.n621.de", 1779573024)]
    changed = ARCHE_CHECKPOINT.replace("1432088532", "1432088533", 1)
    for keys, name in (([log], "arche2025h1"), ([remora], "remora")):  # each signature covers the size
        with pytest.raises(BadSignature, match=name):
            open_note(changed, keys)


def test_published_keys_give_their_key_ids():
    assert Verifier.from_vkey(REMORA_VKEY).key_id.hex() == "da77ade7"  # a type 0x04 key (transparency-dev/formats)
    assert Verifier.from_vkey("TEST+7997405c+AQcC+FTVKf0jlTdHDY3rbevmnKxxPjigCXlVtGe6RIr6").key_id.hex() == "7997405c"
    # transparency-dev/formats witness tests: a signer and its verifier, the key id computed the same way.
    wit1 = Signer.from_skey("PRIVATE+KEY+Wit1+55ee4561+AeadRiG7XM4XiieCHzD8lxysXMwcViy5nYsoXURWGrlE")
    assert wit1.verifier().vkey == "Wit1+55ee4561+AVhZSmQj9+SoL+p/nN0Hh76xXmF7QcHfytUrI1XfSClk"
    assert key_id("Wit1", ED25519, wit1.verifier().public_key).hex() == "55ee4561"


# -- statebook's notes, checked by the independent verifier -------------------------------------


def test_a_checkpoint_note_round_trips_and_the_independent_verifier_accepts_it():
    note = sign_note(BODY, LOG)
    assert open_note(note, [LOG.verifier()]) == (BODY.decode(), ["PeterNeumann"])
    assert c2sp_verify(note, [PETER_VKEY]) == [("PeterNeumann", None)]
    assert parse_checkpoint(open_note(note, [LOG.verifier()])[0]).size == 3


def test_cosignatures_round_trip_and_the_independent_verifier_accepts_them():
    note = cosigned(sign_note(BODY, LOG), *WITNESSES[:2], time=1_790_000_123)
    w = [s.verifier() for s in WITNESSES]
    witnessed = open_witnessed(note, [LOG.verifier()], w, 2)
    assert [(c.name, c.time) for c in witnessed.cosignatures] == [(WITNESSES[0].name, 1_790_000_123),
                                                                  (WITNESSES[1].name, 1_790_000_123)]
    assert c2sp_verify(note, [PETER_VKEY, *(v.vkey for v in w)]) == [
        ("PeterNeumann", None), (WITNESSES[0].name, 1_790_000_123), (WITNESSES[1].name, 1_790_000_123)]
    line = note.decode().splitlines()[-1]
    raw = base64.b64decode(line.split(" ")[-1])
    assert raw[:4] == w[1].key_id and raw[4:12] == (1_790_000_123).to_bytes(8, "big") and len(raw) == 76
    public = Ed25519PublicKey.from_public_bytes(w[1].public_key)
    public.verify(raw[12:], b"cosignature/v1\ntime 1790000123\n" + BODY)  # raises unless the bytes are right
    assert cosigned_message(BODY, 0) == b"cosignature/v1\ntime 0\n" + BODY


def test_one_key_for_both_types_has_two_key_ids():
    plain, cosigner = LOG, LOG.as_kind(COSIGNATURE_V1)
    assert plain.verifier().key_id != cosigner.verifier().key_id
    with pytest.raises(UnverifiedNote):  # a note key does not stand for a cosignature, nor the reverse
        open_note(sign_note(BODY, cosigner, time=5), [plain.verifier()])
    with pytest.raises(UnverifiedNote):
        open_note(sign_note(BODY, plain), [cosigner.verifier()])


# -- forgeries ---------------------------------------------------------------------------------


def test_a_changed_text_fails_its_signature():
    note = sign_note(BODY, LOG)
    forged = note.replace(b"\n3\n", b"\n4\n", 1)
    with pytest.raises(BadSignature, match="PeterNeumann"):
        open_note(forged, [LOG.verifier()])


def test_a_note_re_signed_by_another_key_under_the_same_name_is_unverified():
    impostor = Signer.generate(LOG.name)
    with pytest.raises(UnverifiedNote, match="not signed by the log|no signature"):
        open_note(sign_note(BODY.replace(b"\n3\n", b"\n4\n"), impostor), [LOG.verifier()])


def test_a_key_id_collision_with_a_bad_signature_fails_the_note():
    """An attacker who found a key whose id collides with the log's (cheap: 4 bytes) signs under the log's name
    and id: the configured key checks that signature, and it fails."""
    attacker = Ed25519PrivateKey.generate()
    forged_sig = attacker.sign(BODY)
    line = "\u2014 " + LOG.name + " " + base64.b64encode(LOG.verifier().key_id + forged_sig).decode() + "\n"
    with pytest.raises(BadSignature, match="PeterNeumann"):
        open_note(BODY + b"\n" + line.encode(), [LOG.verifier()])
    honest_first = sign_note(BODY, LOG) + line.encode()  # one good signature does not excuse a bad one
    with pytest.raises(BadSignature):
        open_note(honest_first, [LOG.verifier()])


def test_a_wrong_key_name_is_an_unknown_key():
    note = sign_note(BODY, LOG).replace(b"PeterNeumann", b"PeterNeuman")
    with pytest.raises(UnverifiedNote):
        open_note(note, [LOG.verifier()])


@pytest.mark.parametrize("cut", ["last byte", "signature line", "blank line", "half a signature"])
def test_a_truncated_note_is_malformed(cut):
    note = sign_note(BODY, LOG)
    truncated = {"last byte": note[:-1], "signature line": note[:note.rindex(b"\n\n") + 2],
                 "blank line": BODY, "half a signature": note[:len(note) - 40] + b"\n"}[cut]
    with pytest.raises(MalformedNote):
        open_note(truncated, [LOG.verifier()])


def test_a_cosignature_moved_to_another_checkpoint_fails():
    note = cosigned(sign_note(BODY, LOG), WITNESSES[0])
    cosig_line = note.decode().splitlines()[-1] + "\n"
    other = sign_note(checkpoint_body("statebook.example/orders", 4, bytes(32)), LOG) + cosig_line.encode()
    with pytest.raises(BadSignature, match=WITNESSES[0].name):
        open_witnessed(other, [LOG.verifier()], [WITNESSES[0].verifier()], 1)


def test_a_cosignature_with_another_time_fails():
    note = cosigned(sign_note(BODY, LOG), WITNESSES[0], time=1000)
    line = note.decode().splitlines()[-1]
    name, encoded = line[2:].split(" ")
    raw = base64.b64decode(encoded)
    for time in (1001, 0, 2**63 - 1, 2**63, 2**64 - 1):
        moved = raw[:4] + time.to_bytes(8, "big") + raw[12:]
        forged = note.decode().replace(encoded, base64.b64encode(moved).decode())
        with pytest.raises(BadSignature, match=name):
            open_witnessed(forged, [LOG.verifier()], [WITNESSES[0].verifier()], 1)


def test_k_of_n_witnesses():
    verifiers = [w.verifier() for w in WITNESSES]
    note = cosigned(sign_note(BODY, LOG), WITNESSES[0], WITNESSES[2], WITNESSES[0])
    assert len(open_witnessed(note, [LOG.verifier()], verifiers, 2).cosignatures) == 2  # a repeat counts once
    with pytest.raises(TooFewWitnesses, match="2 of the configured witnesses .* needs 3"):
        open_witnessed(note, [LOG.verifier()], verifiers, 3)
    with pytest.raises(TooFewWitnesses, match="needs 1"):  # cosigned by witnesses this policy does not know
        open_witnessed(note, [LOG.verifier()], [WITNESSES[1].verifier()], 1)
    with pytest.raises(UnverifiedNote, match="log"):  # witnesses alone do not make a checkpoint
        open_witnessed(without_line(note, 0), [LOG.verifier()], verifiers, 1)
    with pytest.raises(NoteKeyError):
        open_witnessed(note, [LOG.verifier()], verifiers, 4)
    with pytest.raises(NoteKeyError, match="0x04"):
        open_witnessed(note, [LOG.verifier()], [LOG.verifier()], 1)


def test_two_configured_keys_with_one_name_and_id_are_refused():
    a = Verifier.from_vkey(PETER_VKEY)
    twin = _with_key_id(Verifier(a.name, a.kind, bytes(32)), a.key_id)
    with pytest.raises(NoteKeyError, match="share the name"):
        open_note(sign_note(BODY, LOG), [a, twin])
    assert open_note(sign_note(BODY, LOG), [a, a])[1] == [a.name]  # the same key twice is one key


def _with_key_id(verifier: Verifier, wanted: bytes) -> Verifier:
    """A verifier whose key id is forced to ``wanted`` (a collision, without searching 2**32 keys)."""
    class Colliding(Verifier):
        @property
        def key_id(self) -> bytes:
            return wanted
    return Colliding(verifier.name, verifier.kind, verifier.public_key)


def test_signing_refuses_what_is_no_note():
    for text in ("no newline", "bell\x07\n", b"\xff\n"):
        with pytest.raises(MalformedNote):
            sign_note(text, LOG)
    with pytest.raises(NoteError, match="time"):
        sign_note(BODY, WITNESSES[0])  # a cosigner needs a time
    with pytest.raises(NoteKeyError, match="0x04"):
        cosign(sign_note(BODY, LOG), LOG, 1)
    for name in ("", "a b", "a+b", "tab\there"):
        with pytest.raises(NoteKeyError):
            Signer.generate(name)


def test_the_private_key_stays_out_of_repr_and_errors():
    secret = PETER_SKEY.split("+", 4)[-1]  # base64(type || seed): "AYEKFALVFGyNhPJEMzD1QIDr+Y7hf..."
    assert "seed" not in repr(LOG) and secret not in repr(LOG)
    # Malformed texts cut anywhere in the secret: no error quotes a piece of it.
    for bad in (PETER_SKEY[:-4] + "AAAA", "PRIVATE+KEY+" + secret, "PRIVATE+KEY+a+" + secret,
                "PRIVATE+KEY+PeterNeumann+c74f20a3+" + secret[:-1], PETER_SKEY.replace("+c74f20a3+", "+c74f20a4+")):
        with pytest.raises(NoteKeyError) as caught:
            Signer.from_skey(bad)
        message = str(caught.value)
        assert not any(secret[i:i + 6] in message for i in range(len(secret) - 5)), message


@settings(max_examples=examples(100), deadline=None)
@given(text=st.text(st.characters(min_codepoint=0x20, exclude_categories=["Cs"]), min_size=1, max_size=60),
       data=st.data())
def test_no_single_byte_change_of_a_signed_note_opens_as_it_was(text, data):
    note = cosigned(sign_note(text + "\n", LOG), WITNESSES[0])
    verifiers = [LOG.verifier(), WITNESSES[0].verifier()]
    assert open_note(note, verifiers) == (text + "\n", [LOG.name, WITNESSES[0].name])
    at = data.draw(st.integers(0, len(note) - 1), label="position")
    value = data.draw(st.integers(0, 255).filter(lambda b: b != note[at]), label="byte")
    try:
        opened = open_note(note[:at] + bytes([value]) + note[at + 1:], verifiers)
    except NoteError:
        return
    # Only a renamed or re-keyed signature line opens: as an unknown key's, ignored, and no longer counted.
    assert opened[0] == text + "\n" and len(opened[1]) == 1


def test_importing_the_module_loads_no_cryptography():
    code = "import sys, statebook.adapters.note; print('cryptography' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_a_text_with_blank_lines_is_cut_at_the_last_one():
    text = "statebook.example/orders\n\nsecond paragraph\n\n\nthird\n"
    note = sign_note(text, LOG)
    assert open_note(note, [LOG.verifier()]) == (text, ["PeterNeumann"])
    assert c2sp_verify(note, [PETER_VKEY]) == [("PeterNeumann", None)]


def test_a_cosignature_stating_a_time_past_the_limit_is_refused_even_if_signed():
    """tlog-cosignature: the timestamp MUST NOT exceed 2**63 - 1; a witness key that signed a larger one anyway
    has made no valid cosignature."""
    witness = WITNESSES[0]
    note = sign_note(BODY, LOG)
    private = Ed25519PrivateKey.from_private_bytes(witness.seed)
    for seconds, ok in ((2**63 - 1, True), (2**63, False), (2**64 - 1, False)):
        signature = private.sign(b"cosignature/v1\ntime %d\n" % seconds + BODY)
        raw = witness.verifier().key_id + seconds.to_bytes(8, "big") + signature
        line = f"\u2014 {witness.name} {base64.b64encode(raw).decode()}\n".encode()
        if ok:
            opened = open_witnessed(note + line, [LOG.verifier()], [witness.verifier()], 1)
            assert opened.cosignatures[0].time == seconds
        else:
            with pytest.raises(BadSignature, match=witness.name):
                open_witnessed(note + line, [LOG.verifier()], [witness.verifier()], 1)


def test_a_signature_in_non_canonical_base64_is_malformed():
    """68 bytes of key id and signature leave 2 unused bits in the last base64 digit: setting them decodes to the
    same bytes, but it is not the one encoding of them."""
    note = sign_note(BODY, LOG).decode()
    encoded = note.splitlines()[-1].split(" ")[-1]
    assert encoded.endswith("=") and not encoded.endswith("==")
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    last = digits.index(encoded[-2])
    sloppy = encoded[:-2] + digits[last | 0b11] + "="
    assert sloppy != encoded and base64.b64decode(sloppy) == base64.b64decode(encoded)
    with pytest.raises(MalformedNote):
        open_note(note.replace(encoded, sloppy), [LOG.verifier()])


def test_without_the_audit_extra_a_key_is_one_line_naming_it():
    code = ("import sys; sys.modules['cryptography'] = None\n"
            "from statebook.adapters.note import Signer\n"
            "try:\n    Signer.generate('log.example')\n"
            "except Exception as exc:\n    print(type(exc).__name__, exc)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("MissingExtra ") and "pip install 'statebook[audit]'" in result.stdout
