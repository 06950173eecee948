"""Truncated polynomial probe: the reference against the polynomial it specifies (float64
numpy), and the Pallas kernels against the reference on CPU (interpret mode and lowering only:
nothing here runs on a TPU or GPU).

Tolerances.
  * Reference vs float64 (`poly_bound`): the standard forward error bound of evaluating a
    polynomial in floating point, |fl(P) - P| <= n eps |P|(|x|), where |P| is the polynomial
    with every coefficient and x replaced by its absolute value (no cancellation) and n the
    longest chain of roundings: a projection's D, amplified k <= N times by its power, the
    power's k - 1 products, the sums over r and over orders: n = N (D + 1) + R + N, with
    eps = 2^-24 (observed errors are < 3% of it). Per entry, not relative to the largest.
  * Kernel vs reference, float32 (REL_TOL): both compute the same float32 formulas; what
    differs is the order of summation: the GEMM sums D products in BD-tiles (XLA's dot in its
    own order), the epilogue sums over r and the orders in one matmul with S (the reference
    per order, then a cumsum), and every gradient sums over B in row tiles. Reordered rounding
    is ~sqrt(terms) * 6e-8 of the summed magnitudes, times k for z^k: ~1e-6 relative (observed
    <= 2e-6); the tests allow 1e-5 of the largest |value| of each output (`assert_close`).
    Relative to the largest entry, not per entry: an entry whose terms cancel to ~0 has no
    meaningful relative error.
  * bfloat16 inputs: both sides compute from the same bfloat16 values in float32 (their
    products are exact), so Y and the float32 parameters' gradients keep REL_TOL. A gradient
    returned in bfloat16 (x's, or the params' when they are bfloat16) is its float32 value
    rounded on both sides, and a 1e-6 difference before rounding can flip the last bit:
    2^-8 ~ 4e-3 of that entry, so BF16_TOL = 1e-2 of the largest (observed: equal here).
"""

import functools
from unittest import mock

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from core.kernels.poly_probe import api, reference, tpu
from core.kernels.poly_probe.kernel import KernelConfig, choose_layout, forward, poly_probe_pallas
from core.kernels.poly_probe.reference import truncations

REL_TOL, BF16_TOL = 1e-5, 1e-2  # of max |reference|: see the module docstring
NAMES = ("x", "w0", "w1", "U", "lam")


def make_inputs(B, D, N, R, *, dtype=np.float32, param_dtype=np.float32, seed=0):
    """x ~ N(0, 1); w1 and every U row ~ N(0, 1/D), so each projection z ~ N(0, 1); lam ~
    N(0, 1/R), so each order's term is O(1) (E z^10 ~ 1e3 at k = 5: |Y| up to ~100).

    numpy arrays, and every jax computation in this file is jitted: on 2 cores, eager jax ops
    would each compile a tiny program and cost more than the kernels."""
    rng = np.random.default_rng(seed)
    K = N - 1
    x = rng.standard_normal((B, D), np.float32).astype(dtype)
    w0 = np.asarray(rng.standard_normal(), param_dtype)
    w1 = (rng.standard_normal(D) / np.sqrt(D)).astype(param_dtype)
    U = (rng.standard_normal((K, R, D)) / np.sqrt(D)).astype(param_dtype)
    lam = (rng.standard_normal((K, R)) / np.sqrt(R)).astype(param_dtype)
    return x, w0, w1, U, lam


def assert_close(got, want, name="", tol=REL_TOL):
    assert got.shape == want.shape and got.dtype == want.dtype, name
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    err, scale = np.max(np.abs(got - want)), np.max(np.abs(want))
    assert err <= tol * scale, f"{name}: max error {err:.3g} > {tol} * {scale:.3g}"


def cotangent(B, N):
    """Non-uniform dL/dY, so that every truncation's path back is weighed differently."""
    return np.cos(np.arange(B * N, dtype=np.float32)).reshape(B, N)


def outputs_and_grads(fn, args):
    """(Y, gradients of every arg) for the cotangent above: one jitted vjp, one compile."""

    def run(*a):
        y, vjp = jax.vjp(fn, *a)
        return y, vjp(cotangent(*y.shape))

    return jax.jit(run)(*args)


def assert_outputs_and_grads_close(got, want, names=NAMES):
    (y, grads), (y_ref, grads_ref) = got, want
    assert y.dtype == jnp.float32
    assert_close(y, y_ref, "Y")
    for name, g, w in zip(names, grads, grads_ref, strict=True):
        assert_close(g, w, name, REL_TOL if g.dtype == jnp.float32 else BF16_TOL)


reference_jit = jax.jit(truncations)


@pytest.fixture
def tpu_interpret_state():
    """InterpretParams keeps global simulator state; reset it whatever the test did."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


# ----------------------------------------------------------------- the reference


def poly_float64(x, w0, w1, U, lam, *, absolute=False):
    """Y [B, N] in float64 numpy from the CP form; `absolute`: |P|(|x|) for the error bound."""
    f = (lambda a: np.abs(np.asarray(a, np.float64))) if absolute else np.float64
    x, w0, w1, U, lam = (f(a) for a in (x, w0, w1, U, lam))
    orders = [w0 + x @ w1]
    for k in range(2, U.shape[0] + 2):
        orders.append(np.sum(lam[k - 2] * np.einsum("bd,rd->br", x, U[k - 2]) ** k, axis=1))
    return np.cumsum(np.stack(orders, axis=1), axis=1)


def poly_bound(x, w0, w1, U, lam):
    """n eps |P|(|x|) per entry (see the module docstring)."""
    (_, R, D), N = U.shape, U.shape[0] + 1
    return (N * (D + 1) + R + N) * 2.0**-24 * poly_float64(x, w0, w1, U, lam, absolute=True)


def test_reference_equals_the_full_tensor_polynomial():
    """D = 4, N = 4, R = 3: W^[k] = sum_r lam_r u_r (x) ... (x) u_r built as a dense [D]^k
    tensor and contracted with x k times, independently of the CP shortcut."""
    args = make_inputs(6, 4, 4, 3)
    x, w0, w1, U, lam = (np.asarray(a, np.float64) for a in args)
    letters = "abcd"
    want = [w0 + x @ w1]
    for k in range(2, 5):
        u = U[k - 2]
        outer = ",".join(f"r{letters[i]}" for i in range(k))
        W = np.einsum(f"r,{outer}->{letters[:k]}", lam[k - 2], *([u] * k))  # [D]^k
        xs = ",".join(f"n{letters[i]}" for i in range(k))
        want.append(np.einsum(f"{letters[:k]},{xs}->n", W, *([x] * k)))
    want = np.cumsum(np.stack(want, axis=1), axis=1)
    got = np.asarray(reference_jit(*args), np.float64)
    assert np.all(np.abs(got - want) <= poly_bound(*args))


@pytest.mark.parametrize("R", [3, 64])
def test_both_projection_forms_are_the_polynomial(R):
    """The reference projects with one matmul below PER_ORDER_MIN_RANK and with one per order
    from it on (a CPU speed choice): each form, at a rank on either side of the switch, is
    the float64 polynomial within the float32 error bound."""
    args = make_inputs(16, 24, 4, R)
    want = poly_float64(*args)
    K = args[3].shape[0]
    for min_rank, dots in ((1, 1 + K), (10**6, 2)):  # per order / one matmul, whatever R is
        with mock.patch.object(reference, "PER_ORDER_MIN_RANK", min_rank):
            fn = jax.jit(lambda *a: truncations(*a))  # a new function: jit's cache would
            # otherwise hand back the first trace, made under the other patch
            assert fn.lower(*args).as_text().count("dot_general") == dots
            got = np.asarray(fn(*args), np.float64)
        assert np.all(np.abs(got - want) <= poly_bound(*args)), min_rank


def test_reference_gradients_by_finite_differences():
    """check_grads (reverse mode, first order) in float64: under enable_x64 the reference
    computes in its inputs' float64, where central differences with eps 1e-4 are accurate to
    ~eps^2 = 1e-8 relative (truncation error of a degree-3 polynomial; rounding ~1e-12), well
    inside check_grads' default float64 tolerance, 1e-5."""
    args = make_inputs(3, 5, 3, 2, dtype=np.float64, param_dtype=np.float64)
    with jax.enable_x64(True):
        assert jax.jit(truncations)(*args).dtype == np.float64
        jax.test_util.check_grads(jax.jit(truncations), args, order=1, modes=("rev",))


def test_planted_low_rank_polynomial():
    """A known polynomial, y = 0.5 - x_0 + x_1 + (x_0 + x_1)^2 - x_2^3 + x_3^4 / 4 on Gaussian
    x in D = 16 (rank 1 per order, u's = basis vectors and their sum), evaluated in float64
    from its closed form, truncation by truncation; the reference reproduces it within the
    float32 bound, and so does a random rank-2 polynomial of order 5 against its float64 CP
    evaluation."""
    D, B = 16, 64
    rng = np.random.default_rng(1)
    x = rng.standard_normal((B, D)).astype(np.float32)
    e = np.eye(D, dtype=np.float32)
    w1 = -e[0] + e[1]
    U = np.stack([(e[0] + e[1])[None], e[2][None], e[3][None]])  # [3, 1, D]
    lam = np.array([[1.0], [-1.0], [0.25]], np.float32)
    args = (x, np.float32(0.5), w1, U, lam)
    x64 = x.astype(np.float64)
    terms = [
        0.5 - x64[:, 0] + x64[:, 1],
        (x64[:, 0] + x64[:, 1]) ** 2,
        -(x64[:, 2] ** 3),
        0.25 * x64[:, 3] ** 4,
    ]
    want = np.cumsum(np.stack(terms, axis=1), axis=1)
    got = np.asarray(reference_jit(*args), np.float64)
    assert np.all(np.abs(got - want) <= poly_bound(*args))

    args = make_inputs(B, D, 5, 2, seed=2)
    got = np.asarray(reference_jit(*args), np.float64)
    assert np.all(np.abs(got - poly_float64(*args)) <= poly_bound(*args))


# ----------------------------------------------------------------- kernel == reference

# Small explicit tiles so the small shapes below span several tiles of every axis.
SMALL_BLOCKS = {
    "gpu": dict(block_b=16, block_c=16, block_d=32),
    "tpu": dict(block_b=8, block_c=128, block_d=128),
}


@pytest.mark.parametrize(
    "backend,B,D,N,R,dtype,param_dtype",
    [
        # B, D, C = 65 not multiples of the tiles: grid (3, 5) x 5 D tiles
        ("gpu", 37, 150, 5, 16, np.float32, np.float32),
        ("gpu", 20, 40, 2, 3, jnp.bfloat16, np.float32),  # C = 4: one padded column tile
        ("gpu", 5, 33, 5, 3, jnp.bfloat16, jnp.bfloat16),  # fewer rows than one tile
        ("tpu", 37, 300, 5, 16, np.float32, np.float32),  # D padded to 3 x 128
        ("tpu", 21, 100, 2, 16, jnp.bfloat16, np.float32),  # D padded to one tile, BB = 16
    ],
)
def test_kernel_matches_reference(backend, B, D, N, R, dtype, param_dtype):
    """Y and the gradients of x, w0, w1, U and lam under `interpret=True`; Y both from the
    primal call (accumulator in scratch / a carry, z not written) and from the vjp's forward
    (z saved for the backward)."""
    args = make_inputs(B, D, N, R, dtype=dtype, param_dtype=param_dtype)
    config = KernelConfig(backend=backend, interpret=True, **SMALL_BLOCKS[backend])
    layout = choose_layout(config, B, 1 + (N - 1) * R, D, N, dtype == jnp.bfloat16)
    assert layout.B_pad > B and layout.D_pad > D
    kernel = lambda *a: poly_probe_pallas(*a, config)
    want = outputs_and_grads(truncations, args)
    assert_outputs_and_grads_close(outputs_and_grads(kernel, args), want)
    assert_close(jax.jit(kernel)(*args), want[0], "Y (primal)")


def test_op_interpret_with_default_blocks_equals_xla():
    """Through `op`, default tiles, w0 a Python float held constant (it reaches the custom_vjp
    as a constant, not a tracer): impl="interpret" equals impl="xla"."""
    x, _, w1, U, lam = make_inputs(70, 96, 3, 8)
    fn = lambda impl: lambda x, w1, U, lam: api.op(x, 0.25, w1, U, lam, impl=impl)
    got, want = (outputs_and_grads(fn(impl), (x, w1, U, lam)) for impl in ("interpret", "xla"))
    assert_outputs_and_grads_close(got, want, ("x", "w1", "U", "lam"))


def test_tpu_wrappers_under_interpret_params(tpu_interpret_state):
    """TPU semantics simulated: parallel grid axes run in random order, the z accumulator
    resident across the "arbitrary" D axis (the z output block in the vjp's forward, a VMEM
    scratch in the primal call). Forward grid (3, 1, 3), backward (3, 1)."""
    args = make_inputs(24, 384, 3, 3)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams(), **SMALL_BLOCKS["tpu"])
    kernel = lambda *a: poly_probe_pallas(*a, config)
    want = outputs_and_grads(truncations, args)
    assert_outputs_and_grads_close(outputs_and_grads(kernel, args), want)
    assert_close(jax.jit(kernel)(*args), want[0], "Y (primal)")


def test_interpret_params_catches_a_parallel_reduction_axis(tpu_interpret_state, monkeypatch):
    """The check above has teeth: with D wrongly "parallel", its steps run in a shuffled
    order, the accumulator is zeroed in the middle and the epilogue sees a partial sum."""
    monkeypatch.setattr(tpu, "FWD_SEMANTICS", ("parallel", "parallel", "parallel"))
    args = make_inputs(24, 384, 3, 3)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams(), **SMALL_BLOCKS["tpu"])
    got = jax.jit(lambda *a: forward(*a, config)[0])(*args)  # a new trace: reads the patch
    assert not np.allclose(got, reference_jit(*args), atol=1e-3)


# ----------------------------------------------------------------- under shard_map


def _mesh_4x2():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def test_kernel_gradients_under_shard_map_with_vma_checks(tpu_interpret_state):
    """The custom_vjp inside shard_map(check_vma=True), rows over all 8 devices, TPU semantics
    simulated: the out_shapes carry x's varying axes and the replicated parameters' gradients
    are summed over the shards (without the psum jax rejects the bwd rule; with a mean they
    would be 8x too small). Per-device buffers <= 64 KiB (larger ones can deadlock here)."""
    args = make_inputs(64, 128, 3, 3)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams())
    rows = jax.P(("data", "model"), None)
    kernel = jax.shard_map(
        lambda *a: poly_probe_pallas(*a, config),
        mesh=_mesh_4x2(),
        in_specs=(rows, jax.P(), jax.P(), jax.P(), jax.P()),
        out_specs=rows,
        check_vma=True,
    )
    want = outputs_and_grads(truncations, args)
    assert_outputs_and_grads_close(outputs_and_grads(kernel, args), want)


def test_sharded_op_rejects_a_batch_that_does_not_divide():
    with pytest.raises(ValueError, match="batch=50 does not divide over mesh axes"):
        api.sharded_op(*make_inputs(50, 4, 2, 3), mesh=_mesh_4x2(), batch_axes="data")
    with pytest.raises(ValueError, match="not \\['fsdp'\\]"):
        api.sharded_op(*make_inputs(64, 4, 2, 3), mesh=_mesh_4x2())


# ----------------------------------------------------------------- lowering (no device)


def _specs(B, D, N, R, dtype=jnp.float32):
    f32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.float32)
    x = jax.ShapeDtypeStruct((B, D), dtype)
    return x, f32(), f32(D), f32(N - 1, R, D), f32(N - 1, R)


def _loss(fn, *args):
    return jnp.sum(jnp.sin(fn(*args)))


MARKERS = {"tpu": "tpu_custom_call", "gpu": "__gpu$xla.gpu.triton"}


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
@pytest.mark.parametrize(
    "B,D,N,R,dtype",
    [
        (1000, 4096, 5, 256, jnp.float32),  # the paper's probe on a 4096-wide model
        (64, 300, 5, 16, jnp.bfloat16),
        (37, 20, 2, 3, jnp.float32),
    ],
)
def test_op_lowers_forward_and_grad(monkeypatch, platform, lowering, B, D, N, R, dtype):
    """op(impl="pallas") as it would run on a TPU / GPU, default tiles: lowered (not compiled)
    from CPU. The forward is one kernel call; the grad two (the forward saving z, then the
    epilogue's backward)."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    fwd = lambda *a: api.op(*a, impl="pallas")
    grad = jax.grad(functools.partial(_loss, fwd), argnums=(0, 1, 2, 3, 4))
    for f, calls in ((fwd, 1), (grad, 2)):
        text = jax.jit(f).trace(*_specs(B, D, N, R, dtype)).lower(lowering_platforms=(lowering,))
        assert text.as_text().count(MARKERS[platform]) == calls


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
def test_sharded_op_lowers_with_vma_checks(monkeypatch, platform, lowering):
    """sharded_op(impl="pallas") under shard_map(check_vma=True), rows over "data": one kernel
    call forward, two in the grad, and the replicated parameters' grads all-reduced."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    fwd = functools.partial(api.sharded_op, mesh=_mesh_4x2(), batch_axes="data", impl="pallas")
    grad = jax.grad(functools.partial(_loss, fwd), argnums=(0, 1, 2, 3, 4))
    for f, calls in ((fwd, 1), (grad, 2)):
        text = jax.jit(f).trace(*_specs(4096, 1024, 5, 256)).lower(lowering_platforms=(lowering,))
        text = text.as_text()
        assert text.count(MARKERS[platform]) == calls
        assert ("all_reduce" in text) == (f is grad)


# ----------------------------------------------------------------- op and its errors


def test_auto_on_cpu_is_the_reference():
    args = make_inputs(9, 8, 3, 2)
    assert not api.uses_kernel("auto") and api.uses_kernel("interpret")
    np.testing.assert_array_equal(jax.jit(api.op)(*args), reference_jit(*args))


@pytest.mark.parametrize(
    "impl,match",
    [("pallas", 'impl="interpret"'), ("triton", "is unknown"), ("tiled", "is unknown")],
)
def test_impl_errors_are_one_line(impl, match):
    with pytest.raises(ValueError, match=match) as e:
        api.op(*make_inputs(4, 3, 2, 2), impl=impl)
    assert "\n" not in str(e.value)


def test_bad_shapes_are_one_line_errors_naming_the_shapes():
    x, w0, w1, U, lam = make_inputs(6, 5, 3, 2)
    cases = [
        ((x[0], w0, w1, U, lam), r"x \(5,\) must be \[B, D\]"),
        ((x, w1[:1], w1, U, lam), r"w0 \(1,\) must be a scalar"),
        ((x, w0, w1[:4], U, lam), r"w1 \(4,\) must be \[D\] = \(5,\)"),
        ((x, w0, w1, U[..., :4], lam), r"U \(2, 2, 4\) must be \[K, R, D\] with D = 5"),
        ((x, w0, w1, U[0], lam), r"U \(2, 5\) must be \[K, R, D\]"),
        ((x, w0, w1, U, lam[:, :1]), r"lam \(2, 1\) must be \[K, R\] = \(2, 2\)"),
    ]
    for args, match in cases:
        for impl in ("xla", "interpret"):
            with pytest.raises(ValueError, match=match) as e:
                api.op(*args, impl=impl)
            assert "\n" not in str(e.value)
