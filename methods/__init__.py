"""One package per paper. `make(config)` imports `methods.<config.method>` and calls its `make`.

No registry: a method exists when its package does.
"""

import importlib
import pkgutil

from core import validate
from core.errors import ConfigError
from core.method import Method


def available() -> list[str]:
    return sorted(m.name for m in pkgutil.iter_modules(__path__) if m.ispkg)


def make(config) -> Method:
    """The method `config.method` names, made from `config`: the generic fields are checked
    first (`core.validate`), and every error its `make` raises names the method."""
    name = config.method
    if name not in available():
        raise ConfigError(f"unknown method {name!r}; available: {', '.join(available())}")
    with validate.naming(config):
        validate.config(config)
        return importlib.import_module(f"methods.{name}").make(config)
