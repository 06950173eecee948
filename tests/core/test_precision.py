"""The precision policy (core/precision.py) reaches every method's compiled step.

For each config's smoke variant, the training step the core builds is lowered (not run) and its
StableHLO read: every matmul must carry the configured default precision, and a method that
takes `dtype=bfloat16` must really multiply bfloat16 while its parameters stay float32; a
float32-only method must refuse bfloat16 (and "auto") in one line.
"""

import importlib
import re

import jax
import pytest

import methods
from core import precision, train
from core.errors import ConfigError
from tests.test_configs import CONFIGS

# Steps with no matmul at all (the policy has nothing to reach there; if one gains a matmul,
# the test below checks it like any other).
NO_MATMUL = {
    "hybrid_online": "an online learner over sorted buffers: sorts and cumulative sums",
    "doit": "its default task is a 2-D test function (Rosenbrock): elementwise arithmetic only",
}
DOT = re.compile(r"stablehlo\.(dot_general|convolution)\b[^\n]*")


def smoke_config(name: str, **fields):
    config = importlib.import_module(f"configs.{name}").get_config("mesh=cpu,size=smoke")
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def bfloat16_supported(name: str) -> bool:
    try:
        methods.make(smoke_config(name, dtype="bfloat16"))
    except ConfigError as e:
        assert "not supported by this method" in str(e) and "\n" not in str(e)
        return False
    return True


@pytest.mark.parametrize("name", CONFIGS)
def test_the_step_honours_the_precision_policy(name):
    """One lowering per config (init and lowering cost seconds each): every matmul at the
    configured HIGHEST precision; bfloat16 inputs where the method takes dtype=bfloat16."""
    bfloat16 = bfloat16_supported(name)
    if not bfloat16:
        # Its config must then say float32 (the default "auto" would be refused).
        assert smoke_config(name).dtype == "float32"
        with pytest.raises(ConfigError, match="dtype='auto' is not supported"):
            methods.make(smoke_config(name, dtype="auto"))
    config = smoke_config(name, matmul_precision="highest")
    if bfloat16:
        config.dtype = "bfloat16"
    session = train.init(config, methods.make(config), devices=jax.devices()[:1])
    text = session.step.lower(session.state, session.next_batch()).as_text()
    dots = [m.group(0) for m in DOT.finditer(text)]
    if name in NO_MATMUL:
        assert not dots, f"{name} now has matmuls: drop it from NO_MATMUL"
        return
    assert dots, f"{name}: no matmul in the step (nothing to check)"
    for op in dots:
        if "dot_general" in op:
            assert "precision = [HIGHEST, HIGHEST]" in op, op
    if bfloat16:
        assert any("xbf16>" in op for op in dots), f"{name}: no matmul takes bfloat16 inputs"
        param_dtypes = {str(x.dtype) for x in jax.tree.leaves(session.state.params)}
        assert param_dtypes == {"float32"}, f"{name}: params must stay float32: {param_dtypes}"


def test_auto_precision_follows_the_compute_dtype():
    # On this CPU backend "auto" computes in float32, so float32 matmuls must be exact.
    assert precision.matmul_precision(smoke_config("lm")) == "highest"
    assert precision.matmul_precision(smoke_config("lm", dtype="bfloat16")) == "default"
    assert precision.matmul_precision(smoke_config("lm", matmul_precision="high")) == "high"


def test_unknown_precision_is_one_line():
    with pytest.raises(ConfigError, match="matmul_precision='fast' is unknown") as e:
        precision.matmul_precision(smoke_config("lm", matmul_precision="fast"))
    assert "\n" not in str(e.value)


def test_an_explicit_precision_wins_over_the_policy():
    import jax.numpy as jnp

    def f(a):
        return a @ a, jnp.dot(a, a, precision="default")

    a = jnp.ones((4, 4))
    config = smoke_config("lm", matmul_precision="highest")
    text = jax.jit(precision.traced_with(config, f)).lower(a).as_text()
    ops = [m.group(0) for m in DOT.finditer(text)]
    assert ["HIGHEST" in op for op in ops] == [True, False]
