"""One-line errors for the `--config` flag of every launch entry point.

ml_collections loads `--config=configs/<slug>.py:arg` and applies `--config.a.b=value` overrides
while absl parses the flags, before `main` runs, so a bad config string, a misspelt field or a
value of the wrong type ends in a traceback (or absl's two-line "FATAL Flags parsing error").
`parse_flags` is an absl `flags_parser` (`app.run(main, flags_parser=parse_flags)`) that checks
those first and exits with one line on stderr, `error: ...`, naming the field and the choices
(the valid fields at that level, the expected type):

    error: --config=configs/lm.py:sizes=smoke: config argument 'sizes=smoke' is not key=value ...
    error: --config.train.stepz: config.train has no field 'stepz'; its fields: batch_size, ...
    error: flag --config.train.steps=abc: invalid literal for int() ...; config.train.steps is int
"""

import importlib.util
import os
import re
import sys
from collections.abc import Sequence

from absl import flags
from ml_collections import ConfigDict

from core.errors import ConfigError


def _flag_values(argv: Sequence[str], name: str):
    """(value, override path) pairs: ("configs/lm.py:x", None) for --config, (value, "a.b") for
    --config.a.b; both `--flag=value` and `--flag value` forms."""
    found = []
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        flag, sep, value = arg.partition("=")
        if not sep:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        for dashes in ("--", "-"):
            if flag == f"{dashes}{name}":
                found.append((value, None))
            elif flag.startswith(f"{dashes}{name}."):
                found.append((value, flag.removeprefix(f"{dashes}{name}.")))
    return found


def load(spec: str, name: str = "config") -> ConfigDict:
    """`get_config(arg)` of `path[:arg]`, as ml_collections' config_file flag calls it."""
    path, sep, arg = spec.partition(":")
    if not os.path.isfile(path):
        folder = os.path.dirname(path) or "."
        here = sorted(f for f in os.listdir(folder) if f.endswith(".py")) if os.path.isdir(
            folder
        ) else []  # fmt: skip
        raise ConfigError(f"--{name}={spec}: no file {path!r}; configs here: {', '.join(here)}")
    module_spec = importlib.util.spec_from_file_location("_checked_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    try:
        return module.get_config(arg) if sep else module.get_config()
    except ConfigError as e:
        raise ConfigError(f"--{name}={spec}: {e}") from None


def field(config: ConfigDict, path: str, name: str = "config"):
    """The value at the dotted `path`, or a ConfigError naming the fields at the level where
    the path leaves the config."""
    node, walked = config, name
    for key in path.split("."):
        if not isinstance(node, ConfigDict):
            raise ConfigError(
                f"--{name}.{path}: {walked} is a value ({type(node).__name__}), "
                "not a group of fields"
            )
        if key not in node:
            fields = ", ".join(sorted(node.keys()))
            raise ConfigError(
                f"--{name}.{path}: {walked} has no field {key!r}; its fields: {fields}"
            )
        node, walked = node[key], f"{walked}.{key}"
    return node


def check(
    argv: Sequence[str], name: str = "config", default: str | None = None
) -> ConfigDict | None:
    """Load the config named in argv (or `default`) and check that every override's field
    exists; the config, or None when there is none (absl then reports the missing flag)."""
    values = _flag_values(argv, name)
    specs = [value for value, path in values if path is None] or [default]
    if specs[-1] is None:
        return None
    config = load(specs[-1], name)  # absl keeps the last of repeated flags
    for _, path in values:
        if path is not None:
            field(config, path, name)
    return config


def parse_flags(argv: Sequence[str], name: str = "config") -> list[str]:
    """absl's flag parsing with a one-line `error: ...` and exit status 2 for bad input."""
    config = None
    try:
        config = check(argv, name)
        return flags.FLAGS(argv)
    except ConfigError as e:
        sys.exit(_one_line(e))
    except flags.Error as e:
        message = str(e)
        # A value that does not parse as its field's type: name the type.
        bad = re.match(rf"flag --{re.escape(name)}\.([\w.]+)=", message)
        if bad and config is not None:
            expected = type(field(config, bad.group(1), name)).__name__
            message += f"; {name}.{bad.group(1)} is {expected}"
        sys.exit(_one_line(message))


def _one_line(message) -> int:
    # Messages from ml_collections can hold newlines ("Did you mean ..."): one line, same words.
    print(f"error: {' '.join(str(message).split())}", file=sys.stderr)
    return 2
