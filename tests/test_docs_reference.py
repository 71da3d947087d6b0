"""The API reference renders (issue 30): no raw Sphinx role, one title per page, a class's methods before its
attributes, every line of a docstring's examples inside a code block.

``docs/hooks.py`` checks each rendered page after every build (``make docs`` fails on a problem); here the check
is shown to catch each problem on a small page, and the reference pages are built (about five seconds) when the
``docs`` extra is installed.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def hooks():
    spec = importlib.util.spec_from_file_location("statebook_docs_hooks_ref", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def page(*objects: str, title: int = 1) -> str:
    return "<h1>T</h1>" * title + "".join(objects)


def obj(kind: str, anchor: str, body: str = "") -> str:
    return f'<div class="doc doc-object doc-{kind}">\n<h2 id="{anchor}" class="doc doc-heading">x</h2>{body}</div>'


def test_the_check_finds_each_problem():
    check = hooks().reference_problems
    good = page(obj("class", "statebook.lifecycle.Book"), obj("function", "statebook.lifecycle.Book.begin"),
                obj("attribute", "statebook.lifecycle.Book.store"))
    assert check(good) == []
    assert "raw role" in check(page("<p>see :func:`transition`</p>"))[0]
    assert "2 titles" in check(page(title=2))[0]
    assert "0 titles" in check(page(title=0))[0]
    late = page(obj("class", "statebook.lifecycle.Book"), obj("attribute", "statebook.lifecycle.Book.store"),
                obj("function", "statebook.lifecycle.Book.begin"))
    assert "method after an attribute" in check(late)[0]
    # transition's docstring has a doctest of three lines: shown whole it passes, cut short it is found.
    lines = hooks()._code_lines(hooks()._docstring("statebook.lifecycle.transition"))
    assert len(lines) == 3
    whole = "<pre><code>" + "\n".join(lines).replace(">", "&gt;") + "</code></pre>"
    assert check(page(obj("function", "statebook.lifecycle.transition", whole))) == []
    cut = "<pre><code>" + lines[0].replace(">", "&gt;") + "</code></pre>"
    assert "not in a code block" in check(page(obj("function", "statebook.lifecycle.transition", cut)))[0]


def test_literal_blocks_are_fenced_whole_and_roles_become_optional_references():
    pytest.importorskip("griffe", reason="the docs extra (make docs) installs griffe")
    spec = importlib.util.spec_from_file_location("statebook_griffe_markdown", DOCS / "griffe_markdown.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = "Use it like this::\n\n    a = 1\n\n    b = 2\n\nThen more."
    assert module.fence_literal_blocks(text) == "Use it like this:\n\n```python\na = 1\n\nb = 2\n```\n\nThen more."
    converted = module.convert_roles(":func:`send` and :class:`~.models.Notification`", module="p.m", package="p",
                                     scope="p.m")
    assert converted == ('<autoref identifier="p.m.send" optional><code>send</code></autoref> and '
                         '<autoref identifier="p.models.Notification" optional><code>Notification</code></autoref>')


def test_the_reference_pages_build_and_pass_the_check(tmp_path):
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("mkdocstrings_handlers") is None:
        pytest.skip("needs the docs extra: make docs installs it")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    shutil.copytree(DOCS / "reference", docs / "reference")
    (docs / "index.md").write_text("# statebook\n")
    python = config["plugins"][1]["mkdocstrings"]["handlers"]["python"]
    python["paths"] = [str(ROOT / "build" / "docs-src")]
    python["options"]["extensions"] = [str(ROOT / e) for e in python["options"]["extensions"]]
    config |= {"docs_dir": str(docs), "site_dir": str(tmp_path / "site"), "hooks": [str(DOCS / "hooks.py")],
               "nav": [{"Home": "index.md"}, {"Reference": [{"Command line": "reference/cli.md"},
                                                            *config["nav"][3]["Reference"][1:]]}]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = subprocess.run([str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "-q", "-f",
                           str(tmp_path / "mkdocs.yml")], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": str(Path(sys.executable).parent)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lifecycle = (tmp_path / "site" / "reference" / "api" / "lifecycle" / "index.html").read_text()
    assert lifecycle.index('id="statebook.lifecycle.Book.begin"') < lifecycle.index('id="statebook.lifecycle.Book.store"')
    assert 'class="autorefs autorefs-internal"' in lifecycle  # a role became a link to the object it names
