"""ODPV (paper 9): "Certifying the Full YOLO Pipeline: A Probabilistic Verification Approach".

The method verifies a trained object detector end to end (detector, confidence threshold, NMS)
against bounded input perturbations. This package trains the detector it verifies through the
core, and verifies it:

- `data.py`: synthetic detection scenes (squares and discs, 1-3 per image), pure NumPy,
  deterministic per (split, seed).
- `detector.py`: a tiny anchor-free YOLO-like detector as pure functions of a params dict;
  `forward(params, images_BSS3, cfg) -> outputs_BN6` (x1, y1, x2, y2, s0, s1), the verifier's
  interface, and the YOLO-style loss.
- `boxes.py`: IoU, class-aware greedy NMS and the interval bounds of the verifier.
- the verifier's modules (`verify.py`, `mip.py`, ...).

`make(config)` returns a `core.Method`: the detector's loss under the core's gradient step
(`config.optim`), the endless training stream of fresh scenes (`dataset("train")`), and a
named evaluator "detect": validation mAP50 (and per-class AP50) after NMS at
iota = `MAP_IOTA` and the verifier's eta, at `train.eval_every` (0: at the end).
`train_detector(config, workdir)` trains one and returns its params; `map50(params, config,
split)` scores params on the validation or test scenes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import data as core_data
from core import train
from core.errors import ConfigError
from core.method import Evaluator, Method
from core.precision import compute_dtype
from methods.od_verify import boxes, data, detector

MAP_IOTA = 0.001  # the usual confidence threshold for mAP: nearly every candidate is ranked
MAP_IOU = 0.5
EVAL_SPLITS = ("validation", "test")
EVAL_BATCH = 256  # images per forward call in evaluation


def detector_config(config) -> detector.DetectorConfig:
    channels = config.model.channels
    if not isinstance(channels, tuple | list):
        raise ConfigError(f"model.channels={channels!r} must be a tuple of ints")
    return detector.DetectorConfig(channels=tuple(channels), image=config.model.image)


def _check(config) -> None:
    compute_dtype(
        config.dtype,
        supported=("float32",),
        why="the verifier's bounds are on the float32 detector it certifies",
    )
    data.check_size(config.model.image)
    data.split_seed("train", config.data.seed)
    if not config.data.noise >= 0:
        raise ConfigError(f"data.noise={config.data.noise!r} must be a non-negative pixel sigma")
    for split in EVAL_SPLITS:
        n = config.data[split]
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"data.{split}={n!r} must be a positive number of images")
    if not 0.0 < config.verify.eta <= 1.0:
        raise ConfigError(f"verify.eta={config.verify.eta!r} must be an NMS IoU in (0, 1]")


@functools.lru_cache(maxsize=4)
def _scenes(n: int, size: int, seed: int, noise: float) -> data.Scenes:
    return data.scenes(n, size, seed, noise)


def eval_scenes(config, split: str) -> data.Scenes:
    """The fixed validation or test scenes of `config` (cached)."""
    if split not in EVAL_SPLITS:
        raise ConfigError(f"split={split!r} is not an evaluation split: {', '.join(EVAL_SPLITS)}")
    seed = data.split_seed(split, config.data.seed)
    return _scenes(config.data[split], config.model.image, seed, float(config.data.noise))


@functools.partial(jax.jit, static_argnums=2)
def _forward(params, images_BSS3, cfg):
    return detector.forward(params, images_BSS3, cfg)


@jax.jit
def _nms(outputs_BN6, iota, eta):
    return jax.vmap(boxes.nms_keep, in_axes=(0, None, None))(outputs_BN6, iota, eta)


def outputs(params, cfg: detector.DetectorConfig, images_BSS3) -> np.ndarray:
    """Candidates [B, N, 6] of every image, `EVAL_BATCH` images per call (float32)."""
    out = [
        np.asarray(_forward(params, images_BSS3[i : i + EVAL_BATCH], cfg))
        for i in range(0, len(images_BSS3), EVAL_BATCH)
    ]
    return np.concatenate(out)


def average_precision(recall_M: np.ndarray, precision_M: np.ndarray) -> float:
    """All-point interpolated AP: the area under the precision envelope (precision at recall r
    is the best precision at any recall >= r), over the recall steps."""
    r = np.concatenate([[0.0], recall_M, [1.0]])
    p = np.concatenate([[0.0], precision_M, [0.0]])
    p = np.maximum.accumulate(p[::-1])[::-1]
    steps = np.nonzero(r[1:] != r[:-1])[0]
    return float(np.sum((r[steps + 1] - r[steps]) * p[steps + 1]))


def detection_metrics(outputs_BN6, truth: data.Scenes, *, iota=MAP_IOTA, eta: float) -> dict:
    """mAP50 of candidates after class-aware NMS: per class, detections of all images ranked by
    score; a detection is a true positive when its IoU with a not yet matched ground-truth
    object of its class in its image is the best it has with any of them and >= 0.5 (PASCAL
    VOC matching); AP all-point interpolated; mAP the mean over classes with ground truth."""
    outputs_BN6 = np.asarray(outputs_BN6, np.float32)
    keep_BN = np.asarray(_nms(jnp.asarray(outputs_BN6), iota, eta))
    iou_BNK = np.asarray(boxes.iou(outputs_BN6[:, :, None, :4], truth.boxes_BK4[:, None]))
    scores_BN = outputs_BN6[..., 4:6].max(-1)
    cls_BN = outputs_BN6[..., 4:6].argmax(-1)
    out = {}
    for c in range(detector.CLASSES):
        gt_BK = truth.valid_BK & (truth.classes_BK == c)
        if not gt_BK.any():
            continue
        image_M, cand_M = np.nonzero(keep_BN & (cls_BN == c))
        order = np.argsort(-scores_BN[image_M, cand_M], kind="stable")
        image_M, cand_M = image_M[order], cand_M[order]
        matched_BK = np.zeros_like(gt_BK)
        tp_M = np.zeros(len(image_M), bool)
        for m, (b, n) in enumerate(zip(image_M, cand_M, strict=True)):
            ious = np.where(gt_BK[b], iou_BNK[b, n], -1.0)
            k = int(np.argmax(ious))
            if ious[k] >= MAP_IOU and not matched_BK[b, k]:
                tp_M[m] = matched_BK[b, k] = True
        tp = np.cumsum(tp_M)
        recall = tp / gt_BK.sum()
        precision = tp / np.arange(1, len(tp_M) + 1)
        out[f"ap50_class{c}"] = average_precision(recall, precision)
    out["map50"] = float(np.mean(list(out.values())))
    return out


def map50(params, config, split: str = "validation") -> float:
    """Validation (or test) mAP50 of detector `params` under `config`'s data and NMS eta."""
    return evaluate_detector(params, config, split)["map50"]


def evaluate_detector(params, config, split: str = "validation") -> dict:
    truth = eval_scenes(config, split)
    out = outputs(params, detector_config(config), truth.images_BSS3)
    return detection_metrics(out, truth, eta=config.verify.eta)


def make(config) -> Method:
    cfg = detector_config(config)
    _check(config)
    size, noise = config.model.image, float(config.data.noise)
    train_seed = data.split_seed("train", config.data.seed)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": detector.init(rng, cfg)}

    def loss(params, batch, *, rng, extra):
        del rng, extra
        return detector.loss(params, batch, cfg)

    def examples(rngs):  # one vectorised render per batch; example i from its own generator
        return data.from_generators(rngs, size, noise).batch()

    def dataset(split, *, shard, seed):
        del seed  # the scenes are the data seed's: the model seed changes the initialisation
        if split != "train":
            raise ConfigError(f"od_verify: dataset({split!r}): only 'train' is a stream")
        return core_data.synthetic(
            examples_fn=examples, global_batch=config.train.batch_size, seed=train_seed,
            shard=shard,
        )  # fmt: skip

    def detect(state, *, seed):
        del seed  # the evaluation scenes are fixed by data.seed
        return evaluate_detector(state.params, config, "validation")

    return Method(
        init=init, loss=loss, dataset=dataset, evaluators=(Evaluator("detect", evaluate=detect),)
    )


def train_detector(config, workdir) -> dict:
    """Train the detector of `config` in `workdir` (resuming it there) on one device; its final
    params as host arrays. A preempted run is refused: rerun to finish it."""
    result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    if result.preempted:
        raise ConfigError(f"od_verify: training in {workdir} was preempted; rerun to finish it")
    return jax.tree.map(np.asarray, result.state.params)
