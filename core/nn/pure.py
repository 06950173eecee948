"""An NNX module class as pure functions over plain parameter pytrees: the one adapter every
model in `core.nn` (and any method's own NNX model) uses between its module and the core.

    TRANSFORMER = PureModule(Transformer)            # any constructor (cfg, rngs) -> module
    params = TRANSFORMER.init(cfg, rng)              # nested dict of arrays
    model = TRANSFORMER.bind(cfg, params)            # the module holding params, to call
    graphdef = TRANSFORMER.graphdef(cfg)             # its static structure (cached per cfg)

Inside, models are Flax NNX modules; outside, only plain pytrees cross into the core (jit,
optax, checkpoints, sharding rules all see nested dicts). `init` runs the constructor with
`nnx.Rngs(params=rng)`, so parameters come from that key alone and `jax.eval_shape` of it
allocates nothing. `graphdef` builds the module once per cfg under `nnx.eval_shape` (no
parameter memory, no RNG work) and keeps its structure; `bind` merges params into it. cfg must
be hashable (a frozen dataclass): it is the cache key.
"""

import functools
from collections.abc import Callable, Hashable

import jax
from flax import nnx

CACHE_SIZE = 64  # distinct configs kept per module; a sweep rarely has more at once


class PureModule:
    """`constructor(cfg, rngs)` as init / bind / graphdef (see the module docstring)."""

    def __init__(self, constructor: Callable[[Hashable, nnx.Rngs], nnx.Module]):
        self.constructor = constructor
        # Per instance: each module class keeps its own structures, keyed by cfg alone.
        self.graphdef = functools.lru_cache(maxsize=CACHE_SIZE)(self._build_graphdef)

    def _build_graphdef(self, cfg) -> nnx.GraphDef:
        """The module's static structure, built abstractly."""
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: self.constructor(cfg, nnx.Rngs(0))))
        return graphdef

    def init(self, cfg, rng: jax.Array) -> dict:
        """Fresh parameters as a nested dict of arrays; safe under `jax.eval_shape`."""
        return nnx.to_pure_dict(nnx.state(self.constructor(cfg, nnx.Rngs(params=rng))))

    def bind(self, cfg, params: dict) -> nnx.Module:
        """The module holding `params` (a pytree of `init`'s structure), ready to call."""
        return nnx.merge(self.graphdef(cfg), params)

    def __repr__(self) -> str:
        return f"PureModule({getattr(self.constructor, '__qualname__', self.constructor)})"
