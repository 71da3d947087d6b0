"""A witness cosigns a checkpoint only when it extends the last one it cosigned (issue 31, C2SP tlog-witness).

Attacker: the log's operator (it has the log's signing key and the database) trying to show a witness a history
that does not extend what the witness cosigned; or someone with neither key forging a checkpoint."""

from __future__ import annotations

import pytest

from statebook.adapters.note import (
    COSIGNATURE_V1, BadSignature, Signer, TooFewWitnesses, cosign, open_witnessed, sign_note,
)
from statebook.adapters.witness import WitnessConflict, WitnessRefused, add_checkpoint, witness_request
from statebook.lifecycle import tlog

pytest.importorskip("cryptography")
ORIGIN = "statebook.test/log"


def leaves(n: int, salt: str = "") -> list[bytes]:
    return [tlog.leaf_hash(tlog.fact_leaf(i, f"{salt}{i:060x}".ljust(64, "0"))) for i in range(1, n + 1)]


@pytest.fixture
def keys() -> tuple[Signer, Signer]:
    return Signer.generate(ORIGIN), Signer.generate("witness.test/w1", COSIGNATURE_V1)


def checkpoint(log: Signer, hashes: list[bytes]) -> bytes:
    return sign_note(tlog.checkpoint_body(ORIGIN, len(hashes), tlog.root(hashes)), log)


def test_the_witness_cosigns_a_log_that_grows_and_its_cosignature_verifies(tmp_path, keys):
    log, witness = keys
    first = checkpoint(log, leaves(4))
    line = add_checkpoint(witness_request(0, [], first), [log.verifier()], witness, tmp_path, now=1_700_000_000)
    cosigned = first + line.encode()
    seen = open_witnessed(cosigned, [log.verifier()], [witness.verifier()], 1)
    assert [c.name for c in seen.cosignatures] == ["witness.test/w1"]
    grown = leaves(9)
    second = checkpoint(log, grown)
    add_checkpoint(witness_request(4, tlog.consistency_proof(4, grown), second), [log.verifier()], witness,
                   tmp_path, now=1_700_000_060)
    # The witness now knows size 9: a request from 4 again is a conflict naming 9.
    with pytest.raises(WitnessConflict) as conflict:
        add_checkpoint(witness_request(4, tlog.consistency_proof(4, grown), second), [log.verifier()], witness,
                       tmp_path, now=1_700_000_120)
    assert conflict.value.known == 9


def test_a_fork_is_refused_and_the_witness_state_does_not_move(tmp_path, keys):
    """The operator signs a checkpoint of a rewritten history (same size, other leaves, or grown from a changed
    prefix): no consistency proof from what the witness cosigned exists, so it is refused."""
    log, witness = keys
    add_checkpoint(witness_request(0, [], checkpoint(log, leaves(5))), [log.verifier()], witness, tmp_path, now=1)
    forked = leaves(8, salt="f")
    for proof in (tlog.consistency_proof(5, forked), [], [b"\x00" * 32] * 3):
        with pytest.raises(WitnessRefused, match="does not verify"):
            add_checkpoint(witness_request(5, proof, checkpoint(log, forked)), [log.verifier()], witness, tmp_path,
                           now=2)
    same_size_other_root = leaves(5, salt="g")
    with pytest.raises(WitnessRefused, match="does not verify"):
        add_checkpoint(witness_request(5, [], checkpoint(log, same_size_other_root)), [log.verifier()], witness,
                       tmp_path, now=3)
    # The honest continuation still goes through: the refusals left the state at 5.
    honest = leaves(7)
    add_checkpoint(witness_request(5, tlog.consistency_proof(5, honest), checkpoint(log, honest)), [log.verifier()],
                   witness, tmp_path, now=4)


def test_a_checkpoint_not_signed_by_the_log_or_a_malformed_request_is_refused(tmp_path, keys):
    log, witness = keys
    forger = Signer.generate(ORIGIN)
    with pytest.raises(WitnessRefused, match="log's key"):
        add_checkpoint(witness_request(0, [], checkpoint(forger, leaves(3))), [log.verifier()], witness, tmp_path,
                       now=1)
    note = checkpoint(log, leaves(3))
    for bad in (b"old 00\n\n" + note, b"new 0\n\n" + note, b"old 0\nnot base64!\n\n" + note,
                b"old 0\n" + b"QUJD\n\n" + note, note):
        with pytest.raises(WitnessRefused):
            add_checkpoint(bad, [log.verifier()], witness, tmp_path, now=1)
    assert list(tmp_path.iterdir()) == []


def test_a_forged_cosignature_does_not_count(tmp_path, keys):
    """Attacker: no witness key. A cosignature line made with another key under the witness's name, or the
    witness's real cosignature moved onto another checkpoint, does not count towards k."""
    log, witness = keys
    note = checkpoint(log, leaves(3))
    impostor = Signer.generate("witness.test/w1", COSIGNATURE_V1)
    with pytest.raises(TooFewWitnesses):  # another key: another key id, so not the witness's at all
        open_witnessed(cosign(note, impostor, 5), [log.verifier()], [witness.verifier()], 1)
    line = add_checkpoint(witness_request(0, [], note), [log.verifier()], witness, tmp_path, now=5)
    other = checkpoint(log, leaves(4))
    with pytest.raises(BadSignature):
        open_witnessed(other + line.encode(), [log.verifier()], [witness.verifier()], 1)
