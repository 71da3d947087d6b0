"""Every ``statebook`` command under bad input, in process through typer's CliRunner, on both backends.

Each example seeds both databases (support.seed), runs the same command line against each with
``--db``, and checks: no exception escaped (only SystemExit), the exit code is in the table (0 done,
1 findings or a failed run — only for the commands that have findings or runs, 2 refused input or
unusable configuration), a failure prints exactly one line on stderr and no traceback, a refusal
writes nothing, ``verify`` stays clean, and both backends exit the same way.

Not fuzzed: ``demo`` (its one input is a file path it deletes and recreates). ``run`` gets only a
``--for`` that is short or invalid: an accepted ``nan``/``inf``/huge value would block the suite.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from typer.testing import CliRunner

from statebook.adapters.cli import app

from .strategies import Seed, ids, number_texts, texts, time_texts
from .support import Pair, Twin, delta, examples, open_pair, resolve

pytestmark = pytest.mark.postgres

EXAMPLES = {
    "lifecycle": 15, "history_replay": 20, "verify": 8, "dispatch_ls_show": 15, "dispatch_ack_retry": 15,
    "dispatch_purge": 25, "dispatch_deliver": 8, "schedule_add": 40, "schedule_by_ref": 20, "schedule_fire": 8,
    "runs": 10, "run": 6,
}
"""Examples per command group (HYPOTHESIS_PROFILE=deep runs ten times as many)."""

FINDINGS_OR_RUNS = {"verify", "run", "fire", "deliver"}
"""The commands whose exit 1 means findings (verify), a run or a delivery that failed; any other exit 1 is a bug."""

cli = CliRunner()


@pytest.fixture(scope="module")
def pair(pg_url, tmp_path_factory):
    yield from open_pair(tmp_path_factory.mktemp("fuzz") / "cli.db", pg_url)


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("configs")


def check(pair: Pair, args: list[Any]) -> None:
    """Run ``statebook --db URL *args`` on each backend; the property of the module docstring."""
    codes = []
    for twin in pair.twins:
        codes.append(_one(pair, twin, args))
    assert codes[0][0] == codes[1][0], f"backends disagree: {[t.name for t in pair.twins]} exit {codes}"
    assert codes[0] == codes[1], f"backends wrote differently: {[t.name for t in pair.twins]} {codes}"


def _one(pair: Pair, twin: Twin, args: list[Any]) -> tuple[int, tuple[tuple[str, int], ...]]:
    pair.fresh(twin)
    argv = ["--db", twin.url, *(str(a) for a in resolve(args, twin.seeds))]
    before = pair.measure(twin)
    result = cli.invoke(app, argv, env={"STATEBOOK_DB": None, "STATEBOOK_APP": None})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        exc = result.exception
        exc.add_note(f"escaped from `statebook {' '.join(map(repr, argv[2:]))}` on {twin.name}")
        raise exc
    code = result.exit_code
    output = result.stdout + result.stderr
    assert "Traceback" not in output, f"{twin.name}: a traceback was printed: {output[-2000:]}"
    assert code in (0, 1, 2), f"{twin.name}: exit {code} is not in the table (0, 1, 2)"
    if code == 1:
        assert FINDINGS_OR_RUNS & set(argv), f"{twin.name}: exit 1 from a command without findings: {result.stderr}"
    after = pair.measure(twin)
    if code != 0:
        # Warnings (a missing notify template) are their own lines; the error is one line.
        lines = [line for line in result.stderr.strip().splitlines() if not line.startswith("warning: ")]
        # Two assertions, so Hypothesis reports typer's own usage box apart from our messages.
        if result.stderr.startswith("Usage:"):
            assert len(lines) == 1, f"{twin.name}: a usage error printed {len(lines)} lines: {result.stderr[:600]}"
        assert len(lines) == 1, f"{twin.name}: exit {code} printed {len(lines)} lines on stderr: {result.stderr[:2000]}"
    if code == 2:
        assert after == before, f"{twin.name}: refused (exit 2) but wrote rows: {delta(before, after)}"
    pair.verify_clean(twin)
    timed = FINDINGS_OR_RUNS & set(argv) - {"verify"}  # a daemon's or a fired run's writes depend on timing
    return code, () if timed else delta(before, after)


entity_types = texts("dispatch", "schedule", "schedule_run")
entity_ids = ids("pending", "delivered", "dead_letter", "schedule").filter(lambda v: isinstance(v, (str, Seed)))
refs = ids("schedule", "schedule_name", "pending").filter(lambda v: isinstance(v, (str, Seed)))
flag = st.booleans()


def opt(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """``[]`` or ``[name, value]``: an option that may be left out."""
    return st.one_of(st.just([]), values.map(lambda v: [name, v]))


def flags(*names: str) -> st.SearchStrategy[list[str]]:
    return st.lists(st.sampled_from(names), unique=True, max_size=len(names))


def joined(*parts: st.SearchStrategy[list[Any]]) -> st.SearchStrategy[list[Any]]:
    return st.tuples(*parts).map(lambda lists: [x for part in lists for x in part])


# -- lifecycle, history, replay, verify ---------------------------------------------------------
@examples(EXAMPLES["lifecycle"])
@given(st.one_of(
    st.just(["lifecycle", "ls"]),
    entity_types.map(lambda t: ["lifecycle", "show", t]),
    st.tuples(entity_types, texts("mermaid", "text")).map(lambda a: ["lifecycle", "graph", a[0], "--format", a[1]]),
))
def test_lifecycle_commands(pair, args):
    check(pair, args)


@examples(EXAMPLES["history_replay"])
@given(st.one_of(
    joined(st.just(["history"]), st.tuples(entity_types, entity_ids).map(list), flags("--json")),
    joined(st.just(["replay"]), st.tuples(entity_types, entity_ids).map(list), opt("--as-of", time_texts())),
))
def test_history_and_replay(pair, args):
    check(pair, args)


@examples(EXAMPLES["verify"])
@given(joined(st.just(["verify"]), opt("--type", entity_types), flags("--json")))
def test_verify(pair, args):
    check(pair, args)


# -- dispatch -----------------------------------------------------------------------------------
@examples(EXAMPLES["dispatch_ls_show"])
@given(st.one_of(
    joined(st.just(["dispatch", "ls"]), opt("--status", texts("pending", "delivered")), opt("--limit", number_texts()),
           flags("--json", "--reveal")),
    joined(st.just(["dispatch", "show"]), entity_ids.map(lambda i: [i]), flags("--reveal")),
))
def test_dispatch_ls_and_show(pair, args):
    check(pair, args)


@examples(EXAMPLES["dispatch_ack_retry"])
@example(["dispatch", "retry", Seed("pending")])
@example(["dispatch", "expedite", Seed("pending")])
@example(["dispatch", "expedite", Seed("dead_letter")])
@given(st.one_of(
    st.tuples(entity_ids, st.one_of(st.just(Seed("ack_token")), texts())).map(lambda a: ["dispatch", "ack", *a]),
    entity_ids.map(lambda i: ["dispatch", "retry", i]),
    entity_ids.map(lambda i: ["dispatch", "expedite", i]),
))
def test_dispatch_ack_and_retry(pair, args):
    check(pair, args)


@examples(EXAMPLES["dispatch_purge"])
@example(["dispatch", "purge", "--before", "nan"])
@example(["dispatch", "purge", "--before", "nan", "--dry-run"])
@example(["dispatch", "purge", "--before", "inf", "--status", "pending", "--force", "--yes"])
@given(st.one_of(
    joined(st.just(["dispatch", "purge"]), entity_ids.map(lambda i: [i]), flags("--force")),
    joined(st.just(["dispatch", "purge"]), opt("--before", time_texts()),
           st.lists(texts("delivered", "dead_letter", "pending"), max_size=2).map(
               lambda ss: [x for s in ss for x in ("--status", s)]),
           flags("--dry-run", "--force", "--yes")),
))
def test_dispatch_purge(pair, args):
    check(pair, args)


# -- settings files (deliver --once, fire, run) -------------------------------------------------
CONFIGS = (
    "", "[dispatch]\nbatch_size = 10\n", "[dispatch]\nbatch_size = nan\n", "[dispatch]\nbatch_size = -1\n",
    "[dispatch]\nbatch_size = 99999999999999999999\n", "[dispatch]\nnotify_template = [\"/bin/true\", \"{deliver_to}\"]\n",
    "[dispatch]\nnotify_template = \"/bin/true\"\n", "[dispatchx]\nbatch_size = 1\n", "[dispatch]\nbatchsize = 1\n",
    "not toml [", "[scheduler]\ntick_seconds = \"abc\"\n", "[scheduler]\ntick_seconds = inf\n",
    "[scheduler]\ntimezone = \"Mars/Olympus\"\n", "[retention]\ndelivered_days = nan\n",
    "[limits]\njson_depth = 0\n",
    "[[scheduler.schedules]]\nname = \"bad\"\ntrigger_type = \"cron\"\ncron_expr = \"0 0 31 2 *\"\naction_kind = \"command\"\n"
    "action_command = \"/bin/true\"\n",
)


def config_args(config_dir: Path, content: str | None, name: str = "--config") -> list[str]:
    """``[]``, a missing file, or a file holding ``content``."""
    if content is None:
        return []
    if content == "<missing>":
        return [name, str(config_dir / "missing.toml")]
    path = config_dir / f"c{abs(hash(content))}.toml"
    path.write_text(content, encoding="utf-8", errors="surrogatepass")
    return [name, str(path)]


configs = st.one_of(st.none(), st.just("<missing>"), st.sampled_from(CONFIGS),
                    texts().map(lambda t: f"[dispatch]\nnotify_template = [\"/bin/true\", {t!r}]\n"))


@examples(EXAMPLES["dispatch_deliver"])
@example("[dispatchx]\nbatch_size = 1\n")
@example("[scheduler]\ntick_seconds = \"abc\"\n")
@given(configs)
def test_dispatch_deliver_once(pair, config_dir, content):
    check(pair, ["dispatch", "deliver", "--once", *config_args(config_dir, content)])


# -- schedules ----------------------------------------------------------------------------------
CRONS = ("0 9 * * *", "0 0 31 2 *", "61 * * * *", "* * * *", "@reboot")
ZONES = ("UTC", "Europe/Paris", "Mars/Olympus", "../../etc/passwd", "")
trigger = st.one_of(
    st.sampled_from(CRONS).map(lambda c: ["--cron", c]),
    texts().map(lambda c: ["--cron", c]),
    number_texts().map(lambda n: ["--every", n]),
    time_texts().map(lambda t: ["--at", t]),
)
extra_trigger = st.integers(0, 9).flatmap(lambda n: trigger if n == 0 else st.just([]))


@examples(EXAMPLES["schedule_add"])
@example(["schedule", "add", "x", "--cron", "0 0 31 2 *", "--command", "/bin/true"])
@example(["schedule", "add", "x", "--at", "nan", "--command", "/bin/true"])
@example(["schedule", "add", "x", "--at", "inf", "--command", "/bin/true"])
@example(["schedule", "add", "x", "--at", "1e400", "--command", "/bin/true"])
@example(["schedule", "add", "x", "--every", "99999999999", "--command", "/bin/true"])
@example(["schedule", "add", "x", "--every", "60", "--tz", "Mars/Olympus", "--command", "/bin/true"])
@given(joined(
    st.just(["schedule", "add"]), texts("hourly", "nightly").map(lambda n: [n]), trigger, extra_trigger,
    opt("--tz", st.one_of(st.sampled_from(ZONES), texts())), opt("--kind", texts("command", "agent")),
    opt("--command", texts("/bin/true")), st.lists(texts("-n"), max_size=2).map(lambda a: [x for v in a for x in ("--arg", v)]),
    opt("--cwd", texts("/tmp")), opt("--max-runs", number_texts()), opt("--budget-usd", number_texts()),
    opt("--budget-tokens", number_texts()), opt("--missed", texts("skip", "run_once")),
    opt("--overlap", texts("skip", "allow")), st.one_of(st.just([]), st.tuples(texts("note"), texts("ops")).map(
        lambda a: ["--notify-kind", a[0], "--notify-to", a[1]])),
    flags("--paused", "--json"),
))
def test_schedule_add(pair, args):
    check(pair, args)


@examples(EXAMPLES["schedule_by_ref"])
@given(st.one_of(
    joined(st.just(["schedule", "ls"]), flags("--all", "--json")),
    st.tuples(st.sampled_from(["show", "enable", "disable", "rm"]), refs).map(lambda a: ["schedule", *a]),
    joined(st.just(["schedule", "runs"]), refs.map(lambda r: [r]), opt("--limit", number_texts())),
))
def test_schedule_by_ref(pair, args):
    check(pair, args)


@examples(EXAMPLES["schedule_fire"])
@given(refs, configs.filter(lambda c: c is None or "schedules" not in c))
def test_schedule_fire(pair, config_dir, ref, content):
    check(pair, ["schedule", "fire", ref, *config_args(config_dir, content)])


@examples(EXAMPLES["runs"])
@given(st.sampled_from(["show", "cancel"]), ids("pending", "schedule").filter(lambda v: isinstance(v, (str, Seed))),
       flags("--json"))
def test_runs(pair, which, run_id, extra):
    check(pair, ["runs", which, run_id, *extra])


# -- the daemon ---------------------------------------------------------------------------------
SHORT_OR_INVALID = ("0.2", "0", "-1", "abc", "", "0x10")


@examples(EXAMPLES["run"])
@example("0.2", "INFO", "<missing>")
@example("0.2", "LOUD", None)
@example("0.2", "INFO", "not toml [")
@example("0.2", "INFO", CONFIGS[-1])
@given(st.sampled_from(SHORT_OR_INVALID), st.one_of(st.just("INFO"), st.sampled_from(["LOUD", "debug", "", "\x00"])),
       configs)
def test_run(pair, config_dir, run_for, log_level, content):
    check(pair, ["run", "--for", run_for, "--log-level", log_level, *config_args(config_dir, content)])
