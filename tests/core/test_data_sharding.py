"""core.data and core.sharding: process-count invariance, resumption, layout rules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from configs.common import mesh_config
from core import data, sharding
from core.errors import ConfigError
from core.mesh import make_mesh


def example(rng):
    return {"x": rng.normal(size=3).astype(np.float32), "i": rng.integers(0, 100)}


def test_global_batches_do_not_depend_on_the_process_count():
    one = data.synthetic(example, global_batch=8, seed=3, shard=(0, 1))
    two = [data.synthetic(example, global_batch=8, seed=3, shard=(p, 2)) for p in range(2)]
    for _ in range(3):
        whole = next(one)
        parts = [next(it) for it in two]
        for key in whole:
            np.testing.assert_array_equal(whole[key], np.concatenate([p[key] for p in parts]))


def test_synthetic_iterator_resumes_exactly():
    it = data.synthetic(example, global_batch=4, seed=0)
    next(it)
    saved = it.get_state()
    expected = [next(it)["x"] for _ in range(2)]
    fresh = data.synthetic(example, global_batch=4, seed=0)
    fresh.set_state(saved)
    np.testing.assert_array_equal(
        np.stack(expected), np.stack([next(fresh)["x"] for _ in range(2)])
    )


def test_an_indexed_stream_sees_its_global_batch_index_also_after_a_resume():
    def example_at(rng, b):  # a curriculum keyed by the step
        return {**example(rng), "b": np.int32(b)}

    it = data.synthetic(example_at, global_batch=4, seed=0, indexed=True, shard=(1, 2))
    assert [int(next(it)["b"][0]) for _ in range(3)] == [0, 1, 2]
    fresh = data.synthetic(example_at, global_batch=4, seed=0, indexed=True, shard=(1, 2))
    fresh.set_state(it.get_state())
    resumed = next(fresh)
    assert resumed["b"].tolist() == [3, 3]
    plain = data.synthetic(example, global_batch=4, seed=0, shard=(1, 2))
    for _ in range(3):
        next(plain)
    np.testing.assert_array_equal(resumed["x"], next(plain)["x"])  # the same generators


def test_a_vectorised_examples_fn_gives_the_same_stream():
    def examples(rngs):  # what example() draws, per generator, stacked in one call
        return {
            "x": np.stack([r.normal(size=3) for r in rngs]).astype(np.float32),
            "i": np.array([r.integers(0, 100) for r in rngs]),
        }

    one = data.synthetic(example, global_batch=8, seed=3)
    halves = [
        data.synthetic(examples_fn=examples, global_batch=8, seed=3, shard=(p, 2)) for p in (0, 1)
    ]
    for _ in range(2):
        whole, parts = next(one), [next(h) for h in halves]
        for key in whole:
            np.testing.assert_array_equal(whole[key], np.concatenate([p[key] for p in parts]))
    with pytest.raises(ConfigError, match="exactly one of example_fn and examples_fn"):
        data.synthetic(example, examples_fn=examples, global_batch=8, seed=0)


def test_seeds_give_different_streams():
    a = next(data.synthetic(example, global_batch=4, seed=0))["x"]
    b = next(data.synthetic(example, global_batch=4, seed=1))["x"]
    assert not np.array_equal(a, b)


def test_in_memory_epochs_are_permutations_and_process_count_invariant():
    arrays = {"x": np.arange(10) * 10, "y": np.arange(20).reshape(10, 2)}
    one = [next(it) for it in [data.in_memory(arrays, global_batch=5, seed=3)] for _ in range(4)]
    stream = np.concatenate([b["x"] for b in one])
    for epoch in (stream[:10], stream[10:]):  # each epoch visits every example once
        np.testing.assert_array_equal(np.sort(epoch), arrays["x"])
    assert not np.array_equal(stream[:10], stream[10:])  # a new order per epoch
    np.testing.assert_array_equal(one[0]["y"][:, 0], one[0]["x"] // 5)  # rows stay together
    halves = [data.in_memory(arrays, global_batch=4, seed=3, shard=(p, 2)) for p in (0, 1)]
    whole = data.in_memory(arrays, global_batch=4, seed=3)
    for _ in range(3):
        joined = np.concatenate([next(h)["x"] for h in halves])
        np.testing.assert_array_equal(joined, next(whole)["x"])
    full = next(data.in_memory(arrays, global_batch=10, seed=0, shuffle=False))
    np.testing.assert_array_equal(full["x"], arrays["x"])
    with pytest.raises(ConfigError, match="one shared leading dimension"):
        data.in_memory({"x": np.arange(3), "y": np.arange(4)}, global_batch=1, seed=0)


def test_batch_not_divisible_by_processes():
    with pytest.raises(ConfigError, match="not divisible by the process count 3"):
        data.synthetic(example, global_batch=8, seed=0, shard=(0, 3))


def test_to_global_places_the_batch_over_the_data_axes():
    mesh = make_mesh(mesh_config("cpu"))
    batch = data.to_global({"x": np.arange(16.0).reshape(8, 2)}, sharding.batch_sharding(mesh))
    assert batch["x"].sharding.spec == P(("data", "fsdp"))
    np.testing.assert_array_equal(np.asarray(batch["x"]), np.arange(16.0).reshape(8, 2))
    assert len(batch["x"].addressable_shards) == 8


def mesh_of(shape):
    config = mesh_config("cpu")
    config.shape = shape
    return make_mesh(config)


def test_mesh_fills_minus_one_and_uses_auto_axes():
    mesh = mesh_of((-1, 2, 1))
    assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "model": 1}
    assert all(t == jax.sharding.AxisType.Auto for t in mesh.axis_types)


def test_multislice_mesh_needs_as_many_granules_as_dcn_shape():
    config = mesh_config("cpu")
    config.shape, config.dcn_shape = (1, 4, 1), (-1, 1, 1)
    # One process with 8 devices is one granule; the -1 asks for 8 / 4 = 2 of them.
    with pytest.raises(ConfigError, match=r"needs 2 processes, but the devices span 1"):
        make_mesh(config)
    config.dcn_shape = (1, 1, 1)
    config.shape = (2, -1, 1)
    mesh = make_mesh(config)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "model": 1}


def test_fsdp_shards_the_largest_divisible_dim_and_rules_come_first():
    mesh = mesh_of((2, 2, 2))
    rules = ((r"attn/q/kernel$", P(None, "model")),)
    tree = {
        "attn": {"q": {"kernel": jnp.zeros((64, 128))}},  # rule on dim 1, FSDP on dim 0
        "mlp": {"kernel": jnp.zeros((64, 256))},  # FSDP on the larger dim 1
        "scale": jnp.zeros((64,)),  # below fsdp_min_size: replicated
        "odd": jnp.zeros((63, 129)),  # not divisible by 2 anywhere: replicated
    }
    specs = jax.tree.map(lambda s: s.spec, sharding.tree_shardings(tree, mesh, rules, 1024))
    assert specs["attn"]["q"]["kernel"] == P("fsdp", "model")
    assert specs["mlp"]["kernel"] == P(None, "fsdp")
    assert specs["scale"] == P(None)
    assert specs["odd"] == P(None, None)


def test_rules_drop_axes_the_mesh_lacks_or_that_do_not_divide():
    mesh = mesh_of((8, 1, 1))
    rules = ((r"w$", P("model", "data")),)
    spec = sharding.tree_shardings({"w": jnp.zeros((4, 6))}, mesh, rules)["w"].spec
    # "model" has size 1 (kept, harmless); 6 is not divisible by data=8 (dropped).
    assert spec == P("model", None)


def test_optimizer_state_follows_the_parameter_layout():
    mesh = mesh_of((1, 4, 2))
    rules = ((r"attn/q/kernel$", P(None, "model")),)
    params = {"attn": {"q": {"kernel": jnp.zeros((64, 128))}}}
    state = {"params": params, "opt_state": optax.adam(1e-3).init(params)}
    shardings = sharding.tree_shardings(state, mesh, rules, 1024)
    param_spec = shardings["params"]["attn"]["q"]["kernel"].spec
    mu_spec = shardings["opt_state"][0].mu["attn"]["q"]["kernel"].spec
    assert param_spec == mu_spec == P("fsdp", "model")


def test_check_batch_size_names_the_data_parallel_size():
    with pytest.raises(ConfigError, match="not divisible by the data-parallel size 4"):
        sharding.check_batch_size(6, mesh_of((2, 2, 2)))
