"""Selective rotary: the Pallas kernels against the jnp reference on CPU (interpret mode and
lowering only: nothing here runs on a TPU or GPU), and properties of `op` on impl="xla" and
impl="interpret".

Tolerances (float32): the kernel and the reference compute the same float32 formulas but
differently: the kernel's in-tile cumsum is a HIGHEST-precision triangular matmul plus a
carry, the reference's a sequential `cumsum`; both then take exact sin/cos of angles up to
~T * temp (~40 rad here), so a rounding difference of eps * |S| ~ 5e-6 in the angle shows up
in the outputs, times |x| ~ 3. Hence atol 3e-5 on outputs and 1e-5 relative on final_state.
bfloat16: both sides round the same float32 value to 8 mantissa bits, and a 1e-6 difference
before rounding can flip the last bit: 1 ulp = 2^-8 ~ 4e-3 relative; tolerance 1e-2.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from core.kernels.selective_rotary import api, tpu
from core.kernels.selective_rotary.kernel import (
    KernelConfig,
    rotate_pallas,
    selective_rotary_pallas,
)
from core.kernels.selective_rotary.reference import selective_rotary_reference
from core.nn.positions import rope

F32_ATOL, BF16_TOL = 3e-5, 1e-2
IMPLS = ["xla", "interpret"]


def make_inputs(B, T, H, K, *, offset=True, dtype=jnp.float32, seed=0):
    """q, k ~ N(0, 1); phi in [0, 1) (angles grow ~T/2); temp spans RoPE-like frequencies.

    numpy arrays, and every jax computation in this file is jitted: on 2 cores, eager jax ops
    would each compile a tiny program and cost more than the kernels."""
    R = K // 2
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, H, K), np.float32).astype(dtype)
    k = rng.standard_normal((B, T, H, K), np.float32).astype(dtype)
    phi = rng.uniform(size=(B, T, H, R)).astype(dtype)
    temp = (10.0 ** (-np.arange(R) / R)).astype(np.float32)
    off = (3.0 * rng.standard_normal((B, H, R))).astype(np.float32) if offset else None
    return q, k, phi, temp, off


rotate_pallas_jit = jax.jit(rotate_pallas, static_argnums=5)
reference_jit = jax.jit(selective_rotary_reference)


def jit_op(impl):
    """`api.op` jitted: one compile per shape instead of one per eager primitive."""
    return jax.jit(functools.partial(api.op, impl=impl))


def assert_outputs_close(got, want, dtype=jnp.float32):
    (gq, gk, gf), (wq, wk, wf) = got, want
    assert gq.dtype == wq.dtype == dtype and gk.dtype == wk.dtype == dtype
    assert gf.dtype == wf.dtype == jnp.float32 and gf.shape == wf.shape
    tol = (
        dict(atol=F32_ATOL, rtol=0) if dtype == jnp.float32 else dict(atol=BF16_TOL, rtol=BF16_TOL)
    )
    for g, w in ((gq, wq), (gk, wk)):
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32), **tol)
    np.testing.assert_allclose(gf, wf, rtol=1e-5, atol=1e-5)


@pytest.fixture
def tpu_interpret_state():
    """InterpretParams keeps global simulator state; reset it whatever the test did."""
    yield
    pltpu.reset_tpu_interpret_mode_state()


# ----------------------------------------------------------------- kernel == reference


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
@pytest.mark.parametrize(
    "B,T,H,K,offset,dtype",
    [
        (2, 37, 3, 8, True, jnp.float32),  # T not a multiple of the tile, C = 12 lanes
        (1, 37, 1, 16, False, jnp.float32),
        (2, 20, 3, 32, True, jnp.bfloat16),  # C = 48
        (1, 5, 2, 16, False, jnp.bfloat16),  # T shorter than one tile
    ],
)
def test_forward_matches_reference(backend, B, T, H, K, offset, dtype):
    q, k, phi, temp, off = make_inputs(B, T, H, K, offset=offset, dtype=dtype)
    config = KernelConfig(backend=backend, interpret=True, block_t=16)
    off_or_zero = off if offset else np.zeros((B, H, K // 2), np.float32)
    got = rotate_pallas_jit(q, k, phi, temp, off_or_zero, config)
    assert_outputs_close(got, reference_jit(q, k, phi, temp, off), dtype)


def test_forward_several_lane_blocks_and_tiles():
    """C = 256 lanes in two 128-blocks (TPU) / 16 blocks of 16 (GPU), T in 3 tiles."""
    q, k, phi, temp, off = make_inputs(2, 24, 2, 256)
    want = reference_jit(q, k, phi, temp, off)
    for backend, block_c in (("tpu", 128), ("gpu", 16)):
        config = KernelConfig(backend=backend, interpret=True, block_t=8, block_c=block_c)
        assert_outputs_close(rotate_pallas_jit(q, k, phi, temp, off, config), want)


def _loss_with_all_outputs(fn, q, k, phi, temp, off):
    """A scalar touching every output, final_state included, with non-uniform cotangents."""
    qo, ko, fin = fn(q, k, phi, temp, off)
    wq = jnp.cos(jnp.arange(qo.size, dtype=jnp.float32)).reshape(qo.shape)
    wk = jnp.sin(jnp.arange(ko.size, dtype=jnp.float32)).reshape(ko.shape)
    return jnp.sum(qo * wq) + jnp.sum(ko * wk) + jnp.sum(jnp.sin(fin))


@pytest.mark.parametrize("backend", ["gpu", "tpu"])
def test_gradients_match_reference(backend):
    """dq, dk, dphi, dtemp, doffset (float32). dtemp sums g_angle * S over B*T*H = 222 terms
    of size ~|S| ~ 20, so it gets rtol 1e-4; the others atol 1e-4 (angle rounding as above,
    summed over <= T terms by the reverse cumsum)."""
    args = make_inputs(2, 37, 3, 8)
    config = KernelConfig(backend=backend, interpret=True, block_t=16)
    kernel = lambda *a: selective_rotary_pallas(*a, config)
    argnums = (0, 1, 2, 3, 4)
    grad = lambda fn: jax.jit(jax.grad(lambda *a: _loss_with_all_outputs(fn, *a), argnums))
    got, want = grad(kernel)(*args), grad(selective_rotary_reference)(*args)
    for name, g, w in zip(("q", "k", "phi", "temp", "offset"), got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype, name
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


def test_op_gradients_with_mask_and_no_offset():
    """Through `op`: the mask multiplies phi before the kernel (plain autodiff), so masked
    positions get zero phi gradient; impl="interpret" equals impl="xla" (same tolerance)."""
    q, k, phi, temp, _ = make_inputs(2, 12, 2, 8)
    mask = np.ones((2, 12), np.float32)
    mask[:, [1, 6]] = 0

    def grads(impl):
        masked_op = lambda q, k, phi, temp, _: api.op(q, k, phi, temp, mask_BT=mask, impl=impl)
        loss = lambda *a: _loss_with_all_outputs(masked_op, *a, None)
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, phi, temp)

    got, want = grads("interpret"), grads("xla")
    for name, g, w in zip(["q", "k", "phi", "temp"], got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)
    np.testing.assert_array_equal(got[2][:, [1, 6]], 0.0)


def test_tpu_wrapper_under_interpret_params(tpu_interpret_state):
    """TPU semantics simulated: parallel grid axes run in random order, scratch is real."""
    q, k, phi, temp, off = make_inputs(3, 20, 2, 16)  # buffers <= 4 KiB, grid (3, 1, 3)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams(), block_t=8)
    got = rotate_pallas_jit(q, k, phi, temp, off, config)
    assert_outputs_close(got, reference_jit(q, k, phi, temp, off))


def test_interpret_params_catches_a_parallel_time_axis(tpu_interpret_state, monkeypatch):
    """The check above has teeth: with T wrongly "parallel" the carry breaks and it fails."""
    monkeypatch.setattr(tpu, "SEMANTICS", ("parallel", "parallel", "parallel"))
    q, k, phi, temp, off = make_inputs(3, 20, 2, 16)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams(), block_t=8)
    got = rotate_pallas(q, k, phi, temp, off, config)  # not the jitted one: its cache holds the
    # right semantics
    want = reference_jit(q, k, phi, temp, off)
    assert not np.allclose(got[0], want[0], atol=1e-3)


# ----------------------------------------------------------------- under shard_map

SHARD_SPECS = dict(batch_axes="data", head_axes="model")


def _mesh_4x2():
    return jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _outputs_and_grads(fn, args):
    loss = lambda *a: _loss_with_all_outputs(fn, *a)
    return jax.jit(fn)(*args), jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4)))(*args)


def _assert_outputs_and_grads_close(got, want):
    """The tolerances of the unsharded tests (assert_outputs_close, test_gradients_match_...)."""
    assert_outputs_close(got[0], want[0])
    for name, g, w in zip(("q", "k", "phi", "temp", "offset"), got[1], want[1], strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=name)


@pytest.mark.parametrize("impl", IMPLS)
def test_sharded_op_equals_op(impl):
    """Batch over "data" (4), heads over "model" (2): outputs and all gradients equal the
    unsharded reference; temp is replicated, so its gradient is the sum over the 8 shards."""
    args = make_inputs(8, 37, 4, 8)
    sharded = functools.partial(api.sharded_op, mesh=_mesh_4x2(), impl=impl, **SHARD_SPECS)
    want = _outputs_and_grads(selective_rotary_reference, args)
    _assert_outputs_and_grads_close(_outputs_and_grads(sharded, args), want)


def test_kernel_gradients_under_shard_map_with_vma_checks(tpu_interpret_state):
    """The kernel's custom_vjp inside shard_map(check_vma=True), TPU semantics simulated: the
    out_shapes carry the inputs' varying axes and the replicated temp's gradient is psummed
    (without the psum, jax rejects the bwd rule; with a pmean it would be 8x too small)."""
    args = make_inputs(8, 20, 4, 8)
    config = KernelConfig(backend="tpu", interpret=pltpu.InterpretParams(), block_t=8)
    x, state = jax.P("data", None, "model", None), jax.P("data", "model", None)
    kernel = jax.shard_map(
        lambda *a: selective_rotary_pallas(*a, config),
        mesh=_mesh_4x2(),
        in_specs=(x, x, x, jax.P(), state),
        out_specs=(x, x, state),
        check_vma=True,
    )
    want = _outputs_and_grads(selective_rotary_reference, args)
    _assert_outputs_and_grads_close(_outputs_and_grads(kernel, args), want)


def test_sharded_op_rejects_shapes_that_do_not_divide():
    q, k, phi, temp, off = make_inputs(6, 8, 4, 8)
    with pytest.raises(ValueError, match="batch=6 does not divide over mesh axes"):
        api.sharded_op(q, k, phi, temp, off, mesh=_mesh_4x2(), **SHARD_SPECS)
    with pytest.raises(ValueError, match="not \\['fsdp'\\]"):
        api.sharded_op(q, k, phi, temp, off, mesh=_mesh_4x2(), batch_axes=("data", "fsdp"))


# ----------------------------------------------------------------- lowering (no device)

LOWER_SHAPES = [
    (2, 256, 4, 64, jnp.float32),
    (2, 200, 8, 64, jnp.bfloat16),
    (2, 37, 3, 8, jnp.float32),
]


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
@pytest.mark.parametrize("B,T,H,K,dtype", LOWER_SHAPES)
def test_op_lowers_forward_and_grad(monkeypatch, platform, lowering, B, T, H, K, dtype):
    """op(impl="pallas") as it would run on a TPU / GPU: lowered (not compiled) from CPU."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in make_inputs(B, T, H, K, dtype=dtype)]
    fwd = lambda *a: api.op(*a, impl="pallas")
    loss = lambda *a: _loss_with_all_outputs(fwd, *a).astype(jnp.float32)
    marker = "tpu_custom_call" if platform == "tpu" else "__gpu$xla.gpu.triton"
    # The forward is one kernel call; the grad two (forward, then the cotangents' rotation).
    for f, calls in ((fwd, 1), (jax.grad(loss, argnums=(0, 1, 2, 3, 4)), 2)):
        text = jax.jit(f).trace(*specs).lower(lowering_platforms=(lowering,)).as_text()
        assert text.count(marker) == calls


@pytest.mark.parametrize("platform,lowering", [("tpu", "tpu"), ("gpu", "cuda")])
def test_sharded_op_lowers_with_vma_checks(monkeypatch, platform, lowering):
    """sharded_op(impl="pallas") under shard_map(check_vma=True), lowered from CPU with local
    shards: one kernel call forward, two in the grad, and temp's gradient all-reduced."""
    monkeypatch.setattr(api, "_platform", lambda: platform)
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in make_inputs(8, 64, 4, 16)]
    fwd = functools.partial(api.sharded_op, mesh=_mesh_4x2(), impl="pallas", **SHARD_SPECS)
    grad = jax.grad(lambda *a: _loss_with_all_outputs(fwd, *a), argnums=(0, 1, 2, 3, 4))
    marker = "tpu_custom_call" if platform == "tpu" else "__gpu$xla.gpu.triton"
    for f, calls in ((fwd, 1), (grad, 2)):
        text = jax.jit(f).trace(*specs).lower(lowering_platforms=(lowering,)).as_text()
        assert text.count(marker) == calls
        assert ("all_reduce" in text) == (f is grad)


# ----------------------------------------------------------------- properties of op


@pytest.mark.parametrize("impl", IMPLS)
def test_phi_one_with_rope_frequencies_is_rope(impl):
    """phi = 1, temp = base^(-2j/K): S_t = t (inclusive cumsum), so q' = RoPE at positions 1..T
    and so are the attention scores. The integer positions are exact in float32, so only the
    angle products' rounding differs: atol 1e-5."""
    op = jit_op(impl)
    B, T, H, K = 2, 24, 2, 16
    q, k, _, _, _ = make_inputs(B, T, H, K, offset=False)
    freqs = (10000.0 ** (-2.0 * np.arange(K // 2) / K)).astype(np.float32)
    qo, ko, fin = op(q, k, np.ones((B, T, H, K // 2), np.float32), freqs)
    pos = np.broadcast_to(np.arange(1, T + 1), (B, T))
    rope_jit = jax.jit(rope)
    qr, kr = rope_jit(q, pos), rope_jit(k, pos)
    np.testing.assert_allclose(qo, qr, atol=1e-5)
    np.testing.assert_allclose(ko, kr, atol=1e-5)
    np.testing.assert_array_equal(fin, np.full((B, H, K // 2), float(T)))
    scores = lambda a, b: np.einsum("bthk,bshk->bhts", np.asarray(a), np.asarray(b))
    np.testing.assert_allclose(scores(qo, ko), scores(qr, kr), atol=1e-4)


@pytest.mark.parametrize("impl", IMPLS)
def test_same_rotation_keeps_pairwise_dot_products(impl):
    """<R(a) q, R(a) k> = <q, k> per pair (j, j + R) and head, at every position."""
    op = jit_op(impl)
    q, k, phi, temp, off = make_inputs(2, 13, 3, 16)
    qo, ko, _ = op(q, k, phi, temp, off)
    pair_dot = lambda a, b: a[..., :8] * b[..., :8] + a[..., 8:] * b[..., 8:]
    qo, ko = np.asarray(qo), np.asarray(ko)
    np.testing.assert_allclose(pair_dot(qo, ko), pair_dot(q, k), atol=1e-5)


@pytest.mark.parametrize("impl", IMPLS)
def test_chunks_and_decode_steps_equal_one_pass(impl):
    """Carrying final_state as the next offset: 7 + 5 chunks, and 8 then four T=1 steps."""
    op = jit_op(impl)
    q, k, phi, temp, off = make_inputs(2, 12, 3, 8)
    whole = op(q, k, phi, temp, off)
    for splits in ([7], [8, 9, 10, 11]):
        outs, state = [], off
        for s, e in zip([0, *splits], [*splits, 12], strict=True):
            qo, ko, state = op(q[:, s:e], k[:, s:e], phi[:, s:e], temp, state)
            outs.append((qo, ko))
        got_q = np.concatenate([o[0] for o in outs], axis=1)
        got_k = np.concatenate([o[1] for o in outs], axis=1)
        assert_outputs_close((got_q, got_k, state), whole)


@pytest.mark.parametrize("impl", IMPLS)
def test_masked_positions_do_not_advance_the_angle(impl):
    """Kept positions' outputs and final_state equal those of the sequence with padding removed."""
    op = jit_op(impl)
    q, k, phi, temp, off = make_inputs(2, 12, 3, 8)
    mask = np.ones((2, 12), np.int32)
    mask[0, [0, 3, 4, 11]] = 0  # padding at the start, in the middle and at the end
    mask[1, [2, 5, 6, 7]] = 0
    qo, ko, fin = op(q, k, phi, temp, off, mask)
    keep = [np.flatnonzero(m) for m in mask]  # 8 kept in each row
    take = lambda x: np.stack([np.asarray(x)[b, keep[b]] for b in range(2)])
    want_q, want_k, want_fin = op(take(q), take(k), take(phi), temp, off)
    assert_outputs_close((take(qo), take(ko), fin), (want_q, want_k, want_fin))


def test_auto_on_cpu_is_the_reference():
    args = make_inputs(1, 9, 2, 8)
    got, want = jax.jit(api.op)(*args), reference_jit(*args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize(
    "impl,match",
    [("pallas", 'impl="interpret"'), ("triton", "is unknown"), ("reference", "is unknown")],
)
def test_impl_errors_are_one_line(impl, match):
    with pytest.raises(ValueError, match=match) as e:
        api.op(*make_inputs(1, 4, 1, 8), impl=impl)
    assert "\n" not in str(e.value)


def test_bad_shapes_are_one_line_errors():
    q, k, phi, temp, off = make_inputs(1, 4, 2, 8)
    for bad in ((q, k, phi, temp[:3], off), (q, k, phi, temp, off[:, :1])):
        with pytest.raises(ValueError, match="must be") as e:
            api.op(*bad, impl="interpret")
        assert "\n" not in str(e.value)
