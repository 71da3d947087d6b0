"""statebook.adapters — the composition root and the edges: storage backends, settings, CLI, daemon.

Importing it registers the two storage backends (:mod:`.sqlite`, :mod:`.postgres`) with
``statebook.lifecycle.store``, so a Book over an engine of either dialect finds its store.
"""

from . import postgres, sqlite  # noqa: F401  (registers the storage backends)
