"""An auditor finds the row someone edited behind the engine's back (specs/lifecycle.md: a row is the fold of
its facts): the entity's page verifies it on request and shows the finding inline; an untouched entity's
verify is clean."""

from __future__ import annotations

import pytest

from .scenes import tampered_dispatch

pytestmark = pytest.mark.browser


def test_an_auditor_sees_the_verify_finding_of_a_row_edited_with_raw_sql(console):
    clean, edited = console.run(tampered_dispatch(console.book))
    console.start()
    console.sign_in("aude")
    b = console.browser

    b.open(f"/e/dispatch/{edited}")
    b.wait_text(edited, "mallory")  # the row as stored
    b.follow("Verify this entity")
    b.wait_text("verify found 1 problem", "(checked", css="#verify")
    assert "row_mismatch: column 'deliver_to' is 'mallory'; the facts say 'ops'" in b.text("#verify")

    b.open(f"/e/dispatch/{clean}")
    b.wait_text(clean)
    b.follow("Verify this entity")
    b.wait_text("verified 1 fact", "the row is the fold of its facts", "(checked", css="#verify")
