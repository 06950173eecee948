"""Every entry the generic tests run (tests/test_configs.py, tests/core/test_precision.py,
tests/aot): each configs/<slug>.py with its declarations (`core.declarations.entries()`), and
the kinds of method tests/kinds.py defines (evaluate-only, data-free). Parametrize over `NAMES`
and look the entry up in `BY_NAME`: a new config is covered as soon as it exists."""

from core import declarations
from tests import kinds

ENTRIES = [*declarations.entries(), *kinds.ENTRIES]
BY_NAME = {entry.name: entry for entry in ENTRIES}
NAMES = [entry.name for entry in ENTRIES]
assert len(BY_NAME) == len(ENTRIES), "two entries share a name"
