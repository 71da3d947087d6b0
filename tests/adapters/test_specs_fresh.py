"""The generated pages of specs/ match the lifecycles they describe (L16)."""

from __future__ import annotations

from statebook.adapters import specgen
from statebook.adapters.registry import builtin_registry


def test_spec_pages_are_current():
    """L16: every built-in lifecycle's page in specs/ equals what the generator writes today."""
    outdated = specgen.stale()
    assert not outdated, (
        f"stale spec page(s): {', '.join(p.name for p in outdated)}; "
        "run `python -m statebook.adapters.specgen` and commit the result"
    )
    assert sorted(p.name for p in specgen.pages()) == sorted(f"{lc.entity_type}.md" for lc in builtin_registry())


def test_a_changed_or_missing_page_is_reported_and_rewritten(tmp_path):
    """L16: the freshness check can fail: an edited page and a missing page are both stale until rewritten."""
    assert sorted(specgen.write(specs_dir=tmp_path)) == sorted(specgen.pages(specs_dir=tmp_path))
    assert specgen.stale(specs_dir=tmp_path) == []
    edited = tmp_path / "dispatch.md"
    edited.write_text(edited.read_text() + "hand edit\n")
    (tmp_path / "schedule.md").unlink()
    assert sorted(p.name for p in specgen.stale(specs_dir=tmp_path)) == ["dispatch.md", "schedule.md"]
    assert sorted(p.name for p in specgen.write(specs_dir=tmp_path)) == ["dispatch.md", "schedule.md"]
    assert specgen.stale(specs_dir=tmp_path) == []


def test_check_mode_exits_nonzero_on_a_stale_page(tmp_path, capsys):
    """L16: `specgen --check` exits 1 and names the stale page; it writes nothing."""
    specgen.write(specs_dir=tmp_path)
    (tmp_path / "schedule_run.md").write_text("old\n")
    assert specgen.main(["--check"], specs_dir=tmp_path) == 1
    assert "schedule_run.md" in capsys.readouterr().err
    assert (tmp_path / "schedule_run.md").read_text() == "old\n"
    assert specgen.main([], specs_dir=tmp_path) == 0
    assert specgen.main(["--check"], specs_dir=tmp_path) == 0
