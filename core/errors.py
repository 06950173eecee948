"""One exception type for user-facing configuration and input errors.

Everything a researcher can get wrong by hand (a config field, a mesh, a batch size, a workdir)
raises `ConfigError` with a one-line message that names the offending field and value, so launch
scripts can print it without a traceback.
"""


class ConfigError(ValueError):
    """A configuration or input problem, described in one line."""


def method_name(config) -> str:
    """The method a config runs, as error messages name it ("this method" when unnamed)."""
    return config.get("method") or "this method"
