"""Marginals for ALI-CFM: unpaired samples observed at K times, no trajectories.

    m = load("knot", seed=0)                  # Marginals: times [K], samples K x [n_k, D]
    train, t_held, x_held_ND = leave_one_out(m, 3)
    x_units_ND = m.denormalise(x_held_ND)     # back to data units, where EMD is reported

As in the official code (github.com/mmacosha/adversarially-learned-interpolants):
- times are time indices divided by the largest index (`training_funcs.py`: timesteps / t_max),
  so K marginals sit at 0, 1/(K-1), ..., 1;
- samples are min-max normalised per dimension over all times together (`data_utils.py:
  get_dataset`), before any marginal is left out; `low`/`high` undo it.
Every data set is float32 numpy, seeded by an int or a `np.random.Generator`; bad inputs raise
`ConfigError` with one line naming the problem.
"""

import inspect
import numbers
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from core import wheels
from core.errors import ConfigError


class Marginals(NamedTuple):
    times: np.ndarray  # [K] float32 in [0, 1], increasing
    samples: list  # K arrays [n_k, D] float32 (normalised when high > low)
    low: np.ndarray  # [D] float32 min over all times (0 when not normalised)
    high: np.ndarray  # [D] float32 max over all times (1 when not normalised)

    def denormalise(self, x_ND) -> np.ndarray:
        """`x_ND` in data units: undoes the min-max normalisation (EMD is reported there)."""
        return np.asarray(x_ND, np.float32) * _span(self.low, self.high) + self.low


def _span(low, high):
    # A constant dimension keeps span 1 (the official code would divide by zero and give NaN).
    return np.where(high > low, high - low, 1).astype(np.float32)


def _int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _rng(seed) -> np.random.Generator:
    if isinstance(seed, np.random.Generator):
        return seed
    return np.random.default_rng(_int("seed", seed, 0))


def from_samples(samples, normalise: bool = True) -> Marginals:
    """Marginals of `samples` (K >= 2 arrays [n_k, D]) at times index / (K - 1)."""
    samples = [np.asarray(x, np.float32) for x in samples]
    if len(samples) < 2:
        raise ConfigError(f"need at least 2 marginals, got {len(samples)}")
    dims = {x.shape[1] if x.ndim == 2 else None for x in samples}
    if len(dims) != 1 or None in dims or any(len(x) == 0 for x in samples):
        shapes = [x.shape for x in samples]
        raise ConfigError(f"marginals must be non-empty [n_k, D] of one dimension D, got {shapes}")
    if not all(np.isfinite(x).all() for x in samples):
        raise ConfigError("marginal samples contain NaN or inf")
    (d,) = dims
    low, high = np.zeros(d, np.float32), np.ones(d, np.float32)
    if normalise:
        low = np.min([x.min(0) for x in samples], axis=0)
        high = np.max([x.max(0) for x in samples], axis=0)
        samples = [(x - low) / _span(low, high) for x in samples]
    times = (np.arange(len(samples)) / (len(samples) - 1)).astype(np.float32)
    return Marginals(times, samples, low, high)


def leave_one_out(m: Marginals, k: int) -> tuple[Marginals, float, np.ndarray]:
    """(the marginals without number k, its time, its samples [n_k, D]) for the official
    leave-one-out evaluation; the others keep their original times (no re-spacing), so the
    gap at t_k is what a model must interpolate across. Normalisation stays that of all K."""
    count = len(m.times)
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or not 0 < k < count - 1:
        raise ConfigError(f"leave_one_out: k must be an intermediate index 0 < k < {count - 1}")
    keep = [i for i in range(count) if i != k]
    train = m._replace(times=m.times[keep], samples=[m.samples[i] for i in keep])
    return train, float(m.times[k]), m.samples[k]


# ---------------------------------------------------------------------------------------------
# Synthetic data sets

TRIMODAL_MEANS = np.array([-1.5, 0.0, 1.5])


def trimodal(n: int = 1000, seed=0, normalise: bool = True) -> Marginals:
    """1-D, K = 3 (official `distributions/trimodal_distribution.py`): q_0 = q_1 = N(0, 0.3^2),
    q_0.5 = equal mixture of N(-1.5, 0.2^2), N(0, 0.2^2), N(1.5, 0.2^2); n samples each."""
    rng, n = _rng(seed), _int("n", n, 1)
    x0 = rng.normal(0.0, 0.3, n)
    # As the official code: each sample's mode is drawn at random (np.random.choice, p = 1/3),
    # so the three counts vary around n/3 instead of being exactly equal.
    x_half = rng.normal(TRIMODAL_MEANS[rng.integers(0, 3, n)], 0.2)
    x1 = rng.normal(0.0, 0.3, n)
    return from_samples([x[:, None] for x in (x0, x_half, x1)], normalise)


def knot_curve(k: int) -> np.ndarray:
    """[k, 2] noiseless knot of the official `distributions/knot_distribution.py` at its k time
    indices: a line from (-3, ~1) down to (0, ~0), a full circle of radius 1 about (0, 1), and a
    line up to (3, ~1). The official code splits the indices into thirds (k % 3 == 0)."""
    k = _int("k", k, 3)
    if k % 3:
        raise ConfigError(f"knot: k must be a multiple of 3 (line, loop, line), got {k}")
    s = np.linspace(-1.5, 1.5, k)  # official: 3 * (t / t.max()) - 1.5, t = linspace(0, 3, k)
    s1, s2, s3 = s[: k // 3], s[k // 3 : -k // 3], s[-k // 3 :]  # by index, as the official
    x = np.concatenate([3 * (s1 + 0.5), np.cos(2 * np.pi * (s2 - 0.75)), 3 * (s3 - 0.5)])
    y1, y3 = -np.tanh(5 * (s1 + 1)) / 2 + 0.5, np.tanh(5 * (s3 - 1)) / 2 + 0.5
    y = np.concatenate([y1, np.sin(2 * np.pi * (s2 - 0.75)) + 1, y3])
    return np.stack([x, y], -1)


def knot(k: int = 300, per_time: int = 10, seed=0, std: float = 0.1, normalise=True) -> Marginals:
    """2-D knot: `per_time` samples of knot_curve(k) + N(0, std^2 I) at each of k times. The
    official runs use k = 1200 and std 0.1 (old-oskar/train_ali_cfm.py, in the repo's history,
    not at HEAD); 300 keeps tests and EMD cheap. 10 samples per time is hard-coded there."""
    path_K2 = knot_curve(k)
    per_time = _int("per_time", per_time, 1)
    if not isinstance(std, numbers.Real) or not (np.isfinite(std) and std >= 0):
        raise ConfigError(f"knot: std must be a finite number >= 0, got {std!r}")
    noise_KP2 = _rng(seed).normal(0.0, std, (len(path_K2), per_time, 2))
    return from_samples(list(path_K2[:, None, :] + noise_KP2), normalise)


GMM_MODES, GMM_RADIUS, GMM_SIGMA, GMM_TURN = 4, 2.0, 0.2, 2 * np.pi / 3


def gmm_centres(t: float, modes: int = GMM_MODES) -> np.ndarray:
    """[modes, 2] mode centres at time t in [0, 1]: on the circle of radius GMM_RADIUS at
    angles 2 pi j / modes + GMM_TURN * t (counter-clockwise)."""
    angle_M = 2 * np.pi * np.arange(modes) / modes + GMM_TURN * t
    return GMM_RADIUS * np.stack([np.cos(angle_M), np.sin(angle_M)], -1)


def rotating_gmm(
    k: int = 7, n: int = 500, seed=0, normalise: bool = True, modes: int = GMM_MODES
) -> Marginals:
    """2-D, k marginals of n samples: an equal mixture of `modes` (4) isotropic Gaussians (sigma
    0.2) whose centres turn on the circle of radius 2 by 120 degrees in total (`gmm_centres`). The
    official repo has no such data set (its toy_experiment/generate_rotating_gaussians.py, in
    the history, is one correlated Gaussian whose mean moves on a line while its covariance
    turns), so this is our choice, fixed before any experiment ran. For k = 7, neighbouring
    (and leave-one-out) marginals are 20 (40) degrees apart: below the 45 degrees at which OT
    between modes 90 degrees apart pairs a mode with the wrong neighbour, so a straight path
    across a left-out marginal fails only by its chord, 2 (1 - cos 20 deg) = 0.12 inside the
    arc at the gap's middle (sigma is 0.2). With several modes a minibatch holds unequal counts
    per mode, so exact OT must pair some points across modes; `modes=1` (one Gaussian on the
    arc) has no such ambiguity."""
    rng, k, n, modes = _rng(seed), _int("k", k, 2), _int("n", n, 1), _int("modes", modes, 1)
    samples = []
    for t in np.arange(k) / (k - 1):
        centre_N2 = gmm_centres(t, modes)[rng.integers(0, modes, n)]
        samples.append(centre_N2 + GMM_SIGMA * rng.standard_normal((n, 2)))
    return from_samples(samples, normalise)


# ---------------------------------------------------------------------------------------------
# krumsiek11 (scanpy's simulated haematopoiesis: 11 genes, 4 realisations x 160 time steps)

SCANPY_SPEC = "scanpy==1.11.5"  # checked: its wheel holds the 59,808-byte file below
KRUMSIEK_MEMBER = "scanpy/datasets/krumsiek11.txt"
KRUMSIEK_CACHE = Path("~/.cache/iclr26/scanpy-krumsiek11")


def krumsiek11_path(folder: str | os.PathLike | None = None) -> Path:
    """krumsiek11.txt in `folder` (else $ALI_CFM_DATA, else ~/.cache/iclr26/scanpy-krumsiek11),
    extracted from the scanpy wheel on first use (pip, no dependencies; scanpy is never
    installed or imported). Offline, put the file in a folder and set ALI_CFM_DATA to it."""
    folder = Path(folder or os.environ.get("ALI_CFM_DATA") or KRUMSIEK_CACHE).expanduser()
    target = folder / Path(KRUMSIEK_MEMBER).name
    if target.is_file():
        return target
    print(f"ali_cfm: fetching {SCANPY_SPEC} (2 MB) into {folder} ...", file=sys.stderr)
    try:
        return wheels.extract_member(SCANPY_SPEC, KRUMSIEK_MEMBER, target)
    except wheels.WheelError as e:
        raise ConfigError(
            f"{e}; offline, set ALI_CFM_DATA to a folder with {target.name}"
        ) from None


def read_krumsiek11(path) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """(time step [N] int, expression [N, G] float32, gene names) from scanpy's krumsiek11.txt:
    `#` comment lines, the last one `# it <genes...>`, then one row `it g_1 ... g_G` per cell,
    the realisations one after another (it restarts at 0)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read the krumsiek11 file ({e.strerror or e})") from None
    heads = [line[1:].split() for line in lines if line.startswith("#")]
    if not heads or heads[-1][:1] != ["it"] or len(heads[-1]) < 2:
        raise ConfigError(f"{path}: no '# it <gene names>' header line")
    genes = tuple(heads[-1][1:])
    steps, rows = [], []
    for number, line in enumerate(lines, start=1):
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        if len(fields) != len(genes) + 1:
            raise ConfigError(
                f"{path}: line {number}: expected {len(genes) + 1} fields, got {len(fields)}"
            )
        try:
            steps.append(int(fields[0]))
            rows.append([float(v) for v in fields[1:]])
        except ValueError:
            raise ConfigError(f"{path}: line {number}: a field is not a number") from None
    if not rows:
        raise ConfigError(f"{path}: no cells after the header")
    return np.array(steps), np.array(rows, np.float32), genes


def bin_by_time(step_N, x_ND, bins: int) -> list[np.ndarray]:
    """`bins` arrays [n_b, D]: cells grouped into equal-width bins of their time step."""
    bins, step_N, x_ND = _int("bins", bins, 2), np.asarray(step_N), np.asarray(x_ND)
    if len(step_N) == 0 or len(step_N) != len(x_ND):
        raise ConfigError(f"bin_by_time: {len(step_N)} time steps for {len(x_ND)} cells")
    first, count = step_N.min(), step_N.max() - step_N.min() + 1
    bin_N = (step_N - first) * bins // count
    sizes = np.bincount(bin_N, minlength=bins)
    if (sizes == 0).any():
        raise ConfigError(f"bins={bins} leaves bin(s) empty ({count} time steps in the data)")
    return [x_ND[bin_N == b] for b in range(bins)]


def krumsiek11(bins: int = 7, seed=0, path=None, normalise: bool = True) -> Marginals:
    """The file's 640 cells (4 realisations x 160 steps, 11 genes) in `bins` time bins
    (~91 cells each for 7). Only the file's cells: more realisations would need scanpy's
    simulator (`scanpy.tl.sim` on sim_models/krumsiek11.txt), which we do not import. `seed` is
    checked and unused (the data are fixed); `path` overrides the cached file."""
    _rng(seed)
    step_N, x_NG, _ = read_krumsiek11(path or krumsiek11_path())
    return from_samples(bin_by_time(step_N, x_NG, bins), normalise)


DATASETS = {
    "trimodal": trimodal,
    "knot": knot,
    "rotating_gmm": rotating_gmm,
    "krumsiek11": krumsiek11,
}


def load(name: str, seed=0, **kw) -> Marginals:
    """DATASETS[name](seed=seed, **kw), with unknown names and options as ConfigError."""
    if name not in DATASETS:
        raise ConfigError(f"unknown data set {name!r}; known: {', '.join(sorted(DATASETS))}")
    make = DATASETS[name]
    known = [p for p in inspect.signature(make).parameters if p != "seed"]
    unknown = sorted(set(kw) - set(known))
    if unknown:
        raise ConfigError(f"{name}: bad option(s) {unknown}; options: {', '.join(known)}")
    return make(seed=seed, **kw)
