"""The shared training core: methods are `core.Method`s of pure functions run by `core.train`."""

from core.errors import ConfigError
from core.method import Method
from core.state import TrainState

__all__ = ["ConfigError", "Method", "TrainState"]
