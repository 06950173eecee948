"""What the generic machinery needs to know about a method, declared beside its config.

    # configs/<slug>.py: only what differs from the defaults
    DECLARATIONS = Declarations(largest="size=base")

    declarations.of("lm")       # configs/lm.py's Declarations (the defaults when it declares none)
    declarations.entries()      # every configs/<slug>.py as an Entry, sorted by slug

Read by `launch.aot` (the scaling table compiles each method's largest config; tests/aot its
smoke config too), `launch.device_check` and the generic tests (tests/test_configs.py,
tests/core/test_precision.py, tests/aot). No other table of methods is kept, so adding a method
touches its package, its config, its tests and the docs. A test may define a method of its own
as an `Entry` (no package, no config file) and run it through the same generic checks.
"""

import dataclasses
import importlib
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from ml_collections import ConfigDict

from core.errors import ConfigError

_NOT_CONFIGS = ("__init__", "common")


@dataclasses.dataclass(frozen=True)
class Declarations:
    """Config strings are `get_config`'s argument ("size=base"; "" is the config's default);
    a reason, where one is asked for, is a sentence the tests print, and empty means "no"."""

    # The largest config: what the scaling table (`launch.aot --table`) and tests/aot's large
    # targets compile. `largest_overrides` (dotted field -> value) make its global batch divide
    # over 256 chips and 64 GPUs where the config's own does not.
    largest: str = ""
    largest_overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # The smoke variant: a tiny model, a couple of steps, seconds on a CPU. Every generic test
    # trains or lowers it; device_check runs it on the accelerator.
    smoke: str = "size=smoke"
    # The small config tests/aot compiles for 4 and 8 chips (None: `smoke`). It must have a
    # batch to spread over the chips.
    aot_smoke: str | None = None
    # Why the compiled step has no matmul at all (the precision test then checks that it has
    # none, rather than each matmul's precision).
    no_matmul: str = ""
    # Why the state is replicated and every chip plays the same rounds in order (an online
    # learner): AOT then expects some collective, not necessarily an all-reduce of gradients.
    sequential: str = ""
    # AOT targets (as tests/aot names them, "h100:1x1x8") where this method's aot_smoke program
    # is known not to compile, with the reason: the test expects the failure (strictly: a
    # compile that starts passing fails the test, so the entry is removed then).
    aot_known_failures: Mapping[str, str] = dataclasses.field(default_factory=dict)


# Each field's accepted types, and their name in an error.
_TYPES = {
    "largest": (str, "a string"),
    "largest_overrides": (Mapping, "a mapping of dotted field names to values"),
    "smoke": (str, "a string"),
    "aot_smoke": ((str, type(None)), "a string or None"),
    "no_matmul": (str, "a string (a reason, or empty)"),
    "sequential": (str, "a string (a reason, or empty)"),
    "aot_known_failures": (Mapping, "a mapping of AOT targets to reasons"),
}


def check(name: str, declared) -> Declarations:
    """`declared` if it is well-formed, else a one-line ConfigError naming the method and the
    field."""
    where = f"configs/{name}.py: DECLARATIONS"
    if not isinstance(declared, Declarations):
        raise ConfigError(
            f"{where} must be a core.declarations.Declarations, not {type(declared).__name__}"
        )
    for field in dataclasses.fields(Declarations):
        value = getattr(declared, field.name)
        types, described = _TYPES[field.name]
        if not isinstance(value, types):
            raise ConfigError(f"{where}.{field.name}={value!r} must be {described}")
    for key in declared.largest_overrides:
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{where}.largest_overrides: {key!r} is not a dotted field name")
    return declared


@dataclasses.dataclass(frozen=True)
class Entry:
    """A method as the generic machinery sees it. `make` turns a config into its Method (None:
    `methods.make`, i.e. methods/<config.method>); a test-defined method gives its own."""

    name: str
    get_config: Callable[[str], Any]
    declarations: Declarations = Declarations()
    make: Callable[[Any], Any] | None = None

    def config(self, arg: str, overrides: Mapping[str, Any] | None = None):
        """`get_config(arg)` with `overrides` (dotted field -> value) set; an override of a
        field the config lacks is a ConfigError."""
        config = self.get_config(arg)
        for path, value in (overrides or {}).items():
            *parents, leaf = path.split(".")
            node = config
            for key in parents:
                node = node.get(key) if isinstance(node, ConfigDict) else None
            if not isinstance(node, ConfigDict) or leaf not in node:
                raise ConfigError(f"{self.name}: DECLARATIONS override {path!r}: no such field")
            node[leaf] = value
        return config

    def smoke_config(self, mesh: str | None = None):
        """The smoke variant (on mesh preset `mesh`, if given)."""
        return self.get_config(_with_mesh(self.declarations.smoke, mesh))

    def method(self, config):
        if self.make is not None:
            return self.make(config)
        import methods

        return methods.make(config)

    @property
    def largest(self) -> tuple[str, Mapping[str, Any]]:
        """(config string, overrides) of the largest config."""
        return self.declarations.largest, dict(self.declarations.largest_overrides)

    @property
    def aot_smoke(self) -> tuple[str, Mapping[str, Any]]:
        d = self.declarations
        return (d.smoke if d.aot_smoke is None else d.aot_smoke), {}

    def spec(self, arg: str) -> str:
        """`arg` as a --config string (configs/<name>.py[:arg]), for tables and messages."""
        return f"configs/{self.name}.py" + (f":{arg}" if arg else "")


def _with_mesh(arg: str, mesh: str | None) -> str:
    return ",".join(filter(None, (f"mesh={mesh}" if mesh else "", arg)))


def config_names() -> list[str]:
    """The slug of every configs/<slug>.py, sorted."""
    import configs

    folder = pathlib.Path(next(iter(configs.__path__)))
    return sorted(p.stem for p in folder.glob("*.py") if p.stem not in _NOT_CONFIGS)


def of(name: str) -> Declarations:
    """configs/<name>.py's `DECLARATIONS`, checked (the defaults when it declares none)."""
    if name not in config_names():
        raise ConfigError(f"no configs/{name}.py; configs: {', '.join(config_names())}")
    module = importlib.import_module(f"configs.{name}")
    return check(name, getattr(module, "DECLARATIONS", Declarations()))


def entry(name: str) -> Entry:
    module = importlib.import_module(f"configs.{name}")
    return Entry(name, module.get_config, of(name))


def entries() -> list[Entry]:
    """Every configs/<slug>.py as an Entry, sorted by slug."""
    return [entry(name) for name in config_names()]
