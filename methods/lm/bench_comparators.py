"""The comparators of the generation benchmark (`methods/lm/bench_generate.py`): llama.cpp
(llama-cpp-python) and Hugging Face transformers on PyTorch CPU, on the GGUF file our weights
come from, run in a process of their own:

    echo '[[key, "llama_cpp", {kwargs}], ...]' | python -m methods.lm.bench_comparators

prints {key: result} as one JSON line ({"import_error": ...} when a library is missing, a failed
job's result {"error": ...}). Nothing here runs on JAX: only the measured library's threads work.
"""

import copy
import functools
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

# llama.cpp's KV cache for the batch's sequences as one buffer. One comparison here at batch 16,
# 32 decode steps: per-sequence caches (False) 22 tokens/s, one buffer 291; but later runs with
# one buffer also fell to 14-25 tokens/s on this loaded 2-core host (probably its spinning
# thread barrier stalling when a thread is descheduled): its batch-16 decode is erratic here.
KV_UNIFIED = True


def medians(run, repeats: int) -> dict:
    """run() -> (prefill seconds, decode seconds); one untimed warm-up call (the first call of
    a compiled program pays one-off costs), then medians over `repeats` calls."""
    run()
    times = [run() for _ in range(repeats)]
    return {
        "prefill_s": statistics.median(t[0] for t in times),
        "decode_s": statistics.median(t[1] for t in times),
    }


def rates(seconds: dict, batch: int, prompt_len: int, steps: int) -> dict:
    return {
        **seconds,
        "prefill_tokens": batch * prompt_len,
        "decode_tokens": batch * steps,
        "prefill_tokens_per_s": batch * prompt_len / seconds["prefill_s"],
        "decode_tokens_per_s": batch * steps / seconds["decode_s"],
    }


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

    next_B = tokens_BP[:, 0]  # fixed next tokens (the speed does not depend on which)

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
        out = rates(medians(run, repeats), B, P, new_tokens - 1)
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

    out = rates(medians(run, repeats), B, P, new_tokens - 1)
    return {**out, "torch": torch.__version__, "transformers": transformers.__version__}


def run_jobs(jobs: list) -> dict:
    """[key, function name, kwargs] -> {key: its result}; {"import_error": ...} when a library
    is missing; a failed job's result is {"error": ...}."""
    out = {}
    for key, name, kwargs in jobs:
        kwargs = {**kwargs, "path": Path(kwargs["path"])}
        kwargs["tokens_BP"] = np.asarray(kwargs["tokens_BP"], np.int32)
        try:
            out[key] = {"llama_cpp": llama_cpp, "hf_transformers": hf_transformers}[name](**kwargs)
        except ImportError as e:
            return {"import_error": str(e)}
        except Exception as e:  # a comparator's own failure must not lose the other numbers
            out[key] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
    return out


if __name__ == "__main__":  # one comparator process (`_isolated`): jobs on stdin, JSON out
    print(json.dumps(run_jobs(json.loads(sys.stdin.read()))))
