"""NAB's fused encoder + first layer: the Pallas kernels against the jnp reference on CPU
(interpret mode and lowering only: nothing here runs on a TPU or GPU), the same tile code
scanned on CPU (backend "cpu", impl="tiled"), and properties of the encoding itself.

Tolerances (float32). The kernels build each feature with the same float32 operations as the
reference (same tanh, same order), so f agrees to the bit or an ulp; what differs is the order
of summation: z sums M products in M-tiles (the reference in one dot), and every gradient sums
N pixel terms per tile and per partial, with per-bin constants (lam, k, cos, sin) applied to
the sums rather than to each term. For sums of a few hundred float32 terms that reorders
rounding by ~sqrt(terms) * 6e-8 of the summed magnitudes, ~1e-6 relative; the tests allow
1e-5 of the largest |value| of each output (`assert_close`). Relative to the largest entry, not
per entry: a gradient entry whose terms cancel to ~0 has no meaningful relative error.
"""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from core.kernels.binned_encoding import api, tpu
from core.kernels.binned_encoding.kernel import (
    KernelConfig,
    choose_layout,
    encode_dense_forward,
    encode_dense_pallas,
)
from core.kernels.binned_encoding.reference import Bins, encode, encode_dense

REL_TOL = 1e-5  # of max |reference|: float32 summation order, see the module docstring
PARAMS = (*Bins._fields, "w1", "b1")


def make_inputs(N, M, F, *, k_range=(2.0, 12.0), seed=0):
    """Pixels uniform in [-1, 1]^2; bins inside it with sides 0.2-1 and any rotation; moderate
    steepness (k * h ~ 0.4-12: edges soft enough that the tanh terms are not saturated and every
    bin parameter gets gradient from many pixels); W1 ~ N(0, 1/M).

    numpy arrays, and every jax computation in this file is jitted: on 2 cores, eager jax ops
    would each compile a tiny program and cost more than the kernels."""
    rng = np.random.default_rng(seed)
    f32 = lambda a: np.asarray(a, np.float32)
    coords = f32(rng.uniform(-1, 1, (N, 2)))
    bins = Bins(
        u=f32(rng.uniform(-0.8, 0.8, M)),
        v=f32(rng.uniform(-0.8, 0.8, M)),
        h=f32(rng.uniform(0.2, 1.0, M)),
        w=f32(rng.uniform(0.2, 1.0, M)),
        theta=f32(rng.uniform(-np.pi, np.pi, M)),
        k=f32(rng.uniform(*k_range, M)),
        lam=f32(rng.uniform(0.5, 1.5, M)),
    )
    w1 = f32(rng.standard_normal((M, F)) / np.sqrt(M))
    b1 = f32(rng.standard_normal(F))
    return coords, bins, w1, b1


def assert_close(got, want, name=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape and got.dtype == want.dtype == np.float32, name
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= REL_TOL * scale, f"{name}: max error {err:.3g} > {REL_TOL} * {scale:.3g}"


forward_jit = jax.jit(encode_dense_forward, static_argnums=4)
reference_jit = jax.jit(encode_dense)


def _loss(fn, coords, bins, w1, b1):
    """A scalar with non-uniform cotangents G = cos(index) on every output entry."""
    z = fn(coords, bins, w1, b1)
    g = jnp.cos(jnp.arange(z.size, dtype=jnp.float32)).reshape(z.shape)
    return jnp.sum(z * g)


def grads(fn, args):
    """(d bins, d w1, d b1) of `_loss`, jitted."""
    return jax.jit(jax.grad(functools.partial(_loss, fn), argnums=(1, 2, 3)))(*args)


def assert_grads_close(got, want):
    (gb, gw, gbias), (wb, ww, wbias) = got, want
    assert isinstance(gb, Bins)
    for name, g, w in zip(PARAMS, (*gb, gw, gbias), (*wb, ww, wbias), strict=True):
        assert_close(g, w, name)


@pytest.fixture
def tpu_interpret_state():
    """InterpretParams keeps global simulator state; reset it whatever the test did."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


# Small explicit tiles so the small shapes below span several tiles of every axis.
SMALL_BLOCKS = {
    "gpu": dict(block_n=16, block_m=16, block_f=64, bwd_block_n=16, bwd_rows=32),
    "tpu": dict(block_n=8, block_f=128, bwd_block_n=8, bwd_rows=16),
    "cpu": dict(block_n=16, bwd_block_n=8),
}

# ----------------------------------------------------------------- kernel == reference


@pytest.mark.parametrize("backend", ["gpu", "tpu", "cpu"])
@pytest.mark.parametrize(
    "N,M,F",
    [
        (40, 20, 24),  # M and F under one tile
        (50, 300, 136),  # N, M, F not multiples of any tile: 3 TPU bin tiles, 2 F tiles
        (7, 130, 16),  # fewer pixels than one tile
    ],
)
def test_forward_matches_reference(backend, N, M, F):
    args = make_inputs(N, M, F)
    config = KernelConfig(backend=backend, interpret=True, **SMALL_BLOCKS[backend])
    assert_close(forward_jit(*args, config), reference_jit(*args), "z")


@pytest.mark.parametrize("backend", ["gpu", "tpu", "cpu"])
def test_gradients_match_reference(backend):
    """All seven bin parameters, W1 and b1 against autodiff of the reference; the backward
    runs as several partials (GPU: 2 partials of 2 pixel tiles, 19 bin tiles; TPU: 4 of 2,
    3 bin tiles), with padding in N, M and F."""
    args = make_inputs(50, 300, 136)
    config = KernelConfig(backend=backend, interpret=True, **SMALL_BLOCKS[backend])
    layout = choose_layout(config, 50, 300, 136)
    assert layout.partials > 1 or (backend == "cpu" and layout.N_bwd // layout.bwd_bn == 7)
    kernel = lambda *a: encode_dense_pallas(*a, config)
    assert_grads_close(grads(kernel, args), grads(encode_dense, args))


@pytest.mark.parametrize("impl", ["interpret", "tiled"])
def test_op_kernel_paths_equal_xla_with_default_blocks_and_dict_bins(impl):
    """Through `op` with bins as a dict (how the method holds them): impl="interpret" (GPU
    wrapper, default tiles) and impl="tiled" (CPU scan, here two 256-pixel tiles) equal
    impl="xla" in z and in every gradient; the gradient keeps the dict structure; coords get
    a zero gradient on the kernel paths."""
    coords, bins, w1, b1 = make_inputs(300 if impl == "tiled" else 70, 40, 32)
    bins = bins._asdict()

    def run(impl):
        fn = functools.partial(api.op, impl=impl)
        loss = functools.partial(_loss, fn)
        z = jax.jit(fn)(coords, bins, w1, b1)
        return z, jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(coords, bins, w1, b1)

    (z, (dc, db, dw, dbias)), (z_ref, (_, db_ref, dw_ref, dbias_ref)) = run(impl), run("xla")
    assert_close(z, z_ref, "z")
    assert isinstance(db, dict) and set(db) == set(Bins._fields)
    for name in Bins._fields:
        assert_close(db[name], db_ref[name], name)
    assert_close(dw, dw_ref, "w1")
    assert_close(dbias, dbias_ref, "b1")
    np.testing.assert_array_equal(dc, 0.0)


def test_tpu_wrappers_under_interpret_params(tpu_interpret_state):
    """TPU semantics simulated: parallel grid axes run in random order, outputs resident
    across the "arbitrary" reduction axes. Forward grid (3, 1, 3), backward (2, 3, 2)."""
    args = make_inputs(24, 300, 16)
    config = KernelConfig(
        backend="tpu", interpret=pltpu.InterpretParams(), block_n=8, bwd_block_n=8, bwd_rows=16
    )
    assert_close(forward_jit(*args, config), reference_jit(*args), "z")
    kernel = lambda *a: encode_dense_pallas(*a, config)
    assert_grads_close(grads(kernel, args), grads(encode_dense, args))


@pytest.mark.parametrize("which", ["FWD_SEMANTICS", "BWD_SEMANTICS"])
def test_interpret_params_catches_a_parallel_reduction_axis(
    tpu_interpret_state, monkeypatch, which
):
    """The check above has teeth: with the reduced axis (bin tiles in the forward, pixel tiles
    in the backward) wrongly "parallel", its steps run in a shuffled order, the accumulator is
    zeroed in the middle, and the result is wrong."""
    monkeypatch.setattr(tpu, which, ("parallel", "parallel", "parallel"))
    args = make_inputs(24, 300, 16)
    config = KernelConfig(
        backend="tpu", interpret=pltpu.InterpretParams(), block_n=8, bwd_block_n=8, bwd_rows=24
    )
    if which == "FWD_SEMANTICS":  # not forward_jit: its cache holds the right semantics
        got, want = encode_dense_forward(*args, config), reference_jit(*args)
    else:
        kernel = lambda *a: encode_dense_pallas(*a, config)
        got = jax.grad(functools.partial(_loss, kernel), argnums=2)(*args)
        want = grads(encode_dense, args)[1]
    assert not np.allclose(got, want, atol=1e-3)


# ----------------------------------------------------------------- under shard_map


def _mesh_4x2():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_kernel_gradients_under_shard_map_with_vma_checks(tpu_interpret_state):
    """The custom_vjp inside shard_map(check_vma=True), pixels over all 8 devices, TPU
    semantics simulated: the out_shapes carry the pixels' varying axes and the replicated
    bins', W1's and b1's gradients are summed over the shards (without the psum, jax rejects
    the bwd rule; with a mean they would be 8x too small)."""
    args = make_inputs(64, 20, 16)  # 8 pixels per device: per-device buffers ~1 KiB
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams())
    rows = jax.P(("data", "model"), None)
    kernel = jax.shard_map(
        lambda *a: encode_dense_pallas(*a, config),
        mesh=_mesh_4x2(),
        in_specs=(rows, jax.P(), jax.P(), jax.P()),
        out_specs=rows,
        check_vma=True,
    )
    assert_close(jax.jit(kernel)(*args), reference_jit(*args), "z")
    assert_grads_close(grads(kernel, args), grads(encode_dense, args))


def test_tiled_sharded_op_with_vma_checks_equals_reference():
    """impl="tiled" (the CPU scan) under `sharded_op`, check_vma=True, pixels over all 8
    devices in two tiles each: the scan's zero carries are marked varying (without that jax
    rejects the carry's type change) and the gradients equal the reference's."""
    args = make_inputs(8 * 512, 20, 16)
    fn = functools.partial(api.sharded_op, mesh=_mesh_4x2(), pixel_axes=("data", "model"))
    tiled = functools.partial(fn, impl="tiled")
    assert api.uses_kernel("tiled") and not api.uses_kernel("xla")
    assert_close(jax.jit(tiled)(*args), reference_jit(*args), "z")
    assert_grads_close(grads(tiled, args), grads(encode_dense, args))


def test_sharded_op_rejects_pixels_that_do_not_divide():
    with pytest.raises(ValueError, match="pixels=50 does not divide over mesh axes"):
        api.sharded_op(*make_inputs(50, 4, 8), mesh=_mesh_4x2(), pixel_axes="data")
    with pytest.raises(ValueError, match="not \\['fsdp'\\]"):
        api.sharded_op(*make_inputs(64, 4, 8), mesh=_mesh_4x2())


# ----------------------------------------------------------------- lowering (no device)


def _specs(N, M, F):
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    return f32(N, 2), Bins(*(f32(M),) * 7), f32(M, F), f32(F)


MARKERS = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
@pytest.mark.parametrize("N,M,F", [(65536, 456, 256), (1000, 130, 300), (37, 20, 24)])
def test_op_lowers_forward_and_grad(monkeypatch, platform, lowering, N, M, F):
    """op(impl="pallas") as it would run on a TPU / GPU, default tiles: lowered (not compiled)
    from CPU. The forward is one kernel call; the grad two (the forward, then the backward)."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    fwd = lambda *a: api.op(*a, impl="pallas")
    grad = jax.grad(lambda *a: jnp.sum(jnp.sin(fwd(*a))), argnums=(1, 2, 3))
    for f, calls in ((fwd, 1), (grad, 2)):
        text = jax.jit(f).trace(*_specs(N, M, F)).lower(lowering_platforms=(lowering,)).as_text()
        assert text.count(MARKERS[platform]) == calls


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
def test_sharded_op_lowers_with_vma_checks(monkeypatch, platform, lowering):
    """sharded_op(impl="pallas") under shard_map(check_vma=True), pixels over "data": one
    kernel call forward, two in the grad, and the replicated parameters' grads all-reduced."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    fwd = functools.partial(api.sharded_op, mesh=_mesh_4x2(), pixel_axes="data", impl="pallas")
    grad = jax.grad(lambda *a: jnp.sum(jnp.sin(fwd(*a))), argnums=(1, 2, 3))
    for f, calls in ((fwd, 1), (grad, 2)):
        text = jax.jit(f).trace(*_specs(4096, 456, 256)).lower(lowering_platforms=(lowering,))
        text = text.as_text()
        assert text.count(MARKERS[platform]) == calls
        assert ("all_reduce" in text) == (f is grad)


# ----------------------------------------------------------------- properties of the encoding


def _distance_to_binary(f_NM):
    """Mean over pixels of the l1 distance of f to the nearest vertex of {0, 1}^M."""
    return np.mean(np.sum(np.minimum(np.abs(f_NM), np.abs(1.0 - f_NM)), axis=1))


def test_features_tend_to_hard_boxes_as_k_grows():
    """lam = 1: the paper's limit. As k grows the l1 distance to {0, 1}^M shrinks (~1/k:
    only pixels within ~1/k of an edge are far from 0 or 1), and hard boxes are the limit."""
    coords, bins, _, _ = make_inputs(400, 16, 8)
    bins = bins._replace(lam=np.ones(16, np.float32))
    encode_jit = jax.jit(encode)
    distances = []
    for k in (4.0, 16.0, 64.0, 256.0):
        f_NM = np.asarray(encode_jit(coords, bins._replace(k=np.full(16, k, np.float32))))
        distances.append(_distance_to_binary(f_NM))
    assert all(a > 2 * b for a, b in itertools.pairwise(distances)), distances
    # The limit itself: the indicator of the rotated rectangle, away from its edges.
    f_NM = np.asarray(encode_jit(coords, bins._replace(k=np.full(16, 1e4, np.float32))))
    c, s = np.cos(bins.theta), np.sin(bins.theta)
    dx, dy = coords[:, :1] - bins.u, coords[:, 1:] - bins.v
    xr, yr = c * dx - s * dy, s * dx + c * dy
    margin_x, margin_y = np.abs(xr) - bins.h / 2, np.abs(yr) - bins.w / 2
    inside = (margin_x < 0) & (margin_y < 0)
    clear = np.minimum(np.abs(margin_x), np.abs(margin_y)) > 1e-3  # 10 / k from every edge
    np.testing.assert_array_equal(np.round(f_NM[clear]), inside[clear])
    assert np.max(np.abs(f_NM[clear] - inside[clear])) < 1e-6  # tanh(10) = 1 - 4e-9


def test_quarter_turn_with_swapped_sides_gives_the_same_features():
    """theta + pi/2 with h and w swapped is the same bin: x' -> -y', y' -> x' and each soft box
    is even. Tolerance: cos/sin of the shifted float32 angle differ from the exact quarter turn
    by ~1e-7, moving x', y' by ~1e-7 * |c - centre| <= 3e-7; the features' slope is <= k/2 = 6,
    so ~2e-6; atol 1e-5."""
    coords, bins, _, _ = make_inputs(300, 32, 8)
    turned = bins._replace(theta=bins.theta + np.float32(np.pi / 2), h=bins.w, w=bins.h)
    encode_jit = jax.jit(encode)
    np.testing.assert_allclose(encode_jit(coords, turned), encode_jit(coords, bins), atol=1e-5)


def test_auto_on_cpu_is_tiled():
    args = make_inputs(9, 5, 4)
    assert api.uses_kernel("auto") and api.uses_kernel("interpret")
    tiled = jax.jit(functools.partial(api.op, impl="tiled"))
    np.testing.assert_array_equal(jax.jit(api.op)(*args), tiled(*args))


@pytest.mark.parametrize(
    "impl,match",
    [("pallas", 'impl="interpret"'), ("triton", "is unknown"), ("reference", "is unknown")],
)
def test_impl_errors_are_one_line(impl, match):
    with pytest.raises(ValueError, match=match) as e:
        api.op(*make_inputs(4, 3, 2), impl=impl)
    assert "\n" not in str(e.value)


def test_bad_shapes_are_one_line_errors_naming_the_shapes():
    coords, bins, w1, b1 = make_inputs(6, 5, 4)
    cases = [
        ((coords, bins, w1[:3], b1), r"w1 \(3, 4\) must be \[M, F\] with M = 5"),
        ((coords, bins, w1, b1[:2]), r"b1 \(2,\) must be \[F\] = \(4,\)"),
        ((coords[:, :1], bins, w1, b1), r"coords \(6, 1\) must be \[N, 2\]"),
        ((coords, bins._replace(k=bins.k[:4]), w1, b1), "seven \\[M\\] arrays of one M"),
        ((coords, {"u": bins.u}, w1, b1), "expected \\['u', 'v'"),
    ]
    for args, match in cases:
        for impl in ("xla", "interpret", "tiled"):
            with pytest.raises(ValueError, match=match) as e:
                api.op(*args, impl=impl)
            assert "\n" not in str(e.value)
