"""ZeRO stages as layouts (``sm.nn.shard``): every stage trains to the unsharded run's and
the NumPy reference's losses; the state (stage 1), the gradients (2) and the parameters
(3) are split over the data-parallel axis; stage 3 frees each layer's gathered
parameters and prefetches the next; bucketed gathers and reduce-scatters equal the
per-parameter ones bit for bit; checkpoints load across stages and world sizes; argument
errors on every rank; a rank failing in backward with a prefetch in flight ends the job."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import errors_of, run_program
from fault_programs.runner import mpiexec, run_mpi
from mpi4py import MPI

import sbpmpi as sm

S, B, P = sm.sbp.split, sm.sbp.broadcast, sm.sbp.partial_sum
comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
ROOT = Path(__file__).resolve().parents[2]


def world() -> sm.Placement:
    return sm.placement("cpu", list(range(size)))


class MLP(sm.nn.Module):
    def __init__(self) -> None:
        sm.manual_seed(5)
        self.l1 = sm.nn.Linear(7, 5, placement=world(), dtype=np.float64)
        self.l2 = sm.nn.Linear(5, 3, placement=world(), dtype=np.float64)

    def forward(self, x):
        return self.l2(sm.nn.relu(self.l1(x)))


OPTIMIZERS = {"sgd-momentum": lambda ps: sm.optim.SGD(ps, lr=0.3, momentum=0.9),
              "adam": lambda ps: sm.optim.Adam(ps, lr=0.05)}


def make(stage: int, opt: str):
    model = MLP()
    o = OPTIMIZERS[opt](model.parameters())
    return sm.nn.shard(model, o, stage=stage) if stage else (model, o)


def steps(model, opt, first: int, count: int) -> list[float]:
    losses = []
    for s in range(first, first + count):
        rng = np.random.default_rng(s)
        x, y = rng.standard_normal((11, 7)), rng.integers(0, 3, 11)
        opt.zero_grad()
        loss = sm.nn.cross_entropy(model(sm.tensor(x, placement=world(), sbp=S(0))), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.numpy()))
    return losses


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_trains_to_the_unsharded_losses(stage, opt):
    base_model, base_opt = make(0, opt)
    base = steps(base_model, base_opt, 0, 5)
    model, o = make(stage, opt)
    got = steps(model, o, 0, 5)
    np.testing.assert_allclose(got, base, rtol=1e-11)
    for p, q in zip(model.parameters(), base_model.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-10, atol=1e-13)
    inner = o if stage == 3 else o.optimizer
    for state in inner.state:  # every state tensor split(0) over the data axis: 1/N a rank
        for v in state.values():
            assert v.sbp == (S(0),)
            held = comm.allgather(v.to_local().size)
            assert sum(held) == v.size and max(held) <= -(-v.shape[0] // size) * (
                v.size // v.shape[0])
    want = (B,) if stage == 1 else (S(0),)
    assert all(p.sbp == want for p in model.parameters())
    if stage > 1:
        assert all(p.grad.sbp == (S(0),) for p in model.parameters())  # reduce-scattered
    else:  # left unreduced, whole on every rank; its global value is the gradient
        for p, q in zip(model.parameters(), base_model.parameters()):
            assert p.grad.sbp == (P,) and p.grad.to_local().shape == p.shape
            np.testing.assert_allclose(p.grad.numpy(), q.grad.numpy(), rtol=1e-9, atol=1e-13)


def _example():
    """examples/train_mlp.py as a module (its MLP, layouts, data and NumPy reference)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_mlp", ROOT / "examples" / "train_mlp.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("optim", ["sgd", "adam"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_every_stage_trains_the_example_mlp_to_the_numpy_losses(stage, optim):
    ex = _example()
    x_all, y_all, _ = ex.load_data("auto", 0)
    kinds = ["dp"] + (["2d"] if size >= 4 and size % 2 == 0 else [])
    for kind in kinds:  # 2d: data parallel on mesh axis 0, tensor parallel on axis 1
        lay = ex.layouts(kind)
        pl = lay["placement"]
        sm.manual_seed(0)
        model = ex.MLP(x_all.shape[1], 12, 10, lay, np.float64)
        lr = 0.1 if optim == "sgd" else 0.01
        opt = ex.make_optimizer(optim, model.parameters(), lr)
        ref = ex.NumpyMLP([p.numpy() for p in model.parameters()], optim, lr, np.float64)
        model, opt = sm.nn.shard(model, opt, stage=stage, axis=0)
        y_sbp = tuple(s if isinstance(s, sm.sbp.Split) else B for s in lay["x"])
        for idx in ex.batches(len(y_all), 61, 0, 0)[:6]:  # 61 rows: uneven over the ranks
            xb, yb = x_all[idx], y_all[idx]
            opt.zero_grad()
            loss = sm.nn.cross_entropy(model(sm.tensor(xb, placement=pl, sbp=lay["x"])),
                                       sm.tensor(yb, placement=pl, sbp=y_sbp))
            loss.backward()
            opt.step()
            np.testing.assert_allclose(loss.item(), ref.step(xb, yb), rtol=1e-10)
        for p, q in zip(model.parameters(), ref.p):
            np.testing.assert_allclose(p.numpy(), q, rtol=1e-9, atol=1e-12)


@pytest.mark.mpi(min_size=1)
def test_stage2_keeps_whole_parameters_equal_to_the_updated_slices():
    model, o = make(2, "adam")
    base_model, base_opt = make(0, "adam")
    steps(model, o, 0, 3)
    steps(base_model, base_opt, 0, 3)
    wholes = model.held_parameters()
    assert len(wholes) == len(model.parameters())
    for w, leaf, q in zip(wholes, model.parameters(), base_model.parameters()):
        assert w.sbp == (B,) and leaf.sbp == (S(0),)
        assert w.to_local().shape == q.shape  # every rank holds the whole parameter
        np.testing.assert_array_equal(w.numpy(), leaf.numpy())  # gathered after the step
        np.testing.assert_allclose(w.numpy(), q.numpy(), rtol=1e-10, atol=1e-13)
    # the gradients were reduce-scattered: each rank holds its rows only
    for leaf in model.parameters():
        held = comm.allgather(leaf.grad.to_local().shape[0])
        assert sum(held) == leaf.shape[0] and max(held) == -(-leaf.shape[0] // size)


@pytest.mark.mpi(min_size=1)
def test_stage1_reduce_scatters_each_gradient_and_all_gathers_each_parameter():
    model, o = make(1, "adam")
    steps(model, o, 0, 1)
    with sm.trace() as t:
        steps(model, o, 1, 1)
    params = model.parameters()
    whole = sum(p.size * 8 for p in params)
    if size == 1:  # nothing to reduce or gather
        assert [r.op for r in t if r.op != "all_reduce"] == []
        return
    ops = [r.op.removesuffix("_v") for r in t]
    # the one all-reduce is the loss's value (8 bytes): no gradient is all-reduced
    assert [r.nbytes for r in t if r.op == "all_reduce"] == [8]
    assert ops.count("reduce_scatter") == ops.count("all_gather") == len(params)
    scatters = [r.nbytes for r in t if r.op.startswith("reduce_scatter")]
    gathers = [r.nbytes for r in t if r.op.startswith("all_gather")]
    assert scatters == [p.size * 8 for p in params]  # each rank's whole unreduced gradient
    rows = [-(-p.shape[0] // size) if rank < p.shape[0] % size or p.shape[0] % size == 0
            else p.shape[0] // size for p in params]
    assert gathers == [r * (p.size // p.shape[0]) * 8 for r, p in zip(rows, params)]
    # on the wire (ring): (N-1)/N of each gradient, the slice to each of N-1 ranks: summed
    # over the ranks 2P(N-1), the 2P(N-1)/N a rank of DP's all-reduce
    wire = comm.allreduce(sum(scatters) * (size - 1) / size + sum(gathers) * (size - 1))
    assert wire == pytest.approx(2 * whole * (size - 1), rel=1e-12)


class Deep(sm.nn.Module):
    """Three layers of different sizes: the held bytes tell which layers are gathered."""

    def __init__(self) -> None:
        sm.manual_seed(6)
        self.l1 = sm.nn.Linear(7, 5, placement=world(), dtype=np.float64)
        self.l2 = sm.nn.Linear(5, 6, placement=world(), dtype=np.float64)
        self.l3 = sm.nn.Linear(6, 3, placement=world(), dtype=np.float64)

    def forward(self, x):
        return self.l3(sm.nn.relu(self.l2(sm.nn.relu(self.l1(x)))))


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("prefetch", [False, True])
def test_stage3_frees_each_layer_after_its_forward_and_backward(prefetch):
    base, net = Deep(), Deep()
    model, o = sm.nn.shard(net, sm.optim.Adam(net.parameters(), lr=0.05), stage=3,
                           prefetch=prefetch)
    layer = [sum(p.size * 8 for p in m.parameters()) for m in (base.l1, base.l2, base.l3)]
    # one layer gathered at a time; with prefetch also the next one (in forward order,
    # then in backward order), once the first forward has shown the order
    want = max(a + b for a, b in zip(layer, layer[1:])) if prefetch else max(layer)
    x = np.random.default_rng(3).standard_normal((11, 7))
    xt = sm.tensor(x, placement=world(), sbp=S(0))
    for _ in range(3):
        model.reset_peak()
        o.zero_grad()
        loss = sm.nn.cross_entropy(model(xt), np.arange(11) % 3)
        assert model.gathered_bytes == 0  # every layer freed after its forward
        loss.backward()
        assert model.gathered_bytes == 0  # and after its gradients were reduce-scattered
        assert model.peak_gathered_bytes == want
        assert model.peak_gathered_bytes < sum(layer)
        o.step()
    with sm.no_grad():
        got = model(xt).numpy()
    for p, q in zip(base.parameters(), model.parameters()):
        p.to_local()[...] = q.to_global(sbp=B).to_local()
    with sm.no_grad():
        np.testing.assert_allclose(got, base(xt).numpy(), rtol=1e-12)
    assert model.gathered_bytes == 0


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("stage", [2, 3])
def test_bucketed_gathers_and_reduce_scatters_are_bit_identical_to_one_per_parameter(stage):
    runs = {}
    for bucketed, prefetch in ((True, True), (True, False), (False, False)):
        model = MLP()
        o = OPTIMIZERS["adam"](model.parameters())
        model, o = sm.nn.shard(model, o, stage=stage, bucketed=bucketed, prefetch=prefetch)
        losses = steps(model, o, 0, 2)
        with sm.trace() as t:
            losses += steps(model, o, 2, 1)
        gathers = sum("gather" in r.op for r in t)
        scatters = sum("reduce_scatter" in r.op or "all_to_all" in r.op for r in t)
        runs[bucketed, prefetch] = (losses, [p.numpy() for p in model.parameters()],
                                    (gathers, scatters))
    ref = runs[False, False]
    for key in ((True, True), (True, False)):
        assert runs[key][0] == ref[0]
        for p, q in zip(runs[key][1], ref[1]):
            np.testing.assert_array_equal(p, q)
    if size > 1:  # one call per layer (two layers) instead of one per parameter
        gathers = {2: 1, 3: 2}[stage]  # stage 2 after the step; stage 3 forward and backward
        assert runs[True, True][2] == runs[True, False][2] == (2 * gathers, 2)
        assert ref[2] == (4 * gathers, 4)


@pytest.mark.mpi(min_size=1)
def test_shard_bucketed_must_be_a_bool():
    model = MLP()
    opt = sm.optim.SGD(model.parameters(), lr=0.1)
    assert errors_of(lambda: sm.nn.shard(model, opt, stage=3, bucketed=1)) == (
        "TypeError", "shard: bucketed must be a bool, got int 1")


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("saved, loaded", [(3, 1), (1, 3), (3, 0), (0, 3), (2, 0), (0, 2),
                                           (2, 3), (1, 2)])
def test_a_checkpoint_saved_under_one_stage_resumes_under_another(shared_dir, saved, loaded):
    ref_model, ref_opt = make(0, "adam")
    ref = steps(ref_model, ref_opt, 0, 5)
    model, o = make(saved, "adam")
    steps(model, o, 0, 2)
    sm.checkpoint.save_training_state(shared_dir, model, o)
    model2, o2 = make(loaded, "adam")
    sm.checkpoint.load_training_state(shared_dir, model2, o2)
    np.testing.assert_allclose(steps(model2, o2, 2, 3), ref[2:], rtol=1e-10)


@pytest.mark.mpi(min_size=1)
def test_shard_arguments_are_checked_on_every_rank():
    model = MLP()
    opt = sm.optim.SGD(model.parameters(), lr=0.1)
    assert errors_of(lambda: sm.nn.shard(model, opt, stage=4)) == (
        "ValueError", "shard: stage must be 1, 2 or 3, got 4")
    assert errors_of(lambda: sm.nn.shard(model, opt, stage=1, axis=1)) == (
        "ValueError", "shard: axis must be a mesh axis of the parameters' 1-d placement "
        "(0..0), got 1")
    other = sm.optim.SGD(MLP().parameters(), lr=0.1)
    kind, text = errors_of(lambda: sm.nn.shard(model, other, stage=3))
    assert kind == "ValueError" and "exactly the module's parameters" in text


class Blocks(sm.nn.Module):
    """Layers kept in an ``sm.nn.ModuleList`` (as the GPT example keeps its blocks) and a
    head beside them."""

    def __init__(self) -> None:
        sm.manual_seed(7)
        pl = world()
        self.blocks = sm.nn.ModuleList([sm.nn.Linear(7, 6, placement=pl, dtype=np.float64),
                                        sm.nn.Linear(6, 5, placement=pl, dtype=np.float64)])
        self.head = sm.nn.Linear(5, 3, placement=pl, dtype=np.float64)

    def forward(self, x):
        for block in self.blocks:
            x = sm.nn.relu(block(x))
        return self.head(x)


def numpy_blocks_step(p: list[np.ndarray], state: dict, x: np.ndarray, y: np.ndarray,
                      opt: str) -> float:
    """One step of :class:`Blocks` in NumPy (mean cross-entropy; ``opt`` as OPTIMIZERS:
    SGD lr 0.3 momentum 0.9, or Adam lr 0.05 with torch's defaults), updating ``p``."""
    layers = [(p[i], p[i + 1]) for i in range(0, len(p), 2)]
    hs, pre = [x], []
    for i, (w, b) in enumerate(layers):
        a = hs[-1] @ w + b
        pre.append(a)
        hs.append(np.maximum(a, 0) if i < len(layers) - 1 else a)
    z = hs[-1]
    zs = z - z.max(1, keepdims=True)
    logp = zs - np.log(np.exp(zs).sum(1, keepdims=True))
    n = len(y)
    loss = -logp[np.arange(n), y].sum() / n
    d = np.exp(logp)
    d[np.arange(n), y] -= 1
    d /= n
    grads: list[np.ndarray] = []
    for i in reversed(range(len(layers))):
        grads = [hs[i].T @ d, d.sum(0)] + grads
        if i:
            d = (d @ layers[i][0].T) * (pre[i - 1] > 0)
    state["t"] = t = state.get("t", 0) + 1
    for i, g in enumerate(grads):
        m = state.setdefault(("m", i), np.zeros_like(g))
        v = state.setdefault(("v", i), np.zeros_like(g))
        if opt == "sgd-momentum":
            m[...] = 0.9 * m + g
            p[i] -= 0.3 * m
        else:
            m[...] = 0.9 * m + 0.1 * g
            v[...] = 0.999 * v + 0.001 * g * g
            p[i] -= (0.05 / (1 - 0.9 ** t)) * (m / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8))
    return float(loss)


@pytest.mark.mpi(min_size=1)
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_a_model_with_a_module_list_shards_at_every_stage(stage, opt):
    """The blocks of a ``ModuleList`` are found by path (``blocks.0.weight``): every stage
    trains to the NumPy losses and parameters and to the unsharded run's; the model keeps
    its class, its names and its layers' own ``forward`` (no monkey-patching)."""
    base = Blocks()
    base_opt = OPTIMIZERS[opt](base.parameters())
    net = Blocks()
    names = [n for n, _ in net.named_parameters()]
    assert names == ["blocks.0.weight", "blocks.0.bias", "blocks.1.weight", "blocks.1.bias",
                     "head.weight", "head.bias"]
    ref = [q.numpy() for q in net.parameters()]
    model, o = sm.nn.shard(net, OPTIMIZERS[opt](net.parameters()), stage=stage)
    assert isinstance(model, sm.nn.Module) and type(net) is Blocks
    assert [n for n, _ in model.named_parameters()] == names
    assert all("forward" not in vars(m) for m in net.modules())
    state: dict = {}
    for s in range(4):
        rng = np.random.default_rng(s)
        x, y = rng.standard_normal((11, 7)), rng.integers(0, 3, 11)
        want = numpy_blocks_step(ref, state, x, y, opt)
        got = []
        for m, opt_ in ((model, o), (base, base_opt)):
            opt_.zero_grad()
            loss = sm.nn.cross_entropy(m(sm.tensor(x, placement=world(), sbp=S(0))), y)
            loss.backward()
            opt_.step()
            got.append(float(loss.numpy()))
        np.testing.assert_allclose(got[0], want, rtol=1e-11)
        np.testing.assert_allclose(got[0], got[1], rtol=1e-11)
        assert model.gathered_bytes == 0  # stage 3: every block freed after its step
    for p, q, r in zip(model.parameters(), base.parameters(), ref):
        assert p.sbp == ((B,) if stage == 1 else (S(0),))
        np.testing.assert_allclose(p.numpy(), r, rtol=1e-10, atol=1e-13)
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.mpi(min_size=1)
def test_each_stage_is_a_module_of_its_own_class():
    from sbpmpi.parallel.zero import ZeroStage1, ZeroStage2, ZeroStage3

    classes = {1: ZeroStage1, 2: ZeroStage2, 3: ZeroStage3}
    for stage, cls in classes.items():
        net = MLP()
        model, _ = sm.nn.shard(net, sm.optim.SGD(net.parameters(), lr=0.1), stage=stage)
        assert type(model) is cls and model.stage == stage and model.module is net
        assert isinstance(model, sm.nn.Module) and type(net) is MLP
        assert model.state_dict().keys() == {"l1.weight", "l1.bias", "l2.weight", "l2.bias"}
        assert list(model.modules())[1:] == list(net.modules())
        model.eval()
        assert not net.training and not net.l1.training
        model.train()
        assert net.training and net.l1.training


def test_the_old_module_name_warns_and_re_exports():
    import importlib
    import sys

    from sbpmpi.parallel.zero import ShardedOptimizer, ZeroModule

    sys.modules.pop("sbpmpi.zero", None)
    with pytest.warns(DeprecationWarning, match=r"sbpmpi\.zero moved to sbpmpi\.parallel\.zero"):
        old = importlib.import_module("sbpmpi.zero")
    assert old.shard is sm.nn.shard and old.ShardedModule is ZeroModule
    assert old.ShardedOptimizer is ShardedOptimizer


def test_zero_declares_its_backward_rules_once_and_no_name_is_overwritten():
    from sbpmpi.autograd.rules import register_rules, rule_for
    from sbpmpi.parallel.zero.backward_rules import ZERO_BACKWARD_RULES as ZERO_RULES

    assert all(rule_for(name) is rule for name, rule in ZERO_RULES.items())
    register_rules(ZERO_RULES)  # the same rules again: nothing changes
    assert all(rule_for(name) is rule for name, rule in ZERO_RULES.items())
    with pytest.raises(ValueError, match=r"op names \['matmul', 'zero_pack'\] already have "
                                         r"backward rules"):
        register_rules({"zero_pack": rule_for("add"), "matmul": rule_for("add")})
    assert rule_for("matmul") is not rule_for("add")
    assert rule_for("zero_pack") is ZERO_RULES["zero_pack"]


# ---- checkpoints across stages and world sizes (programs under their own mpiexec) -----------

TIMEOUT = 240


def _run(n, *args):
    return run_program(n, *args, timeout=TIMEOUT)


@pytest.mark.parametrize("save,resume", [((2, "3"), (3, "1")), ((4, "1"), (1, "0")),
                                         ((3, "b"), (2, "3")), ((2, "2"), (3, "3")),
                                         ((4, "3"), (2, "2")), ((3, "2"), (1, "0"))],
                         ids=["n2-stage3-to-n3-stage1", "n4-stage1-to-n1-dp",
                              "n3-buckets-to-n2-stage3", "n2-stage2-to-n3-stage3",
                              "n4-stage3-to-n2-stage2", "n3-stage2-to-n1-dp"])
def test_a_checkpoint_resumes_under_another_stage_and_world_size(tmp_path, save, resume):
    prog = ROOT / "tests" / "train_programs" / "resume_zero.py"
    assert "SAVED" in _run(save[0], prog, "save", tmp_path, save[1])
    assert "RESUME OK" in _run(resume[0], prog, "resume", tmp_path, resume[1])


# ---- faults: a rank raising in backward with a prefetch in flight ---------------------------

@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec on PATH")
@pytest.mark.parametrize("n", [2, 3])
def test_a_rank_raising_in_backward_with_a_prefetch_in_flight_ends_the_job(n):
    res = run_mpi(n, "zero_raise.py", timeout=60)
    assert res.rc != 0, res
    assert res.seconds < 30, res
    assert "sbpmpi: rank 1: uncaught RuntimeError: relu rule failed on rank 1" in res.out, res
    assert "rank 1: prefetch started before the failure" in res.out, res
    assert "should not happen" not in res.out, res
