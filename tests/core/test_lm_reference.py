"""The transformer LM against logits recorded from its code before core.nn.attention/layers
existed (tests/fixtures/lm_reference.npz, tests/fixtures/record_lm_reference.py): the refactor
must not change a single number, nor a parameter path."""

import functools
from pathlib import Path

import jax
import numpy as np
import pytest

from core.nn import transformer
from tests.fixtures import record_lm_reference as ref
from tests.fixtures import record_transformer_defaults as defaults_ref

FIXTURE = np.load(Path(ref.__file__).with_name("lm_reference.npz"))


@pytest.mark.parametrize("name,fields", ref.CASES, ids=[name for name, _ in ref.CASES])
def test_logits_and_features_equal_the_recorded_transformer(name, fields):
    cfg = transformer.TransformerConfig(**fields)
    abstract = jax.eval_shape(functools.partial(transformer.init_params, cfg), jax.random.key(0))
    # The recorded parameters are drawn per path: a renamed or reshaped leaf fails here.
    params = ref.synthetic_params(abstract)
    tokens_BT, key_mask_BT, positions_BT = ref.inputs(fields)
    kw = dict(positions_BT=positions_BT, key_mask_BT=key_mask_BT)
    logits_BTV, _ = transformer.apply(cfg, params, tokens_BT, **kw)
    # atol 1e-5: XLA:CPU's float32 code differs by CPU model (recorded on Intel; an AMD EPYC
    # machine gave up to 1.8e-6 absolute on these logits, bit-equal on the recording CPU); a
    # changed mask value, softmax or missing term moves them by far more.
    np.testing.assert_allclose(logits_BTV, FIXTURE[f"{name}/logits_BTV"], rtol=0, atol=1e-5)
    np.testing.assert_allclose(
        transformer.features(cfg, params, tokens_BT, **kw),
        FIXTURE[f"{name}/features_BTD"],
        rtol=0,
        atol=1e-5,
    )


DEFAULTS = np.load(Path(ref.__file__).with_name("transformer_defaults.npz"))
SAME_CPU = str(DEFAULTS["cpu_model"]) == defaults_ref.cpu_model()


@pytest.mark.parametrize(
    "name,fields", defaults_ref.CASES, ids=[name for name, _ in defaults_ref.CASES]
)
def test_default_configs_keep_their_init_paths_and_logits(name, fields):
    """Today's configs (no num_kv_heads / tie_embeddings / rope_layout / norm_eps given) against
    transformer_defaults.npz, recorded before those fields existed: bit for bit on the recording
    CPU model, the parameter paths and shapes always."""
    recorded = {key: DEFAULTS[f"{name}/{key}"] for key in ("logits_BTV", "prefill_BTV", "step_BTV")}
    got = defaults_ref.run_case(fields)
    assert list(got.pop("params")) == list(DEFAULTS[f"{name}/params"])
    for key, want in recorded.items():
        if SAME_CPU:
            np.testing.assert_array_equal(got[key], want, err_msg=key)
        else:
            # atol 1e-5 off the recording CPU model, as above: XLA:CPU's float32 code differs
            # by CPU model (up to 1.8e-6 seen); bfloat16 rounding can amplify one such flip,
            # so the bf16 case gets 1 bf16 ulp at |logit| ~ 4 (2^-6) instead.
            atol = 2**-6 if fields.get("dtype") == "bfloat16" else 1e-5
            np.testing.assert_allclose(got[key], want, rtol=0, atol=atol, err_msg=key)
