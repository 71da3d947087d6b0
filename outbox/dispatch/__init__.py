"""statebook.outbox.dispatch — delivering dispatches, on the delivery core (:mod:`statebook.outbox.core`).

What is special about a dispatch: its attempts, backoff and lease sized from the transport's timeout
(:mod:`.attempts`), the transport run between claim and finalization (:mod:`.steps`), passes that
claim no faster than sends can start (:mod:`.delivery`), offers of fresh rows to an idle worker
(:mod:`.offers`) and the :class:`~.worker.DeliveryWorker`; around them the dispatch's own table
(:mod:`.schema`), lifecycle (:mod:`.policy`), enqueue (:mod:`.enqueue`), transports (:mod:`.transport`),
acknowledgement (:mod:`.ack`), operator actions and retention (:mod:`.admin`), its read model
(:mod:`.models`) and argument checks (:mod:`.checks`, :mod:`.bounds`). Its public names are exported from
:mod:`statebook.outbox`.
"""

__all__: list[str] = []  # every public name of a dispatch is statebook.outbox's
