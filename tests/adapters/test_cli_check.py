"""`statebook check` (adapters/cli/check.py): each kind of finding, in text and JSON, and its exit codes."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest
from typer.testing import CliRunner

from statebook.adapters.cli import app

runner = CliRunner()
_names = itertools.count()

DOORS = '''
import sqlalchemy as sa
from statebook.lifecycle import Lifecycle, Registry, edges, managed_table

doors = managed_table("check_doors", sa.Column("id", sa.String(32), primary_key=True), meta=sa.MetaData())
REASONS = {"door.shut.built", "door.open.pushed", "door.shut.pulled", "door.gone.removed", "door.purged.old"}
V1 = Lifecycle(entity_type="door", table=doors, statuses=("shut", "open", "gone"), initial={"shut"},
               terminal={"gone"}, edges=(*edges("shut", "open", "gone"), *edges("open", "shut")),
               reason_prefixes={"door"}, reasons=REASONS)
'''


@pytest.fixture
def write_app(tmp_path, monkeypatch):
    """Write an application module (DOORS plus ``body``) and return its ``module:registry`` spec."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(body: str) -> str:
        name = f"check_app_{next(_names)}"
        (tmp_path / f"{name}.py").write_text(DOORS + body)
        return f"{name}:registry"

    return write


def check(*args: str):
    return runner.invoke(app, ["check", *args], env={"STATEBOOK_DB": None, "STATEBOOK_APP": None})


def findings(result) -> list[tuple[str, str]]:
    report = json.loads(result.stdout)
    return [(f["kind"], f["key"]) for f in report["findings"]]


def test_a_clean_registry_exits_0(write_app):
    spec = write_app("registry = Registry([V1])\n")
    result = check("--app", spec)
    assert result.exit_code == 0, result.output
    assert "1 lifecycle(s), 0 finding(s) (no --db: history not checked)" in result.stdout
    json_result = check("--app", spec, "--json")
    assert json_result.exit_code == 0 and json.loads(json_result.stdout)["ok"] is True


def test_the_builtin_registry_is_clean():
    """The built-in lifecycles' gated exits are statebook's own, reviewed here: they are not the user's findings."""
    result = check("--app", "statebook.adapters.registry:builtin_registry")
    assert result.exit_code == 0, result.output


def test_a_refused_registration_is_a_finding(write_app):
    spec = write_app('registry = Registry([V1.extend(statuses=["lost"])])\n')
    result = check("--app", spec)
    assert result.exit_code == 1
    assert "registration_refused" in result.stdout and "'lost'" in result.stdout
    assert "cannot be reached" in result.stdout
    assert [k for k, _ in findings(check("--app", spec, "--json"))] == ["registration_refused"]


def test_an_unused_reason_code_is_a_finding(write_app):
    spec = write_app('registry = Registry([V1.extend(reasons=["door.ajar.slammed"])])\n')
    result = check("--app", spec)
    assert result.exit_code == 1
    assert "unused_reason door: reason code 'door.ajar.slammed' names status 'ajar'" in result.stdout
    assert findings(check("--app", spec, "--json")) == [("unused_reason", "unused_reason:door:door.ajar.slammed")]


def test_a_gated_exit_is_a_finding_until_accepted(write_app):
    spec = write_app('registry = Registry([V1.extend(edges=edges("gone", "shut", actors="operator"))])\n')
    result = check("--app", spec)
    assert result.exit_code == 1
    assert "gated_exit door: terminal status 'gone' can be left for 'shut' by operator" in result.stdout
    key = "gated_exit:door:gone->shut"
    assert findings(check("--app", spec, "--json")) == [("gated_exit", key)]
    accepted = check("--app", spec, "--accept", key)
    assert accepted.exit_code == 0 and "0 finding(s), 1 accepted" in accepted.stdout


async def _history(url: str, spec: str) -> None:
    """Facts of V1 doors in a database (shut -> open)."""
    import importlib

    from statebook.adapters.db import open_book
    from statebook.lifecycle import Actor, Reason, Registry, create, transition

    module = importlib.import_module(spec.partition(":")[0])
    book = await open_book(url, registry=Registry([module.V1]).seal())
    try:
        await create(book, "door", values={}, status="shut", reason=Reason("door.shut.built"), actor=Actor("system"),
                     entity_id="d1")
        await transition(book, "door", "d1", "open", expected="shut", reason=Reason("door.open.pushed"),
                         actor=Actor("system"))
    finally:
        await book.engine.dispose()


@pytest.mark.parametrize("body, expected", [
    ("registry = Registry([V1])\n", []),
    ("registry = Registry([V1.extend(statuses=['ajar'], edges=edges('open', 'ajar') + edges('ajar', 'shut'))])\n",
     ["unaccepted_policy"]),
    ("from dataclasses import replace\n"
     "V2 = replace(V1.extend(statuses=['ajar'], edges=edges('open', 'ajar') + edges('ajar', 'shut')), accepts=(V1,))\n"
     "registry = Registry([V2])\n", []),
    ("from statebook.adapters.registry import builtin_registry\nregistry = builtin_registry()\n",
     ["unknown_entity_type"]),
], ids=["same_policy", "changed_policy", "changed_policy_accepting_v1", "type_not_declared"])
def test_drift_against_the_databases_history(write_app, tmp_path, body: str, expected: list[str]):
    old = write_app("registry = Registry([V1])\n")
    url = f"sqlite:///{tmp_path / 'doors.db'}"
    asyncio.run(_history(url, old))
    spec = write_app(body)
    result = check("--app", spec, "--db", url, "--json")
    assert result.exit_code == (1 if expected else 0), result.output
    assert [k for k, _ in findings(result)] == expected
    if expected == ["unaccepted_policy"]:
        text = check("--app", spec, "--db", url)
        assert "2 fact(s) of door were written under policy" in text.stdout and "accepts=" in text.stdout


def test_the_root_db_option_is_used_too(write_app, tmp_path):
    old = write_app("registry = Registry([V1])\n")
    url = f"sqlite:///{tmp_path / 'doors.db'}"
    asyncio.run(_history(url, old))
    spec = write_app("registry = Registry([V1.extend(reasons=['door.open.kicked'])])\n")
    result = runner.invoke(app, ["--db", url, "check", "--app", spec, "--json"], env={"STATEBOOK_APP": None})
    assert [k for k, _ in findings(result)] == ["unaccepted_policy"]


@pytest.mark.parametrize("args, message", [
    ((), "check needs --app module:attr"),
    (("--app", "no_such_module_here:registry"), "no module named 'no_such_module_here'"),
    (("--app", "statebook.adapters.registry:builtin_registry", "--db", "/nonexistent/x.db"), "does not exist"),
], ids=["no_app", "bad_module", "missing_database"])
def test_bad_input_exits_2_with_one_line(args, message):
    result = check(*args)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
