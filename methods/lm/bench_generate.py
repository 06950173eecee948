"""Text generation speed of a pretrained LM with the KV cache, side by side with llama.cpp and
Hugging Face transformers (PyTorch, CPU), in one process. Part of `methods/lm/bench.py`.

    python -m launch.bench --methods=lm             # SmolLM2-135M-Instruct, batch 1 and 16

What is timed, for each of float32 and bfloat16 (params and compute) and batch 1 and 16:
  prefill: `core.pretrained.generate`'s jitted prefill over a PROMPT_LEN-token prompt per row
    (compiled beforehand), tokens/s = batch x prompt / seconds (median of REPEATS);
  decode: NEW_TOKENS - 1 jitted single-token steps dispatched back to back after a prefill, one
    block_until_ready at the end, tokens/s = batch x steps / seconds (median of REPEATS).
The comparators run the same token ids, the same batch and the same number of steps:
  llama.cpp (`llama-cpp-python`, the bench extra: built from source) on the very GGUF file the
    weights come from (Q4_1 blocks, Q8_0 embedding): one `llama_decode` of all rows' prompts
    (one sequence id per row), then one `llama_decode` of one token per row per step;
  transformers on PyTorch CPU (`AutoModelForCausalLM.from_pretrained(folder, gguf_file=...)`,
    which dequantizes the same file) in float32 and bfloat16: a forward over the prompts with
    use_cache, then one token per row per step with the past key values, under inference_mode.
Every library gets this machine's cores (torch.set_num_threads, n_threads). A comparator that is
not installed is skipped and named in the notes (`pip install -e .[bench]`). Each comparator
library runs in its own fresh process (the same interpreter), after ours: one after the other
in one process, a library's idle thread pool slowed the next one's decode by up to 10x.

Also measured (in smoke mode too, on a tiny random model): bfloat16 over float32, batch 16 over
batch 1, and the Python loop of jitted steps against `core.nn.sampler.sample_jit` (one
`lax.while_loop`) for the same prompt and number of tokens.
"""

import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import time

import jax
import numpy as np

from core.benchmark import Ratio
from core.nn import sampler, transformer
from core.pretrained import generate
from methods.lm.bench_comparators import medians, rates

MODEL = "smollm2-135m-instruct"
FULL = {"batches": (1, 16), "prompt_len": 64, "new_tokens": 33, "repeats": 3}
SMOKE = {"batches": (1, 2), "prompt_len": 8, "new_tokens": 5, "repeats": 1}
DTYPES = ("float32", "bfloat16")
# The smoke model: the real one's shape features (GQA, tied embeddings), tiny.
SMOKE_CFG = transformer.TransformerConfig(
    vocab_size=128,
    num_layers=2,
    d_model=32,
    num_heads=4,
    num_kv_heads=2,
    d_ff=64,
    max_len=256,
    tie_embeddings=True,
    norm_eps=1e-5,
)


def _prompts(batch: int, prompt_len: int, vocab: int) -> np.ndarray:
    """Fixed token ids [batch, prompt_len] (ids >= 3: no special tokens), the same for every
    library."""
    return np.random.default_rng(0).integers(3, vocab, (batch, prompt_len)).astype(np.int32)


def _decoder(cfg, params, tokens_BP, new_tokens: int):
    """(prefill() -> (token_B, cache), decode(token_B, cache) -> last token_B, programs): the
    generate programs for these prompts, greedy; each call blocks on its result."""
    B, P = tokens_BP.shape
    _, cache_len = generate.cache_shape(cfg, P, new_tokens)
    progs = generate.programs(cfg, params, batch_size=B, prompt_len=P, cache_len=cache_len)
    lengths_B, rng = np.full((B,), P, np.int32), jax.random.PRNGKey(0)

    def prefill():
        return jax.block_until_ready(progs.prefill(params, tokens_BP, lengths_B, rng))

    def decode(token_B, cache):  # dispatched back to back: one wait at the end
        for i in range(1, new_tokens):
            position_B = np.full((B,), P + i - 1, np.int32)
            token_B, cache = progs.step(params, token_B, position_B, np.int32(i), cache, rng)
        return jax.block_until_ready(token_B)

    return prefill, decode, progs


def ours(cfg, params, tokens_BP, new_tokens: int, repeats: int) -> dict:
    """core.pretrained.generate's two programs, greedy."""
    prefill, decode, progs = _decoder(cfg, params, tokens_BP, new_tokens)

    def run():
        start = time.perf_counter()
        state = prefill()
        middle = time.perf_counter()
        decode(*state)
        return middle - start, time.perf_counter() - middle

    out = rates(medians(run, repeats), *tokens_BP.shape, new_tokens - 1)
    return {**out, "compile_s": progs.compile_s}


def loop_vs_while_loop(cfg, params, tokens_BP, new_tokens: int, repeats: int) -> dict:
    """Seconds for a prompt plus `new_tokens` greedy tokens: generate's Python loop of jitted
    steps against the core sampler's single jitted lax.while_loop (both: prefill included)."""
    prefill, decode, _ = _decoder(cfg, params, tokens_BP, new_tokens)
    sample = functools.partial(
        sampler.sample_jit, cfg, params, tokens_BP, rng=jax.random.PRNGKey(0)
    )

    def python_loop():
        decode(*prefill())

    def while_loop():
        jax.block_until_ready(sample(max_new_tokens=new_tokens, temperature=0.0).tokens_BN)

    seconds = {}
    for name, fn in (("python_loop", python_loop), ("while_loop", while_loop)):
        fn()  # compile / first call
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        seconds[name] = statistics.median(times)
    return seconds


# ------------------------------------------------------------------ the figures


def _speed_ratios(what, a_label, a, b_label, b) -> list[Ratio]:
    return [
        Ratio(f"{what}: {stage}", a_label, a[key], b_label, b[key], "tokens/s")
        for stage, key in (("prefill", "prefill_tokens_per_s"), ("decode", "decode_tokens_per_s"))
    ]


def _isolated(library: str, jobs: list, notes: list) -> dict:
    """The jobs' results from a fresh process of this interpreter: each library's threads alone
    on the cores (run one after the other in one process, a library's idle thread pool slowed
    the next library's decode by up to 10x on 2 cores). Missing libraries and failures go to
    the notes."""
    proc = subprocess.run(
        [sys.executable, "-m", "methods.lm.bench_comparators"],
        input=json.dumps(jobs),
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    try:
        out = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        notes.append(f"{library} failed (exit {proc.returncode}): {last[:300]}")
        return {}
    if "import_error" in out:
        notes.append(f"{library} not installed ({out['import_error']}): not measured; "
                     "`pip install -e .[bench]`")  # fmt: skip
        return {}
    for key, result in list(out.items()):
        if "error" in result:
            notes.append(f"{key} failed: {result['error']}")
            del out[key]
    return out


def _model(smoke: bool, dtype: str):
    """(cfg, device params, GGUF path or None, the params' bytes)."""
    if smoke:  # a tiny random model: seconds, and the real file is never touched
        cfg = dataclasses.replace(SMOKE_CFG, dtype=dtype, param_dtype=dtype)
        params = transformer.init_params(cfg, jax.random.PRNGKey(0))
        path = None
    else:
        from core import pretrained

        model = pretrained.load(MODEL, dtype=dtype)
        cfg, params, path = model.cfg, model.params, model.source
    params = jax.block_until_ready(generate.as_device_params(params))
    nbytes = sum(x.nbytes for x in jax.tree.leaves(params))
    return cfg, params, path, nbytes


def measure_generation(*, smoke: bool = False) -> tuple[list[Ratio], dict, list[str]]:
    """The figures, the details (every number) and the notes of the generation benchmark."""
    size = SMOKE if smoke else FULL
    threads = os.cpu_count() or 1
    P, N, R = size["prompt_len"], size["new_tokens"], size["repeats"]
    ratios, notes = [], []
    details = {"model": "smoke (random)" if smoke else MODEL, **size, "threads": threads}
    runs = details["runs"] = {}
    path = None
    for dtype in DTYPES:
        cfg, params, path, nbytes = _model(smoke, dtype)
        details[f"param_bytes_{dtype}"] = nbytes
        for B in size["batches"]:
            tokens_BP = _prompts(B, P, cfg.vocab_size)
            runs[f"ours/{dtype}/b{B}"] = ours(cfg, params, tokens_BP, N, R)
        if dtype == "float32":
            loop = loop_vs_while_loop(cfg, params, _prompts(1, P, cfg.vocab_size), N, R)
            details["loop_vs_while_loop_float32_b1"] = loop
        del params
    if smoke:
        notes.append("smoke: a tiny random model; llama.cpp and transformers not run")
    else:
        details["gguf_file"] = str(path)
        details["gguf_bytes"] = os.path.getsize(path)
        jobs = {"llama-cpp-python": [], "transformers": []}
        for B in size["batches"]:
            common = {"path": str(path), "new_tokens": N, "repeats": R, "threads": threads}
            common["tokens_BP"] = _prompts(B, P, cfg.vocab_size).tolist()
            jobs["llama-cpp-python"].append([f"llama.cpp/q4_1/b{B}", "llama_cpp", common])
            for dtype in DTYPES:
                job = [f"transformers/{dtype}/b{B}", "hf_transformers", {**common, "dtype": dtype}]
                jobs["transformers"].append(job)
        for library, library_jobs in jobs.items():
            runs.update(_isolated(library, library_jobs, notes))
    setting = f"prompt {P}, {N - 1} decode steps, {threads} threads"
    for B in size["batches"]:
        f32, bf16 = runs[f"ours/float32/b{B}"], runs[f"ours/bfloat16/b{B}"]
        what = f"generate, batch {B} ({setting})"
        ratios += _speed_ratios(what, "ours bfloat16", bf16, "ours float32", f32)
        for dtype in DTYPES:
            ours_run = runs[f"ours/{dtype}/b{B}"]
            if f"llama.cpp/q4_1/b{B}" in runs:
                ratios += _speed_ratios(
                    what, f"ours {dtype}", ours_run, "llama.cpp Q4_1", runs[f"llama.cpp/q4_1/b{B}"]
                )
            if f"transformers/{dtype}/b{B}" in runs:
                theirs = runs[f"transformers/{dtype}/b{B}"]
                ratios += _speed_ratios(
                    what, f"ours {dtype}", ours_run, f"transformers {dtype}", theirs
                )
    B1, BN = size["batches"]
    for dtype in DTYPES:
        ratios.append(
            Ratio(
                f"generate decode, batch {BN} over batch {B1}, {dtype} ({setting})",
                f"batch {BN}",
                runs[f"ours/{dtype}/b{BN}"]["decode_tokens_per_s"],
                f"batch {B1}",
                runs[f"ours/{dtype}/b{B1}"]["decode_tokens_per_s"],
                "tokens/s",
            )
        )
    loop = details["loop_vs_while_loop_float32_b1"]
    ratios.append(
        Ratio(
            f"prompt {P} + {N} greedy tokens, batch 1, float32: seconds",
            "generate (Python loop of jitted steps)",
            loop["python_loop"],
            "sampler.sample_jit (one lax.while_loop)",
            loop["while_loop"],
            "s",
        )
    )
    if not smoke:
        ratios.append(
            Ratio(
                "weight bytes read per decode step: our bfloat16 params vs the GGUF file",
                "ours bfloat16",
                details["param_bytes_bfloat16"],
                "GGUF (Q4_1, Q8_0 embedding)",
                details["gguf_bytes"],
                "bytes",
            )
        )
    return ratios, details, notes
