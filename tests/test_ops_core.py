"""The op library's core (``analytic.ops``: engine, symbolic tensors and autograd, primitives, the step)
against the storage tracker on tiny torch programs, and hand counts."""

import sys

import pytest

from lm_accounting.analytic.ops import aten as A
from lm_accounting.analytic.ops.engine import Affine
from lm_accounting.analytic.ops.step import training_step
from lm_accounting.analytic.ops.tensors import Run, Tensor, backward, checkpoint, empty, parameter, repeated

B = Affine(1)
V, D, F, S = 100, 16, 24, 8


def test_storage_charges_and_frees_by_reference():
    with Run() as run:
        a = empty((B, S, D))  # 4·S·D bytes a row
        view = A.view(a, -1, D)
        del a  # the view keeps the storage
        b = empty((B, S, F))
        del view, b
        phase = run.phase()
    assert phase.end == Affine(0)
    assert phase.peak.at(3) == 3 * (S * D + S * F) * 4


class EmbedHead:
    """``head(emb(x))`` and ``F.cross_entropy`` over the flattened logits: the program of ``torch_emb_head``."""

    def __init__(self, batch):
        self.emb = parameter((V, D), name="emb")
        self.head = parameter((V, D), name="head")
        self.ids = empty((batch, S), "int64")
        self.targets = empty((batch, S), "int64")

    def parameters(self):
        return [self.emb, self.head]

    def loss(self):
        logits = A.linear(A.embedding(self.emb, self.ids), self.head)
        return A.cross_entropy(A.view(logits, -1, V), A.view(self.targets, -1))


def torch_emb_head(batch, optimizer):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as tf

    from lm_accounting.measure.tracker import measure_training_step

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, D)
            self.head = torch.nn.Linear(D, V, bias=False)

        def forward(self, x):
            return self.head(self.emb(x))

    with torch.device("meta"):
        m = M()
        ids = torch.randint(0, V, (batch, S))
        targets = torch.randint(0, V, (batch, S))
    opt = torch.optim.AdamW(m.parameters(), foreach=optimizer == "foreach")
    return measure_training_step(
        m, ids, targets, lambda out, t: tf.cross_entropy(out.view(-1, V), t.view(-1)), optimizer=opt
    )


def test_embedding_linear_cross_entropy_by_hand():
    """Forward: embedding output (T·D·4), logits (T·V·4), log_softmax (T·V·4), loss and total weight (4 + 4);
    the logits die with the forward (nothing saves them), the rest is saved.  Backward: the seed (4),
    nll_loss_backward (T·V·4), the total weight released, then log_softmax_backward_data (T·V·4) on top of
    the saved log_softmax: three T·V tensors at once, with the loss and the seed; later the embedding's
    gradient (V·D·4) is made beside the head's (V·D·4) and dx (T·D·4)."""
    step = training_step(lambda: EmbedHead(B), optimizer="foreach")
    params = 2 * V * D * 4
    for t in (8, 16):  # B = 1, 2
        baseline = 3 * params + 2 * 8 * t
        assert step.baseline.at(t // S) == baseline
        assert step.forward.peak.at(t // S) == baseline + t * D * 4 + 2 * t * V * 4 + 8
        assert step.forward.end.at(t // S) == baseline + t * D * 4 + t * V * 4 + 8
        softmax = baseline + t * D * 4 + 3 * t * V * 4 + 4 + 4
        embedding = baseline + 2 * V * D * 4 + t * D * 4 + 4 + 4
        assert step.backward.peak.at(t // S) == max(softmax, embedding)
        assert step.optimizer_step.peak.at(t // S) == baseline + params + params  # grads + foreach's sqrt(v)


@pytest.mark.parametrize("optimizer", ["foreach", "for-loop"])
def test_embedding_linear_cross_entropy_equals_tracker(optimizer):
    step = training_step(lambda: EmbedHead(B), optimizer=optimizer)
    for batch in (1, 3):
        assert step.at(batch) == torch_emb_head(batch, optimizer)


class CheckpointedMLP:
    """``checkpoint(mlp, h)`` with ``mlp(x) = down(silu(gate(x)) * up(x))`` on an embedding, then a head."""

    def __init__(self, batch):
        self.emb = parameter((V, D), name="emb")
        self.gate, self.up = parameter((F, D), name="gate"), parameter((F, D), name="up")
        self.down, self.head = parameter((D, F), name="down"), parameter((V, D), name="head")
        self.ids, self.targets = empty((batch, S), "int64"), empty((batch, S), "int64")

    def parameters(self):
        return [self.emb, self.gate, self.up, self.down, self.head]

    def mlp(self, x):
        return A.linear(A.mul(A.silu(A.linear(x, self.gate)), A.linear(x, self.up)), self.down)

    def loss(self):
        h = A.embedding(self.emb, self.ids)
        h = A.add(h, checkpoint(self.mlp, h))
        logits = A.linear(h, self.head)
        return A.cross_entropy(A.view(logits, -1, V), A.view(self.targets, -1))


def torch_checkpointed_mlp_class():
    """``CheckpointedMLP`` in torch: an embedding, a SwiGLU MLP under non-reentrant checkpoint with a residual,
    a head (no bias)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as tf
    from torch.utils.checkpoint import checkpoint as ck

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, D)
            self.gate = torch.nn.Linear(D, F, bias=False)
            self.up = torch.nn.Linear(D, F, bias=False)
            self.down = torch.nn.Linear(F, D, bias=False)
            self.head = torch.nn.Linear(D, V, bias=False)

        def mlp(self, x):
            return self.down(tf.silu(self.gate(x)) * self.up(x))

        def forward(self, x):
            h = self.emb(x)
            return self.head(h + ck(self.mlp, h, use_reentrant=False))

    return M


def torch_checkpointed_mlp(batch):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as tf

    from lm_accounting.measure.tracker import measure_training_step

    with torch.device("meta"):
        m = torch_checkpointed_mlp_class()()
        ids = torch.randint(0, V, (batch, S))
        targets = torch.randint(0, V, (batch, S))
    opt = torch.optim.AdamW(m.parameters(), foreach=True)
    return measure_training_step(
        m, ids, targets, lambda out, t: tf.cross_entropy(out.view(-1, V), t.view(-1)), optimizer=opt
    )


def test_checkpoint_equals_torch_checkpoint():
    step = training_step(lambda: CheckpointedMLP(B), optimizer="foreach")
    for batch in (1, 2):
        assert step.at(batch) == torch_checkpointed_mlp(batch)


def test_accumulate_grad_clones_a_gradient_another_node_still_holds():
    """``y = p + x`` then ``y * x``: AddBackward0 hands the same tensor to p's AccumulateGrad and to x's
    path; x's node has not run yet, so p's gradient is a clone (accumulate_grad.h: use_count > 1)."""
    with Run() as run:
        p = parameter((4, 4))
        x = parameter((4, 4))
        loss = A.sum_(A.view(A.mul(A.add(p, x), x), -1), 0)
        run.phase()
        backward(loss)
        assert p.grad is not None and x.grad is not None
        assert p.grad.storage is not x.grad.storage


def test_no_torch_import():
    assert "lm_accounting.analytic.ops.tensors" in sys.modules
    for name in ("engine", "tensors", "aten", "step", "transformers.llama"):
        __import__(f"lm_accounting.analytic.ops.{name}")
    assert isinstance(empty, object) and Tensor


def torch_plain(model_fn, batch):
    """The CPU allocator's view of the same torch program (no dispatch mode: the plain run)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as tf

    from lm_accounting.measure.allocator import measure_training_step_plain
    from lm_accounting.measure.tracker import init_optimizer_state

    m = model_fn()
    ids = torch.randint(0, V, (batch, S))
    targets = torch.randint(0, V, (batch, S))
    opt = torch.optim.AdamW(m.parameters(), foreach=True)
    init_optimizer_state(opt)
    return measure_training_step_plain(
        m, ids, targets, lambda out, t: tf.cross_entropy(out.view(-1, V), t.view(-1)), opt
    )


@pytest.mark.parametrize("program", ["emb-head", "checkpointed-mlp"])
def test_plain_cpu_run_equals_the_allocator(program):
    """No dispatch mode on cpu: gradient sums in place, wrapped Python numbers, AdamW's step counters and
    checkpoint's saved CPU RNG state on the device."""
    torch = pytest.importorskip("torch")

    class EH(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(V, D)
            self.head = torch.nn.Linear(D, V, bias=False)

        def forward(self, x):
            return self.head(self.emb(x))

    CM = torch_checkpointed_mlp_class()

    ours, theirs = {"emb-head": (EmbedHead, EH), "checkpointed-mlp": (CheckpointedMLP, CM)}[program]
    step = training_step(lambda: ours(B), optimizer="foreach", device="cpu", traced=False)
    for batch in (1, 3):
        assert step.at(batch) == torch_plain(theirs, batch)


def test_reshape_views_only_what_memory_order_allows():
    """A (B, S, h, d) tensor transposed to (B, h, S, d): merging B and h needs a copy (S lies between them in
    memory); its transpose back merges S and h as a view; splitting the last dim is always a view."""
    with Run():
        x = empty((2, 8, 4, 16))
        q = A.transpose(x, 1, 2)
        assert A.view_layout(q, (8, 8, 16)) is None
        assert A.view_layout(A.transpose(q, 1, 2), (2, 32, 16)) is not None
        assert A.view_layout(x, (2, 8, 4, 4, 4)) is not None
        before = x.storage
        assert A.reshape(q, 8, 8, 16).storage is not before  # a copy (clone, then _unsafe_view)
        assert A.reshape(x, 2, 8, 64).storage is before  # a view


class Chain:
    """``h = h + down(silu(gate(h)))`` n times (each block possibly checkpointed) on an embedding, then a head;
    ``repeat``: the middle blocks replayed once (``tensors.repeated``)."""

    def __init__(self, batch, n, repeat, ck):
        self.emb, self.head = parameter((V, D), name="emb"), parameter((V, D), name="head")
        self.blocks = [(parameter((F, D)), parameter((D, F))) for _ in range(n)]
        self.ids, self.targets = empty((batch, S), "int64"), empty((batch, S), "int64")
        self.repeat, self.ck = repeat, ck

    def parameters(self):
        return [self.emb] + [w for block in self.blocks for w in block] + [self.head]

    def block(self, i, h):
        gate, down = self.blocks[i]
        f = lambda x: A.linear(A.silu(A.linear(x, gate)), down)
        return A.add(h, checkpoint(f, h) if self.ck else f(h))

    def loss(self):
        h = A.embedding(self.emb, self.ids)
        n = len(self.blocks)
        if self.repeat:
            h = self.block(0, h)
            with repeated(n - 2):
                h = self.block(1, h)
            h = self.block(n - 1, h)
        else:
            for i in range(n):
                h = self.block(i, h)
        return A.cross_entropy(A.view(A.linear(h, self.head), -1, V), A.view(self.targets, -1))


@pytest.mark.parametrize("ck", [False, True], ids=["plain-blocks", "checkpointed"])
@pytest.mark.parametrize("traced", [True, False], ids=["traced", "plain"])
def test_repeated_blocks_equal_every_block_replayed(ck, traced):
    """n alike blocks replayed once (``repeated``) give the step that replaying all n gives, for every B."""
    for optimizer in ("foreach", "for-loop"):
        each = training_step(lambda: Chain(B, 6, False, ck), optimizer=optimizer, device="cpu", traced=traced)
        once = training_step(lambda: Chain(B, 6, True, ck), optimizer=optimizer, device="cpu", traced=traced)
        assert [once.at(b) for b in (1, 2, 5)] == [each.at(b) for b in (1, 2, 5)]
