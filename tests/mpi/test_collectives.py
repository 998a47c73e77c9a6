"""launcher collectives against NumPy references. Written for any MPI size and any number of
local devices: run as `pytest --with-mpi tests/mpi` and `mpirun -n 2 python -m pytest --with-mpi tests/mpi`."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import launcher

pytestmark = pytest.mark.mpi


@pytest.fixture(scope="module")
def world():
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def n_local():
    return jax.local_device_count()


def per_device_values(rank, base=1.0):
    """Row i holds (global device index + base), as the normalize job lays it out."""
    first = rank * n_local()
    return np.arange(first, first + n_local(), dtype=np.float32) + base


def test_stacked_pmap_leaf_sums_over_all_devices(world):
    rank, size = world
    x = jax.pmap(lambda v: v)(per_device_values(rank))
    total = launcher.allreduce(x)
    expected = np.arange(size * n_local(), dtype=np.float32).sum() + size * n_local()
    assert total.shape == x.shape
    np.testing.assert_allclose(np.asarray(total), np.full(n_local(), expected))
    normalized = np.asarray(x) / np.asarray(total)
    all_values = launcher.allgather(normalized)
    assert all_values.shape == (size * n_local(),)
    np.testing.assert_allclose(all_values.sum(), 1.0, rtol=1e-6)


def test_sharded_leaf_over_mesh_keeps_its_sharding(world):
    rank, size = world
    mesh = Mesh(np.array(jax.local_devices()), ("devices",))
    sharding = NamedSharding(mesh, PartitionSpec("devices"))
    x = jax.device_put(per_device_values(rank), sharding)
    out = launcher.allreduce(x, op="max")
    assert out.sharding == x.sharding or n_local() == 1
    np.testing.assert_allclose(np.asarray(out), np.full(n_local(), size * n_local(), np.float32))


@pytest.mark.parametrize("op, reference", [
    ("sum", lambda xs: np.sum(xs, axis=0)),
    ("mean", lambda xs: np.mean(xs, axis=0)),
    ("max", lambda xs: np.max(xs, axis=0)),
    ("min", lambda xs: np.min(xs, axis=0)),
])
def test_per_process_leaves_match_numpy(world, op, reference):
    rank, size = world
    contributions = [np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4) * (r + 1) - r for r in range(size)]
    out = launcher.allreduce({"np": contributions[rank], "jax": jnp.asarray(contributions[rank])}, op=op)
    np.testing.assert_allclose(out["np"], reference(np.stack(contributions)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["jax"]), reference(np.stack(contributions)), rtol=1e-6)
    assert isinstance(out["np"], np.ndarray) and isinstance(out["jax"], jax.Array)


def test_mixed_dtypes_scalars_and_nesting(world, transport_path):
    rank, size = world
    tree = {
        "f32": np.full((2, 3), rank + 1, np.float32),
        "f64": np.array([rank * 0.5], np.float64),
        "i32": jnp.array([rank, 2 * rank], jnp.int32),
        "scalar": float(rank),
        "int": rank + 1,
        "bf16": jnp.array([1.5, 2.0], jnp.bfloat16),
        "nested": [np.ones(5, np.float32), (np.int64(rank),)],
        "empty": np.zeros((0, 3), np.float32),
    }
    out = launcher.allreduce(tree)
    ranks = np.arange(size)
    np.testing.assert_allclose(out["f32"], np.full((2, 3), (ranks + 1).sum()))
    np.testing.assert_allclose(out["f64"], [ranks.sum() * 0.5])
    np.testing.assert_array_equal(np.asarray(out["i32"]), [ranks.sum(), 2 * ranks.sum()])
    assert out["i32"].dtype == np.int32 and out["f64"].dtype == np.float64
    assert out["scalar"] == pytest.approx(ranks.sum()) and isinstance(out["scalar"], float)
    assert out["int"] == (ranks + 1).sum() and isinstance(out["int"], int)
    assert out["bf16"].dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out["bf16"], np.float32), [1.5 * size, 2.0 * size])
    np.testing.assert_allclose(out["nested"][0], np.full(5, size))
    assert out["nested"][1][0] == ranks.sum()
    assert out["empty"].shape == (0, 3)


def test_empty_tree_is_returned_unchanged():
    assert launcher.allreduce({}) == {}
    assert launcher.allreduce([]) == []


def test_bool_any_and_all(world):
    rank, size = world
    out = launcher.allreduce({"any": np.array(rank == size - 1), "all": np.array(rank == 0)}, op="max")
    assert bool(out["any"]) is True
    assert bool(out["all"]) is True
    out = launcher.allreduce({"all": np.array(rank == 0)}, op="min")
    assert bool(out["all"]) is (size == 1)
    assert launcher.allreduce(np.array([True, False]), op="sum").tolist() == [size, 0]


def test_broadcast_from_root(world, transport_path):
    rank, size = world
    root = size - 1
    tree = {"a": np.full(3, rank, np.float32), "b": jnp.array(rank * 10, jnp.int32), "c": [float(rank)]}
    out = launcher.broadcast(tree, root=root)
    np.testing.assert_array_equal(out["a"], np.full(3, root, np.float32))
    assert int(out["b"]) == root * 10 and out["b"].dtype == jnp.int32
    assert out["c"][0] == root


def test_allgather_in_rank_order(world):
    rank, size = world
    out = launcher.allgather({"rows": np.full((2, 3), rank, np.int32), "scalar": np.float32(rank)})
    assert out["rows"].shape == (2 * size, 3)
    np.testing.assert_array_equal(out["rows"][:, 0], np.repeat(np.arange(size), 2))
    np.testing.assert_array_equal(out["scalar"], np.arange(size, dtype=np.float32))


def test_allgather_jax_leaves_in_rank_order(world):
    """jax.Array leaves (single-device, scalar, half precision, per-device rows) come back in rank
    order with their dtype; at MPI size 1 order cannot be seen, so this matters under mpirun -n 2."""
    rank, size = world
    stacked = jax.pmap(lambda v: v)(per_device_values(rank, base=0.0))
    tree = {"rows": jnp.full((2, 3), rank, jnp.int32), "scalar": jnp.float32(rank),
            "bf16": jnp.full((2,), rank + 0.5, jnp.bfloat16), "f16": jnp.array([rank, -rank], jnp.float16),
            "stacked": stacked}
    out = launcher.allgather(tree)
    ranks = np.arange(size)
    assert all(isinstance(leaf, jax.Array) for leaf in jax.tree_util.tree_leaves(out))
    assert out["rows"].shape == (2 * size, 3) and out["rows"].dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(out["rows"])[:, 0], np.repeat(ranks, 2))
    np.testing.assert_array_equal(np.asarray(out["scalar"]), ranks.astype(np.float32))
    assert out["bf16"].dtype == jnp.bfloat16 and out["f16"].dtype == jnp.float16
    np.testing.assert_array_equal(np.asarray(out["bf16"], np.float32), np.repeat(ranks + 0.5, 2))
    np.testing.assert_array_equal(np.asarray(out["f16"], np.float32), np.stack([ranks, -ranks], 1).ravel())
    np.testing.assert_array_equal(np.asarray(out["stacked"]), np.arange(size * n_local(), dtype=np.float32))


def test_allgather_half_precision_numpy_keeps_dtype(world):
    import ml_dtypes
    rank, size = world
    out = launcher.allgather({"bf16": np.full(2, rank + 0.5, ml_dtypes.bfloat16),
                              "f16": np.full(1, -rank, np.float16)})
    assert out["bf16"].dtype == ml_dtypes.bfloat16 and out["f16"].dtype == np.float16
    np.testing.assert_array_equal(out["bf16"].astype(np.float32), np.repeat(np.arange(size) + 0.5, 2))
    np.testing.assert_array_equal(out["f16"], -np.arange(size, dtype=np.float16))


def test_broadcast_keeps_half_precision_dtypes(world, transport_path):
    """bf16/f16 travel as float32 on the wire; what comes back must have the input's dtype."""
    import ml_dtypes
    rank, size = world
    root = size - 1
    tree = {"jax_bf16": jnp.full((3,), rank + 0.5, jnp.bfloat16), "jax_f16": jnp.full((2, 2), rank, jnp.float16),
            "np_bf16": np.full(2, rank + 0.25, ml_dtypes.bfloat16), "np_f16": np.float16(rank),
            "f32": jnp.full((1,), rank, jnp.float32)}
    out = launcher.broadcast(tree, root=root)
    for key, leaf in tree.items():
        assert np.dtype(out[key].dtype) == np.dtype(leaf.dtype), key
        assert np.shape(out[key]) == np.shape(leaf), key
    np.testing.assert_array_equal(np.asarray(out["jax_bf16"], np.float32), np.full(3, root + 0.5))
    np.testing.assert_array_equal(np.asarray(out["jax_f16"], np.float32), np.full((2, 2), root))
    np.testing.assert_array_equal(out["np_bf16"].astype(np.float32), np.full(2, root + 0.25))
    assert isinstance(out["np_f16"], np.float16) and float(out["np_f16"]) == root
    assert isinstance(out["jax_bf16"], jax.Array) and isinstance(out["np_bf16"], np.ndarray)


def test_barrier_returns():
    launcher.barrier()


def test_inside_pmap_the_collectives_refuse_and_name_psum():
    for call in (launcher.allreduce, launcher.broadcast, launcher.allgather):
        with pytest.raises(ValueError, match="named axis 'i'.*jax.lax.psum"):
            jax.pmap(call, axis_name="i")(jnp.ones((n_local(), 3)))


def step_tree(rank):
    """A gradient tree of 24 leaves of mixed sizes, a bfloat16 and a bool leaf, on the first device."""
    return {"w": [jnp.full((i % 7 + 1, 3), float(rank + i)) for i in range(24)],
            "half": jnp.array([rank, 0.5], jnp.bfloat16), "flag": jnp.array(rank > 0), "count": rank}


@pytest.mark.parametrize("op, path", [("sum", "fast"), ("mean", "fast"), ("max", "fast"), ("min", "fast"),
                                      ("sum", "ordered"), ("mean", "ordered")])
def test_inside_jit_the_allreduce_equals_the_one_outside_bit_for_bit(world, op, path, monkeypatch):
    """Issue 35: the exchange inside the job's jitted step, with the same semantics as outside,
    through mpi4jax's FFI target (fast) or its public ordered op."""
    from launcher.rank.collectives import transport
    if path == "ordered":
        monkeypatch.setattr(transport, "FAST_PATH", False)
    rank, _ = world
    tree = step_tree(rank)
    inside = jax.jit(lambda t: launcher.allreduce(t, op=op))(tree)
    outside = launcher.allreduce(tree, op=op)
    for a, b in zip(jax.tree.leaves(inside), jax.tree.leaves(outside)):
        if isinstance(b, jax.Array):  # a Python number comes back as one outside, as a JAX scalar inside
            assert a.dtype == b.dtype and a.shape == b.shape, (a, b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_jitted_data_parallel_step_exchanges_its_gradients(world):
    rank, size = world
    w = jnp.arange(4.0)

    @jax.jit
    def step(w, x):
        grads = jax.grad(lambda w: jnp.sum((x @ w) ** 2))(w)
        return w - 0.01 * launcher.allreduce(grads, op="mean")

    xs = [jnp.full((2, 4), float(r + 1)) for r in range(size)]
    expected = w - 0.01 * sum(jax.grad(lambda w, x=x: jnp.sum((x @ w) ** 2))(w) for x in xs) / size
    np.testing.assert_allclose(np.asarray(step(w, xs[rank])), np.asarray(expected), rtol=1e-6)


def test_inside_jit_broadcast_and_allgather_match_the_ones_outside(world):
    rank, size = world
    tree = {"x": jnp.arange(3.0) + rank, "h": jnp.ones(2, jnp.float16) * rank, "n": jnp.int32(rank)}
    inside_b, inside_g = jax.jit(lambda t: (launcher.broadcast(t, root=size - 1), launcher.allgather(t)))(tree)
    outside_b, outside_g = launcher.broadcast(tree, root=size - 1), launcher.allgather(tree)
    for a, b in zip(jax.tree.leaves((inside_b, inside_g)), jax.tree.leaves((outside_b, outside_g))):
        assert jnp.dtype(a.dtype) == jnp.dtype(np.asarray(b).dtype) and np.shape(a) == np.shape(b), (a, b)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unknown_op_lists_the_valid_ones():
    with pytest.raises(ValueError, match="op='prod' is not supported; use one of sum, mean, max, min"):
        launcher.allreduce(np.ones(2), op="prod")


def test_non_array_leaf_is_rejected():
    with pytest.raises(TypeError, match=r"tree\['x'\] is a str"):
        launcher.allreduce({"x": "text"})


@pytest.fixture(params=["staged", "fast", "ordered"])
def transport_path(request, monkeypatch):
    """Run a test over every way a leaf can travel: staged through host memory (mpi4py, the CPU's
    default for arrays on the first device), and the device path with mpi4jax's FFI target (fast)
    or its public ordered op."""
    from launcher.rank.collectives import choice, staged, transport
    if choice.current() == "xla":  # tier_xla.yaml: every device leaf goes one way, over XLA's collectives
        if request.param != "staged":
            pytest.skip("transport: xla has one path for every device leaf (run as the 'staged' case)")
        return "xla"
    if request.param != "staged":
        monkeypatch.setattr(staged, "STAGED", False)
    if request.param == "ordered":
        monkeypatch.setattr(transport, "FAST_PATH", False)
    else:
        assert transport.FAST_PATH, "mpi4jax internals not found: the fast path is off"
    return request.param


def test_many_leaves_mixed_sizes_and_dtypes(world, transport_path):
    """A 100-leaf 'gradient' tree plus leaves large enough to travel alone."""
    rank, size = world
    tree = {"grads": [jnp.full((97,), i + rank, jnp.float32) for i in range(100)],
            "big": jnp.full((1 << 20) + 3, rank + 1.0, jnp.float32),          # 4 MiB + 12 B: its own call
            "ints": jnp.arange(5, dtype=jnp.int32) * (rank + 1),
            "half": jnp.full((3,), 0.5, jnp.float16)}
    for op in ("sum", "mean", "max"):
        out = launcher.allreduce(tree, op=op)
        ranks = np.arange(size)
        per_rank = {"sum": np.sum, "mean": np.mean, "max": np.max}[op]
        for i, leaf in enumerate(out["grads"]):
            np.testing.assert_allclose(np.asarray(leaf), np.full(97, per_rank(i + ranks)), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(out["big"][:4]), per_rank(ranks + 1.0))
        np.testing.assert_allclose(np.asarray(out["ints"]), np.arange(5) * per_rank(ranks + 1), rtol=1e-6)
        assert out["half"].dtype == jnp.float16
        assert out["ints"].dtype == (np.float32 if op == "mean" else np.int32)


def test_calls_stay_paired_when_inputs_finish_out_of_order(world, transport_path):
    """Ranks alternate which call gets a slow (still computing) input and never block in between.
    If a later call could overtake an earlier one, ranks would pair different calls: wrong sums."""
    rank, size = world
    matrix = jnp.eye(128, dtype=jnp.float32)

    @jax.jit
    def slow(v):
        a = jnp.broadcast_to(v[:1], (128, 128))
        for _ in range(20):
            a = a @ matrix
        return v + (a[0, 0] - a[0, 0])

    outputs = []
    for i in range(60):
        value = jnp.full(256, float(i) + rank, jnp.float32)
        outputs.append(launcher.allreduce(slow(value) if (i + rank) % 2 == 0 else value))
    expected = [size * i + np.arange(size).sum() for i in range(60)]
    np.testing.assert_allclose([float(o[0]) for o in outputs], expected)


def test_fast_path_refuses_a_multi_device_computation():
    if n_local() < 2:
        pytest.skip("needs 2 local devices (XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    from mpi4py import MPI
    from launcher.rank.collectives import transport
    mesh = Mesh(np.array(jax.local_devices()), ("d",))
    x = jax.device_put(jnp.ones(4), NamedSharding(mesh, PartitionSpec("d")))
    with pytest.raises(NotImplementedError, match="runs only in a single-device computation.*jax.lax.psum"):
        jax.jit(lambda v: transport.allreduce_flat(v, MPI.SUM, MPI.COMM_WORLD))(x)


def test_replicated_leaf_counts_once_per_process(world):
    """An array replicated over the local devices is one contribution per process, not one per device."""
    rank, size = world
    mesh = Mesh(np.array(jax.local_devices()), ("devices",))
    x = jax.device_put(jnp.full(3, rank + 1.0), NamedSharding(mesh, PartitionSpec()))
    out = launcher.allreduce(x)
    assert out.sharding.is_equivalent_to(x.sharding, x.ndim)
    np.testing.assert_allclose(np.asarray(out), np.full(3, np.arange(1, size + 1).sum()))


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_stacked_leaves_of_mixed_dtypes_match_numpy(world, op, transport_path):
    """pmap-laid-out leaves (one row per device) of several dtypes, with a per-process leaf beside them."""
    rank, size = world
    n = n_local()
    device_ids = np.arange(rank * n, rank * n + n)
    values = lambda d: {"f": np.linspace(0, 1, 6, dtype=np.float32).reshape(2, 3) * (d + 1) - d,
                        "i": np.array([d, -d, 3], np.int32), "b": np.array(d % 2 == 0)}
    per_device = [values(int(d)) for d in device_ids]
    stacked = jax.pmap(lambda t: t)(jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_device))
    tree = {"stacked": stacked, "single": jnp.full(2, rank + 1.0)}
    out = launcher.allreduce(tree, op=op)
    everyone = [values(d) for d in range(size * n)]
    reference = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}[op]
    for key in ("f", "i", "b"):
        want = reference(np.stack([v[key] for v in everyone]), axis=0)
        got = out["stacked"][key]
        assert got.shape == (n,) + want.shape and got.sharding == stacked[key].sharding
        for row in np.asarray(got):
            np.testing.assert_allclose(row, want, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out["single"]), np.full(2, reference(np.arange(1, size + 1.0))))


def test_model_parallel_weight_is_one_value_per_process(world):
    """A weight sharded over the local devices along any axis is a layout, not per-device values."""
    rank, size = world
    mesh = Mesh(np.array(jax.local_devices()), ("model",))
    for spec in (PartitionSpec(None, "model"), PartitionSpec("model", None)):
        w = jax.device_put(jnp.full((4, 2 * n_local()), rank + 1.0), NamedSharding(mesh, spec))
        out = launcher.allreduce({"w": w}, op="mean")["w"]
        assert out.shape == w.shape and out.sharding == w.sharding
        np.testing.assert_allclose(np.asarray(out), np.full(w.shape, np.mean(np.arange(1, size + 1.0))))


def test_tree_packer_exchanges_a_gradient_tree_as_one_buffer(world):
    """Pack inside pmap (one row per device), one allreduce, unpack inside pmap: the mean over
    every device of every process, leaf for leaf, as allreduce of the tree gives."""
    rank, size = world
    n = n_local()
    tree = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32), "layers": [np.zeros(())]}
    tree["layers"][0] = np.float32(2.0) * np.ones((), np.float32)
    packer = launcher.TreePacker(tree)
    assert packer.size == 6 + 3 + 1
    # device i of this process holds the tree scaled by its global device index + 1
    scales = per_device_values(rank)
    stacked = jax.tree_util.tree_map(lambda leaf: np.stack([leaf * s for s in scales]), tree)
    flat = jax.pmap(packer.pack)(stacked)
    assert flat.shape == (n, packer.size)
    total = jax.pmap(packer.unpack)(launcher.allreduce(flat, op="mean"))
    reference = launcher.allreduce(jax.pmap(lambda t: t)(stacked), op="mean")
    mean_scale = np.mean(np.arange(size * n) + 1.0)
    for got, want, leaf in zip(jax.tree_util.tree_leaves(total), jax.tree_util.tree_leaves(reference),
                               jax.tree_util.tree_leaves(tree)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(got)[0], leaf * mean_scale, rtol=1e-6)


def test_tree_packer_refuses_mixed_dtypes_and_other_structures():
    packer = launcher.TreePacker({"a": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match="structure"):
        packer.pack({"b": np.zeros(2, np.float32)})
    with pytest.raises(TypeError, match="one dtype"):
        launcher.TreePacker({"a": np.zeros(2, np.float32), "b": np.zeros(2, np.int32)})


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16], ids=["bfloat16", "float16"])
def test_tree_packer_keeps_half_precision(world, dtype):
    """A half-precision tree packs into a buffer of its own dtype (not float32), which travels,
    and unpacks into leaves of that dtype with the exact values (small integers: exact in bf16)."""
    rank, size = world
    tree = {"w": jnp.arange(6, dtype=dtype).reshape(2, 3) * (rank + 1), "b": jnp.full((3,), rank + 1, dtype),
            "s": [jnp.asarray(-2 * (rank + 1), dtype)]}
    packer = launcher.TreePacker(tree)
    assert np.dtype(packer.dtype) == np.dtype(dtype) and packer.size == 6 + 3 + 1
    assert packer.shapes == [(3,), (), (2, 3)]  # leaves in the tree's order: b, s, w
    flat = jax.jit(packer.pack)(tree)
    assert flat.dtype == dtype and flat.shape == (packer.size,)
    np.testing.assert_array_equal(np.asarray(flat, np.float32),
                                  np.array([1, 1, 1, -2, 0, 1, 2, 3, 4, 5], np.float32) * (rank + 1))
    back = jax.jit(packer.unpack)(flat)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(tree)
    for got, want in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(tree)):
        assert got.dtype == dtype and got.shape == want.shape
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))
    # the packed buffer through a collective, then back into the tree
    total = packer.unpack(launcher.allreduce(flat))
    factor = sum(r + 1 for r in range(size))
    assert all(leaf.dtype == dtype for leaf in jax.tree_util.tree_leaves(total))
    np.testing.assert_array_equal(np.asarray(total["w"], np.float32), np.arange(6).reshape(2, 3) * factor)
    np.testing.assert_array_equal(np.asarray(total["b"], np.float32), np.full(3, factor))
    assert float(total["s"][0]) == -2 * factor and total["s"][0].shape == ()


def test_tree_packer_from_shape_dtype_structs():
    like = {"a": jax.ShapeDtypeStruct((2, 2), jnp.bfloat16), "b": jax.ShapeDtypeStruct((3,), jnp.bfloat16)}
    packer = launcher.TreePacker(like)
    assert np.dtype(packer.dtype) == np.dtype(jnp.bfloat16) and packer.size == 7
    tree = {"a": jnp.ones((2, 2), jnp.bfloat16), "b": jnp.full(3, 2.5, jnp.bfloat16)}
    flat = packer.pack(tree)
    assert flat.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(flat, np.float32), [1, 1, 1, 1, 2.5, 2.5, 2.5])
    back = packer.unpack(flat)
    assert back["b"].dtype == jnp.bfloat16 and back["a"].shape == (2, 2)
    np.testing.assert_array_equal(np.asarray(back["b"], np.float32), [2.5, 2.5, 2.5])


def _mixed_tree(rank):
    """Every kind of leaf the staged path takes, in several dtypes, small and large."""
    import ml_dtypes
    return {"f32": jnp.full((3, 2), rank + 1.5, jnp.float32), "bf16": jnp.full((5,), rank + 0.5, jnp.bfloat16),
            "f16": jnp.array([rank, -rank], jnp.float16), "i32": jnp.arange(4, dtype=jnp.int32) * (rank + 1),
            "bool": jnp.array([rank == 0, True]), "scalar": jnp.float32(rank),
            "empty": jnp.zeros((0, 3), jnp.float32), "large": jnp.full((1 << 12) + 1, rank + 2.0, jnp.float32),
            "np_f64": np.array([1.0 + 1e-12 * rank]), "np_i64": np.array([2**40 + rank]),
            "np_bf16": np.full(2, rank + 0.25, ml_dtypes.bfloat16), "np_scalar": np.float32(rank),
            "py_int": rank, "py_float": rank / 3, "py_bool": rank == 0}


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_staged_results_match_the_device_path_leaf_for_leaf(world, op, monkeypatch):
    """The staged path and the device path (which the tests above check against NumPy) must give
    the same value, dtype, type and placement for every kind of leaf."""
    from launcher.rank.collectives import staged as staged_path
    rank, _ = world
    tree = _mixed_tree(rank)
    assert staged_path.staged_signature(jax.tree_util.tree_leaves(tree)) is not None
    staged = launcher.allreduce(tree, op=op)
    monkeypatch.setattr(staged_path, "STAGED", False)
    reference = launcher.allreduce(tree, op=op)
    for key in tree:
        got, want = staged[key], reference[key]
        assert type(got) is type(want), (key, type(got), type(want))
        assert np.asarray(got).dtype == np.asarray(want).dtype, key
        assert np.shape(got) == np.shape(want), key
        rtol = 1e-2 if key in ("bf16", "f16", "np_bf16") else 1e-6
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=rtol, err_msg=key)
        if isinstance(want, jax.Array):  # on the input's device (the device path may name it another way)
            assert got.sharding == tree[key].sharding and got.sharding.is_equivalent_to(want.sharding, got.ndim), key
    assert staged["np_i64"][0] == reference["np_i64"][0]  # int64 exact (a float64 round trip would not be)


def test_bfloat16_mean_stays_bfloat16(world, transport_path):
    out = launcher.allreduce({"bf16": jnp.ones(3, jnp.bfloat16), "f16": jnp.ones(3, jnp.float16)}, op="mean")
    assert out["bf16"].dtype == jnp.bfloat16 and out["f16"].dtype == jnp.float16
    np.testing.assert_allclose(np.asarray(out["bf16"], np.float32), np.ones(3))


@pytest.mark.parametrize("op", ["sum", "mean"])
def test_staged_results_own_their_memory(world, op):
    """A lone large leaf comes back as its staging buffer, handed to JAX without a copy: a later call
    must not write into it, and donating it must not corrupt anything. A leaf of a shared buffer is
    copied out, so keeping it does not keep its neighbours' memory alive."""
    import gc
    import tracemalloc
    rank, size = world
    big = jnp.full(1 << 16, rank + 1.0, jnp.float32)            # 256 KiB: alone in its buffer
    first = launcher.allreduce(big, op=op)
    second = launcher.allreduce(big * 3, op=op)
    total = np.arange(1, size + 1).sum() / (size if op == "mean" else 1)
    np.testing.assert_allclose(np.asarray(first), np.full(1 << 16, total))
    np.testing.assert_allclose(np.asarray(second), np.full(1 << 16, 3 * total))
    doubled = jax.jit(lambda x: x * 2, donate_argnums=0)(second)
    np.testing.assert_allclose(np.asarray(doubled)[:3], 6 * total)
    np.testing.assert_allclose(np.asarray(first)[:3], total)

    tree = {"small": jnp.ones(4), "neighbour": jnp.ones(1 << 19)}  # 2 MiB: one shared buffer with `small`
    launcher.allreduce(tree, op=op)                               # warm: plans, caches
    gc.collect()
    tracemalloc.start()
    try:
        kept = launcher.allreduce(tree, op=op)["small"]
        gc.collect()
        numpy_bytes = sum(stat.size for stat in tracemalloc.take_snapshot().filter_traces(
            [tracemalloc.DomainFilter(True, np.lib.tracemalloc_domain)]).statistics("filename"))
    finally:
        tracemalloc.stop()
    assert numpy_bytes < 1 << 20, f"keeping one small leaf keeps {numpy_bytes} bytes of NumPy memory alive"
    np.testing.assert_allclose(np.asarray(kept), np.full(4, size / (size if op == "mean" else 1)))


@pytest.mark.parametrize("collective", ["allreduce", "broadcast"])
def test_results_kept_from_one_call_survive_the_next_calls_of_the_same_tree(world, collective):
    """A tree's leaves share one staging buffer, taken again by the next call of the same dtypes and
    sizes: the results of the calls before, kept as a training loop keeps them, must not change."""
    rank, size = world

    def tree(value):
        return {"f32": [jnp.full(1024, value + i, jnp.float32) for i in range(3)],
                "i32": jnp.full((4, 5), value, jnp.int32), "host": np.full(7, value, np.float64)}

    def call(value):
        if collective == "allreduce":
            return launcher.allreduce(tree(value + rank))
        return launcher.broadcast(tree(value + rank), root=0)

    def expected(value):
        if collective == "broadcast":
            return tree(value)
        return jax.tree_util.tree_map(lambda *xs: sum(np.asarray(x) for x in xs), *[tree(value + r) for r in range(size)])

    kept = [(value, call(value)) for value in (1, 10, 100)]
    for value, result in kept:
        for got, want in zip(jax.tree_util.tree_leaves(result), jax.tree_util.tree_leaves(expected(value))):
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=f"the call of {value}")


def test_broadcast_of_every_kind_of_leaf(world):
    rank, size = world
    root = size - 1
    tree = _mixed_tree(rank)
    out = launcher.broadcast(tree, root=root)
    expected = _mixed_tree(root)
    for key, want in expected.items():
        got = out[key]
        assert type(got) is type(want) or (isinstance(want, jax.Array) and isinstance(got, jax.Array)), key
        assert np.dtype(np.asarray(got).dtype) == np.dtype(np.asarray(want).dtype), key
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=key)
    lone = launcher.broadcast(jnp.full(1 << 14, rank, jnp.bfloat16), root=root)  # one leaf: no byte layout
    assert lone.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(lone, np.float32), np.full(1 << 14, root))


def test_a_staged_collective_is_tracked_as_one_blocking_call(world):
    """The watchdog sees a staged allreduce or broadcast as one collective, pending only inside MPI
    (waiting for the inputs to be computed is no hang)."""
    from launcher.rank.tracker import TRACKER
    seen = []
    enter = TRACKER.enter
    def spy(seq, name):
        seen.append((seq, name, TRACKER.count))
        enter(seq, name)
    before = TRACKER.count
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(TRACKER, "enter", spy)
        launcher.allreduce({"a": jnp.ones(3), "b": np.ones(2), "c": 1.0})
        launcher.broadcast({"a": jnp.ones(3), "b": 2})
    assert seen == [(before + 1, "allreduce", before + 1), (before + 2, "broadcast", before + 2)]
    assert TRACKER.count == before + 2 and TRACKER.blocking is None
    assert TRACKER.latest[0] == before + 2


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.int32, jnp.complex64, jnp.bfloat16, jnp.float16, jnp.bool_,
                                   jnp.uint8])
@pytest.mark.parametrize("shape", [(), (3, 2), (1 << 15,)], ids=["scalar", "matrix", "128k"])
def test_one_array_matches_the_device_path(world, dtype, shape, monkeypatch):
    """A lone array (a loss, a count, a packed buffer) takes a short cut: it must give what the device
    path gives, for every op, and its broadcast what the root had."""
    from launcher.rank.collectives import staged as staged_path
    rank, size = world
    value = lambda r: (jnp.arange(math.prod(shape)).reshape(shape) % 7 + r).astype(dtype)
    x = value(rank)
    ops = ("sum", "mean") if dtype == jnp.complex64 else ("sum", "mean", "max", "min")  # MPI orders no complex
    staged = {op: launcher.allreduce(x, op=op) for op in ops}
    sent = launcher.broadcast(x, root=size - 1)
    monkeypatch.setattr(staged_path, "STAGED", False)
    for op, got in staged.items():
        want = launcher.allreduce(x, op=op)
        assert got.dtype == want.dtype and got.shape == want.shape, op
        assert got.sharding == x.sharding and got.sharding.is_equivalent_to(want.sharding, got.ndim), op
        np.testing.assert_allclose(np.asarray(got, np.complex128), np.asarray(want, np.complex128), rtol=1e-2, err_msg=op)
    assert sent.dtype == x.dtype and sent.shape == x.shape
    np.testing.assert_array_equal(np.asarray(sent), np.asarray(value(size - 1)))


@pytest.mark.parametrize("lone", [True, False], ids=["lone array", "in a tree"])
def test_half_precision_travels_as_float32(world, lone):
    """float16 is summed as float32 and cast back, as bfloat16 is: a mean of values near float16's
    largest (65504) must not overflow on the way (a float16 sum of two of them is inf)."""
    tree = {"f16": jnp.full(3, 60000, jnp.float16), "bf16": jnp.full(3, 1.5, jnp.bfloat16)}
    out = {key: launcher.allreduce(x, op="mean") for key, x in tree.items()} if lone else \
        launcher.allreduce(tree, op="mean")
    assert out["f16"].dtype == jnp.float16 and out["bf16"].dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(out["f16"], np.float32), np.full(3, 60000, np.float32))
    np.testing.assert_array_equal(np.asarray(out["bf16"], np.float32), np.full(3, 1.5, np.float32))


def jax_spans_every_process(world):
    return jax.process_count() == world[1]


def test_the_transport_in_force_carries_the_device_leaves(world):
    """Under tier_xla.yaml the device leaves really go over XLA's collectives (xla.LAST holds the
    latest exchange), and under tier.yaml never."""
    from launcher.rank.collectives import choice, xla
    xla.LAST.clear()
    total = launcher.allreduce({"a": jnp.arange(3.0), "b": jnp.ones(2, jnp.bfloat16)})
    assert bool(xla.LAST) == (choice.current() == "xla")
    np.testing.assert_array_equal(np.asarray(total["a"]), np.arange(3.0) * world[1])


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
def test_both_transports_give_the_same_bits(world, op):
    """The same 24-leaf tree (bfloat16, bool, per-device rows, Python numbers) over mpi4jax and over
    XLA's collectives: the same bits. Needs JAX's multi-process runtime (tier_xla.yaml)."""
    if not jax_spans_every_process(world):
        pytest.skip("needs jax.distributed over every process (tests/mpi/tier_xla.yaml)")
    from launcher.rank.collectives import choice
    rank, size = world
    rng = np.random.default_rng([rank, 3])
    tree = {f"w{i}": jnp.asarray(rng.normal(size=(i % 5 + 1, 3)).astype(np.float32)) for i in range(18)}
    tree.update(half=jnp.asarray(rng.normal(size=7), jnp.bfloat16), flags=jnp.asarray(rng.normal(size=4) > 0),
                count=rank + 1, scale=float(rank) / 3, host=rng.normal(size=5),
                rows=jax.pmap(lambda v: v)(per_device_values(rank)))
    results = {}
    for name in ("mpi4jax", "xla"):
        with choice.using(name):
            results[name] = jax.tree_util.tree_map(np.asarray, launcher.allreduce(tree, op=op))
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(results["mpi4jax"])[0],
                            jax.tree_util.tree_leaves(results["xla"])):
        assert a.dtype == b.dtype, path
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))


def test_broadcast_and_allgather_over_both_transports_agree(world):
    if not jax_spans_every_process(world):
        pytest.skip("needs jax.distributed over every process (tests/mpi/tier_xla.yaml)")
    from launcher.rank.collectives import choice
    rank, size = world
    tree = {"x": jnp.full((2, 3), rank + 1.0), "h": jnp.full(4, rank, jnp.float16), "i": jnp.arange(3) + rank}
    out = {}
    for name in ("mpi4jax", "xla"):
        with choice.using(name):
            out[name] = (launcher.broadcast(tree, root=size - 1), launcher.allgather(tree))
    for a, b in zip(jax.tree_util.tree_leaves(out["mpi4jax"]), jax.tree_util.tree_leaves(out["xla"])):
        assert np.asarray(a).dtype == np.asarray(b).dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(out["xla"][0]["x"]), np.full((2, 3), float(size)))
    np.testing.assert_array_equal(np.asarray(out["xla"][1]["i"]), np.concatenate([np.arange(3) + r for r in range(size)]))


def test_transport_xla_without_jax_distributed_says_what_to_set(world):
    if jax_spans_every_process(world) or world[1] == 1:
        pytest.skip("JAX spans every process here: nothing to refuse")
    from launcher.rank.collectives import choice
    with choice.using("xla"), pytest.raises(RuntimeError, match="set jax_distributed: true"):
        launcher.allreduce(jnp.ones(3))
