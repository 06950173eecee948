"""The official ALI-CFM GAN and CFM steps (PyTorch) on our weights and batches, run by `bench.py`
in a process of its own (torch and numpy only: no JAX, so any interpreter with torch will do):

    ALI_CFM_OFFICIAL=/path/to/adversarially-learned-interpolants \\
        /path/to/python-with-torch methods/ali_cfm/bench_official.py IN.npz

IN.npz (`bench.official_inputs`): our initial G, D and u_theta in torch's state-dict names and
layout (weights [out, in]), one GAN batch (x0, x1, xt and its time t) with the t-noise our steps
draw, one CFM batch (x0, x1) with the times our steps draw, and the settings.

From the checkout that ALI_CFM_OFFICIAL names, `ali_cfm/nets.py` is imported as it is
(`TrainableInterpolant`, `Discriminator`, `MLP`: torch and numpy only). Its steps live in
`ali_cfm/training/training_funcs.py`, whose imports pull in wandb, tqdm, POT and the repo's
plotting and metric modules (pandas, matplotlib, scikit-learn): `gan_step` and `cfm_step` below
copy the lines of one loop iteration of its two training functions instead, minus the batch
sampling and the logging. Prints one JSON line: each checked step's losses, then, at each of
the settings' thread counts, the median seconds of a GAN step and of a CFM step (Adam at the
settings' rates, torch's other defaults, as the official scripts build them), or
{"import_error": ...} when torch or the checkout is missing.
"""

import contextlib
import json
import os
import statistics
import sys
import time
import warnings

import numpy as np


def gan_step(interpolant, discriminator, opt_g, opt_d, x0, x1, xt, t_value, correct_coeff):
    """One iteration of `train_interpolant_with_gan` (training_funcs.py) after its batch
    (`sample_full_batch` gives xts and the scalar t) and before its `wandb.log`, for the
    settings the benchmark runs: gan_loss "RpGAN" (r1 = r2 = 0), reg_term_type "linear",
    reg_metric "l2". Returns (d_loss, g_loss, g_loss_, reg_weight_loss)."""
    import torch
    import torch.nn.functional as F

    xts = {0: x0, 1: x1}  # sample_full_batch's {t / t_max: x}: the entries the regulariser reads
    batch_size = x0.shape[0]
    # --- copied from training_funcs.py:train_interpolant_with_gan -----------------------------
    t = torch.ones(batch_size, 1) * t_value

    xt_fake = interpolant(x0, x1, t)

    real_inputs = torch.cat([xt, t], dim=-1)
    fake_inputs = torch.cat([xt_fake.detach(), t], dim=-1)

    real_proba = discriminator(real_inputs)
    fake_proba = discriminator(fake_inputs)

    # Train discriminator
    opt_d.zero_grad()
    r1 = 0
    r2 = 0
    d_loss = F.softplus((fake_proba - real_proba) + r1 + r2).mean()

    d_loss.backward()
    opt_d.step()

    # Train generator
    opt_g.zero_grad()
    real_inputs = torch.cat([xt, t], dim=-1)
    fake_inputs = torch.cat([xt_fake, t], dim=-1)

    real_proba = discriminator(real_inputs)
    fake_proba = discriminator(fake_inputs)
    g_loss_ = F.softplus((real_proba - fake_proba)).mean()  # noqa: UP034 (as the official)

    reg_weight_loss = interpolant.compute_linear_reg_term(xt_fake, xts, t, "l2", 0.2, 0.2)

    g_loss = g_loss_ + correct_coeff * reg_weight_loss
    g_loss.backward()
    opt_g.step()
    # --- end of the copy ----------------------------------------------------------------------
    return d_loss, g_loss, g_loss_, reg_weight_loss


def cfm_step(ot_cfm_model, ot_cfm_optimizer, interpolant, x0, x1, t):
    """One iteration of `train_ot_cfm` (training_funcs.py) with its batch (x0, x1) and its
    `t = torch.rand(B, 1)` given, before its `wandb.log`. Returns the loss."""
    import torch

    # --- copied from training_funcs.py:train_ot_cfm -------------------------------------------
    ot_cfm_optimizer.zero_grad()

    xt = interpolant(x0, x1, t, training=False).detach()
    ut = interpolant.dI_dt(x0, x1, t).detach()

    vt = ot_cfm_model(torch.cat([xt, t], dim=-1))

    loss = torch.mean((vt - ut) ** 2)
    loss.backward()
    ot_cfm_optimizer.step()
    # --- end of the copy ----------------------------------------------------------------------
    return loss


@contextlib.contextmanager
def fixed_noise(noise):
    """`torch.randn_like` returns `noise` (our step's t-noise) inside: the official forward
    draws G's t-noise with it, and the checked losses need the draw our step made."""
    import torch

    draw = torch.randn_like
    torch.randn_like = lambda like: noise.reshape(like.shape).to(like.dtype)
    try:
        yield
    finally:
        torch.randn_like = draw


def _modules(s: dict, arrays: dict):
    """The official G, D and u_theta, as `scripts/train_ali_single_cell.py:train_ali` builds
    them, holding our weights (every entry set: load_state_dict is strict)."""
    from ali_cfm.nets import MLP, Discriminator, TrainableInterpolant

    interpolant = TrainableInterpolant(dim=s["dim"], h_dim=s["width"], t_smooth=s["t_smooth"])
    discriminator = Discriminator(in_dim=s["dim"] + 1, w=s["width"], apply_sigmoid=False)
    model = MLP(dim=s["dim"], time_varying=True, w=s["width"])
    import torch

    for prefix, module in (("g.", interpolant), ("d.", discriminator), ("v.", model)):
        state = {k[len(prefix) :]: torch.from_numpy(v) for k, v in arrays.items()
                 if k.startswith(prefix)}  # fmt: skip
        module.load_state_dict(state, strict=True)
    return interpolant, discriminator, model


def _median_seconds(fn, repeats: int, budget_s: float, warmup: int = 3) -> float:
    """Median seconds of `fn()` over `repeats` calls, or over those that fit in `budget_s`
    (at least 5): a step that stalls (threads contending for busy cores) ends in seconds."""
    for _ in range(warmup):
        fn()
    times, end = [], time.perf_counter() + budget_s
    while len(times) < repeats and (len(times) < 5 or time.perf_counter() < end):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(path: str) -> dict:
    try:
        import torch

        sys.path.insert(0, os.environ["ALI_CFM_OFFICIAL"])
        with warnings.catch_warnings():  # nets.py imports numpy.matlib (deprecated)
            warnings.simplefilter("ignore")
            import ali_cfm.nets  # noqa: F401
    except (ImportError, KeyError) as e:
        return {"import_error": repr(e)}
    with np.load(path) as z:
        arrays = dict(z)
    s = json.loads(str(arrays.pop("settings")))
    torch.set_num_threads(s["threads"][0])  # the checked steps at the first thread count
    names = ("gan_x0", "gan_x1", "gan_xt", "gan_noise_SB", "cfm_x0", "cfm_x1", "cfm_t_SB")
    x0, x1, xt, noise_SB, c0, c1, t_SB = (torch.from_numpy(arrays.pop(k)) for k in names)
    adam = lambda module, lr: torch.optim.Adam(module.parameters(), lr=lr)

    interpolant, discriminator, _ = _modules(s, arrays)
    opt_g, opt_d = adam(interpolant, s["gan_lr"]), adam(discriminator, s["gan_lr"])
    gan = lambda: gan_step(interpolant, discriminator, opt_g, opt_d, x0, x1, xt, s["t"],
                           s["correct_coeff"])  # fmt: skip
    out = {k: [] for k in ("d_loss", "g_loss", "g_adv", "g_reg", "cfm_loss")}
    for noise_B in noise_SB:  # the checked steps, from our initial weights
        with fixed_noise(noise_B):
            losses = gan()
        for k, v in zip(("d_loss", "g_loss", "g_adv", "g_reg"), losses, strict=True):
            out[k].append(v.item())

    # The CFM stage on a fresh copy: G as it started (ours reads the GAN run's initial state).
    frozen, _, model = _modules(s, arrays)
    opt_v = adam(model, s["cfm_lr"])
    for t_B in t_SB:
        out["cfm_loss"].append(cfm_step(model, opt_v, frozen, c0, c1, t_B[:, None]).item())

    cfm = lambda: cfm_step(model, opt_v, frozen, c0, c1, torch.rand(c0.shape[0], 1))
    out["seconds"] = {}  # {threads: {"gan": median s, "cfm": median s}}
    for threads in s["threads"]:
        torch.set_num_threads(threads)
        out["seconds"][threads] = {
            "gan": _median_seconds(gan, s["repeats"], s["budget_s"]),
            "cfm": _median_seconds(cfm, s["repeats"], s["budget_s"]),
        }
    out["torch"] = torch.__version__
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
