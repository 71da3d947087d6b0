"""L12c: an application's extension of the built-in dispatch lifecycle keeps verifying after the built-in one
grows (here: the release reason of O21 joined the dispatch policy)."""

from __future__ import annotations

from statebook.adapters.db import open_book
from statebook.lifecycle import Registry, edges, verify
from statebook.outbox import DISPATCH, enqueue_dispatch
from statebook.outbox.dispatch.policy import DISPATCH_V1
from statebook.scheduler import SCHEDULE, SCHEDULE_RUN

CANCELLABLE = dict(statuses=["cancelled"], terminal=["cancelled"], edges=edges("pending", "cancelled", actors="operator"),
                   reasons={"dispatch.cancelled.operator"})


def test_an_extension_accepts_the_same_extension_of_what_its_base_accepts():
    """L12c: DISPATCH accepts DISPATCH_V1, so DISPATCH.extend(x) accepts DISPATCH_V1.extend(x) — the policy an
    application wrote its facts under before the upgrade."""
    before, after = DISPATCH_V1.extend(**CANCELLABLE), DISPATCH.extend(**CANCELLABLE)
    assert before.fingerprint != after.fingerprint
    assert after.policy_for(before.fingerprint) is not None
    assert {lc.fingerprint for lc in after.accepted} >= {DISPATCH.fingerprint, DISPATCH_V1.fingerprint}


async def test_facts_of_an_extension_of_the_previous_policy_verify_after_the_upgrade(tmp_path, clock):
    """L12c: a dispatch written by an application's extension of DISPATCH_V1 verifies when the same database
    is opened with the same extension of today's DISPATCH."""
    url = f"sqlite:///{tmp_path / 'app.db'}"
    old = await open_book(url, registry=Registry([DISPATCH_V1.extend(**CANCELLABLE), SCHEDULE, SCHEDULE_RUN]).seal(),
                          clock=clock)
    await enqueue_dispatch(old, kind="k", deliver_to="x")
    await old.engine.dispose()
    new = await open_book(url, registry=Registry([DISPATCH.extend(**CANCELLABLE), SCHEDULE, SCHEDULE_RUN]).seal(),
                          clock=clock)
    try:
        report = await verify(new)
        assert report.ok, report.findings
        assert report.facts == 1
    finally:
        await new.engine.dispose()
