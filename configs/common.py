"""The base config every method config starts from, and the mesh presets.

Select a preset with the config string, e.g. `--config=configs/lm.py:mesh=tpu,size=small`; any
field can then be overridden, e.g. `--config.train.steps=100 --config.mesh.shape=2,4,1`.
"""

from ml_collections import ConfigDict

from core.errors import ConfigError

AXES = ("data", "fsdp", "model")

# shape: per slice/node; dcn_shape: across slices/nodes (empty for one). -1 is filled from the
# device count. Data parallelism goes over the slow links, FSDP/tensor parallelism over fast ones.
MESH_PRESETS = {
    # All local CPU devices data-parallel (8 fake devices in tests).
    "cpu": dict(shape=(-1, 1, 1), dcn_shape=(), platform="cpu"),
    # One GPU node: FSDP over NVLink-connected GPUs.
    "gpu": dict(shape=(1, -1, 1), dcn_shape=(), platform="gpu"),
    # Several GPU nodes (one process per GPU or per node): FSDP inside a node of 8 GPUs,
    # data parallel across nodes. Override mesh.shape for nodes with another GPU count.
    "gpu_multinode": dict(shape=(1, 8, 1), dcn_shape=(-1, 1, 1), platform="gpu"),
    # One TPU slice (v4, v5e, v5p, v6e alike): FSDP over all chips of the slice.
    "tpu": dict(shape=(1, -1, 1), dcn_shape=(), platform="tpu"),
    # One TPU slice with 4-way tensor parallelism (large models).
    "tpu_tp4": dict(shape=(1, -1, 4), dcn_shape=(), platform="tpu"),
    # Multi-slice TPU: data parallel across 2 slices over DCN; set mesh.dcn_shape for more.
    "tpu_multislice": dict(shape=(1, -1, 1), dcn_shape=(2, 1, 1), platform="tpu"),
    # Whatever devices are there, data-parallel (notebooks, quick looks).
    "auto": dict(shape=(-1, 1, 1), dcn_shape=(), platform="auto"),
}


def mesh_config(preset: str) -> ConfigDict:
    if preset not in MESH_PRESETS:
        raise ConfigError(
            f"mesh={preset!r} is not a preset; expected one of: {', '.join(MESH_PRESETS)}"
        )
    return ConfigDict({"axes": AXES, **MESH_PRESETS[preset]})


def parse_arg(arg: str | None, defaults: dict[str, str]) -> dict[str, str]:
    """Parse the config string "key=value,key=value" against known keys and defaults."""
    options = dict(defaults)
    for item in filter(None, (arg or "").split(",")):
        key, sep, value = item.partition("=")
        if not sep or key not in defaults:
            raise ConfigError(
                f"config argument {item!r} is not key=value with key in: {', '.join(defaults)}"
            )
        options[key] = value
    return options


def choose(field: str, value: str, known):
    """`known[value]` (a dict) or `value` (a tuple/list of names), or a ConfigError naming the
    field and the choices: the check every config option of the form name=value needs."""
    if value not in known:
        raise ConfigError(f"{field}={value!r} is unknown; expected one of: {', '.join(known)}")
    return known[value] if isinstance(known, dict) else value


def base_config(mesh: str = "auto") -> ConfigDict:
    c = ConfigDict()
    c.method = ""
    c.seed = 0
    # The precision policy (core/precision.py): compute dtype (params stay float32) and the
    # default precision of every matmul the core traces ("auto": highest when computing in
    # float32, default in bfloat16). Float32-only methods set dtype="float32" in their config.
    c.dtype = "auto"  # float32 on CPU, bfloat16 compute on accelerators
    c.matmul_precision = "auto"
    c.mesh = mesh_config(mesh)
    c.fsdp_min_size = 2**14  # leaves smaller than this stay replicated under FSDP

    c.train = ConfigDict()
    c.train.steps = 1000
    c.train.batch_size = 64  # global, across all devices and processes
    c.train.log_every = 50
    c.train.eval_every = 0  # >0: every N steps and at the end; 0: at the end; <0: never
    c.train.checkpoint_every = 500  # 0: never
    c.train.keep_checkpoints = 2
    # Another run's workdir (or its checkpoints/ folder): start from the params of its newest
    # good checkpoint, placed in this run's layout; optimiser state and step start fresh. Or
    # "pretrained:<name or path>" (core.pretrained: a registered name, a .gguf file or a Hugging
    # Face Llama folder), for a method whose params are a transformer tree of that shape.
    c.train.init_from = ""
    # Instruments (they observe a run, nothing it computes depends on them):
    # "first:last": a jax.profiler trace of those steps in <workdir>/profile (core/profile.py).
    c.train.profile = ""
    # Every metrics row also as TensorBoard scalars in <workdir>/tensorboard (local workdirs).
    c.train.tensorboard = False

    c.optim = ConfigDict()
    c.optim.name = "adamw"
    c.optim.lr = 1e-3
    c.optim.b1 = 0.9
    c.optim.b2 = 0.999
    c.optim.eps = 1e-8
    c.optim.weight_decay = 0.0
    c.optim.weight_decay_end = None  # a number: a cosine from weight_decay to it (adamw, lion)
    c.optim.momentum = 0.0
    c.optim.warmup_steps = 0
    c.optim.schedule = "constant"
    c.optim.final_lr_fraction = 0.0
    c.optim.grad_clip = 0.0  # 0: off
    return c


def set_training(c: ConfigDict, *, steps: int, batch_size: int, lr: float) -> ConfigDict:
    """The usual training defaults for a run of `steps`: log 10 times (at most every 100 steps),
    checkpoint half-way and at the end, 10 % warmup (at most 100 steps) then cosine decay,
    global-norm clipping at 1."""
    c.train.steps = steps
    c.train.batch_size = batch_size
    c.train.log_every = max(1, min(100, steps // 10))
    c.train.checkpoint_every = max(1, steps // 2)
    c.optim.lr = lr
    c.optim.warmup_steps = min(100, steps // 10)
    c.optim.schedule = "cosine"
    c.optim.grad_clip = 1.0
    return c
