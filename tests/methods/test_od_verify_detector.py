"""od_verify's detector side: the scenes, the decode interface the verifier reads, the loss,
mAP50, and training through the core."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import methods.od_verify as od
from configs.od_verify import get_config
from core.errors import ConfigError
from core.train import RunResult
from core.workdir import read_metrics
from methods.od_verify import data, detector


def perfect_raw(scenes: data.Scenes, grid: int, confidence: float = 8.0) -> np.ndarray:
    """The raw head [B, G, G, 7] whose decode is exactly the scenes' boxes at the responsible
    cells, with objectness and class logits +-`confidence` (the inverse of `decode`)."""
    B = len(scenes.boxes_BK4)
    raw = np.zeros((B, grid, grid, 7), np.float32)
    raw[..., 4] = -confidence
    for b, k in zip(*np.nonzero(scenes.valid_BK), strict=True):
        x1, y1, x2, y2 = scenes.boxes_BK4[b, k].astype(np.float64)
        cx, cy = (x1 + x2) / 2 * grid, (y1 + y2) / 2 * grid
        col, row = int(cx), int(cy)
        # A centre on a cell edge needs sigmoid(tx) = 0: kept 1e-4 of a cell inside instead.
        logit = lambda f: np.log(np.clip(f, 1e-4, 1 - 1e-4) / (1 - np.clip(f, 1e-4, 1 - 1e-4)))
        raw[b, row, col, :2] = logit(cx - col), logit(cy - row)
        raw[b, row, col, 2:4] = np.log((x2 - x1) * grid), np.log((y2 - y1) * grid)
        raw[b, row, col, 4] = confidence
        raw[b, row, col, 5:7] = -confidence
        raw[b, row, col, 5 + scenes.classes_BK[b, k]] = confidence
    return raw


# Scenes


def test_scenes_are_deterministic_and_the_splits_disjoint():
    seeds = {(split, s): data.split_seed(split, s) for split in data.SPLITS for s in range(50)}
    assert len(set(seeds.values())) == len(seeds)  # one-to-one over (split, data seed)
    a = data.scenes(16, 64, data.split_seed("validation", 0))
    b = data.scenes(16, 64, data.split_seed("validation", 0))
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    images = {
        split: data.scenes(32, 64, data.split_seed(split, 0)).images_BSS3 for split in data.SPLITS
    }
    hashes = [{img.tobytes() for img in images[split]} for split in data.SPLITS]
    assert all(len(h) == 32 for h in hashes)  # no repeated scene within a split either
    assert not (hashes[0] & hashes[1] or hashes[0] & hashes[2] or hashes[1] & hashes[2])
    # The training stream's batch b is examples b*B.. of the train seed: scenes() reproduces it.
    stream = od.make(get_config("size=smoke")).dataset("train", shard=(0, 1), seed=0)
    next(stream)
    second = next(stream)
    expected = data.scenes(16, 64, data.split_seed("train", 0)).images_BSS3[8:]
    np.testing.assert_array_equal(second["images"], expected)


@pytest.mark.parametrize("size", [64, 32])
def test_every_box_is_tight_around_its_object(size):
    """Noise-free: every pixel is the background or an object's colour; each object's pixels
    lie inside its box, and an object no other overlaps fills its box to every edge, with a
    disc's pixels fewer than its square's (pi / 4 of them)."""
    seed, n = data.split_seed("test", 3), 64
    s = data.scenes(n, size, seed, noise=0.0)
    assert s.images_BSS3.dtype == np.float32 and s.images_BSS3.shape == (n, size, size, 3)
    assert s.boxes_BK4.min() >= 0.0 and s.boxes_BK4.max() <= 1.0
    np.testing.assert_array_equal(s.boxes_BK4[~s.valid_BK], 0.0)
    assert s.valid_BK[:, 0].all() and set(s.valid_BK.sum(1)) == {1, 2, 3}
    lo, hi = data.side_range(size)
    alone = 0
    for i in range(n):
        background, objects = data.layout(np.random.default_rng([seed, i]), size)
        img = s.images_BSS3[i]
        owned = np.all(img == background.astype(np.float32), axis=-1)
        for k, (cls, box, _, colour) in enumerate(objects):
            assert s.valid_BK[i, k] and s.classes_BK[i, k] == cls
            np.testing.assert_array_equal(s.boxes_BK4[i, k] * size, box)  # exact: k / size
            x1, y1, x2, y2 = box
            assert lo <= x2 - x1 == y2 - y1 <= hi
            mask = np.all(img == colour.astype(np.float32), axis=-1)
            owned |= mask
            rows, cols = np.nonzero(mask)
            assert rows.min() >= y1 and rows.max() < y2 and cols.min() >= x1 and cols.max() < x2
            others = [o[1] for j, o in enumerate(objects) if j != k]
            if all(data._iou(box, o) == 0 for o in others):
                alone += 1
                assert (rows.min(), rows.max() + 1, cols.min(), cols.max() + 1) == (y1, y2, x1, x2)
                expected = np.pi / 4 if cls == 1 else 1.0
                # A disc on the pixel grid: pi / 4 of its square up to edge pixels (~2 / side).
                assert abs(mask.sum() / (x2 - x1) ** 2 - expected) < 2.5 / (x2 - x1)
            for other in others:
                assert data._iou(box, other) <= data.MAX_IOU
        assert owned.all()
    assert alone > n  # most objects stand alone: the tightness check ran on many


@pytest.mark.parametrize("size", [64, 32])
def test_one_object_per_responsible_cell(size):
    # The detector's targets see every object. Without the placement's cell rule 28 of ~4000
    # objects share a cell at 32 px (IoU <= 0.1 alone already separates them at 64).
    s = data.scenes(2000, size, 7, noise=0.0)
    pos_BN, _, _ = detector.targets(s.boxes_BK4, s.classes_BK, s.valid_BK, size // 8)
    assert int(pos_BN.sum()) == int(s.valid_BK.sum())


def test_bad_scene_requests_are_one_line_errors():
    for call, field in [
        (lambda: data.scenes(4, 60, 0), "model.image=60"),
        (lambda: data.scenes(4, 8, 0), "model.image=8"),
        (lambda: data.scenes(0, 64, 0), "n=0"),
        (lambda: data.scenes(4, 64, -1), "seed=-1"),
        (lambda: data.scenes(4, 64, 0, noise=-0.1), "data.noise=-0.1"),
        (lambda: data.split_seed("train2", 0), "split='train2'"),
        (lambda: get_config("size=huge"), "size='huge'"),
        (lambda: get_config("image=48"), "image='48'"),
    ]:
        with pytest.raises(ConfigError, match=field) as e:
            call()
        assert "\n" not in str(e.value)
    config = get_config("size=smoke")
    config.verify.eta = 0.0
    with pytest.raises(ConfigError, match=r"verify\.eta=0\.0"):
        od.make(config)


# Decode: the verifier's interface


def test_decode_is_row_major_with_confidences_objectness_times_class_probability():
    G = 8
    raw = np.asarray(jax.random.normal(jax.random.key(0), (2, G, G, 7)) * 3)
    out = np.asarray(detector.decode(jnp.asarray(raw)))
    assert out.shape == (2, G * G, 6)
    assert (out[..., 2] > out[..., 0]).all() and (out[..., 3] > out[..., 1]).all()
    sig = 1 / (1 + np.exp(-raw[..., 4].reshape(2, G * G)))
    # float32 sigmoid and softmax against float64: a few ulps of values <= 1.
    np.testing.assert_allclose(out[..., 4] + out[..., 5], sig, atol=1e-6)
    np.testing.assert_array_equal(
        (out[..., 4] > out[..., 5]).reshape(2, G, G), raw[..., 5] > raw[..., 6]
    )
    # One confident cell at (row 2, col 5): its candidate is n = 2 * G + 5, centred in the cell.
    planted = np.zeros((1, G, G, 7), np.float32)
    planted[..., 4] = -10.0
    planted[0, 2, 5, 4] = 10.0
    out = np.asarray(detector.decode(jnp.asarray(planted)))[0]
    n = int(np.argmax(out[:, 4:].max(-1)))
    assert n == 2 * G + 5
    x1, y1, x2, y2 = out[n, :4]
    # Centre (col + 1/2) / G, side exp(0) / G = one cell: float32 rounding only.
    np.testing.assert_allclose([(x1 + x2) / 2, (y1 + y2) / 2], [5.5 / G, 2.5 / G], atol=1e-6)
    np.testing.assert_allclose([x2 - x1, y2 - y1], [1 / G, 1 / G], atol=1e-6)


@pytest.mark.parametrize("size", [64, 32])
def test_forward_batched_and_vmapped_agree(size):
    cfg = detector.DetectorConfig((8, 8, 8, 8), size)
    params = detector.init(jax.random.key(1), cfg)
    images = jnp.asarray(data.scenes(4, size, 0).images_BSS3)
    batched = jax.jit(lambda x: detector.forward(params, x, cfg))(images)
    single = jax.jit(jax.vmap(lambda x: detector.forward(params, x[None], cfg)[0]))(images)
    assert batched.shape == (4, (size // 8) ** 2, 6) and batched.dtype == jnp.float32
    # The same convolutions, batched differently: float32 summation order only.
    np.testing.assert_allclose(batched, single, rtol=1e-5, atol=1e-6)


# The loss


def test_the_loss_is_lowest_at_the_truth():
    s = data.scenes(16, 64, 0)
    truth = perfect_raw(s, 8)
    batch = {k: jnp.asarray(v) for k, v in s.batch().items()}
    loss = lambda raw: detector.loss_from_raw(jnp.asarray(raw), batch)
    best, metrics = loss(truth)
    # The inverse decode is exact up to float32 rounding of log / logit.
    assert float(metrics["iou"]) > 0.9999 and float(metrics["class_accuracy"]) == 1.0
    assert float(best) < 0.05  # what logits of +-8 leave: 2 e^-8 per cell, ~0.03 per object
    for i, delta in [(0, 1.0), (1, -1.0), (2, 0.5), (3, -0.5)]:  # each box coordinate moved
        moved = truth.copy()
        moved[..., i] += delta
        assert float(loss(moved)[0]) > float(best) + 0.1
    flipped = truth.copy()
    flipped[..., 5:7] = flipped[..., 6:4:-1]  # every class swapped
    assert float(loss(flipped)[0]) > float(best) + 1.0
    quiet = truth.copy()
    quiet[..., 4] = -8.0  # no cell claims an object
    assert float(loss(quiet)[0]) > float(best) + 1.0


# mAP50


def test_map50_is_one_for_perfect_outputs_and_drops_for_shifted_boxes():
    s = data.scenes(64, 64, data.split_seed("validation", 0))
    out = np.asarray(detector.decode(jnp.asarray(perfect_raw(s, 8))))
    metric = lambda o: od.detection_metrics(o, s, eta=0.45)["map50"]
    assert metric(out) == pytest.approx(1.0, abs=1e-12)  # a sum of recall steps of 1 / n
    side = out[..., 2:3] - out[..., 0:1]
    small, half = out.copy(), out.copy()
    small[..., 0:4:2] += 0.1 * side  # IoU 0.82: still a hit
    half[..., 0:4:2] += 0.5 * side  # IoU 1/3: every box a miss
    assert metric(small) == pytest.approx(1.0, abs=1e-12)
    assert metric(half) == 0.0
    # Half of the images missed, their detections ranked below every hit: AP is then the
    # recall the other half reaches (precision 1 up to it), per class.
    some = out.copy()
    some[:32, :, 0:4:2] += 0.5 * side[:32]
    some[:32, :, 4:6] *= 0.5
    gt = [s.valid_BK & (s.classes_BK == c) for c in (0, 1)]
    expected = np.mean([g[32:].sum() / g.sum() for g in gt])
    assert metric(some) == pytest.approx(expected, abs=1e-12)
    first = some.copy()
    first[32:, :, 4:6] *= 0.25  # the hits now ranked below every miss: precision drops
    assert metric(first) < expected - 0.1


def test_average_precision_is_the_area_under_the_precision_envelope():
    # Two objects; ranked detections TP, FP, TP: recall .5, .5, 1; precision 1, .5, 2/3.
    ap = od.average_precision(np.array([0.5, 0.5, 1.0]), np.array([1.0, 0.5, 2 / 3]))
    assert ap == pytest.approx(0.5 * 1 + 0.5 * 2 / 3, abs=1e-12)


# Training through the core


def test_training_lowers_the_loss_and_raises_map50(tmp_path, monkeypatch):
    config = get_config("size=quick")
    config.train.steps, config.train.log_every, config.train.checkpoint_every = 150, 30, 0
    config.optim.warmup_steps = 10
    config.data.validation = 64
    params = od.train_detector(config, str(tmp_path))
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(params))
    losses = [r["loss"] for r in read_metrics(str(tmp_path)) if "loss" in r]
    # Measured: ~6.9 over the first 10 steps, ~1.6 over the last 10 (mAP50 ~0.67 vs ~0.01).
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10]), losses
    untrained = od.make(config).init(jax.random.key(0), None)["params"]
    assert od.map50(params, config) > od.map50(untrained, config) + 0.2
    # A preempted run is refused in one line rather than returning half-trained params.
    monkeypatch.setattr(od.train, "run", lambda *a, **k: RunResult(None, [], preempted=True))
    with pytest.raises(ConfigError, match="preempted") as e:
        od.train_detector(config, str(tmp_path))
    assert "\n" not in str(e.value)
