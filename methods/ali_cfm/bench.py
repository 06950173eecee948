"""ALI-CFM's step costs: the GAN and CFM steps, where a GAN step's time goes (the host's batch with
its exact OT chain vs the jitted networks), OT on the host vs inside jit, and the official
PyTorch steps on our weights.

    ALI_CFM_OFFICIAL=/path/to/adversarially-learned-interpolants \\
    ALI_CFM_TORCH_PYTHON=/path/to/venv-with-torch/bin/python \\
        python -m launch.bench --methods=ali_cfm           # configs/ali_cfm.py, size=small
    python -m launch.bench --methods=ali_cfm --smoke       # seconds (size=smoke, trimodal only)

ALI_CFM_OFFICIAL: a checkout of github.com/mmacosha/adversarially-learned-interpolants.
ALI_CFM_TORCH_PYTHON: the interpreter that runs `bench_official.py` (it needs torch and numpy,
not JAX); default: this one. Without torch or the checkout the comparison is skipped (one line).

One process, float32, one device, the small config (batch 128, width 64), per data set
(trimodal: 1-D, K = 3; rotating_gmm: 2-D, K = 7):
1. the jitted GAN step (`core.train`'s step of role=gan: D's Adam step, then G's against the
   updated D) on a batch already on the device: the networks alone;
2. the host's batch (`batches.examples_fn`: one draw per marginal per example, then, with the
   config's coupling=full, the exact OT chain through the K marginals, POT's network simplex
   in `core.ot.chain`), the draws alone and the chain alone: which share of a step is OT;
3. the CFM step (role=cfm: u_theta on the frozen G, u_t = dG/dt by jvp) and the OT-CFM
   baseline's step. role=cfm reads G from a gan run's workdir: here the GAN session's initial
   state, saved as a checkpoint in a temporary workdir;
4. one 128 x 128 coupling, POT's exact solve on the host (`core.ot.exact_coupling`) against a
   jitted log-domain Sinkhorn (`sinkhorn_plan`) and its plan's row argmax (the official "plan
   argmax" map), with how often that map agrees with the exact permutation;
5. the official GAN and CFM steps (`bench_official.py`, its own process) on our initial
   weights and batches: each loss of the first CHECKED_STEPS steps checked equal to ours, then
   its step times with torch at this host's core count (the threads JAX's CPU client uses)
   and at 1 thread. Our throughput is set against the faster of the two: on a host that other
   jobs keep busy, torch's OpenMP threads can stall a step by 100x when they outnumber the
   free cores (both times stay in the details, and a note says when that happened).
"""

import functools
import json
import os
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from configs import ali_cfm as ali_config
from core import checkpoint, ot, train
from core.benchmark import Ratio, Result, median_seconds, step_seconds
from core.data import to_global
from core.errors import ConfigError
from methods import ali_cfm as ali
from methods.ali_cfm import batches, nets

DATASETS = ("trimodal", "rotating_gmm")
SINKHORN_EPS = 0.01  # on the min-max normalised data (normalise=yes): squared costs up to D
SINKHORN_ITERS = 200
CHECKED_STEPS = 2  # the second step's losses read the first step's Adam updates
# float32 on both sides, the same sums in another order: O(1) losses over 128-256 terms, whose
# rounding is ~1e-7 relative; the Adam updates between the steps move parameters by 5e-5.
RTOL = 1e-5
OFFICIAL_BUDGET_S = 4.0  # per timed official step kind and thread count (>= 5 steps)
OFFICIAL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_official.py")


@functools.partial(jax.jit, static_argnames=("eps", "iters"))
def sinkhorn_plan(x_ND, y_MD, *, eps: float = SINKHORN_EPS, iters: int = SINKHORN_ITERS):
    """The entropic OT plan [N, M] between the uniform measures on x and y, squared Euclidean
    cost, after `iters` log-domain Sinkhorn sweeps (each sets the row potential f, then the
    column potential g): the columns sum to 1/M up to rounding, the rows to 1/N up to the
    iteration's convergence. Log-domain because exp(-C / eps) underflows float32 at C / eps >
    ~87, which squared distances of normalised data reach at eps = 0.01."""
    C_NM = jnp.sum((x_ND[:, None] - y_MD[None]) ** 2, axis=-1)
    N, M = C_NM.shape
    log_a, log_b = -jnp.log(N), -jnp.log(M)

    def sweep(_, fg):
        f_N, g_M = fg
        f_N = eps * (log_a - jax.nn.logsumexp((g_M[None] - C_NM) / eps, axis=1))
        g_M = eps * (log_b - jax.nn.logsumexp((f_N[:, None] - C_NM) / eps, axis=0))
        return f_N, g_M

    init = (jnp.zeros(N, C_NM.dtype), jnp.zeros(M, C_NM.dtype))
    f_N, g_M = jax.lax.fori_loop(0, iters, sweep, init)
    return jnp.exp((f_N[:, None] + g_M[None] - C_NM) / eps)


@functools.partial(jax.jit, static_argnames=("eps", "iters"))
def sinkhorn_map(x_ND, y_MD, *, eps: float = SINKHORN_EPS, iters: int = SINKHORN_ITERS):
    """[N] int: each row's partner by the argmax of its Sinkhorn plan row (as `exact_coupling`
    takes the exact plan's: the official `x1[pi.argmax(axis=1)]`)."""
    return jnp.argmax(sinkhorn_plan(x_ND, y_MD, eps=eps, iters=iters), axis=1)


def _config(size: str, role: str, dataset: str, **ali_opts):
    c = ali_config.get_config(f"size={size},role={role},dataset={dataset}")
    c.ali.eval_samples = 0  # no W1: only steps run here
    c.ali.update(ali_opts)
    return c


def _rngs(seed: int, b: int, n: int) -> list:
    """Batch b's example generators, as `core.data.synthetic` makes them (one process)."""
    return [np.random.default_rng([seed, b * n + j]) for j in range(n)]


def _device_batch(session, host_batch: dict):
    return to_global(host_batch, session.batch_sharding)


def _numpy(tree):
    return jax.tree.map(lambda x: np.array(x, copy=True), jax.device_get(tree))


def first_steps(session, batch, steps: int) -> tuple[dict, list[dict]]:
    """(the initial params, each step's metrics as floats): `steps` steps of the session's
    jitted step from its initial state, all on `batch`; the session keeps the last state."""
    params = _numpy(session.state.params)
    state, rows = session.state, []
    for _ in range(steps):
        state, metrics = session.step(state, batch)
        rows.append({k: float(v) for k, v in metrics.items()})
    session.state = state
    return params, rows


def step_keys(key, steps: int) -> list:
    """The rng of each of the first `steps` steps (`core.train`: fold_in(state.rng, step))."""
    return [jax.random.fold_in(key, s) for s in range(steps)]


def gan_noise(keys, B: int) -> np.ndarray:
    """[S, B]: G's t-noise in each step (`losses._fake`: normal(fold_in(rng, 0), [B]))."""
    draw = lambda k: jax.random.normal(jax.random.fold_in(k, 0), (B,), jnp.float32)
    return np.stack([np.asarray(draw(k)) for k in keys])


def cfm_times(keys, B: int) -> np.ndarray:
    """[S, B]: the times of each CFM step (`ali.flow_objective`: uniform(rng, [B]))."""
    return np.stack([np.asarray(jax.random.uniform(k, (B,), jnp.float32)) for k in keys])


def official_1d_cfm_loss(v, g, x0_BD, x1_BD, t_B) -> float:
    """The official CFM loss where D = 1: `TrainableInterpolant.dI_dt` squeezes f's output and
    jacobian to [B], which broadcast against t [B, 1] to a target u [B, B], u_ij = (x1_i - x0_i)
    + (1 - 2 t_i) f_j + t_i (1 - t_i) df_j/dt, and the loss is mean_ij (v_i - u_ij)^2."""
    f = lambda t: nets.mlp(g, jnp.concatenate([x0_BD, x1_BD, t[:, None]], -1), jax.nn.elu)[:, 0]
    f_B, df_B = jax.jvp(f, (t_B,), (jnp.ones_like(t_B),))
    t = t_B[:, None]
    u_BB = (x1_BD - x0_BD) + (1 - 2 * t) * f_B[None] + t * (1 - t) * df_B[None]
    x_BD = nets.interpolant(g, x0_BD, x1_BD, t_B)
    return float(jnp.mean((nets.velocity(v, x_BD, t_B) - u_BB) ** 2))


def _torch_layers(prefix: str, params: dict) -> dict:
    """Our MLP as torch `nn.Sequential` entries: layer i at index 2 i, weight [out, in]."""
    out = {}
    for i in range(len(params)):
        p = params[f"dense_{i}"]
        out[f"{prefix}.{2 * i}.weight"] = np.ascontiguousarray(np.asarray(p["kernel"]).T)
        out[f"{prefix}.{2 * i}.bias"] = np.asarray(p["bias"])
    return out


def official_inputs(gc, cc, g, d, v, gan_batch, cfm_batch, times_K, noise_SB, t_SB, repeats):
    """What `bench_official.py` reads: our initial weights in torch's names, the batches (the
    GAN's intermediate knot at times_K[i]), the draws our steps made, and both stages'
    settings: a dict of arrays and one JSON string."""
    x_BKD, i = gan_batch["x_BKD"], int(gan_batch["i_B"][0])
    if gc.ali.gan != "rpgan" or gc.ali.reg != "linear":  # the branches bench_official copies
        raise ConfigError(f"ali.gan={gc.ali.gan!r}, ali.reg={gc.ali.reg!r}: the official step "
                          "is copied for rpgan and linear only")  # fmt: skip
    settings = {"dim": x_BKD.shape[-1], "width": gc.ali.width, "t_smooth": nets.T_SMOOTH,
                "t": float(times_K[i]), "gan_lr": gc.optim.lr, "cfm_lr": cc.optim.lr,
                "correct_coeff": float(gc.ali.reg_weight), "repeats": repeats,
                "budget_s": OFFICIAL_BUDGET_S,
                "threads": sorted({os.cpu_count() or 1, 1}, reverse=True)}  # fmt: skip
    arrays = {**_torch_layers("g.interpolant_net", g), **_torch_layers("d.net", d),
              **_torch_layers("v.net", v)}  # fmt: skip
    return {"settings": json.dumps(settings), **arrays,
            "gan_x0": x_BKD[:, 0], "gan_x1": x_BKD[:, -1], "gan_xt": x_BKD[:, i],
            "gan_noise_SB": noise_SB, "cfm_x0": cfm_batch["x_BKD"][:, 0],
            "cfm_x1": cfm_batch["x_BKD"][:, -1], "cfm_t_SB": t_SB}  # fmt: skip


def run_official(inputs: dict) -> dict:
    """`bench_official.py`'s JSON line on `inputs`, run by $ALI_CFM_TORCH_PYTHON."""
    python = os.environ.get("ALI_CFM_TORCH_PYTHON") or sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "inputs.npz")
        np.savez(path, **inputs)
        proc = subprocess.run([python, OFFICIAL, path], capture_output=True, text=True,
                              check=False)  # fmt: skip
    if proc.returncode:
        raise RuntimeError(f"the official comparator failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_dataset(size: str, dataset: str, repeats: int, host_repeats: int) -> dict:
    """Every number of one data set (see the module), the losses of our first steps ("ours")
    and the official process's answer ("theirs": its losses and times, or its import error)."""
    one = jax.devices()[:1]
    gc, oc = _config(size, "gan", dataset), _config(size, "otcfm", dataset)
    B, seed = gc.train.batch_size, gc.seed
    split = batches.split_marginals(ali.data_of(gc), gc.ali.held_out)  # as `ali.make` splits
    gan_fn = batches.examples_fn(split.train, seed, coupling=gc.ali.coupling, gan=True)
    gan_host = gan_fn(_rngs(seed, 0, B), 0)
    cfm_host = batches.examples_fn(split.train, seed, gan=False)(_rngs(seed, 0, B), 0)
    K = len(split.train.times)
    r = {"batch": B, "width": gc.ali.width, "dim": split.train.samples[0].shape[1],
         "marginals": K, "coupling": gc.ali.coupling,
         "ot_solves": K - 1 if gc.ali.coupling == "full" else 2}  # fmt: skip

    gan = train.init(gc, ali.make(gc), devices=one)
    with tempfile.TemporaryDirectory() as workdir:  # role=cfm reads G from a gan run's workdir
        with checkpoint.Checkpointer(os.path.join(workdir, "checkpoints"), async_save=False) as c:
            c.save(0, gan.state)
        cc = _config(size, "cfm", dataset, interpolant=workdir)
        cfm = train.init(cc, ali.make(cc), devices=one)
    noise_SB = gan_noise(step_keys(gan.state.rng, CHECKED_STEPS), B)
    t_SB = cfm_times(step_keys(cfm.state.rng, CHECKED_STEPS), B)
    gan_batch, cfm_batch = _device_batch(gan, gan_host), _device_batch(cfm, cfm_host)
    gan_params, gan_rows = first_steps(gan, gan_batch, CHECKED_STEPS)
    cfm_params, cfm_rows = first_steps(cfm, cfm_batch, CHECKED_STEPS)
    jax.tree.map(np.testing.assert_array_equal, cfm_params["g"], gan_params["g"])
    r["gan_step_s"] = step_seconds(gan, gan_batch, repeats)
    r["cfm_step_s"] = step_seconds(cfm, cfm_batch, repeats)
    otcfm = train.init(oc, ali.make(oc), devices=one)
    r["otcfm_step_s"] = step_seconds(otcfm, _device_batch(otcfm, cfm_host), repeats)

    r["batch_s"] = median_seconds(lambda: gan_fn(_rngs(seed, 0, B), 0), host_repeats)
    r["draw_s"] = median_seconds(lambda: batches.draw(split.train, _rngs(seed, 0, B)),
                                 host_repeats)  # fmt: skip
    clouds_KBD, i = batches.draw(split.train, _rngs(seed, 0, B)), int(gan_host["i_B"][0])
    if gc.ali.coupling == "full":
        chain = lambda: batches.couple(clouds_KBD)
    else:
        chain = lambda: batches.couple_triple(clouds_KBD, i)
    r["chain_s"] = median_seconds(chain, host_repeats)

    x_ND, y_ND = clouds_KBD[0], clouds_KBD[1]  # marginals 0 and 1 of the batch's draws
    exact_N = ot.exact_coupling(x_ND, y_ND)
    r["exact_pair_s"] = median_seconds(lambda: ot.exact_coupling(x_ND, y_ND), host_repeats)
    x, y = jnp.asarray(x_ND), jnp.asarray(y_ND)
    r["sinkhorn_pair_s"] = median_seconds(lambda: sinkhorn_map(x, y).block_until_ready(),
                                          host_repeats)  # fmt: skip
    r["sinkhorn_agreement"] = float(np.mean(np.asarray(sinkhorn_map(x, y)) == exact_N))
    plan_NM = np.asarray(sinkhorn_plan(x, y), np.float64)
    r["sinkhorn_row_error"] = float(np.abs(plan_NM.sum(1) * len(x_ND) - 1).max())

    r["ours"] = {"d_loss": [row["d/loss"] for row in gan_rows],
                 "g_loss": [row["g/loss"] for row in gan_rows],
                 "g_adv": [row["g/adv"] for row in gan_rows],
                 "g_reg": [row["g/reg"] for row in gan_rows],
                 "cfm_loss": [row["loss"] for row in cfm_rows]}  # fmt: skip
    if r["dim"] == 1:  # the official's first CFM loss, reproduced with its [B, B] broadcast
        x0, x1 = (jnp.asarray(cfm_host["x_BKD"][:, k]) for k in (0, -1))
        r["ours"]["official_1d_cfm_loss"] = official_1d_cfm_loss(
            cfm_params["v"], cfm_params["g"], x0, x1, jnp.asarray(t_SB[0])
        )
    inputs = official_inputs(gc, cc, gan_params["g"], gan_params["d"], cfm_params["v"], gan_host,
                             cfm_host, split.train.times, noise_SB, t_SB, repeats)  # fmt: skip
    r["theirs"] = run_official(inputs)
    return r


def check_official(r: dict) -> None:
    """The official losses equal ours (AssertionError otherwise). Where D = 1 the official CFM
    target is a [B, B] broadcast (`official_1d_cfm_loss`): its first loss is checked against
    that reproduction, and its second, after an update on that loss, is not compared."""
    ours, theirs = r["ours"], r["theirs"]
    for k in ("d_loss", "g_loss", "g_adv", "g_reg"):
        np.testing.assert_allclose(theirs[k], ours[k], rtol=RTOL, err_msg=k)
    if r["dim"] == 1:
        np.testing.assert_allclose(theirs["cfm_loss"][0], ours["official_1d_cfm_loss"],
                                   rtol=RTOL, err_msg="cfm_loss (the 1-D broadcast)")  # fmt: skip
    else:
        np.testing.assert_allclose(theirs["cfm_loss"], ours["cfm_loss"], rtol=RTOL,
                                   err_msg="cfm_loss")  # fmt: skip


def _ratios(ds: str, r: dict) -> list[Ratio]:
    B, eps, iters = r["batch"], SINKHORN_EPS, SINKHORN_ITERS
    out = [
        Ratio(f"{ds}: host batch (draws + OT chain) / jitted GAN step, B={B}", "host batch",
              r["batch_s"], "GAN step (D, then G)", r["gan_step_s"], "s"),
        Ratio(f"{ds}: OT chain ({r['ot_solves']} exact couplings) in the host batch",
              "OT chain", r["chain_s"], "host batch", r["batch_s"], "s"),
        Ratio(f"{ds}: CFM step (frozen G, jvp target) / OT-CFM baseline step", "CFM",
              r["cfm_step_s"], "OT-CFM", r["otcfm_step_s"], "s"),
        Ratio(f"{ds}: {B}x{B} coupling, Sinkhorn in jit ({iters} sweeps, eps {eps}) / "
              "exact POT on host", "Sinkhorn in jit", r["sinkhorn_pair_s"], "POT exact",
              r["exact_pair_s"], "s"),
    ]  # fmt: skip
    if "import_error" not in r["theirs"]:
        for stage in ("gan", "cfm"):
            threads, seconds = r[f"official_{stage}"]
            out.append(Ratio(f"{ds}: {stage.upper()} step throughput, ours (JAX) / official "
                             "(PyTorch, its faster thread count)", "ours",
                             1 / r[f"{stage}_step_s"], f"official, {threads} thread(s)",
                             1 / seconds, "steps/s"))  # fmt: skip
    return out


def _notes(ds: str, r: dict) -> list[str]:
    ms = lambda s: f"{s * 1e3:.2f} ms"
    total = r["batch_s"] + r["gan_step_s"]
    faster = "exact POT on the host" if r["exact_pair_s"] < r["sinkhorn_pair_s"] else "Sinkhorn"
    notes = [
        f"{ds} (D={r['dim']}, K={r['marginals']}): a GAN step is {ms(total)} of host batch + "
        f"networks: the batch {ms(r['batch_s'])} (draws {ms(r['draw_s'])}, OT chain "
        f"{ms(r['chain_s'])} = {r['chain_s'] / total:.0%} of the whole), the jitted networks "
        f"{ms(r['gan_step_s'])} ({r['gan_step_s'] / total:.0%})",
        f"{ds}: {faster} is faster at {r['batch']}x{r['batch']} ({ms(r['exact_pair_s'])} exact "
        f"vs {ms(r['sinkhorn_pair_s'])} Sinkhorn); the Sinkhorn argmax map agrees with the exact "
        f"permutation on {r['sinkhorn_agreement']:.0%} of rows (row marginals off by up to "
        f"{r['sinkhorn_row_error']:.1e} relative); in jit the batch's chain would be "
        f"{r['ot_solves']} such solves; the method keeps exact OT on the host, as the paper "
        "couples by exact OT",
    ]
    if "gan_speedup" in r:
        notes.append(f"{ds}: ours over the official (losses checked equal first): GAN step "
                     f"{r['gan_speedup']:.2f}x, CFM step {r['cfm_speedup']:.2f}x its throughput "
                     "(the aim: 2x)")  # fmt: skip
        times = "; ".join(f"{n} thread(s): GAN {ms(t['gan'])}, CFM {ms(t['cfm'])}"
                          for n, t in r["theirs"]["seconds"].items())  # fmt: skip
        same = r["theirs"]["seconds"][str(os.cpu_count() or 1)]
        stalled = any(same[k] > 2 * r[f"official_{k}"][1] for k in ("gan", "cfm"))
        notes.append(f"{ds}: official step times, torch at {times}" + (
            f" (at {os.cpu_count()} threads it stalled: its OpenMP threads contend with the "
            "host's other load)" if stalled else ""))  # fmt: skip
    return notes


DEVIATIONS = (
    "the official CFM step pairs x0, x1 by torchcfm's sample_plan (cfm_ot border/full) or by "
    "sampled triplets (mmot, the 5-D configs); ours takes the endpoints of the exact OT chain "
    "through all K marginals; the comparison feeds both steps the same x0, x1 and t",
    "the official dI_dt squeezes its [B, 1, 1] outputs to [B] when D = 1, so its CFM target "
    "broadcasts to [B, B] (rows mixed): trimodal's official CFM loss is not ours (its first "
    "loss is checked against a reproduction of that broadcast)",
    "the official forward draws G's t-noise with torch.randn_like: for the checked steps it "
    "returns our step's draw",
)


def measure(*, smoke: bool = False) -> Result:
    size, datasets = ("smoke", DATASETS[:1]) if smoke else ("small", DATASETS)
    repeats, host_repeats = (2, 2) if smoke else (200, 30)
    records = {ds: measure_dataset(size, ds, repeats, host_repeats) for ds in datasets}
    ratios, notes = [], []
    for ds, r in records.items():
        theirs = r["theirs"]
        if "import_error" in theirs:
            line = (
                f"{ds}: official PyTorch comparison skipped ({theirs['import_error']}): set "
                "ALI_CFM_TORCH_PYTHON to a python with torch, ALI_CFM_OFFICIAL to a checkout"
            )
            print(f"ali_cfm: {line}", flush=True)
            notes.append(line)
        else:
            check_official(r)  # before any of its times is reported
            for stage in ("gan", "cfm"):  # the official's faster thread count, and our speedup
                threads, seconds = min(((int(n), t[stage]) for n, t in theirs["seconds"].items()),
                                       key=lambda nt: nt[1])  # fmt: skip
                r[f"official_{stage}"] = (threads, seconds)
                r[f"{stage}_speedup"] = seconds / r[f"{stage}_step_s"]
        ratios += _ratios(ds, r)
        notes += _notes(ds, r)
    if any("import_error" not in r["theirs"] for r in records.values()):
        notes += [f"deviation: {d}" for d in DEVIATIONS]
    details = {"size": size, "sinkhorn": {"eps": SINKHORN_EPS, "iters": SINKHORN_ITERS},
               "checked_steps": CHECKED_STEPS, "rtol": RTOL, "host_cpu_count": os.cpu_count(),
               **records}  # fmt: skip
    return Result(ratios, details, notes)
