"""core.aot's pure parts (no libtpu or CUDA plugin needed): target names, HLO collective
bytes, and the step `compile_step` compiles being the trainer's."""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from configs.common import base_config
from core import aot, train
from core.errors import ConfigError
from core.method import Method

# TPU's compiled HLO prints operands without shapes; CPU/GPU print them inline. Async pairs
# ("-start" / "-done") must count once; to_apply=%region is an attribute, not an operand.
HLO = """
  %p0 = bf16[1024,512]{1,0:T(8,128)(2,1)} parameter(0)
  %p1 = f32[256]{0} parameter(1)
  %ar = (bf16[1024,512]{1,0}, f32[256]{0}) all-reduce(%p0, %p1), channel_id=1, to_apply=%region_0
  %ag = f32[4096]{0} all-gather-start(f32[256]{0} %p1), dimensions={0}
  %agd = f32[4096]{0} all-gather-done(%ag)
  %rs = f32[16]{0} reduce-scatter(%p1), dimensions={0}, to_apply=%region_1
  ROOT %cp = bf16[1024,512]{1,0} collective-permute(%p0), source_target_pairs={{0,1}}
  %add.1 = f32[256]{0} add(%p1, %p1)
"""


def test_collective_bytes_are_operand_bytes_per_kind():
    got = aot.collective_bytes(HLO)
    assert got == {
        "all-reduce": 1024 * 512 * 2 + 256 * 4,
        "all-gather": 256 * 4,  # the operand, not the gathered result
        "reduce-scatter": 256 * 4,  # the operand, not the scattered result
        "all-to-all": 0,
        "collective-permute": 1024 * 512 * 2,
    }


def test_shape_bytes_reads_dtypes_and_skips_tokens():
    assert aot.shape_bytes("(f32[2,3]{1,0}, s8[5]{0}, pred[], token[])") == 24 + 5 + 1
    assert aot.shape_bytes("f8e4m3fn[4,4]") == 16


@pytest.mark.parametrize(
    "name,want",
    [
        ("v5e:16x16", aot.Target("v5e:16x16", "tpu", "v5e", "16x16", 1)),
        ("2xv5e:16x16", aot.Target("2xv5e:16x16", "tpu", "v5e", "16x16", 2)),
        ("h100:2x4x8", aot.Target("h100:2x4x8", "gpu", "h100", "2x4x8", 1)),
    ],
)
def test_targets_parse(name, want):
    assert aot.parse_target(name) == want


@pytest.mark.parametrize("name", ["v5e-256", "v9:2x2", "h100:8", "b200:1x1x8"])
def test_bad_targets_are_one_line_config_errors(name):
    with pytest.raises(ConfigError, match=name) as e:
        aot.parse_target(name)
    assert "\n" not in str(e.value)


def test_compile_step_compiles_the_trainers_step_and_shardings(monkeypatch):
    """`compile_step` takes the step and shardings of `core.train.plan`, the ones `init` uses;
    here for this machine's CPU devices (no plugin), with a 2-way FSDP mesh."""
    import numpy as np

    from core import data

    def init(rng, batch_spec):
        return {"params": {"w": jax.random.normal(rng, (256, 128))}}

    def loss(params, batch, *, rng, extra):
        return ((batch["x"] @ params["w"]) ** 2).mean(), {}

    def dataset(split, *, shard, seed):
        example = lambda rng: {"x": rng.normal(size=256).astype(np.float32)}
        return data.synthetic(example, global_batch=8, seed=seed, shard=shard)

    config = base_config(mesh="auto")
    config.mesh.shape = (4, 2, 1)
    config.train.batch_size = 8
    config.fsdp_min_size = 1
    planned = []
    real_plan = train.plan

    def recording_plan(*args, **kwargs):
        planned.append(real_plan(*args, **kwargs))
        return planned[-1]

    monkeypatch.setattr(train, "plan", recording_plan)
    compiled = aot.compile_step(config, Method(init, loss, dataset=dataset), jax.devices()[:8])
    (plan,) = planned
    assert plan.state_shardings.params["w"].spec == P("fsdp", None)  # the trainer's FSDP rule
    specs = [s.spec for s in jax.tree.leaves(compiled.input_shardings)]
    assert P("fsdp", None) in specs and P(("data", "fsdp")) in specs  # params; the batch
    assert aot.collective_bytes(compiled.as_text())["all-reduce"] > 0
