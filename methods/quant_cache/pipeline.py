"""The transform's evaluation: every setting of `quant_cache.settings` sampled from the same
noise and labels and scored with FD-digits, plus the calibration-pool similarity and the
BOPs accounting. `evaluator(config, cfg, sched)` is the Method's host `evaluate`.

Per evaluation seed (the run's seed): the samples' noise, labels (balanced) and sampler noise,
the pools, the calibration draws and the VC batch all come from it, each from its own stream.
Metrics (flat host floats, one row):
    <setting>/fd, /accuracy     FD-digits against `eval_split`, conditional accuracy
    <setting>/var/<i>           the samples' variance entering step i (i = steps: the output)
    <setting>/var_dev           mean over steps of |var - var of fp| (needs fp in the list)
    <setting>/speedup           BOPs of fp over the setting's BOPs (`cost.py`)
    <setting>/seconds           wall time of its sampling (CPU fake-quant: not a speed claim)
    pool/cos_cached/<i>, pool/cos_uncached/<i>, pool/cos_gap, pool/cos_gap_growth
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from core import digits
from methods.quant_cache import calibrate, cost, sampling
from methods.quant_cache import settings as settings_lib

QC, Q, C = "w4a4+c2", "w4a4", "c2"  # the claimed setting and its halves (select.py)
QC_VARIANTS = (QC, f"{QC}+kmeans", f"{QC}+tap", f"{QC}+vc")
STREAMS = {"samples": 0, "pool": 1, "select": 2, "vc": 3}


def _key(seed: int, stream: str) -> jax.Array:
    return jax.random.fold_in(jax.random.key(seed), STREAMS[stream])


class Pipeline:
    """Shared pieces of one seed's evaluation, each computed once (pools per cache interval,
    ranges per (cache, rule), VC fits per setting)."""

    def __init__(self, config, cfg, sched, params, seed: int):
        self.qc, self.cfg, self.sched, self.params = config.quant_cache, cfg, sched, params
        self.seed = seed
        self.steps, self.eta = self.qc.sample_steps, self.qc.eta
        self.pools, self.ranges_cache = {}, {}

    def pool(self, cache_every: int) -> calibrate.Pool:
        if cache_every not in self.pools:
            self.pools[cache_every] = calibrate.collect(
                self.cfg,
                self.params,
                self.sched,
                cache_every,
                trajectories=self.qc.pool_trajectories,
                steps=self.steps,
                eta=self.eta,
                rng=_key(self.seed, "pool"),  # one noise for every pool: paired by trajectory
            )
        return self.pools[cache_every]

    def ranges(self, setting):
        key = (setting.cache_every, setting.calibration)
        if key not in self.ranges_cache:
            pool = self.pool(setting.cache_every)
            rng = np.random.default_rng([self.seed, STREAMS["select"]])
            rows = calibrate.select(
                pool,
                setting.calibration,
                self.qc.calibration_size,
                clusters=self.qc.clusters,
                alpha=self.qc.tap_alpha,
                subsamples=self.qc.tap_subsamples,
                fraction=self.qc.tap_fraction,
                rng=rng,
            )
            self.ranges_cache[key] = calibrate.ranges(self.cfg, self.params, self.sched, pool, rows)
        return self.ranges_cache[key]

    def vc_fit(self, setting, ranges):
        n = self.qc.vc_batch
        k_noise, k_sample = jax.random.split(_key(self.seed, "vc"))
        x_noise = jax.random.normal(k_noise, (n, *digits.IMAGE_SHAPE))
        y_B = jnp.asarray(calibrate.labels(n))
        eps, form = self.qc.vc_eps, self.qc.vc_form
        key = (self.cfg, sampling.sched_key(self.sched), setting, self.steps, self.eta, eps, form)
        fit = sampling.program(
            ("vc", *key),
            lambda: lambda params, x, y, k, r: sampling.fit_vc(
                self.cfg, params, self.sched, setting, x, y, k,
                steps=self.steps, eta=self.eta, ranges=r, eps=eps, form=form,
            ),
        )  # fmt: skip
        return fit(self.params, x_noise, y_B, k_sample, ranges)

    def run(self, setting):
        """(final samples [N, 8, 8, 1], labels [N], per-step variance [S + 1], seconds)."""
        ranges = self.ranges(setting) if setting.quantized else None
        vc_fit = self.vc_fit(setting, ranges) if setting.vc else None
        n = self.qc.num_samples
        k_noise, k_sample = jax.random.split(_key(self.seed, "samples"))
        x_noise = jax.random.normal(k_noise, (n, *digits.IMAGE_SHAPE))
        y_B = jnp.asarray(calibrate.labels(n))

        def build():
            def go(params, x, y, k, r, fit):
                out = sampling.sample(
                    self.cfg, params, self.sched, setting, x, y, k,
                    steps=self.steps, eta=self.eta, ranges=r, vc_fit=fit,
                )  # fmt: skip
                every = jnp.concatenate([out.inputs, out.x[None]])
                return out.x, jnp.var(every, axis=(1, 2, 3, 4))

            return go

        go = sampling.program(
            ("sample", self.cfg, sampling.sched_key(self.sched), setting, self.steps, self.eta),
            build,
        )
        args = (self.params, x_noise, y_B, k_sample, ranges, vc_fit)
        compiled = go.lower(*args).compile()  # outside the timing (cached after the first seed)
        start = time.perf_counter()
        x, var_S = jax.block_until_ready(compiled(*args))
        return np.asarray(x), np.asarray(y_B), np.asarray(var_S), time.perf_counter() - start


def pool_similarity(pipe: Pipeline, cache_every: int) -> dict:
    """Mean pairwise cosine of the pool's inputs per step, with and without the cache."""
    cached = calibrate.mean_pairwise_cosine(pipe.pool(cache_every).inputs_SBHWC)
    uncached = calibrate.mean_pairwise_cosine(pipe.pool(1).inputs_SBHWC)
    gap = cached - uncached
    half = len(gap) // 2
    out = {f"pool/cos_cached/{i}": float(v) for i, v in enumerate(cached)}
    out |= {f"pool/cos_uncached/{i}": float(v) for i, v in enumerate(uncached)}
    out["pool/cos_gap"] = float(np.mean(gap))
    out["pool/cos_gap_growth"] = float(np.mean(gap[half:]) - np.mean(gap[:half]))
    return out


def evaluate_all(config, cfg, sched, params, seed: int, *, progress=print) -> dict:
    """Every setting of config.quant_cache.settings for one seed (module docstring)."""
    qc = config.quant_cache
    chosen = settings_lib.parse_list(qc.settings)
    clf = digits.classifier(qc.classifier_cache)
    splits = digits.load_splits()
    real = getattr(splits, qc.eval_split)
    real_feats = digits.features(clf, real.images)
    pipe = Pipeline(config, cfg, sched, params, seed)
    macs = sampling.layer_macs(cfg, params, sched)
    out, variances = {}, {}
    for setting in chosen:
        x, y, var_S, seconds = pipe.run(setting)
        name = setting.name
        out[f"{name}/fd"] = digits.frechet_distance(digits.features(clf, x), real_feats)
        out[f"{name}/accuracy"] = digits.conditional_accuracy(clf, x, y)
        out[f"{name}/seconds"] = seconds
        out[f"{name}/speedup"] = cost.speedup(cfg, macs, setting, qc.sample_steps)
        out |= {f"{name}/var/{i}": float(v) for i, v in enumerate(var_S)}
        variances[name] = var_S
        progress(f"quant_cache seed {seed}: {name:18s} FD {out[f'{name}/fd']:7.2f}  "
                 f"acc {out[f'{name}/accuracy']:.3f}  {seconds:5.1f} s")  # fmt: skip
    if "fp" in variances:
        for name, var_S in variances.items():
            out[f"{name}/var_dev"] = float(np.mean(np.abs(var_S - variances["fp"])))
    caches = sorted({s.cache_every for s in chosen if s.cache_every > 1})
    if caches:
        out |= pool_similarity(pipe, caches[0])
    return out


def evaluator(config, cfg, sched):
    """The transform Method's `evaluate(state, *, seed)`."""

    def evaluate(state, *, seed):  # the core passes config.seed
        return evaluate_all(config, cfg, sched, state.params, seed)

    return evaluate


def derived(m: dict) -> dict:
    """The experiment's per-seed differences from one seed's metrics (those whose settings
    ran): FD gaps between settings, and the superadditive gap over FD(fp)."""
    fd = {k.removesuffix("/fd"): v for k, v in m.items() if k.endswith("/fd")}
    out = {"test/superadditive": (fd[QC] - max(fd[Q], fd[C])) / fd["fp"]}
    for bits in ("w8a8", "w4a8"):  # reported beside the claimed setting
        if {bits, f"{bits}+c2"} <= set(fd):
            out[f"test/superadditive_{bits}"] = (fd[f"{bits}+c2"] - max(fd[bits], fd[C])) / fd["fp"]
    tap_vc = f"{QC}+tap+vc"
    if tap_vc in fd:
        out["test/tap_vc_gain"] = fd[QC] - fd[tap_vc]
    if f"{QC}+tap" in fd:
        out["test/tap_minus_uniform"] = fd[QC] - fd[f"{QC}+tap"]
    if f"{QC}+kmeans" in fd:
        out["test/kmeans_minus_tap"] = fd[f"{QC}+kmeans"] - fd[f"{QC}+tap"]
    if f"{QC}+vc" in fd:
        out["test/vc_fd_gain"] = fd[QC] - fd[f"{QC}+vc"]
        out["test/vc_var_gain"] = m[f"{QC}/var_dev"] - m[f"{QC}+vc/var_dev"]
    if all(v in fd for v in (*QC_VARIANTS, tap_vc)):
        out["test/tap_vc_closest"] = min(fd[v] for v in QC_VARIANTS) - fd[tap_vc]
    return out
