"""A deployment setting of the trained model, named by "+"-joined tokens:

    fp                 full precision, no cache
    w<W>a<A>           fake-quantised linear layers (W-bit weights per output channel, A-bit
                       activations per tensor), e.g. w8a8, w4a8
    c<N>               FORA cache, every block's branches refreshed every N steps, e.g. c2
    uniform|kmeans|tap the calibration rule (quantised settings; default uniform)
    vc                 variance compensation after every step (needs quantisation or a cache)

e.g. "w4a8+c2+tap+vc" (Q&C), "w4a8+c2" (naive Q+C: uniform calibration), "c3", "w8a8".
"""

import re
from typing import NamedTuple

from core.errors import ConfigError

CALIBRATIONS = ("uniform", "kmeans", "tap")


class Setting(NamedTuple):
    name: str
    w_bits: int | None = None  # None: float weights
    a_bits: int | None = None
    cache_every: int = 1  # 1: no cache
    calibration: str | None = None  # quantised settings only
    vc: bool = False

    @property
    def quantized(self) -> bool:
        return self.w_bits is not None


def parse(name: str) -> Setting:
    """The Setting a name describes; a one-line ConfigError naming the bad token otherwise."""
    what = f"quant_cache.settings: {name!r}"
    tokens = name.split("+")
    if tokens == ["fp"]:
        return Setting("fp")
    fields = {}
    for token in tokens:
        bits = re.fullmatch(r"w(\d)a(\d)", token)
        cache = re.fullmatch(r"c(\d+)", token)
        if bits:
            w, a = int(bits[1]), int(bits[2])
            if not (2 <= w <= 8 and 2 <= a <= 8):
                raise ConfigError(f"{what}: {token} needs bit widths in 2..8")
            fields["bits"] = (w, a)
        elif cache:
            if int(cache[1]) < 2:
                raise ConfigError(f"{what}: {token} needs N >= 2 (c1 is no cache: drop it)")
            fields["cache"] = int(cache[1])
        elif token in CALIBRATIONS:
            fields["calibration"] = token
        elif token == "vc":
            fields["vc"] = True
        else:
            raise ConfigError(
                f"{what}: unknown token {token!r}; expected fp, w<W>a<A>, c<N>, "
                f"{', '.join(CALIBRATIONS)} or vc"
            )
    if len(fields) != len(tokens):
        raise ConfigError(f"{what}: a token kind appears twice")
    if "calibration" in fields and "bits" not in fields:
        raise ConfigError(f"{what}: a calibration rule needs a quantised setting (w<W>a<A>)")
    if fields.get("vc") and not ({"bits", "cache"} & set(fields)):
        raise ConfigError(f"{what}: vc compensates a quantised or cached model; add one")
    w, a = fields.get("bits", (None, None))
    calibration = fields.get("calibration", "uniform") if w else None
    return Setting(name, w, a, fields.get("cache", 1), calibration, fields.get("vc", False))


def parse_list(text: str) -> list[Setting]:
    """A "/"-separated list of names (the config's quant_cache.settings), fp included once."""
    names = [n for n in text.split("/") if n]
    if not names:
        raise ConfigError("quant_cache.settings is empty; e.g. fp/w4a8+c2/w4a8+c2+tap+vc")
    if len(set(names)) != len(names):
        raise ConfigError(f"quant_cache.settings={text!r} repeats a name")
    return [parse(n) for n in names]
