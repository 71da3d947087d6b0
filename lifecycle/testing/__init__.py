"""statebook.lifecycle.testing — the verification kit users run in their CI (needs ``statebook[testing]``).

- :mod:`.strategies`: Hypothesis strategies for any registered lifecycle — valid and invalid commands,
  creations, column and creation values, actors, reason codes, idempotency keys.
- :mod:`.model`: :class:`ReferenceModel`, the oracle built from the registry with ``transitions``:
  whether a command is accepted, and what the engine answers (unique keys read by :mod:`.uniques`).
- :mod:`.machine`: :class:`LifecycleMachine`, the ready ``RuleBasedStateMachine`` you subclass with
  your registry, a book factory, your rules and your invariants (see its module docstring).
- :mod:`.runner`: the profiles (:data:`PROFILES`) and how ``run_as_test`` runs a machine, shrinking a
  failure within :data:`SHRINK_SECONDS`.
- :mod:`.cases`: :class:`~.cases.StorageConformance`, storage-level cases you subclass with your own
  book factory to check your database set-up (roles, extensions, pragmas).

This package imports Hypothesis; nothing else in statebook imports this package.
"""

from .checks import Checks, Snapshot
from .faults import AmbiguousCommit, CallerAborted, ConnectionDropped
from .machine import PROFILES, SHRINK_SECONDS, LifecycleMachine, judge, machine_settings, register_profiles
from .model import Entity, KeyUse, Prediction, ReferenceModel, TransitionCmd, build_machine, trigger_name
from . import strategies

__all__ = [
    "PROFILES", "SHRINK_SECONDS", "AmbiguousCommit", "CallerAborted", "Checks", "ConnectionDropped", "Entity",
    "KeyUse", "LifecycleMachine", "Prediction", "ReferenceModel", "Snapshot", "TransitionCmd", "build_machine", "judge",
    "machine_settings", "register_profiles", "strategies", "trigger_name",
]
