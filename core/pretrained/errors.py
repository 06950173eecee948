"""The one error type of `core.pretrained`: a one-line `ConfigError` naming the file and the
tensor or field at fault (a missing or truncated file, an unsupported quantization type, a
tensor of the wrong shape, an unknown model name, an architecture that is not Llama)."""

from core.errors import ConfigError


class PretrainedError(ConfigError):
    """A pretrained checkpoint cannot be found, read or mapped; one line."""


def one_line(e: BaseException) -> str:
    """An exception's message on one line (library errors can span several)."""
    return " ".join(str(e).split()) or type(e).__name__
