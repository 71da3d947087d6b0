"""statebook.lifecycle.testing — the verification kit users run in their CI (needs ``statebook[testing]``).

- :mod:`.strategies`: Hypothesis strategies for any registered lifecycle — valid and invalid commands,
  creations, column and creation values, actors, reason codes, idempotency keys.
- :mod:`.model`: :class:`ReferenceModel`, the oracle built from the registry with ``transitions``:
  whether a command is accepted, and what the engine answers.
- :mod:`.machine`: :class:`LifecycleMachine`, the ready ``RuleBasedStateMachine`` you subclass with
  your registry, a book factory, your rules and your invariants (see its module docstring).
- :mod:`.cases`: :class:`~.cases.StorageConformance`, storage-level cases you subclass with your own
  book factory to check your database set-up (roles, extensions, pragmas).

This package imports Hypothesis; nothing else in statebook imports this package.
"""

from .checks import Checks, Snapshot
from .faults import AmbiguousCommit, CallerAborted, ConnectionDropped
from .machine import PROFILES, LifecycleMachine, judge, machine_settings, register_profiles
from .model import Entity, KeyUse, Prediction, ReferenceModel, TransitionCmd, build_machine, trigger_name
from . import strategies

__all__ = [
    "PROFILES", "AmbiguousCommit", "CallerAborted", "Checks", "ConnectionDropped", "Entity", "KeyUse",
    "LifecycleMachine", "Prediction", "ReferenceModel", "Snapshot", "TransitionCmd", "build_machine", "judge",
    "machine_settings", "register_profiles", "strategies", "trigger_name",
]
