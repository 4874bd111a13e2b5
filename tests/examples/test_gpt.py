"""examples/train_gpt.py: every layout that fits the world trains the GPT with the
losses of the one-process NumPy reference (gpt_reference.py), dropout masks that do
not depend on the layout, and the communication of a Megatron step.

"Fits": dp, tp and sp run on every world size (splits may be uneven: 97 tokens, heads
split 2/1/1 on 3 ranks); 2d needs an even world (a (world / 2) x 2 mesh). The example's
own command (``mpiexec -n N python examples/train_gpt.py --layout L --check``, 50 steps
at its default size) runs in tests/examples/test_every_example.py at small sizes and in the docs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import sbpmpi as sm
from sbpmpi.comm.trace import Trace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import gpt_reference  # noqa: E402
import train_gpt  # noqa: E402

comm = MPI.COMM_WORLD
size = comm.Get_size()
LAYERS = 2
SMALL = ["--layers", str(LAYERS), "--heads", "4", "--dim", "16", "--seq", "8",
         "--batch", "5", "--sample", "6"]


def fitting_layouts() -> list[str]:
    return ["dp", "tp", "sp"] + (["2d"] if size % 2 == 0 else [])


def same_on_every_rank(value: object) -> bool:
    return all(v == value for v in comm.allgather(value))


# ---- serial: the corpus and the batches ---------------------------------------------------

def test_vocabulary_divides_by_neither_3_nor_4():
    v = len(train_gpt.VOCAB)
    assert v % 3 and v % 4 and v % 2
    data = train_gpt.load_corpus()
    assert data.min() >= 0 and data.max() < v and len(data) > 10_000


def test_batches_depend_on_the_seed_and_step_only():
    data = train_gpt.load_corpus()
    x, y = train_gpt.batch_at(data, 3, 4, 8, seed=1)
    x2, _ = train_gpt.batch_at(data, 3, 4, 8, seed=1)
    np.testing.assert_array_equal(x, x2)
    np.testing.assert_array_equal(x[:, 1:], y[:, :-1])  # targets: the next characters
    assert not np.array_equal(x, train_gpt.batch_at(data, 4, 4, 8, seed=1)[0])


def test_reference_gradients_match_finite_differences():
    """The hand-written backward of the reference: the loss's slope along a random
    direction of every parameter equals a central difference."""
    rng = np.random.default_rng(0)
    v, d, h, t = len(train_gpt.VOCAB), 8, 2, 5
    shapes = {"wte": (v, d), "wpe": (t, d), "lnf.weight": (d,), "lnf.bias": (d,)}
    for name, shape in (("ln1.weight", (d,)), ("ln1.bias", (d,)), ("ln2.weight", (d,)),
                        ("ln2.bias", (d,)), ("attn.qkv_w", (h, d, 3 * d // h)),
                        ("attn.qkv_b", (h, 1, 3 * d // h)), ("attn.proj_w", (h, d // h, d)),
                        ("attn.proj_b", (d,)), ("mlp.fc1.weight", (d, 4 * d)),
                        ("mlp.fc1.bias", (4 * d,)), ("mlp.fc2.weight", (4 * d, d)),
                        ("mlp.fc2.bias", (d,))):
        shapes[f"blocks.0.{name}"] = shape
    params = {k: rng.standard_normal(s) * 0.3 for k, s in shapes.items()}
    ids, targets = rng.integers(0, v, (2, t)), rng.integers(0, v, (2, t))

    def loss_and_grads(p):
        ref = gpt_reference.NumpyGPT(p, h, 1e-5, lambda s: 0.0, (0.9, 0.999), 1e-8, 0.0, 0.0)
        grads = {}
        ref._update = grads.update  # keep the gradients instead of stepping
        return ref.step(ids, targets), grads

    _, grads = loss_and_grads(params)
    for k in params:
        u = rng.standard_normal(params[k].shape)
        eps = 1e-6
        up = dict(params, **{k: params[k] + eps * u})
        down = dict(params, **{k: params[k] - eps * u})
        slope = (loss_and_grads(up)[0] - loss_and_grads(down)[0]) / (2 * eps)
        assert abs(slope - (grads[k] * u).sum()) <= 1e-6 * max(1.0, abs(slope)), k


# ---- MPI: the layouts against the reference -------------------------------------------------

@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp", "2d"])
def test_layout_losses_equal_the_numpy_reference(layout):
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} needs an even world, this one has {size} ranks")
    args = train_gpt.parse(["--layout", layout, "--check", "--steps", "6", *SMALL])
    run = train_gpt.train(args)
    assert run.worst <= 1e-10, run.worst
    assert run.losses[-1] < run.losses[0]  # it learns
    assert same_on_every_rank(run.sample) and len(run.sample) == 6


@pytest.mark.mpi(min_size=2)
def test_2d_keeps_tensor_parallelism_inside_a_host_and_data_parallelism_across_hosts():
    """Across hosts filled in rank order by pairs (``run_tests.py --hosts 2``: 2 x 2), each
    row of the 2d mesh (the tensor axis) lies on one host and its data axis crosses hosts,
    so the layer's all-reduces stay on shared memory; the losses are checked above."""
    nodes = [sm.env.node_of(r) for r in range(size)]
    if size % 2 or sm.env.get_node_count() < 2 or nodes != sorted(nodes) or any(
            nodes.count(k) % 2 for k in set(nodes)):
        pytest.skip(f"needs hosts of an even number of ranks each, in rank order; "
                    f"the ranks' hosts are {nodes}")
    mesh = train_gpt.gpt_layout("2d").placement.ranks
    assert mesh.shape == (size // 2, 2)
    for row in mesh.tolist():  # tensor axis: one host
        assert len({nodes[r] for r in row}) == 1, (row, nodes)
    assert len({nodes[r] for r in mesh[:, 0].tolist()}) == sm.env.get_node_count()


@pytest.mark.mpi(min_size=1)
def test_reference_check_notices_a_different_training():
    """The comparison is not vacuous: a reference with another learning rate differs."""
    args = train_gpt.parse(["--layout", "tp", "--steps", "3", *SMALL])
    mine = train_gpt.train(args)
    args.lr *= 1.01
    other = train_gpt.train(args)
    assert max(abs(a - b) / b for a, b in zip(mine.losses, other.losses)) > 1e-6


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("layout", ["tp", "sp", "2d"])
def test_dropout_losses_equal_the_dp_run(layout):
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} needs an even world, this one has {size} ranks")
    args = train_gpt.parse(["--layout", layout, "--dropout", "0.2", "--compare-dp",
                            "--steps", "3", *SMALL])
    run = train_gpt.train(args)
    assert run.worst <= 1e-10, run.worst
    args.dropout, args.compare_dp = 0.0, False
    plain = train_gpt.train(args)
    assert abs(run.losses[0] - plain.losses[0]) > 1e-3  # the masks did drop something


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_stages_train_the_gpt_to_the_numpy_losses(stage):
    """The GPT keeps its blocks in an ``sm.nn.ModuleList``: ``sm.nn.shard`` finds each
    block's parameters by path at every stage (stage 3 gathers each block around its
    forward), and the sharded run gives the NumPy reference's losses."""
    from dataclasses import replace

    args = train_gpt.parse(["--layout", "dp", "--steps", "3", "--buckets", "off", *SMALL])
    data = train_gpt.load_corpus()
    trainer = train_gpt.build(args, "dp")
    ref = gpt_reference.NumpyGPT(
        {k: p.numpy() for k, p in trainer.model.named_parameters()}, args.heads, 1e-5,
        lambda t: args.lr * train_gpt.lr_factor(args.steps, args.warmup)(t), (0.9, 0.999),
        1e-8, args.weight_decay, args.clip, args.gelu)
    net, opt = sm.nn.shard(trainer.model, trainer.optimizer, stage=stage)
    trainer = replace(trainer, optimizer=opt, net=net)
    for step in range(args.steps):
        ids, targets = train_gpt.batch_at(data, step, args.batch, args.seq, args.seed)
        np.testing.assert_allclose(trainer.step(ids, targets), ref.step(ids, targets),
                                   rtol=1e-10)
    assert net.gathered_bytes == 0


# ---- MPI: communication of one step -----------------------------------------------------------

def traced_step(layout: str) -> tuple[Trace, Trace]:
    """Forward and backward traces of one step (after a first step: caches warm)."""
    args = train_gpt.parse(["--layout", layout, "--clip", "0", *SMALL])
    trainer = train_gpt.build(args, layout)
    ids, targets = train_gpt.batch_at(train_gpt.load_corpus(), 0, args.batch, args.seq, 0)
    trainer.step(ids, targets)
    with sm.trace() as forward:
        loss = trainer.loss(ids, targets)
    with sm.trace() as backward:
        loss.backward()
    return forward, backward


def calls(t: Trace, itemsize: int = 8) -> list[tuple[str, int]]:
    """(op, elements) of each call, in order; an uneven split's ``all_gather_v`` counts as
    an ``all_gather`` (and ``reduce_scatter_v`` as a ``reduce_scatter``)."""
    return [(r.op.removesuffix("_v"), r.nbytes // itemsize) for r in t.records]


@pytest.mark.mpi(min_size=1)
def test_tp_step_is_megatrons_communication():
    """Megatron's count, from the number of blocks L. Forward: one all-reduce of the
    activation per row-parallel output (attention's projection and the MLP's second
    linear: two per block), one for the vocab-parallel embedding lookup, and the loss's
    two small ones (the row max and a fused (N, 2) sum). Backward: one activation
    all-reduce per column-parallel input (Megatron's f: the input of attention and of the
    MLP, two per block, and the tied output head's), and nothing else: the layer norms,
    the residual stream and the embeddings see broadcast gradients. One rank: none."""
    args = train_gpt.parse(SMALL)
    b, t, d = args.batch, args.seq, args.dim
    act = b * t * d
    forward, backward = traced_step("tp")
    if size == 1:
        assert calls(forward) == calls(backward) == []
        return
    assert calls(forward) == [("all_reduce", act)] * (2 * LAYERS + 1) + [
        ("all_reduce", b * t), ("all_reduce", 2 * b * t)]
    assert calls(backward) == [("all_reduce", act)] * (2 * LAYERS + 1)


@pytest.mark.mpi(min_size=1)
def test_sp_replaces_each_activation_all_reduce_by_a_reduce_scatter_and_an_all_gather():
    """tp's 2L + 1 activation all-reduces of each direction become a reduce-scatter and
    an all-gather each (forward: into the sequence split after each row-parallel output,
    gathered before the next attention, MLP or head; backward: the reverse). The loss's
    two all-reduces stay, and the layer norms' parameters, which see a sequence split,
    get their weight and bias gradients all-reduced (D elements each, 4L + 2)."""
    args = train_gpt.parse(SMALL)
    b, t, d = args.batch, args.seq, args.dim
    act = b * t * d
    forward, backward = traced_step("sp")
    f, g = calls(forward), calls(backward)
    if size == 1:
        assert f == g == []
        return
    pairs = 2 * LAYERS + 1  # tp's activation all-reduces
    assert [op for op, _ in f if op != "all_reduce"] == ["reduce_scatter", "all_gather"] * pairs
    assert [c for c in f if c[0] == "all_reduce"] == [("all_reduce", b * t),
                                                      ("all_reduce", 2 * b * t)]
    assert [c[0] for c in g if c[0] != "all_reduce"] == ["reduce_scatter", "all_gather"] * pairs
    assert [c for c in g if c[0] == "all_reduce"] == [("all_reduce", d)] * (4 * LAYERS + 2)
    # a reduce-scatter takes the whole activation; an all-gather this rank's share of it
    assert all(n == act for op, n in f + g if op == "reduce_scatter")
    shares = {b * (t // size) * d, b * -(-t // size) * d}
    assert all(n in shares for op, n in f + g if op == "all_gather")


@pytest.mark.mpi(min_size=2)
def test_2d_step_is_tp_on_the_tensor_axis_and_bucketed_gradients_on_the_data_axis():
    """On the (n/2) x 2 mesh: tp's 2L + 1 backward activation all-reduces among the two
    ranks of this rank's mesh row (its part of the batch), and on the data axis (the
    column) only the gradient buckets' all-reduces, which carry each parameter's local
    gradient once."""
    if size % 2:
        pytest.skip(f"2d needs an even world, this one has {size} ranks")
    args = train_gpt.parse(SMALL)
    mesh = np.arange(size).reshape(size // 2, 2)
    rank = comm.Get_rank()
    row, column = tuple(mesh[rank // 2]), tuple(mesh[:, rank % 2])
    rows = len(np.array_split(np.arange(args.batch), size // 2)[rank // 2])
    _, backward = traced_step("2d")
    on_row = [(r.op, r.nbytes // 8) for r in backward.records if r.group_ranks == row]
    on_column = [(r.op, r.nbytes // 8) for r in backward.records if r.group_ranks == column]
    assert len(on_row) + len(on_column) == len(backward.records)
    assert on_row == [("all_reduce", rows * args.seq * args.dim)] * (2 * LAYERS + 1)
    params = train_gpt.build(args, "2d").model.parameters()
    if size == 2:  # a 1 x 2 mesh: no data axis to reduce over
        assert on_column == []
    else:
        assert {op for op, _ in on_column} == {"all_reduce"}
        assert len(on_column) < len(params)  # buckets, not one call per parameter
        assert sum(n for _, n in on_column) == sum(p.to_local().size for p in params)


# ---- half-width training and recomputation (issue 32) ------------------------------------------


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("layout", ["dp", "tp", "sp", "2d"])
def test_half_width_training_and_recomputation(layout):
    """bfloat16 and float16 (float32 masters, autocast; float16 with the GradScaler) train
    within 2% of the float32 losses; --recompute full and selective give losses and
    weights bit-identical to none (dropout on)."""
    if layout not in fitting_layouts():
        pytest.skip(f"{layout} needs an even world, this one has {size} ranks")
    runs = {}
    for dtype, rc in [("float32", "none"), ("bfloat16", "none"), ("bfloat16", "full"),
                      ("bfloat16", "selective"), ("float16", "none"), ("float16", "full")]:
        args = train_gpt.parse(["--layout", layout, "--steps", "4", "--dropout", "0.1",
                                "--dtype", dtype, "--recompute", rc, *SMALL])
        trainer_run = train_gpt.train(args)
        runs[dtype, rc] = trainer_run.losses
    base = np.array(runs["float32", "none"])
    for key, losses in runs.items():
        assert np.max(np.abs(np.array(losses) - base) / base) < 0.02, (key, losses, base)
    for dtype, rc in runs:
        if rc != "none":
            assert runs[dtype, rc] == runs[dtype, "none"], (dtype, rc)


def traced_whole_step(layout: str, dtype: str, *extra: str) -> Trace:
    """The trace of one training step (after a first one: caches warm, buckets agreed);
    12 sequences: an even batch split at 1..4 ranks."""
    args = train_gpt.parse(["--layout", layout, "--clip", "0", "--dtype", dtype, "--dropout",
                            "0", *SMALL, "--batch", "12", *extra])
    trainer = train_gpt.build(args, layout)
    ids, targets = train_gpt.batch_at(train_gpt.load_corpus(), 0, args.batch, args.seq, 0)
    trainer.step(ids, targets)
    with sm.trace() as t:
        trainer.step(ids, targets)
    return t


@pytest.mark.mpi(min_size=1)
def test_bfloat16_dp_step_reduces_the_gradients_in_half_the_bytes_of_float32():
    """dp: a bfloat16 step (its default --reduce-dtype bfloat16) hands MPI at most half the
    bytes of a float32 step plus the float32 step's bytes outside the gradient buckets
    (the loss's one 4-byte all-reduce): the buckets' half-width all-to-all and all-gather
    move exactly half the bytes of float32's all-reduces, and no gradient is reduced
    outside them. --reduce-dtype float32 keeps float32's gradient reductions."""
    f32 = traced_whole_step("dp", "float32")
    bf16 = traced_whole_step("dp", "bfloat16")
    kept = traced_whole_step("dp", "bfloat16", "--reduce-dtype", "float32")
    buckets = [r for r in f32 if r.op == "all_reduce" and r.nonblocking]
    rest = [(r.op, r.nbytes, r.dtype) for r in f32 if r not in buckets]
    if size == 1:
        assert f32.nbytes() == bf16.nbytes() == kept.nbytes() == 0
        return
    assert rest == [("all_reduce", 4, "float32")]  # the loss
    fixed = sum(n for _, n, _ in rest)
    half = [r for r in bf16 if r.dtype == "bfloat16"]
    assert {r.op for r in half} == {"all_to_all_v", "all_gather_v"}
    assert 2 * sum(r.nbytes for r in half) == sum(r.nbytes for r in buckets)
    assert [(r.op, r.nbytes, r.dtype) for r in bf16 if r.dtype != "bfloat16"] == rest
    assert bf16.nbytes() <= 0.5 * f32.nbytes() + fixed
    assert [(r.op, r.nbytes, r.dtype) for r in kept] == [(r.op, r.nbytes, r.dtype) for r in f32]
