"""The precision policy (core/precision.py) reaches every method's compiled step.

For each entry's smoke variant (configs/*.py and the kinds of tests/kinds.py), the program the
core builds is lowered (not run) and its StableHLO read: the training step, or the eval step of a
method that trains nothing. Every matmul must carry the configured default precision, and a
method that takes `dtype=bfloat16` must really multiply bfloat16 while its parameters stay
float32; a float32-only method must refuse bfloat16 (and "auto") in one line. A step with no
matmul at all is declared so, with its reason (`Declarations.no_matmul`), and must have none.
"""

import re

import jax
import pytest

from core import precision, train
from core.errors import ConfigError
from tests.entries import BY_NAME, NAMES

DOT = re.compile(r"stablehlo\.(dot_general|convolution)\b[^\n]*")


def smoke_config(name: str, **fields):
    config = BY_NAME[name].smoke_config(mesh="cpu")
    for key, value in fields.items():
        setattr(config, key, value)
    return config


def bfloat16_supported(name: str) -> bool:
    try:
        BY_NAME[name].method(smoke_config(name, dtype="bfloat16"))
    except ConfigError as e:
        assert "not supported by this method" in str(e) and "\n" not in str(e)
        return False
    return True


def lowered_program(config, method) -> tuple[train.Session, str]:
    """The session and the StableHLO of what a run of `config` compiles: its training step,
    or, for a method that trains nothing, the eval step of its first stream on that stream's
    first batch."""
    session = train.init(config, method, devices=jax.devices()[:1])
    if session.step is not None:
        return session, session.step.lower(session.state, session.next_batch()).as_text()
    stream = next(s for s in session.streams if s.eval_step is not None)
    batch = next(iter(method.dataset(stream.evaluator.split, shard=(0, 1), seed=config.seed)))
    key = jax.random.PRNGKey(0)
    return session, stream.eval_step.lower(session.state, batch, key).as_text()


@pytest.mark.parametrize("name", NAMES)
def test_the_step_honours_the_precision_policy(name):
    """One lowering per entry (init and lowering cost seconds each): every matmul at the
    configured HIGHEST precision; bfloat16 inputs where the method takes dtype=bfloat16."""
    entry = BY_NAME[name]
    bfloat16 = bfloat16_supported(name)
    if not bfloat16:
        # Its config must then say float32 (the default "auto" would be refused).
        assert smoke_config(name).dtype == "float32"
        with pytest.raises(ConfigError, match="dtype='auto' is not supported"):
            entry.method(smoke_config(name, dtype="auto"))
    config = smoke_config(name, matmul_precision="highest")
    if bfloat16:
        config.dtype = "bfloat16"
    session, text = lowered_program(config, entry.method(config))
    dots = [m.group(0) for m in DOT.finditer(text)]
    if entry.declarations.no_matmul:  # the policy has nothing to reach there
        assert not dots, f"{name} now has matmuls: drop its Declarations.no_matmul"
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
