"""ALI-CFM data: times, normalisation, the four data sets, leave-one-out, the krumsiek11 file."""

import math

import numpy as np
import pytest

from core.errors import ConfigError
from methods.ali_cfm import data

# The header of scanpy's krumsiek11.txt, as the real file has it.
GENES = ["Gata2", "Gata1", "Fog1", "EKLF", "Fli1", "SCL", "Cebpa", "Pu.1", "cJun", "EgrNab", "Gfi1"]
HEADER = "# model = sim_models/krumsiek11.txt\n# tmax = 6\n# it   " + "   ".join(GENES) + "\n"


def _stand_in(tmp_path, steps=6, realisations=2, drop_last=False):
    """A krumsiek11.txt of `realisations` x `steps` cells; gene g of the cell at step s in
    realisation r has value s + 0.1 r + 0.01 g, so each cell says where it came from."""
    rows = []
    for r in range(realisations):
        for s in range(steps):
            values = [s + 0.1 * r + 0.01 * g for g in range(len(GENES) - drop_last)]
            rows.append(f"{s:4d}  " + "  ".join(f"{v:.4f}" for v in values))
    path = tmp_path / "krumsiek11.txt"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    return path


# ---------------------------------------------------------------------------------------------
# Times and normalisation


def test_times_are_the_index_over_the_max_index(tmp_path):
    np.testing.assert_allclose(data.rotating_gmm(k=7, n=5).times, np.arange(7) / 6, atol=1e-7)
    np.testing.assert_allclose(data.knot(k=6, per_time=2).times, np.arange(6) / 5, atol=1e-7)
    np.testing.assert_allclose(data.trimodal(n=5).times, [0, 0.5, 1])
    m = data.krumsiek11(bins=4, path=_stand_in(tmp_path))
    np.testing.assert_allclose(m.times, [0, 1 / 3, 2 / 3, 1], atol=1e-7)
    assert m.times.dtype == np.float32


def test_min_max_is_over_all_times_and_denormalise_undoes_it():
    a, b = np.array([[0.0, 10.0], [2.0, 30.0]]), np.array([[4.0, 20.0]])
    m = data.from_samples([a, b])
    np.testing.assert_array_equal(m.low, [0, 10])
    np.testing.assert_array_equal(m.high, [4, 30])
    # Per-time normalisation would map b to [0, 0] or NaN; over all times it is [1, 0.5].
    np.testing.assert_allclose(m.samples[0], [[0, 0], [0.5, 1]])
    np.testing.assert_allclose(m.samples[1], [[1, 0.5]])
    np.testing.assert_allclose(m.denormalise(m.samples[0]), a)
    assert all(x.dtype == np.float32 for x in m.samples)


def test_a_constant_dimension_round_trips_without_nan():
    m = data.from_samples([np.array([[1.0, 5.0]]), np.array([[3.0, 5.0]])])
    assert np.isfinite(m.samples[0]).all() and m.samples[1][0, 1] == 0
    np.testing.assert_allclose(m.denormalise(m.samples[1]), [[3, 5]])


def test_generated_sets_normalise_to_the_unit_box_and_round_trip():
    m, raw = data.knot(k=30, seed=3), data.knot(k=30, seed=3, normalise=False)
    x_ND = np.concatenate(m.samples)
    np.testing.assert_allclose(x_ND.min(0), [0, 0])
    np.testing.assert_allclose(x_ND.max(0), [1, 1])
    np.testing.assert_allclose(m.denormalise(m.samples[7]), raw.samples[7], atol=1e-5)


def test_seeds_repeat_and_differ_and_a_generator_is_taken():
    first, again = data.rotating_gmm(n=20, seed=1), data.rotating_gmm(n=20, seed=1)
    np.testing.assert_array_equal(first.samples[3], again.samples[3])
    assert not np.allclose(first.samples[3], data.rotating_gmm(n=20, seed=2).samples[3])
    m = data.trimodal(n=20, seed=np.random.default_rng(1))
    np.testing.assert_array_equal(m.samples[1], data.trimodal(n=20, seed=1).samples[1])


# ---------------------------------------------------------------------------------------------
# Data sets


def test_trimodal_middle_has_three_separated_modes_and_ends_one():
    n = 3000
    m = data.trimodal(n=n, seed=0, normalise=False)
    x0, x_half, x1 = (x[:, 0] for x in m.samples)
    # Means 1.5 apart with sigma 0.2: the gaps around +-0.75 are 3.75 sigma from every mode.
    regions = [x_half < -0.75, np.abs(x_half) <= 0.75, x_half > 0.75]
    assert all(0.29 * n < r.sum() < 0.38 * n for r in regions)
    assert (np.abs(np.abs(x_half) - 0.75) < 0.1).mean() < 0.01
    for x, mean in zip(regions, [-1.5, 0.0, 1.5], strict=True):
        assert abs(x_half[x].mean() - mean) < 0.03 and abs(x_half[x].std() - 0.2) < 0.02
    for x in (x0, x1):  # N(0, 0.3^2): one mode, nothing out at the side modes
        assert abs(x.mean()) < 0.03 and abs(x.std() - 0.3) < 0.02
        assert (np.abs(x) > 1.2).mean() < 0.001


def test_knot_curve_matches_the_official_formula_by_hand():
    # k = 6: s = -1.5 + 0.6 i; indices 0-1 on the first line, 2-3 on the loop, 4-5 on the last.
    edge, mid = (1 + math.tanh(2.5)) / 2, (1 - math.tanh(0.5)) / 2
    cos, sin = math.cos(0.1 * math.pi), math.sin(0.1 * math.pi)
    expected = [[-3, edge], [-1.2, mid], [cos, 1 - sin], [-cos, 1 - sin], [1.2, mid], [3, edge]]
    np.testing.assert_allclose(data.knot_curve(6), expected, atol=1e-7)
    # k = 3: one point per piece; the middle one is the top of the loop, (0, 2).
    np.testing.assert_allclose(data.knot_curve(3), [[-3, edge], [0, 2], [3, edge]], atol=1e-7)


def test_knot_middle_third_is_the_unit_circle_and_the_noise_is_the_official_std():
    path_K2 = data.knot_curve(300)
    loop = path_K2[100:200]
    np.testing.assert_allclose(np.hypot(loop[:, 0], loop[:, 1] - 1), 1, atol=1e-12)
    assert np.abs(path_K2[:100, 1] - 0.5).max() < 0.5 and path_K2[:100, 0].max() < 0
    m = data.knot(k=6, per_time=4000, seed=0, normalise=False)
    assert len(m.samples) == 6 and m.samples[0].shape == (4000, 2)
    residual_KP2 = np.stack(m.samples) - data.knot_curve(6)[:, None]
    np.testing.assert_allclose(residual_KP2.mean(1), 0, atol=0.01)
    np.testing.assert_allclose(residual_KP2.std(1), 0.1, atol=0.005)
    assert len(data.knot().samples) == 300 and data.knot().samples[0].shape == (10, 2)


def test_rotating_gmm_centres_lie_on_the_circle_and_turn_counter_clockwise():
    square = [[2, 0], [0, 2], [-2, 0], [0, -2]]
    np.testing.assert_allclose(data.gmm_centres(0.0), square, atol=1e-12)
    turned = [2 * np.cos(2 * np.pi / 3), 2 * np.sin(2 * np.pi / 3)]
    np.testing.assert_allclose(data.gmm_centres(1.0)[0], turned, atol=1e-12)  # 120 degrees on
    for t in (0.0, 0.3, 1.0):
        np.testing.assert_allclose(np.linalg.norm(data.gmm_centres(t), axis=1), 2)
    m = data.rotating_gmm(k=7, n=4000, seed=0, normalise=False)
    for t, x_N2 in zip(m.times, m.samples, strict=True):
        centre_M2 = data.gmm_centres(float(t))
        nearest_N = np.argmin(((x_N2[:, None] - centre_M2) ** 2).sum(-1), 1)
        for j in range(4):  # the samples cluster around the centres of their time, sigma 0.2
            x_n2 = x_N2[nearest_N == j]
            np.testing.assert_allclose(x_n2.mean(0), centre_M2[j], atol=0.03)
            np.testing.assert_allclose(x_n2.std(0), 0.2, atol=0.02)


# ---------------------------------------------------------------------------------------------
# Leave one out


def test_leave_one_out_keeps_the_original_times():
    m = data.rotating_gmm(k=7, n=10)
    train, t_held, x_held = data.leave_one_out(m, 2)
    # Re-spacing the six left would give linspace(0, 1, 6) = 0, 0.2, ...: not these.
    np.testing.assert_allclose(train.times, np.array([0, 1, 3, 4, 5, 6]) / 6, atol=1e-7)
    assert t_held == pytest.approx(2 / 6) and x_held is m.samples[2]
    assert len(train.samples) == 6 and train.samples[2] is m.samples[3]
    np.testing.assert_array_equal(train.low, m.low)  # normalised with all K, as the official


@pytest.mark.parametrize("k", [0, 6, -1, 7, 2.0])
def test_leave_one_out_refuses_the_end_points_and_non_indices(k):
    with pytest.raises(ConfigError, match="intermediate index 0 < k < 6"):
        data.leave_one_out(data.rotating_gmm(k=7, n=5), k)


# ---------------------------------------------------------------------------------------------
# krumsiek11


def test_krumsiek11_parser_reads_steps_genes_and_values(tmp_path):
    step_N, x_NG, genes = data.read_krumsiek11(_stand_in(tmp_path))
    assert genes == tuple(GENES) and x_NG.shape == (12, 11) and x_NG.dtype == np.float32
    np.testing.assert_array_equal(step_N, [0, 1, 2, 3, 4, 5] * 2)  # realisations in turn
    np.testing.assert_allclose(x_NG[7, :3], [1.1, 1.11, 1.12], atol=1e-6)  # step 1, real. 1


def test_krumsiek11_bins_cells_by_time_step(tmp_path):
    m = data.krumsiek11(bins=3, path=_stand_in(tmp_path), normalise=False)
    for b, x_NG in enumerate(m.samples):  # bin b holds steps 2b, 2b + 1 of both realisations
        np.testing.assert_allclose(np.sort(np.floor(x_NG[:, 0])), [2 * b] * 2 + [2 * b + 1] * 2)
    sizes = [len(x) for x in data.bin_by_time(np.arange(6), np.zeros((6, 1)), 4)]
    assert sizes == [2, 1, 2, 1]  # equal-width bins of 1.5 steps: steps 0-1, 2, 3-4, 5


def test_krumsiek11_refuses_bad_files_and_too_many_bins(tmp_path):
    with pytest.raises(ConfigError, match="bins=7 leaves bin"):
        data.krumsiek11(bins=7, path=_stand_in(tmp_path))
    with pytest.raises(ConfigError, match="line 4: expected 12 fields, got 11"):
        data.read_krumsiek11(_stand_in(tmp_path, drop_last=True))
    (tmp_path / "no_header.txt").write_text("0 0.1 0.2\n")
    with pytest.raises(ConfigError, match="header"):
        data.read_krumsiek11(tmp_path / "no_header.txt")
    with pytest.raises(ConfigError, match="cannot read"):
        data.read_krumsiek11(tmp_path / "missing.txt")


@pytest.mark.slow  # downloads the scanpy wheel (2 MB) from PyPI
def test_krumsiek11_real_file_from_the_scanpy_wheel(tmp_path):
    path = data.krumsiek11_path(tmp_path)
    step_N, x_NG, genes = data.read_krumsiek11(path)
    assert genes == tuple(GENES) and x_NG.shape == (640, 11) and step_N.max() == 159
    m = data.krumsiek11(bins=7, path=path)
    assert sum(len(x) for x in m.samples) == 640 and min(len(x) for x in m.samples) >= 88


# ---------------------------------------------------------------------------------------------
# Registry and bad inputs


def test_load_builds_every_data_set(tmp_path):
    assert set(data.DATASETS) == {"trimodal", "knot", "rotating_gmm", "krumsiek11"}
    assert data.load("knot", seed=0, k=3).samples[0].shape == (10, 2)
    assert data.load("krumsiek11", path=_stand_in(tmp_path), bins=2).samples[0].shape == (6, 11)
    assert len(data.load("rotating_gmm", n=3).samples) == 7
    assert data.load("trimodal", n=4).samples[1].shape == (4, 1)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: data.load("spiral"), "unknown data set 'spiral'"),
        (lambda: data.load("knot", radius=2), r"knot: bad option\(s\) \['radius'\]"),
        (lambda: data.trimodal(n=0), "n must be an integer >= 1"),
        (lambda: data.trimodal(seed="a"), "seed must be"),
        (lambda: data.trimodal(seed=-1), "seed must be"),
        (lambda: data.knot(k=10), "k must be a multiple of 3"),
        (lambda: data.knot(per_time=0), "per_time must be"),
        (lambda: data.knot(std=-0.1), "std must be"),
        (lambda: data.rotating_gmm(k=1), "k must be an integer >= 2"),
        (lambda: data.rotating_gmm(n=2.5), "n must be an integer"),
        (lambda: data.from_samples([np.zeros((2, 1))]), "at least 2 marginals"),
        (lambda: data.from_samples([np.zeros((2, 1)), np.zeros((2, 2))]), "one dimension D"),
        (lambda: data.from_samples([np.zeros((2, 1)), np.full((2, 1), np.nan)]), "NaN"),
        (lambda: data.bin_by_time(np.arange(3), np.zeros((3, 1)), 1), "bins must be"),
    ],
)
def test_bad_inputs_raise_config_error_naming_the_problem(call, message):
    with pytest.raises(ConfigError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
