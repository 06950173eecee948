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
not installed is skipped and named in the notes (`pip install -e .[bench]`).

Also measured (in smoke mode too, on a tiny random model): bfloat16 over float32, batch 16 over
batch 1, and the Python loop of jitted steps against `core.nn.sampler.sample_jit` (one
`lax.while_loop`) for the same prompt and number of tokens.
"""

import copy
import dataclasses
import functools
import inspect
import os
import statistics
import time

import jax
import numpy as np

from core.benchmark import Ratio
from core.nn import sampler, transformer
from core.pretrained import generate

MODEL = "smollm2-135m-instruct"
FULL = {"batches": (1, 16), "prompt_len": 64, "new_tokens": 33, "repeats": 3}
SMOKE = {"batches": (1, 2), "prompt_len": 8, "new_tokens": 5, "repeats": 1}
DTYPES = ("float32", "bfloat16")
# llama.cpp's KV cache for the batch's sequences as one buffer: at batch 16 and 32 decode steps
# its per-sequence caches (kv_unified False) decoded ~13x slower here (22 vs 291 tokens/s).
KV_UNIFIED = True
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


def _medians(run, repeats: int) -> dict:
    """run() -> (prefill seconds, decode seconds); one untimed warm-up call (the first call of
    a compiled program pays one-off costs), then medians over `repeats` calls."""
    run()
    times = [run() for _ in range(repeats)]
    return {
        "prefill_s": statistics.median(t[0] for t in times),
        "decode_s": statistics.median(t[1] for t in times),
    }


def _rates(seconds: dict, batch: int, prompt_len: int, steps: int) -> dict:
    return {
        **seconds,
        "prefill_tokens": batch * prompt_len,
        "decode_tokens": batch * steps,
        "prefill_tokens_per_s": batch * prompt_len / seconds["prefill_s"],
        "decode_tokens_per_s": batch * steps / seconds["decode_s"],
    }


def ours(cfg, params, tokens_BP, new_tokens: int, repeats: int) -> dict:
    """core.pretrained.generate's two programs, greedy."""
    B, P = tokens_BP.shape
    _, cache_len = generate.cache_shape(cfg, P, new_tokens)
    progs = generate.programs(cfg, params, batch_size=B, prompt_len=P, cache_len=cache_len)
    lengths_B = np.full((B,), P, np.int32)
    rng = jax.random.PRNGKey(0)

    def run():
        start = time.perf_counter()
        token_B, cache = jax.block_until_ready(progs.prefill(params, tokens_BP, lengths_B, rng))
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(1, new_tokens):
            position_B = np.full((B,), P + i - 1, np.int32)
            token_B, cache = progs.step(params, token_B, position_B, np.int32(i), cache, rng)
        jax.block_until_ready(token_B)
        return prefill_s, time.perf_counter() - start

    out = _rates(_medians(run, repeats), B, P, new_tokens - 1)
    return {**out, "compile_s": progs.compile_s, "cache_len": cache_len}


def loop_vs_while_loop(cfg, params, tokens_BP, new_tokens: int, repeats: int) -> dict:
    """Seconds for a prompt plus `new_tokens` greedy tokens: generate's Python loop of jitted
    steps against the core sampler's single jitted lax.while_loop (both: prefill included)."""
    B, P = tokens_BP.shape
    _, cache_len = generate.cache_shape(cfg, P, new_tokens)
    progs = generate.programs(cfg, params, batch_size=B, prompt_len=P, cache_len=cache_len)
    lengths_B, rng = np.full((B,), P, np.int32), jax.random.PRNGKey(0)

    def python_loop():
        token_B, cache = progs.prefill(params, tokens_BP, lengths_B, rng)
        for i in range(1, new_tokens):
            position_B = np.full((B,), P + i - 1, np.int32)
            token_B, cache = progs.step(params, token_B, position_B, np.int32(i), cache, rng)
        jax.block_until_ready(token_B)

    sample = functools.partial(
        sampler.sample_jit, cfg, params, tokens_BP, rng=rng, max_new_tokens=new_tokens
    )

    def while_loop():
        jax.block_until_ready(sample(temperature=0.0).tokens_BN)

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


# ------------------------------------------------------------------ comparators


# A no-op llama.cpp log callback, kept alive here: ctypes calls it after llama_log_set returns.
_QUIET = []


def llama_cpp(path, tokens_BP, new_tokens: int, repeats: int, threads: int) -> dict:
    """llama.cpp through llama-cpp-python's C API: all rows' prompts in one batch (a sequence
    id per row), then one token per row per step. Raises ImportError when not installed."""
    import llama_cpp as lc

    B, P = tokens_BP.shape
    if not _QUIET:
        _QUIET.append(lc.llama_log_callback(lambda level, text, user_data: None))
    lc.llama_log_set(_QUIET[0], None)  # its per-load report would fill the bench's stderr
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(str(path).encode(), lc.llama_model_default_params())
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    cp = lc.llama_context_default_params()
    per_row = P + new_tokens
    cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_seq_max = B * per_row, B * P, B * P, B
    cp.n_threads = cp.n_threads_batch = threads
    cp.kv_unified = KV_UNIFIED
    ctx = lc.llama_init_from_model(model, cp)
    batch = lc.llama_batch_init(B * P, 0, B)

    def decode(rows):  # rows: (token, position, sequence, wants logits)
        batch.n_tokens = len(rows)
        for i, (token, pos, seq, logits) in enumerate(rows):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = int(token), pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    next_B = _prompts(B, 1, 1000)[:, 0] + 3  # fixed next tokens (speed does not depend on them)

    def run():
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        start = time.perf_counter()
        decode([(tokens_BP[b, t], t, b, t == P - 1) for b in range(B) for t in range(P)])
        lc.llama_synchronize(ctx)
        prefill_s = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(1, new_tokens):
            decode([(next_B[b], P + i - 1, b, True) for b in range(B)])
        lc.llama_synchronize(ctx)
        return prefill_s, time.perf_counter() - start

    try:
        out = _rates(_medians(run, repeats), B, P, new_tokens - 1)
    finally:
        lc.llama_batch_free(batch)
        lc.llama_free(ctx)
        lc.llama_model_free(model)
    return {**out, "version": lc.__version__, "threads": threads}


@functools.cache
def _torch_model(path, dtype: str):
    """The GGUF file dequantized by transformers once (float32), cast for other dtypes."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype != "float32":
        return copy.deepcopy(_torch_model(path, "float32")).to(getattr(torch, dtype))
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    for p in model.parameters():  # dequantized tensors can be strided views: matmuls crawl
        p.data = p.data.contiguous()
    return model.eval()


def hf_transformers(path, dtype: str, tokens_BP, new_tokens: int, repeats: int, threads: int):
    """transformers' Llama on PyTorch CPU, greedy with its KV cache."""
    import torch
    import transformers

    torch.set_num_threads(threads)
    model = _torch_model(path, dtype)
    # transformers 5 renamed past_key_values to cache (the old name warns on every call).
    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    B, P = tokens_BP.shape
    ids_BP = torch.as_tensor(tokens_BP, dtype=torch.long)

    def run():
        with torch.inference_mode():
            start = time.perf_counter()
            out = model(input_ids=ids_BP, use_cache=True)
            token_B1 = out.logits[:, -1].argmax(-1, keepdim=True)
            prefill_s = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(1, new_tokens):
                out = model(input_ids=token_B1, use_cache=True, **{name: getattr(out, name)})
                token_B1 = out.logits[:, -1].argmax(-1, keepdim=True)
            return prefill_s, time.perf_counter() - start

    out = _rates(_medians(run, repeats), B, P, new_tokens - 1)
    return {**out, "torch": torch.__version__, "transformers": transformers.__version__}


# ------------------------------------------------------------------ the figures


def _speed_ratios(what, a_label, a, b_label, b) -> list[Ratio]:
    return [
        Ratio(f"{what}: {stage}", a_label, a[key], b_label, b[key], "tokens/s")
        for stage, key in (("prefill", "prefill_tokens_per_s"), ("decode", "decode_tokens_per_s"))
    ]


def _comparator(name, library, fn, notes, unavailable):
    """fn() or None, with the reason in the notes: `library` not installed (then added to
    `unavailable`, and not tried again), or this run failed."""
    if library in unavailable:
        return None
    try:
        return fn()
    except ImportError as e:
        unavailable.add(library)
        notes.append(f"{library} not installed ({e}): not measured; `pip install -e .[bench]`")
    except Exception as e:  # a comparator's own failure must not lose our numbers
        notes.append(f"{name} failed: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
    return None


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
        unavailable = set()
        for B in size["batches"]:
            tokens_BP = _prompts(B, P, cfg.vocab_size)
            run = functools.partial(llama_cpp, path, tokens_BP, N, R, threads)
            got = _comparator(f"llama.cpp, batch {B}", "llama-cpp-python", run, notes, unavailable)
            if got:
                runs[f"llama.cpp/q4_1/b{B}"] = got
            for dtype in DTYPES:
                run = functools.partial(hf_transformers, path, dtype, tokens_BP, N, R, threads)
                name = f"transformers {dtype}, batch {B}"
                got = _comparator(name, "transformers", run, notes, unavailable)
                if got:
                    runs[f"transformers/{dtype}/b{B}"] = got
        details["comparators_not_installed"] = sorted(unavailable)
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
