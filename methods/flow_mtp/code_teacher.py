"""The code teacher: a small byte-level causal transformer trained on the standard library's
Python sources (`core.corpus.python_stdlib`), behind the toy teacher's interface.

    teacher, info = train_teacher(settings, workdir, code=hash)   # cached by config + code
    teacher.logits(tokens_BT)                                     # [B, T, 256] float32
    completions_BN = ar_sample(teacher, transform, context_BC, u_BN)   # KV-cached, inverse CDF

`CodeTeacher.logits` is all the O-PTP loss, the bins and verification call (`teacher.py`), so
the student, `bins`, `decode` and the verification code run on it unchanged. `features` is the
final normalised hidden state (what a Medusa head reads).

The teacher is the network conditioned on the tokens it is given: the student's context window
of C bytes plus the completion (`decode.generate` passes the same window). Verification is
exact for that windowed teacher; it is not the teacher with its whole history.
"""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from configs.common import base_config, set_training
from core import cache, corpus, data, train
from core.method import Method
from core.nn import transformer
from methods.flow_mtp import bins

VOCAB = 256  # bytes


@dataclasses.dataclass(frozen=True)
class TeacherSettings:
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    seq_len: int  # training windows (and max_len)
    steps: int
    batch_size: int
    lr: float
    num_eval: int  # test windows for bits/byte


def net_config(s: TeacherSettings) -> transformer.TransformerConfig:
    return transformer.TransformerConfig(
        vocab_size=VOCAB,
        num_layers=s.num_layers,
        d_model=s.d_model,
        num_heads=s.num_heads,
        d_ff=s.d_ff,
        max_len=s.seq_len,
        position="rope",
        dtype="float32",
    )


@dataclasses.dataclass(frozen=True, eq=False)
class CodeTeacher:
    cfg: transformer.TransformerConfig
    params: dict
    start_token: int = ord("\n")

    @property
    def vocab_size(self) -> int:
        return VOCAB

    def logits(self, tokens_BT):
        """Next-byte logits [B, T, V] after each position (float32)."""
        return transformer.apply(self.cfg, self.params, tokens_BT)[0]

    def features(self, tokens_BT):
        """The final normalised hidden state [B, T, D] (what the output projection reads)."""
        return transformer.features(self.cfg, self.params, tokens_BT)


def ar_sample(teacher: CodeTeacher, transform: bins.SamplingTransform, context_BC, u_BN):
    """The teacher's own autoregressive sampling with a KV cache: prefill the (full) context,
    then one token per step, each the inverse CDF at u_n of the transformed distribution (the
    same `sampling_probs` and edges as training and verification). int32 [B, N]."""
    B, C = context_BC.shape
    N = u_BN.shape[1]
    cache_ = transformer.init_cache(teacher.cfg, B, C + N)
    logits_BTV, cache_ = transformer.apply(teacher.cfg, teacher.params, context_BC, cache=cache_)

    def step(carry, u_B):
        last_BV, cache_ = carry
        token_B = bins.pick(bins.cdf_edges(bins.sampling_probs(last_BV, transform)), u_B)
        logits_B1V, cache_ = transformer.apply(
            teacher.cfg, teacher.params, token_B[:, None], cache=cache_
        )
        return (logits_B1V[:, -1], cache_), token_B

    _, tokens_NB = jax.lax.scan(step, (logits_BTV[:, -1], cache_), u_BN.T.astype(jnp.float32))
    return tokens_NB.T


def lm_method(s: TeacherSettings, source: corpus.Corpus) -> Method:
    """Next-byte prediction on random windows of the train split; held-out test bits/byte."""
    cfg = net_config(s)
    train_bytes = source.split("train")
    test_NT = source.windows("test", length=s.seq_len + 1, count=s.num_eval, seed=0)

    def example(rng):
        start = int(rng.integers(0, train_bytes.size - s.seq_len - 1))
        window = train_bytes[start : start + s.seq_len + 1].astype(np.int32)
        return {"inputs": window[:-1], "targets": window[1:], "mask": np.ones(s.seq_len, bool)}

    def dataset(which, *, shard, seed):
        if which == "eval":
            arrays = {"inputs": test_NT[:, :-1], "targets": test_NT[:, 1:]}
            return data.one_pass(arrays, global_batch=s.batch_size, shard=shard)
        return data.synthetic(example, global_batch=s.batch_size, seed=seed, shard=shard)

    def eval_step(state, batch, *, rng):
        del rng
        logits_BTV, _ = transformer.apply(cfg, state.params, batch["inputs"])
        log_probs = jax.nn.log_softmax(logits_BTV)
        nll_BT = -jnp.take_along_axis(log_probs, batch["targets"][..., None], axis=-1)[..., 0]
        weight_BT = jnp.broadcast_to(batch["mask"][:, None], nll_BT.shape).astype(jnp.float32)
        bits = jnp.sum(nll_BT * weight_BT) / jnp.log(2.0)
        return {"bits_per_byte": (bits, jnp.sum(weight_BT))}

    def init(rng, batch_spec):
        del batch_spec
        return {"params": transformer.init_params(cfg, rng)}

    return Method(
        init=init,
        loss=functools.partial(transformer.next_token_loss, cfg),
        dataset=dataset,
        eval_step=eval_step,
    )


def train_config(s: TeacherSettings, seed: int = 0):
    c = base_config("auto")
    c.method = "flow_mtp_code_teacher"
    c.seed = seed
    c.dtype = "float32"
    set_training(c, steps=s.steps, batch_size=s.batch_size, lr=s.lr)
    c.optim.weight_decay = 0.01
    c.train.checkpoint_every, c.train.eval_every = 0, 0
    c.train.log_every = max(s.steps // 5, 1)
    c.teacher = dataclasses.asdict(s)  # part of the cache key
    return c


def _save_params(path: str, params) -> None:
    flat = {
        jax.tree_util.keystr(k): np.asarray(v)
        for k, v in jax.tree_util.tree_leaves_with_path(params)
    }
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **flat)
    os.replace(tmp, path)  # never a half-written file


def _load_params(path: str, cfg) -> dict:
    template = jax.eval_shape(functools.partial(transformer.init_params, cfg), jax.random.key(0))
    with np.load(path) as stored:
        leaves = [
            np.asarray(stored[jax.tree_util.keystr(k)])
            for k, _ in jax.tree_util.tree_leaves_with_path(template)
        ]
    return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(template), leaves)


def train_teacher(s: TeacherSettings, workdir: str, *, code: str, source=None):
    """(CodeTeacher, info) trained through `core.train` once per (settings, code): the params
    are stored beside the cache entry and read back on later calls. info: the test bits/byte,
    the corpus summary, parameter count and training wall time."""
    source = source or corpus.python_stdlib()
    config = train_config(s)
    cfg = net_config(s)
    key = cache.key(config, code)
    params_path = os.path.join(workdir, "teachers", f"{key}.npz")

    def compute():
        import time

        start = time.perf_counter()
        run_dir = os.path.join(workdir, "runs", f"teacher-{key}")
        result = train.run(config, lm_method(s, source), run_dir, devices=jax.devices()[:1])
        os.makedirs(os.path.dirname(params_path), exist_ok=True)
        _save_params(params_path, jax.device_get(result.state.params))
        final = result.history[-1]
        return {
            "test_bits_per_byte": final["eval/bits_per_byte"],
            "final_train_loss_nats": next(
                r["loss"] for r in reversed(result.history) if "loss" in r
            ),
            "num_params": transformer.num_params(result.state.params),
            "train_seconds": time.perf_counter() - start,
        }

    info = cache.cached(compute, config=config, code=code, root=os.path.join(workdir, "cache"))
    if not os.path.exists(params_path):  # the cache entry outlived its params: train again
        os.remove(os.path.join(workdir, "cache", f"{key}.json"))
        return train_teacher(s, workdir, code=code, source=source)
    teacher = CodeTeacher(cfg, jax.tree_util.tree_map(jnp.asarray, _load_params(params_path, cfg)))
    return teacher, {**info, "corpus": source.summary(), "corpus_root": source.root}
