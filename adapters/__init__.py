"""statebook.adapters — the composition root and the edges: storage backends, settings, CLI, daemon.

Importing :mod:`.db` (where every engine and book is made) registers the two storage backends
(:mod:`.sqlite`, :mod:`.postgres`) with ``statebook.lifecycle.store``, so a Book over an engine of either
dialect finds its store. The package itself imports nothing: the CLI's root starts without SQLAlchemy.
"""
