"""Sample quality and representation quality of a DDT's (EMA) parameters, on the host.

    evaluator = Evaluator(cfg, config.eval, classifier, splits, "encoder/blocks/1")
    metrics = evaluator(net_params)   # {"fd", "cond_accuracy", "probe_accuracy"}

- Samples: `num_samples` images, labels 0..9 in turn, from one fixed noise draw (key 0: every
  arm, seed and checkpoint sees the same noise and labels), Euler over `sample_steps` steps with
  CFG `cfg_scale` on t in [cfg_t_min, cfg_t_max] (`core.diffusion`).
- FD-digits of the samples against the real split `split` (`core.digits`), and the conditional
  accuracy (the classifier's argmax is the label the sample was generated for).
- Linear probe: the tokens at the alignment block for x_t at t = 0.5 (one fixed noise draw per
  image) with the null label (a class-conditional encoder given the label would hand it to the
  probe through its modulation), mean-pooled; logistic regression on standardised features fit
  on the train split and scored on `split`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import diffusion, digits
from core.errors import ConfigError
from core.nn import dit

SPLITS = ("validation", "test")
PROBE_T = 0.5


def guidance(cfg, eval_config) -> diffusion.Guidance:
    e = eval_config
    return diffusion.Guidance(e.cfg_scale, dit.null_label(cfg), e.cfg_t_min, e.cfg_t_max)


def split_of(splits: digits.Splits, name: str) -> digits.Split:
    if name not in SPLITS:
        raise ConfigError(f"eval.split={name!r}; expected one of: {', '.join(SPLITS)}")
    return getattr(splits, name)


def sample_labels(num_samples: int) -> np.ndarray:
    return (np.arange(num_samples) % digits.NUM_CLASSES).astype(np.int32)


@functools.partial(jax.jit, static_argnames=("cfg", "steps", "guidance", "share_every"))
def sample(cfg, params, noise_BHWC, y_B, *, steps, guidance, share_every=1):
    """Euler samples from noise (t = 0) to data (t = 1), clipped to the pixel range."""
    enc, dec = dit.sampler_fns(cfg, params)
    x = diffusion.euler(
        enc, dec, noise_BHWC, y_B, steps=steps, guidance=guidance, share_every=share_every
    )
    return jnp.clip(x, -1.0, 1.0)


@functools.partial(jax.jit, static_argnames=("cfg", "name"))
def pooled_tokens(cfg, params, x_BHWC, noise_BHWC, *, name):
    """Mean-pooled tokens at block `name` for x_t at t = PROBE_T, null label."""
    B = x_BHWC.shape[0]
    t_B = jnp.full((B,), PROBE_T, jnp.float32)
    y_B = jnp.full((B,), dit.null_label(cfg), jnp.int32)
    x_t = diffusion.flow_path(x_BHWC, noise_BHWC, t_B)
    _, captured = dit.encode(cfg, params, x_t, t_B, y_B, capture=(name,))
    return captured[name].astype(jnp.float32).mean(axis=1)


def linear_probe(train_ND, train_labels, test_ND, test_labels) -> float:
    """Held-out accuracy of a logistic regression on standardised features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=2000))
    probe.fit(train_ND, train_labels)
    return float(probe.score(test_ND, test_labels))


class Evaluator:
    def __init__(self, cfg, eval_config, clf: digits.Classifier, splits: digits.Splits, name):
        self.cfg, self.clf, self.name = cfg, clf, name
        e = eval_config
        self.steps = e.sample_steps
        self.guidance = diffusion.Guidance(
            e.cfg_scale, dit.null_label(cfg), e.cfg_t_min, e.cfg_t_max
        )
        self.train, self.real = splits.train, split_of(splits, e.split)
        self.real_features = digits.features(clf, self.real.images)
        self.labels = sample_labels(e.num_samples)
        shape = (e.num_samples, *digits.IMAGE_SHAPE)
        self.noise = np.asarray(jax.random.normal(jax.random.key(0), shape), np.float32)
        k_train, k_real = jax.random.split(jax.random.key(1))
        self.probe_noise = {
            "train": jax.random.normal(k_train, self.train.images.shape),
            "real": jax.random.normal(k_real, self.real.images.shape),
        }

    def samples(self, params) -> np.ndarray:
        x = sample(
            self.cfg, params, self.noise, self.labels, steps=self.steps, guidance=self.guidance
        )
        return np.asarray(x)

    def __call__(self, params) -> dict:
        images = self.samples(params)
        fd = digits.frechet_distance(digits.features(self.clf, images), self.real_features)
        pooled = {
            which: np.asarray(
                pooled_tokens(
                    self.cfg, params, split.images, self.probe_noise[which], name=self.name
                )
            )
            for which, split in (("train", self.train), ("real", self.real))
        }
        probe = linear_probe(pooled["train"], self.train.labels, pooled["real"], self.real.labels)
        return {
            "fd": fd,
            "cond_accuracy": digits.conditional_accuracy(self.clf, images, self.labels),
            "probe_accuracy": probe,
        }
