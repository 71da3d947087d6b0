"""``statebook.sync``: statebook's operations as plain blocking functions, for scripts, Flask and Django views and
notebooks. The implementation, and the rules it keeps, are in :mod:`statebook.adapters.sync` (docs/how-to/sync.md).
"""

from statebook.adapters import sync as _implementation
from statebook.adapters.sync import *  # noqa: F403
from statebook.adapters.sync import __all__ as __all__

__doc__ = _implementation.__doc__
