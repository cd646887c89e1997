"""Tests for lm_accounting.measure.tracker (StorageTracker and measure_*)."""

import copy
import gc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lm_accounting.measure.meta_memo import MetaMemo, distinct_positions, output_specs
from lm_accounting.measure.tracker import (
    ALLOCATOR_ROUNDING,
    CUBLAS_WORKSPACES,
    PhaseBytes,
    StorageTracker,
    cuda_rounding,
    measure_forward,
    measure_training_step,
    measure_training_step_cuda,
)

DEVICES = ["cpu", "meta"]


# --------------------------------------------------------------------------
# Self-contained models
# --------------------------------------------------------------------------
B, D_IN, H, C = 8, 16, 32, 10  # tiny MLP: batch, input, hidden, classes
MLP_PARAMS = D_IN * H + H + H * C + C  # 874
MLP_PARAM_TENSORS = 4


def tiny_mlp(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D_IN, H), nn.ReLU(), nn.Linear(H, C)).to(device)
    x = torch.randn(B, D_IN).to(device)
    y = torch.randint(0, C, (B,)).to(device)
    return model, x, y


def rmsnorm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class TinyLM(nn.Module):
    """Embedding, one pre-norm attention + SiLU-MLP block, RMSNorm, LM head."""

    def __init__(self, vocab=64, d=16, heads=2, seq=8):
        super().__init__()
        self.vocab, self.d, self.heads = vocab, d, heads
        self.emb = nn.Embedding(vocab, d)
        self.n1, self.n2, self.nf = (nn.Parameter(torch.ones(d)) for _ in range(3))
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.proj = nn.Linear(d, d, bias=False)
        self.w1 = nn.Linear(d, 4 * d, bias=False)
        self.w2 = nn.Linear(4 * d, d, bias=False)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, idx):
        b, s = idx.shape
        hd = self.d // self.heads
        x = self.emb(idx)
        q, k, v = self.qkv(rmsnorm(x, self.n1)).view(b, s, 3, self.heads, hd).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * hd**-0.5
        att = att.masked_fill(~self.causal[:s, :s], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, self.d))
        x = x + self.w2(F.silu(self.w1(rmsnorm(x, self.n2))))
        return self.head(rmsnorm(x, self.nf))


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def tiny_lm(device, batch=2, seq=8, **kw):
    torch.manual_seed(0)
    model = TinyLM(seq=seq, **kw)
    idx = torch.randint(0, model.vocab, (batch, seq + 1))
    # contiguous copies: on cpu, .to("cpu") of two slices would share idx's storage
    return model.to(device), idx[:, :-1].contiguous().to(device), idx[:, 1:].contiguous().to(device)


def nbytes(*tensors):
    return sum(t.untyped_storage().nbytes() for t in tensors)


# --------------------------------------------------------------------------
# Hand-computed primitive cases
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_alloc_free_view_inplace(device):
    dev = torch.device(device)
    tr = StorageTracker()
    with tr:
        a = torch.empty(1000, dtype=torch.float32, device=device)
        assert (tr.current[dev], tr.peak[dev]) == (4000, 4000)
        v = a[10:].view(10, 99)  # a view shares a's storage
        a.add_(1.0)  # in-place: returns a
        assert tr.current[dev] == 4000
        b = torch.empty(250, dtype=torch.float64, device=device)  # 2000 B
        assert (tr.current[dev], tr.peak[dev]) == (6000, 6000)
        del a
        assert tr.current[dev] == 6000  # the view keeps the storage alive
        del v
        assert tr.current[dev] == 2000
        del b
        assert (tr.current[dev], tr.peak[dev]) == (0, 6000)


@pytest.mark.parametrize("device", DEVICES)
def test_temporary_in_expression(device):
    dev = torch.device(device)
    tr = StorageTracker()
    with tr:
        a = torch.empty(1000, device=device)
        with tr.phase("expr"):
            b = (a * 2) + 1  # a*2 (4000 B) lives until + returns
    assert tr.phases["expr"][dev] == PhaseBytes(peak=12000, end=8000)
    assert tr.phase_table(device)["expr"] == (12000, 8000)
    del b
    assert tr.current[dev] == 4000


def test_meta_kernels_run_once_per_distinct_input():
    """On meta the tracker runs an op's kernel once per distinct input metadata and afterwards builds its
    output from memory: same shape, strides and dtype, a storage of its own, charged the same bytes."""
    meta = torch.device("meta")
    tr = StorageTracker()
    with tr:
        a, b = torch.empty(3, 5, device="meta"), torch.empty(3, 5, device="meta")
        x, y = a.t() * b.t(), a.t() * b.t()  # (5, 3) with strides (1, 5): a transposed output, twice
        assert (tr.memo.misses, tr.memo.hits) == (1, 1)
        assert (y.shape, y.stride(), y.dtype) == ((5, 3), (1, 5), torch.float32) == (x.shape, x.stride(), x.dtype)
        assert x.untyped_storage() is not y.untyped_storage()
        assert tr.current[meta] == 4 * 60  # a, b, x, y: 60 B each
        del x
        assert tr.current[meta] == 3 * 60
        i = torch.empty(4, dtype=torch.int64, device="meta")
        # what decides the output besides the tensors: a scalar's type, torch's default dtype
        assert [(i * 1).dtype, (i * 1.0).dtype, (i * 1).dtype] == [torch.int64, torch.float32, torch.int64]
        assert (i / 2).dtype == torch.float32
        torch.set_default_dtype(torch.float64)
        try:
            assert (i / 2).dtype == torch.float64
        finally:
            torch.set_default_dtype(torch.float32)
        hits = tr.memo.hits
        a[1:].view(2, 5)  # views and tensors off meta always run their kernels
        a[1:].view(2, 5)
        c = torch.ones(3, device="cpu")
        assert (c * c).tolist() == [1.0, 1.0, 1.0] == (c * c).tolist()
        assert tr.memo.hits == hits
        # an in-place pointwise or foreach op's check runs once per metadata and scalar type (not value)
        assert a.mul_(2) is a and a.mul_(3) is a and tr.memo.hits == hits + 1
        with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
            a.mul_(torch.empty(2, 3, 5, device="meta"))  # new metadata: checked, and refused
        torch._foreach_mul_([a, b], 0.5)
        torch._foreach_mul_([a, b], 0.25)
        assert tr.memo.hits == hits + 2 and tr.current[meta] == 3 * 60 + 32  # a, b, y, i: nothing allocated
        # a Tensor[] return: fresh storages each time
        r1, r2 = torch._foreach_sqrt([a, b]), torch._foreach_sqrt([a, b])
        assert [t.shape for t in r2] == [(3, 5), (3, 5)] and r1[0].untyped_storage() is not r2[0].untyped_storage()
        assert tr.memo.hits == hits + 3 and tr.current[meta] == 7 * 60 + 32


def test_foreach_checks_run_on_one_position_per_distinct_metadata():
    memo = MetaMemo()
    a, b, c = (torch.empty(3, 5, device="meta") for _ in range(3))
    w = torch.empty(4, device="meta")
    cut = distinct_positions(([a, b, w, b], [c, c, w, c], 0.5))
    assert [[id(t) for t in lst] for lst in cut[:2]] == [[id(a), id(w)], [id(c), id(w)]] and cut[2] == 0.5
    assert distinct_positions(([a, b], [c])) is None  # unequal lengths: the kernel's own check runs
    mul = torch.ops.aten._foreach_mul_.List
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):  # a failing position fails
        memo(mul, ([a, b, w], [c, c, torch.empty(2, 4, device="meta")]), {})
    with pytest.raises(RuntimeError):
        memo(mul, ([a, b], [c]), {})
    assert memo(mul, ([a, b, w], [c, c, w]), {}) is None and memo(mul, ([a, b, w], [c, c, w]), {}) is None
    assert (memo.misses, memo.hits) == (3, 1)


def test_memo_rebuilds_only_fresh_dense_outputs():
    """An output that is an input's storage, or a padded storage, is never rebuilt from memory."""
    a = torch.empty(3, 5, device="meta")
    assert output_specs(a, (a,), {}) is None
    padded = torch.empty(20, device="meta")[:15].view(3, 5)  # 80 B of storage behind 60 B of tensor
    assert output_specs(padded, (a,), {}) is None
    assert output_specs(torch.empty(3, 5, device="meta"), (a,), {}) == (((3, 5), (5, 1), torch.float32),)


def test_phase_resets_peak_and_records_end():
    tr = StorageTracker()
    with tr:
        with tr.phase("big"):
            t = torch.empty(1000)
            del t
        keep = torch.empty(10)
        with tr.phase("small"):
            u = torch.empty(20)
    assert list(tr.phase_table("cpu").items()) == [("big", (4000, 0)), ("small", (120, 120))]
    del keep, u


def test_preexisting_tensors_only_counted_when_registered():
    pre = torch.empty(100)
    tr = StorageTracker()
    with tr:
        pre.mul_(2)  # in-place and view outputs alias `pre`: not new allocations
        pre[1:].view(9, 11).t()
        tmp = pre + 1
        assert tr.current[torch.device("cpu")] == 400
        del tmp
        assert tr.current[torch.device("cpu")] == 0
    tr.track(pre, pre[3:], None).track(pre)  # same storage: counted once
    assert tr.live_bytes("cpu") == 400
    del pre
    assert tr.live_bytes("cpu") == 0


@pytest.mark.slow
def test_storage_python_object_is_preserved():
    """Dropping every Python reference to a storage object must not count as a free."""
    tr = StorageTracker()
    with tr:
        t = torch.empty(1000)
    t.untyped_storage()  # a throw-away reference
    gc.collect()
    assert tr.live_bytes("cpu") == 4000
    alias = torch.empty(0)
    alias.set_(t.untyped_storage())  # another tensor, same StorageImpl
    del t
    gc.collect()
    assert tr.live_bytes("cpu") == 4000
    del alias
    assert tr.live_bytes("cpu") == 0


def test_resize_is_counted():
    tr = StorageTracker()
    with tr:
        t = torch.empty(0)
        t.resize_(100)  # aten.resize_ grows the storage in place
    assert (tr.live_bytes("cpu"), tr.peak[torch.device("cpu")]) == (400, 400)
    del t


def test_cuda_rounding():
    assert [cuda_rounding(n) for n in (0, 1, 512, 513, 4000)] == [0, 512, 512, 1024, 4096]
    tr = StorageTracker(rounding=cuda_rounding)
    with tr:
        t = torch.empty(1000, device="meta")
    assert tr.live_bytes("meta") == 4096
    del t


# --------------------------------------------------------------------------
# Autograd: the backward pass and gradient accumulation
# --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_accumulate_grad_clone_and_steal(device):
    dev = torch.device(device)
    w = torch.zeros(1000, device=device, requires_grad=True)
    tr = StorageTracker().track(w)
    with tr:
        # grad of sum() is an expanded 4-byte tensor: AccumulateGrad must clone it.
        w.sum().backward()
    assert w.grad is not None and tr.current[dev] == 4000 + 4000
    w.grad = None
    assert tr.current[dev] == 4000
    with tr:
        # grad of (w * 2).sum() is a fresh contiguous tensor: AccumulateGrad steals it.
        (w * 2).sum().backward()
        assert tr.current[dev] == 8000
        grad_ptr = w.grad.untyped_storage()._cdata  # (holding the storage would keep it alive)
        (w * 3).sum().backward()  # accumulates in place into the existing grad
        assert w.grad.untyped_storage()._cdata == grad_ptr
    assert tr.current[dev] == 8000
    w.grad = None
    assert tr.current[dev] == 4000


# --------------------------------------------------------------------------
# Phase semantics on the tiny MLP, all bytes written out by hand
# --------------------------------------------------------------------------
F32 = 4
P = MLP_PARAMS * F32  # 3496 B of parameters (= grads = exp_avg = exp_avg_sq)
INPUTS = B * D_IN * F32 + B * 8  # x fp32 + y int64 = 576
ACT = B * H * F32  # one hidden activation: 1024
LOGITS = B * C * F32  # 320
SCALAR = F32  # the loss, nll's total_weight, backward's ones_like seed


def test_mlp_phases_by_hand_foreach_false():
    model, x, y = tiny_mlp("meta")
    r = measure_training_step(model, x, y, F.cross_entropy, optimizer_kwargs={"foreach": False})
    base = P + 2 * P + INPUTS  # params, exp_avg, exp_avg_sq, inputs (step counters live on cpu)
    assert r.baseline == base
    # forward: addmm -> h (1024), relu -> a (1024) while h is alive; then h dies
    # (relu saves its output).  End: a (saved by addmm2), log_softmax output
    # (saved by nll), loss and total_weight; the logits died after log_softmax.
    assert r.forward == (base + 2 * ACT, base + ACT + LOGITS + 2 * SCALAR)
    assert r.forward.peak >= P + INPUTS
    # backward: peak at the bias-1 grad: all four grads, grad of h (1024), the
    # loss and the ones seed.  End: the grads only (the loss was deleted).
    assert r.backward == (base + P + ACT + 2 * SCALAR, base + P)
    # for-loop AdamW: per parameter, sqrt(v) and sqrt(v)/c are two temporaries,
    # while the previous parameter's denom is still referenced; largest at w1.
    # Tensors w1 2048 B, b1 128, w2 1280, b2 40; previous + 2·current:
    #   w1 0 + 4096 = 4096;  b1 2048 + 256 = 2304;  w2 128 + 2560 = 2688;  b2 1280 + 80 = 1360
    extra = 4096  # = 2 · D_IN · H · 4, at w1
    assert r.optimizer_step == (base + P + extra, base)  # zero_grad frees grads


def test_mlp_optimizer_variants_by_hand():
    """Bytes above params+grads+m+v held at the step, per implementation."""
    model, x, y = tiny_mlp("meta")
    foreach = measure_training_step(model, x, y, F.cross_entropy, optimizer_kwargs={"foreach": True})
    base = 3 * P + INPUTS
    # _multi_tensor_adamw: _foreach_sqrt(exp_avg_sqs) copies all v at once: +4 B/param.
    assert foreach.optimizer_step == (base + P + P, base)
    default = measure_training_step(*tiny_mlp("meta"), F.cross_entropy)
    loop = measure_training_step(*tiny_mlp("meta"), F.cross_entropy, optimizer_kwargs={"foreach": False})
    assert default == loop  # foreach is the default only when all params are on cuda-like devices
    model, x, y = tiny_mlp("cpu")  # fused AdamW has no meta kernel; run it on cpu
    fused = measure_training_step(model, x, y, F.cross_entropy, optimizer_kwargs={"fused": True})
    steps = MLP_PARAM_TENSORS * F32  # fp32 0-d `step` per parameter, on the model's device
    assert fused.optimizer_step == (base + steps + P, base + steps)  # no temporaries
    with pytest.raises(RuntimeError):
        measure_training_step(*tiny_mlp("meta"), F.cross_entropy, optimizer_kwargs={"fused": True})


@pytest.mark.slow
@pytest.mark.parametrize("grad", [False, True])
def test_measure_forward_by_hand(grad):
    model, x, _ = tiny_mlp("meta")
    baseline, forward = measure_forward(model, x, grad=grad)
    base = P + B * D_IN * F32
    assert baseline == base
    # peak: h and relu(h); end: the logits, plus relu(h) saved by addmm when grad.
    assert forward == (base + 2 * ACT, base + LOGITS + (ACT if grad else 0))


# --------------------------------------------------------------------------
# meta vs real cpu tensors
# --------------------------------------------------------------------------
@pytest.mark.parametrize("make,loss", [(tiny_mlp, F.cross_entropy), (tiny_lm, lm_loss)])
@pytest.mark.parametrize("kw", [{}, {"foreach": True}])  # {} is the for-loop on cpu and meta
def test_meta_matches_cpu(make, loss, kw):
    """Equal up to AdamW's 0-d fp32 `step` counters.

    Without capturable/fused, AdamW creates `state["step"]` on the cpu
    whatever the parameter's device.  On a cpu model those 4 B per parameter
    tensor count towards the model's device, on a meta model they do not.
    Nothing else differs.
    """
    meta = measure_training_step(*make("meta"), loss, optimizer_kwargs=kw)
    model, x, y = make("cpu")
    cpu = measure_training_step(model, x, y, loss, optimizer_kwargs=kw)
    steps = 4 * len(list(model.parameters()))
    assert cpu.baseline - meta.baseline == steps
    for name in ("forward", "backward", "optimizer_step"):
        assert cpu.phase(name).peak - meta.phase(name).peak == steps, name
        assert cpu.phase(name).end - meta.phase(name).end == steps, name
    assert meta.optimizer_step.end == meta.baseline


def test_lm_phase_invariants():
    model, x, y = tiny_lm("meta")
    r = measure_training_step(model, x, y, lm_loss, optimizer_kwargs={"foreach": True})
    p = nbytes(*model.parameters())
    assert r.baseline == 3 * p + nbytes(x, y, model.causal)
    assert r.forward.peak >= p + nbytes(x, y)
    assert r.backward.end == r.baseline + p  # activations gone, grads alive
    assert r.optimizer_step.peak == r.baseline + 2 * p  # grads + sqrt(v) copies


def test_live_model_state_counted_after_backward():
    """Grads live after backward (seen through the tracker, not assumed)."""
    model, x, y = tiny_lm("meta")
    tr = StorageTracker().track_module(model).track(x, y)
    with tr:
        lm_loss(model(x), y).backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None for g in grads)
    assert tr.live_bytes("meta") == nbytes(*model.parameters(), *model.buffers(), x, y, *grads)
    model.zero_grad(set_to_none=True)
    del grads
    assert tr.live_bytes("meta") == nbytes(*model.parameters(), *model.buffers(), x, y)


# --------------------------------------------------------------------------
# Independent reference: torch's MemTracker
# --------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [{"foreach": True}, {"foreach": False}])
def test_against_torch_memtracker(kw):
    mem_tracker = pytest.importorskip("torch.distributed._tools.mem_tracker")
    model, x, y = tiny_lm("meta", batch=2, seq=8, d=32)
    opt = torch.optim.AdamW(model.parameters(), **kw)

    def step():
        loss = lm_loss(model(x), y)
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    mt = mem_tracker.MemTracker()
    mt.track_external(model, opt, x, y)
    with mt:
        step()
    theirs = mt.get_tracker_snapshot("peak")[torch.device("meta")]["Total"]
    ours = measure_training_step(model, x, y, lm_loss, optimizer=opt, warmup_steps=0)
    assert ours.peak == theirs


# --------------------------------------------------------------------------
# CUDA allocator statistics vs the tracker on meta (runs only with a GPU)
# --------------------------------------------------------------------------
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_allocator_matches_meta_tracker():
    # The plain CUDA run (requested bytes less the cuBLAS workspaces) against the tracker's traced run
    # on meta: what each phase leaves live is the same tensors; the plain run's peaks can only be lower
    # (a dispatch mode makes autograd pick out-of-place variants: measure.allocator).
    kw = dict(batch=4, seq=128, vocab=512, d=128, heads=4)
    opt_kw = {"foreach": True}  # cuda's default; meta would default to the for-loop
    model, x, y = tiny_lm("cpu", **kw)
    cuda_model = copy.deepcopy(model).cuda()
    cuda = measure_training_step_cuda(cuda_model, x.cuda(), y.cuda(), lm_loss, optimizer_kwargs=opt_kw)
    meta = measure_training_step(*tiny_lm("meta", **kw), lm_loss, optimizer_kwargs=opt_kw)
    assert cuda.baseline == meta.baseline
    for name in ("forward", "backward", "optimizer_step"):
        assert cuda.phase(name).end == meta.phase(name).end, name
        assert cuda.phase(name).peak <= meta.phase(name).peak, name
    overheads = dict(cuda.overheads)
    assert overheads[CUBLAS_WORKSPACES] > 0 and overheads[ALLOCATOR_ROUNDING] >= 0
    assert meta.forward.peak - meta.baseline > 1_000_000  # the comparison is not vacuous
