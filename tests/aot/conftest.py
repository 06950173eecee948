"""`aot` tests run only when asked for (`pytest -m aot`): with the extra installed they take
minutes, and the default suite (`-m "not slow"`) must not grow."""

import pytest


def pytest_collection_modifyitems(config, items):
    if "aot" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="ahead-of-time compilation: run with pytest -m aot")
    for item in items:
        if "aot" in item.keywords:
            item.add_marker(skip)
