"""The registry an application runs: the built-in lifecycles, or the application's own (``--app``).

``--app module:attr`` (also ``$STATEBOOK_APP`` and the ``app`` settings key) names a
:class:`~statebook.lifecycle.Registry`, or a callable returning one, the way ``procrastinate --app``
names its App. The CLI, the daemon and ``verify`` then work on the application's entity types.
"""

from __future__ import annotations

import importlib
from typing import Any

from statebook.lifecycle import Registry, StatebookError
from statebook.outbox import DISPATCH
from statebook.outbox.notifications import (
    CHANNEL_ATTEMPT, DEDUP_CLAIM, NOTIFICATION, NOTIFICATION_RESPONSE, RATE_BUCKET, RETENTION_RUN,
)
from statebook.scheduler import SCHEDULE, SCHEDULE_RUN

from .errors import ConfigError

BUILTIN_TYPES = (DISPATCH.entity_type, SCHEDULE.entity_type, SCHEDULE_RUN.entity_type)
"""The entity types the daemon and the outbox/scheduler commands drive."""


def builtin_registry(*, seal: bool = True) -> Registry:
    """A registry holding ``dispatch``, ``schedule``, ``schedule_run`` and the notifications' ``notification``,
    ``channel_attempt``, ``dedup_claim``, ``rate_bucket``, ``notification_response`` and
    ``notification_retention``.

    Pass ``seal=False`` to register or extend lifecycles before sealing it yourself.
    """
    registry = Registry([DISPATCH, SCHEDULE, SCHEDULE_RUN, NOTIFICATION, CHANNEL_ATTEMPT, DEDUP_CLAIM, RATE_BUCKET,
                         NOTIFICATION_RESPONSE, RETENTION_RUN])
    return registry.seal() if seal else registry


def load_registry(spec: str) -> Registry:
    """The sealed registry ``spec`` (``module:attr``) names; ConfigError, in one line, when it cannot.

    ``attr`` may be dotted (``module:holder.registry``) and may be a callable taking no arguments
    that returns the registry. An unsealed registry is sealed here: it is about to be run.

    >>> load_registry("statebook.adapters.registry:builtin_registry").sealed
    True
    """
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name.strip() or not attr.strip():
        raise ConfigError(
            f"--app {spec!r} must be module:attr, e.g. myapp.lifecycles:registry (a Registry, or a callable returning one)"
        )
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                f"--app {spec!r}: no module named {exc.name!r}; run from the directory holding it or add "
                "that directory to PYTHONPATH"
            ) from None
        raise ConfigError(f"--app {spec!r}: importing {module_name!r} failed: {exc}") from None
    except StatebookError as exc:  # e.g. a PolicyError raised while the module registers its lifecycles
        raise ConfigError(f"--app {spec!r}: importing {module_name!r} failed: {exc}") from None
    except Exception as exc:
        raise ConfigError(f"--app {spec!r}: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            found = sorted(n for n, v in vars(module).items() if isinstance(v, Registry))
            hint = f"; registries it defines: {', '.join(found)}" if found else ""
            raise ConfigError(f"--app {spec!r}: module {module_name!r} has no attribute {attr!r}{hint}")
        target = getattr(target, part)
    if callable(target) and not isinstance(target, Registry):
        try:
            target = target()
        except StatebookError as exc:
            raise ConfigError(f"--app {spec!r}: calling {attr}() failed: {exc}") from None
        except Exception as exc:
            raise ConfigError(f"--app {spec!r}: calling {attr}() failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(target, Registry):
        raise ConfigError(
            f"--app {spec!r} is a {type(target).__name__}, not a statebook Registry; point it at a Registry "
            "(e.g. registry = builtin_registry(seal=False); registry.register(...); registry.seal()) or at a "
            "function returning one"
        )
    return target if target.sealed else target.seal()


def resolve_registry(app: str | None) -> Registry:
    """``load_registry(app)``, or the built-in registry when no application is named."""
    return builtin_registry() if not app else load_registry(app)


def require_builtins(registry: Registry, what: str) -> None:
    """ConfigError unless the registry holds the built-in types ``what`` (e.g. the daemon) drives."""
    missing = [t for t in BUILTIN_TYPES if t not in registry]
    if missing:
        raise ConfigError(
            f"{what} drives {', '.join(BUILTIN_TYPES)}, but the application's registry lacks {', '.join(missing)}; "
            "start it from builtin_registry(seal=False) and register your lifecycles next to them"
        )
