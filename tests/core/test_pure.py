"""core.nn.pure.PureModule: an NNX module class as init / bind / graphdef over plain pytrees."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from core.nn.pure import PureModule


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    d_in: int
    d_out: int
    squares: int = 0  # the structure (not only shapes) depends on the config


class Toy(nnx.Module):
    def __init__(self, cfg: ToyConfig, rngs: nnx.Rngs):
        self.dense = nnx.Linear(cfg.d_in, cfg.d_out, rngs=rngs)
        self.scale = nnx.Param(jnp.full((cfg.d_out,), 2.0))
        self.squares = cfg.squares  # a static attribute: part of the graphdef

    def __call__(self, x):
        y = self.dense(x) * self.scale[...]
        for _ in range(self.squares):
            y = y * y
        return y


class Doubled(Toy):
    def __call__(self, x):
        return 2 * super().__call__(x)


SMALL, WIDE = ToyConfig(3, 2), ToyConfig(3, 5, squares=1)


def test_init_is_the_module_built_from_the_key():
    toy = PureModule(Toy)
    params = toy.init(SMALL, jax.random.key(7))
    direct = nnx.to_pure_dict(nnx.state(Toy(SMALL, nnx.Rngs(params=jax.random.key(7)))))
    assert jax.tree.structure(params) == jax.tree.structure(direct)
    jax.tree.map(np.testing.assert_array_equal, params, direct)
    other = toy.init(SMALL, jax.random.key(8))
    assert not np.array_equal(other["dense"]["kernel"], params["dense"]["kernel"])
    # Shapes only: no parameter memory, the same tree.
    abstract = jax.eval_shape(functools.partial(toy.init, SMALL), jax.random.key(7))
    assert jax.tree.map(lambda s: s.shape, abstract) == jax.tree.map(np.shape, params)


def test_bind_holds_the_params_and_computes_as_the_module():
    toy = PureModule(Toy)
    params = toy.init(SMALL, jax.random.key(0))
    params["scale"] = jnp.array([3.0, -1.0])  # not the init value: bind must use these
    bound = toy.bind(SMALL, params)
    jax.tree.map(np.testing.assert_array_equal, nnx.to_pure_dict(nnx.state(bound)), params)
    x = jnp.arange(6.0).reshape(2, 3)
    expected = (x @ params["dense"]["kernel"] + params["dense"]["bias"]) * params["scale"]
    np.testing.assert_array_equal(bound(x), expected)
    # Under jit, params are the traced argument (a pure function of them).
    grads = jax.grad(lambda p: toy.bind(SMALL, p)(x).sum())(params)
    np.testing.assert_allclose(grads["scale"], expected.sum(0) / params["scale"], rtol=1e-6)


def test_graphdef_is_cached_per_config():
    calls = []
    toy = PureModule(lambda cfg, rngs: calls.append(cfg) or Toy(cfg, rngs))
    assert toy.graphdef(SMALL) is toy.graphdef(ToyConfig(3, 2))  # equal configs: one build
    assert calls == [SMALL]
    # Another config gets its own structure, whichever was built first.
    x = jnp.ones((4, 3))
    for cfg in (WIDE, SMALL):
        params = toy.init(cfg, jax.random.key(1))
        direct = Toy(cfg, nnx.Rngs(params=jax.random.key(1)))
        np.testing.assert_array_equal(toy.bind(cfg, params)(x), direct(x))
    assert toy.graphdef(WIDE) is not toy.graphdef(SMALL)


def test_each_module_class_keeps_its_own_structures():
    toy, doubled = PureModule(Toy), PureModule(Doubled)
    params = toy.init(SMALL, jax.random.key(2))
    x = jnp.ones((1, 3))
    y = toy.bind(SMALL, params)(x)  # Toy's structure for SMALL is cached first
    np.testing.assert_array_equal(doubled.bind(SMALL, params)(x), 2 * y)
