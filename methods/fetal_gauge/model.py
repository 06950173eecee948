"""The small JAX VLM that the harness scores by option likelihood, on the shared `core.nn.vlm`
(ViT -> merger -> decoder LM).

A question with K options is K text rows after the image: [question] SEP [option] EOS, padded at
the end. Its score for option k is the summed log-probability of the option's tokens and EOS
given the image and the question: the likelihood of that answer text, what the training loss
(next-token NLL of the answer row) maximises. One forward scores every option of B questions:
the image is encoded once per question and its embeddings tiled over its K rows
(`vlm.apply(image_BND=)`); a padded option (a question with fewer than K options) scores -inf.

Why sum, not the mean over tokens: the sum is the answer's probability, which training fits;
the untrained model's preference among option texts (e.g. for short ones) does not depend on
the image, so with answers balanced over classes and shuffled it is at chance either way (the
experiment's untrained arm measures it).
"""

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from core.nn import vlm
from core.precision import compute_dtype
from methods.fetal_gauge import phantoms, text
from methods.fetal_gauge.vocab import TASKS

TEXT_LEN = 24  # [question] SEP [option] EOS with padding: the longest phantom row is 18
K_MAX = 4  # options per question (the benchmark's k = min(4, |vocab|))


def model_config(config) -> vlm.VLMConfig:
    return vlm.from_fields(
        config.model,
        image_height=phantoms.SIZE,
        image_width=phantoms.SIZE,
        channels=3,
        vocab_size=text.VOCAB_SIZE,
        text_len=TEXT_LEN,
        dtype=compute_dtype(config.dtype),
    )


def encode_row(question: str, option: str, qid: str = "") -> tuple[np.ndarray, np.ndarray]:
    """(tokens [TEXT_LEN], score mask [TEXT_LEN]): the mask is 1 at positions whose NEXT token
    is an option token or EOS (the logits that predict the answer)."""
    q, o = text.encode(question), text.encode(option)
    ids = [*q, text.SEP, *o, text.EOS]
    if len(ids) > TEXT_LEN:
        raise ConfigError(
            f"fetal_gauge: question {qid!r} with option {option!r} is {len(ids)} tokens; the "
            f"small VLM reads at most {TEXT_LEN}"
        )
    tokens = np.full(TEXT_LEN, text.PAD, np.int32)
    tokens[: len(ids)] = ids
    mask = np.zeros(TEXT_LEN, np.float32)
    mask[len(q) : len(ids) - 1] = 1.0  # predicting option tokens and EOS
    return tokens, mask


def encode_questions(questions, options, qids=None) -> dict:
    """Arrays of n questions: tokens [n, K_MAX, TEXT_LEN], mask (same), valid [n, K_MAX]."""
    n = len(questions)
    tokens = np.zeros((n, K_MAX, TEXT_LEN), np.int32)
    mask = np.zeros((n, K_MAX, TEXT_LEN), np.float32)
    valid = np.zeros((n, K_MAX), bool)
    for i, (q, opts) in enumerate(zip(questions, options, strict=True)):
        qid = qids[i] if qids else str(i)
        if not 1 <= len(opts) <= K_MAX:
            raise ConfigError(f"fetal_gauge: question {qid!r} has {len(opts)} options; 1..{K_MAX}")
        for k, option in enumerate(opts):
            tokens[i, k], mask[i, k] = encode_row(q, option, qid)
            valid[i, k] = True
    return {"tokens": tokens, "score_mask": mask, "valid": valid}


def encode_records(recs) -> dict:
    """The arrays `core.train` reads: image uint8 [n, S, S, 3], the options' rows, answer [n],
    task id [n] (index in vocab.TASKS)."""
    images = np.stack([np.asarray(r.image, np.uint8) for r in recs])
    if images.shape[1:] != (phantoms.SIZE, phantoms.SIZE, 3):
        raise ConfigError(
            f"fetal_gauge: images of shape {images.shape[1:]}; the small VLM reads "
            f"({phantoms.SIZE}, {phantoms.SIZE}, 3) uint8"
        )
    arrays = encode_questions(
        [r.question for r in recs], [r.options for r in recs], [r.qid for r in recs]
    )
    return {
        "image": images,
        **arrays,
        "answer": np.array([r.answer_idx for r in recs], np.int32),
        "task": np.array([TASKS.index(r.task) for r in recs], np.int32),
    }


def _images(image_BHWC):
    return image_BHWC.astype(jnp.float32) / 127.5 - 1.0  # uint8 -> [-1, 1]


def _row_log_probs(cfg, params, image_BND, tokens_RT, mask_RT):
    """Summed log-probability of the masked next tokens of R text rows after their images."""
    out = vlm.apply(cfg, params, None, tokens_RT, image_BND=image_BND)
    logits_RTV = out.logits_BTV[:, cfg.num_image_tokens : -1]
    log_probs = jax.nn.log_softmax(logits_RTV.astype(jnp.float32))
    next_RT = jnp.take_along_axis(log_probs, tokens_RT[:, 1:, None], -1)[..., 0]
    return jnp.sum(next_RT * mask_RT[:, :-1], axis=-1)


def option_scores(cfg: vlm.VLMConfig, params, batch) -> jax.Array:
    """[B, K] scores (module docstring); -inf for padded options."""
    image_BND, _ = vlm.image_embeddings(cfg, params, _images(batch["image"]))
    B, K, T = batch["tokens"].shape
    tiled = jnp.repeat(image_BND, K, axis=0)  # row b*K + k: image b
    rows = _row_log_probs(
        cfg, params, tiled, batch["tokens"].reshape(B * K, T), batch["score_mask"].reshape(B * K, T)
    )
    return jnp.where(batch["valid"], rows.reshape(B, K), -jnp.inf)


def loss_fn(cfg, params, batch, *, rng=None, extra=None):
    """Next-token NLL of the answer row's option tokens and EOS, per answer token."""
    del rng, extra
    image_BND, _ = vlm.image_embeddings(cfg, params, _images(batch["image"]))
    pick = batch["answer"][:, None, None]
    tokens_BT = jnp.take_along_axis(batch["tokens"], pick, 1)[:, 0]
    mask_BT = jnp.take_along_axis(batch["score_mask"], pick, 1)[:, 0]
    log_prob_B = _row_log_probs(cfg, params, image_BND, tokens_BT, mask_BT)
    return -jnp.sum(log_prob_B) / jnp.maximum(jnp.sum(mask_BT), 1.0), {}


def accuracy_sums(cfg, params, batch) -> dict:
    """{"accuracy": (sum, weight), "accuracy/<task>": ...} of argmax option scores."""
    right_B = jnp.argmax(option_scores(cfg, params, batch), -1) == batch["answer"]
    weight_B = batch.get("mask", jnp.ones_like(right_B)).astype(jnp.float32)
    out = {"accuracy": (jnp.sum(right_B * weight_B), jnp.sum(weight_B))}
    for i, task in enumerate(TASKS):
        in_task = weight_B * (batch["task"] == i)
        out[f"accuracy/{task}"] = (jnp.sum(right_B * in_task), jnp.sum(in_task))
    return out


_scores = jax.jit(option_scores, static_argnums=0)


@dataclasses.dataclass
class VLMModel:
    """The harness's `score_options` model: fixed-shape batches (the last one padded), so one
    compiled function serves every call."""

    cfg: vlm.VLMConfig
    params: dict
    batch_size: int = 64
    name: str = "vlm"

    def score_options(self, images, questions, options) -> list[np.ndarray]:
        n = len(questions)
        arrays = encode_questions(questions, options)
        arrays["image"] = np.stack([np.asarray(im, np.uint8) for im in images])
        out = []
        for start in range(0, n, self.batch_size):
            part = {k: v[start : start + self.batch_size] for k, v in arrays.items()}
            real = len(part["tokens"])
            pad = self.batch_size - real
            part = {
                k: np.concatenate([v, np.zeros((pad, *v.shape[1:]), v.dtype)])
                for k, v in part.items()
            }
            part["valid"][real:, 0] = True  # padded questions: one dummy option, never read
            scores = np.asarray(_scores(self.cfg, self.params, part))[:real]
            out += [scores[i, : len(options[start + i])] for i in range(real)]
        return out


def load(workdir: str, *, batch_size: int = 64) -> VLMModel:
    """The trained VLM of a `core.train` workdir (its config.json and newest checkpoint)."""
    from ml_collections import ConfigDict

    from core import checkpoint

    path = os.path.join(workdir, "config.json")
    if not os.path.exists(path):
        raise ConfigError(f"fetal_gauge: no {path}; give the workdir of a fetal_gauge training run")
    with open(path) as f:
        config = ConfigDict(json.load(f))
    if config.get("method") != "fetal_gauge":
        raise ConfigError(f"fetal_gauge: {path} is a {config.get('method')!r} run")
    cfg = model_config(config)
    init = functools.partial(vlm.init_params, cfg)
    params = checkpoint.run_params(workdir, init, what="fetal_gauge: workdir")
    return VLMModel(cfg, params, batch_size=batch_size)
