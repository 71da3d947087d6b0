"""The fact log's anchors from the command line and the daemon (issue 31, specs/audit.md A7, A8): a note key,
checkpoints published by hand and by `statebook run`, a fact's proof checked offline, a witness's cosignature,
and the alarm when the database no longer extends the last checkpoint.

Attacker of the last tests: write access to the database (raw SQL), no signing key."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app
from statebook.adapters.daemon import run_daemon
from statebook.adapters.settings import load_settings

pytest.importorskip("cryptography")

ENV = {"STATEBOOK_DB": None, "STATEBOOK_APP": None, "STATEBOOK_CONFIG": None}


def invoke(*args: str):
    return CliRunner().invoke(app, list(args), env=ENV)


@pytest.fixture
def log(tmp_path, monkeypatch) -> dict[str, str]:
    """A database with a few facts, a log key and settings that name them (./statebook.toml)."""
    monkeypatch.chdir(tmp_path)
    db = f"sqlite:///{tmp_path / 'app.db'}"
    made = invoke("checkpoint", "note-key", "--name", "example.test/log", "--out", "log.key")
    assert made.exit_code == 0, made.output
    assert (tmp_path / "log.key").stat().st_mode & 0o777 == 0o600
    assert "PRIVATE" not in made.stdout
    (tmp_path / "statebook.toml").write_text(
        f'db = "{db}"\n[audit]\nlog_key = {{ file = "log.key" }}\ncheckpoint_dir = "checkpoints"\n'
        'checkpoint_command = ["sh", "-c", "cat > pushed.note"]\n')
    assert invoke("db", "upgrade").exit_code == 0
    for name in ("a", "b"):
        assert invoke("schedule", "add", name, "--every", "3600", "--command", "/bin/true").exit_code == 0
    return {"db": db, "vkey": made.stdout.strip()}


def facts(schedule: str) -> list[dict]:
    shown = invoke("schedule", "show", schedule, "--json")
    entity = json.loads(shown.stdout)["id"]
    out = invoke("history", "schedule", entity, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_a_published_checkpoint_proves_a_fact_offline_and_an_edited_fact_fails(log, tmp_path):
    first = invoke("checkpoint", "publish")
    assert first.exit_code == 0 and "checkpoint of 2 facts" in first.stdout and "published" in first.stdout
    assert invoke("checkpoint", "publish").stdout.strip().endswith("unchanged since the last checkpoint")
    assert (tmp_path / "pushed.note").read_bytes() == (tmp_path / "checkpoints" / f"{2:020d}.checkpoint").read_bytes()
    assert invoke("schedule", "disable", "a").exit_code == 0
    assert "checkpoint of 3 facts" in invoke("checkpoint", "publish").stdout
    fact = facts("a")[1]
    (tmp_path / "fact.json").write_text(json.dumps(fact))
    proved = invoke("audit", "prove", fact["id"])
    assert proved.exit_code == 0, proved.output
    (tmp_path / "fact.tlog-proof").write_bytes(proved.stdout_bytes)
    ok = invoke("audit", "check-proof", "fact.tlog-proof", "--fact", "fact.json", "--key", log["vkey"])
    assert ok.exit_code == 0 and "is leaf 2 of the 3 facts of example.test/log" in ok.stdout, ok.output
    (tmp_path / "edited.json").write_text(json.dumps({**fact, "reason_summary": "edited"}))
    refused = invoke("audit", "check-proof", "fact.tlog-proof", "--fact", "edited.json", "--key", log["vkey"])
    assert refused.exit_code == 1 and "NOT OK" in refused.stderr
    other = invoke("checkpoint", "note-key", "--name", "example.test/log", "--out", "other.key").stdout.strip()
    assert invoke("audit", "check-proof", "fact.tlog-proof", "--fact", "fact.json", "--key", other).exit_code == 1


def test_a_witness_cosigns_a_growing_log_and_refuses_an_old_size(log, tmp_path):
    w1 = invoke("checkpoint", "note-key", "--witness", "--name", "witness.test/w1", "--out", "w1.key").stdout.strip()
    (tmp_path / "log.vkey").write_text(log["vkey"] + "\n")
    invoke("checkpoint", "publish")
    first = tmp_path / "checkpoints" / f"{2:020d}.checkpoint"
    request = invoke("audit", "witness-request", "--checkpoint", str(first), "--old", "0")
    (tmp_path / "req1").write_bytes(request.stdout_bytes)
    cosigned = invoke("audit", "witness", "req1", "--log-key", "log.vkey", "--key", "w1.key", "--state", "w")
    assert cosigned.exit_code == 0 and cosigned.stdout.startswith("\u2014 witness.test/w1 "), cosigned.output
    invoke("schedule", "disable", "b")
    invoke("checkpoint", "publish")
    second = tmp_path / "checkpoints" / f"{3:020d}.checkpoint"
    (tmp_path / "req2").write_bytes(invoke("audit", "witness-request", "--checkpoint", str(second), "--old",
                                           "2").stdout_bytes)
    later = invoke("audit", "witness", "req2", "--log-key", "log.vkey", "--key", "w1.key", "--state", "w")
    assert later.exit_code == 0, later.output
    again = invoke("audit", "witness", "req1", "--log-key", "log.vkey", "--key", "w1.key", "--state", "w")
    assert again.exit_code == 1 and "last cosigned size 3" in again.stderr
    # The witnessed checkpoint proves a fact with a k-of-n witness policy.
    (tmp_path / "witnessed.note").write_bytes(second.read_bytes() + later.stdout_bytes)
    fact = facts("b")[1]
    (tmp_path / "fact.json").write_text(json.dumps(fact))
    (tmp_path / "p").write_bytes(invoke("audit", "prove", fact["id"], "--checkpoint", "witnessed.note").stdout_bytes)
    checked = invoke("audit", "check-proof", "p", "--fact", "fact.json", "--key", "log.vkey", "--witness", w1,
                     "--k", "1")
    assert checked.exit_code == 0 and "cosigned by witness.test/w1" in checked.stdout, checked.output


@pytest.mark.parametrize("forgery", [
    "DELETE FROM status_transitions WHERE seq = (SELECT max(seq) FROM status_transitions)",
    "UPDATE status_transitions SET hash = (CASE WHEN substr(hash, 1, 1) = '0' THEN '1' ELSE '0' END) || substr(hash, 2) "
    "WHERE seq = (SELECT min(seq) FROM status_transitions)",
    "UPDATE status_transitions SET seq = seq + 1000 WHERE seq = (SELECT min(seq) FROM status_transitions)",
])
def test_a_database_changed_under_the_last_checkpoint_is_an_alarm_and_nothing_is_published(log, tmp_path, forgery):
    assert invoke("checkpoint", "publish").exit_code == 0
    with sqlite3.connect(tmp_path / "app.db") as conn:
        conn.execute(forgery)
    invoke("schedule", "disable", "a")  # the log grows too: the alarm is about what the checkpoint covered
    refused = invoke("checkpoint", "publish")
    assert refused.exit_code == 1 and "checkpoint alarm" in refused.stderr, refused.output
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [f"{2:020d}.checkpoint"]


def test_the_daemon_takes_checkpoints_by_itself(log, tmp_path):
    """A7: with [audit] log_key, `statebook run` publishes a checkpoint when it starts and one more on the way
    out (the facts it wrote while running are anchored too); its counters say how many."""
    toml = tmp_path / "statebook.toml"
    toml.write_text(toml.read_text().replace("[audit]", "[scheduler]\ntick_seconds = 0.2\n[audit]"))
    settings = load_settings(toml, environ={})
    asyncio.run(run_daemon(settings, run_for=1.0))
    published = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert published and published[0] == f"{2:020d}.checkpoint"
    assert invoke("checkpoint", "publish").stdout.strip().endswith("unchanged since the last checkpoint")


def test_verify_checks_the_database_against_a_signed_tree_head(log, tmp_path):
    """`statebook verify --tree-head NOTE --key VKEY`: ok on the log the checkpoint was taken of (and grown since);
    a finding once a fact it covers is changed; the note must open with the log's key."""
    invoke("checkpoint", "publish")
    note = str(tmp_path / "checkpoints" / f"{2:020d}.checkpoint")
    invoke("schedule", "disable", "a")
    ok = invoke("verify", "--tree-head", note, "--key", log["vkey"])
    assert ok.exit_code == 0, ok.output
    assert invoke("verify", "--tree-head", note).exit_code == 2  # no key: an unsigned tree head anchors nothing
    other = invoke("checkpoint", "note-key", "--name", "example.test/log", "--out", "other.key").stdout.strip()
    assert invoke("verify", "--tree-head", note, "--key", other).exit_code == 1
    with sqlite3.connect(tmp_path / "app.db") as conn:
        conn.execute("UPDATE status_transitions SET seq = seq + 1000 WHERE seq = (SELECT min(seq) FROM "
                     "status_transitions)")
    found = invoke("verify", "--tree-head", note, "--key", log["vkey"], "--json")
    assert found.exit_code == 1 and "tree_head_mismatch" in found.stdout, found.output


def test_verify_and_audit_verify_take_a_witness_policy(log, tmp_path):
    """A8: `verify --tree-head` and `audit verify --checkpoint` accept "k of these witness keys": a checkpoint the
    witness cosigned passes with --k 1, the same note without the cosignature (or with a forged one) does not."""
    w1 = invoke("checkpoint", "note-key", "--witness", "--name", "witness.test/w1", "--out", "w1.key").stdout.strip()
    (tmp_path / "log.vkey").write_text(log["vkey"] + "\n")
    invoke("checkpoint", "publish")
    note = tmp_path / "checkpoints" / f"{2:020d}.checkpoint"
    (tmp_path / "req").write_bytes(invoke("audit", "witness-request", "--checkpoint", str(note), "--old",
                                          "0").stdout_bytes)
    line = invoke("audit", "witness", "req", "--log-key", "log.vkey", "--key", "w1.key", "--state", "w").stdout_bytes
    (tmp_path / "witnessed").write_bytes(note.read_bytes() + line)
    policy = ["--key", "log.vkey", "--witness", w1, "--k", "1"]
    assert invoke("verify", "--tree-head", "witnessed", *policy).exit_code == 0
    refused = invoke("verify", "--tree-head", str(note), *policy)
    assert refused.exit_code == 1 and "does not verify" in refused.stderr, refused.output
    assert invoke("verify", "--witness", w1).exit_code == 2  # a policy without a note to check
    exported = invoke("export", "--bundle", "bundle")
    assert exported.exit_code == 0, exported.output
    assert invoke("audit", "verify", "bundle", "--checkpoint", "witnessed", *policy).exit_code == 0
    unwitnessed = invoke("audit", "verify", "bundle", "--checkpoint", str(note), *policy)
    assert unwitnessed.exit_code == 1 and "checkpoint note" in unwitnessed.stdout, unwitnessed.output


def test_the_checkpoint_directory_stands_for_its_latest_and_an_embedded_daemon_fills_it(log, tmp_path):
    """A7: `verify --tree-head DIR` and `audit verify --checkpoint DIR` take a checkpoint directory for its latest
    checkpoint; an application's in-process daemon (statebook.adapters.asgi.embedded) takes checkpoints too."""
    from statebook.adapters.asgi import embedded

    settings = load_settings(tmp_path / "statebook.toml", environ={})

    async def run_embedded() -> None:
        async with embedded(settings, delivery=True):
            await asyncio.sleep(0.3)

    asyncio.run(run_embedded())
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [f"{2:020d}.checkpoint"]
    (tmp_path / "log.vkey").write_text(log["vkey"] + "\n")
    assert invoke("verify", "--tree-head", "checkpoints", "--key", "log.vkey").exit_code == 0
    assert invoke("export", "--bundle", "bundle").exit_code == 0
    assert invoke("audit", "verify", "bundle", "--checkpoint", "checkpoints", "--key", "log.vkey").exit_code == 0
    (tmp_path / "empty").mkdir()
    empty = invoke("verify", "--tree-head", "empty", "--key", "log.vkey")
    assert empty.exit_code == 2 and "without a checkpoint" in empty.stderr
