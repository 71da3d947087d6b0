"""statebook.outbox.core — the delivery skeleton every lifecycle delivered by leased claims shares.

A deliverable lifecycle (dispatches, notifications, or one a user declares) keeps due rows that
workers claim under a lease and finish under the lease's fencing token. What every such lifecycle
does the same way is here, written once: the due scan (:mod:`.due`), the candidate and the lease
(:mod:`.lease`), set-based claims and fenced records (:mod:`.claims`), the slots of a pass
(:mod:`.slots`) and the worker loop (:mod:`.passes`). Each lifecycle says only what is special
about it: what a claim and a finalization write, and what the work between them is.
"""

from .claims import Planned, claim_set, read_rows, record_set, won
from .due import DueScan
from .lease import Candidate, Lease
from .passes import PassWorker
from .slots import Claimed, run_in_slots

__all__ = ["Candidate", "Claimed", "DueScan", "Lease", "PassWorker", "Planned", "claim_set", "read_rows", "record_set",
           "run_in_slots", "won"]
