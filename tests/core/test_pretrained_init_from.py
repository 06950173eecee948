"""`train.init_from=pretrained:<path>` through core.train: a transformer method starts from the
checkpoint's weights (cast to its param dtypes, in its layout), and a method whose params do not
fit the checkpoint, or a checkpoint that cannot be read, fails in one line before the workdir
exists."""

import functools

import jax
import numpy as np
import pytest

from configs.common import base_config
from core import data, pretrained, train
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from tests.core.test_pretrained import CTX, D, F, G, H, L, V, hf_weights, write_gguf

SEQ = 8


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLR26_PRETRAINED_DIR", str(tmp_path / "cache"))


def lm_method(**cfg_fields):
    """A next-token LM on random tokens whose transformer is `cfg_fields` over the tiny Llama's."""
    fields = dict(vocab_size=V, num_layers=L, d_model=D, num_heads=H, num_kv_heads=G, d_ff=F)
    fields |= dict(max_len=CTX, norm_eps=1e-5) | cfg_fields
    cfg = transformer.TransformerConfig(**fields)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": transformer.init_params(cfg, rng)}

    def example(rng):
        tokens = rng.integers(0, V, SEQ + 1)
        return {"inputs": tokens[:-1], "targets": tokens[1:], "mask": np.ones(SEQ, np.float32)}

    def dataset(split, *, shard, seed):
        return data.synthetic(example, global_batch=8, seed=seed, shard=shard)

    loss = functools.partial(transformer.next_token_loss, cfg)
    return Method(init, loss=loss, dataset=dataset, sharding_rules=transformer.SHARDING_RULES)


def config(init_from, steps=1):
    c = base_config(mesh="auto")
    c.method = "tiny_llama"
    c.mesh.shape = (2, 1, 4)  # data 2, model 4: the weights are placed in the method's layout
    c.train.steps, c.train.batch_size, c.train.log_every = steps, 8, 100
    c.train.checkpoint_every, c.train.eval_every = 0, -1
    c.train.init_from = init_from
    return c


def test_a_transformer_method_starts_from_the_checkpoints_weights(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    loaded = pretrained.load(path).params
    session = train.init(config(f"pretrained:{path}"), lm_method())
    jax.tree.map(np.testing.assert_array_equal, session.state.params, loaded)
    q = session.state.params["blocks"][0]["attn"]["q"]["kernel"]
    assert q.sharding == session.state_shardings.params["blocks"][0]["attn"]["q"]["kernel"]
    # A bfloat16 method gets the weights cast to bfloat16.
    session = train.init(config(f"pretrained:{path}"), lm_method(param_dtype="bfloat16"))
    cast = jax.tree.map(lambda x: np.asarray(x, jax.numpy.bfloat16), loaded)
    jax.tree.map(np.testing.assert_array_equal, session.state.params, cast)


@pytest.mark.parametrize(
    ("method_fields", "message"),
    [
        (dict(d_ff=128), r"blocks/0/mlp/down/kernel is \(96, 64\) in the checkpoint but \(128, "),
        (dict(num_kv_heads=None), r"blocks/0/attn/k/kernel is \(64, 32\) in the checkpoint"),
        (dict(tie_embeddings=True), "the checkpoint's parameter lm_head/kernel is not the method"),
    ],
)
def test_a_method_that_does_not_fit_fails_in_one_line_before_the_workdir_exists(
    tmp_path, method_fields, message
):
    path = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    workdir = tmp_path / "run"
    with pytest.raises(ConfigError, match=message) as e:
        train.run(config(f"pretrained:{path}"), lm_method(**method_fields), str(workdir))
    assert "\n" not in str(e.value) and str(e.value).startswith("tiny_llama: train.init_from")
    assert not workdir.exists()


def test_an_unreadable_checkpoint_fails_before_the_workdir_exists(tmp_path):
    path = write_gguf(tmp_path / "tiny.gguf", hf_weights())
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    for source, message in (
        (f"pretrained:{path}", "tiny.gguf: truncated or corrupt GGUF file"),
        ("pretrained:no-such-model", "unknown pretrained model 'no-such-model'"),
    ):
        workdir = tmp_path / "run"
        with pytest.raises(ConfigError, match=message) as e:
            train.run(config(source), lm_method(), str(workdir))
        assert "\n" not in str(e.value)
        assert not workdir.exists()
