"""What a tensor-parallel rank allocates beyond the TP-local single-GPU replay.  No torch.

``analytic.parallel.rank_step`` predicts one rank from the single-GPU replay R of the TP-local model
(``local_config``) with TP's all-reduces (``Sizes.all_reduce``, ``replay._tp_all_reduce``: each
row-parallel output and column-parallel input gradient cloned by the functional all-reduce beside its
partial), shifted by the rank's model states and saved activations.  Measured against the real job on
the fake process group (torch 2.13, ``parallelize_module``; ``measure.distributed``), that is
byte-exact for TP in every setup, also where those all-reduces set the peaks (the narrow model of
``tests/test_tensor_parallel_measured.py``); the functions here are what a vocab-parallel rank adds.

Sequence parallel is replayed as such, in every precision (``replay_training_step(sp=M)``: the norms
and the residual stream at T/M rows, the all-gathers and reduce-scatters around the projections, in the
forward, the recompute and the backward), and so is vocab parallel with it (``vocab_parallel_replay``'s
``sp``).
"""

from __future__ import annotations

from functools import lru_cache

from ..config import ModelConfig
from ..layout import ParallelLayout
from ..names import DTYPE_BYTES
from ..setup import TrainingSetup


def vocab_parallel_replay(
    local: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    mode: str,
    tp: int,
    sp: int = 1,
    batch: int = 1,
    units=None,
    where: tuple[str, int] = ("meta", 1),
    cuda_batch: int | None = None,
):
    """The replay (``analytic.replay``, a ``StepInBatch``) of TP rank 0 of the vocab-parallel job
    (``measure.parallelize.apply_vocab_parallel``, ``measure.distributed.vocab_parallel_cross_entropy``),
    with sequence parallel when ``sp`` = M (``replay_training_step``'s ``sp``; ``batch``: its hint, the
    result holds for B = 1 if it is 1, else for every B > 1).  The blocks are the TP-local model's
    (``local``: h/M heads, d_ff/M); rank 0 holds Vl = ceil(V/M) rows of the embedding and of the LM head
    (DTensor's ``Shard(0)``: ``torch.chunk``, the first ranks one row more).  What differs from
    ``replay_training_step``, in program order:

    1. embedding forward (``_vocab_embedding_forward``): a masked lookup in the local rows and an
       all-reduce of the (B, S, d) output;
    2. LM head: logits T·Vl (the replay's head sequence with Vl rows);
    3. the loss is ``loss_parallel``'s (``_loss_parallel_forward``/``_backward``), not the course's;
    4. LM head backward: its input gradient is all-reduced (column-wise input, Replicate);
    5. embedding backward (``_vocab_embedding_backward``): the whole (V, d) gradient.

    Sequence parallel: the embedding's partial output is reduce-scattered to T/M rows instead of
    all-reduced (1, ``_sp_reduce_scatter``), ln_final's output all-gathered for the LM head, and in the
    backward the LM head's input gradient reduce-scattered (4) and the embedding's output gradient
    all-gathered back to the whole (B, S, d) (5).

    ``units`` (``analytic.fsdp.FsdpUnits``): a rank of FSDP2 × TP + VP, FSDP2's events at the unit
    boundaries as in ``replay_training_step``; under its amp-bf16 policy ``setup`` is the bf16 model it
    runs, whose bf16 logits the model casts to fp32 for the loss (``logits.float()``).
    """
    from .fsdp import FsdpEvents
    from .memory import adamw_step_counter_bytes
    from .params import parameter_breakdown
    from .replay import (
        Affine,
        PeakEnvelope,
        PhaseInBatch,
        StepInBatch,
        _amp_layer_backward,
        _amp_layer_forward,
        _amp_layer_forward_unsaved,
        _block,
        _layer_backward,
        _layer_forward,
        _layer_forward_unsaved,
        _layer_runs,
        _norm_backward,
        _norm_forward,
        _Replay,
        _sp_all_gather,
        _sp_reduce_scatter,
    )
    from .sizes import Sizes

    if local.moe or local.mla or local.tie_embeddings or local.positions != "rope":
        raise ValueError("vocab parallel is replayed for the dense, untied course architecture only")
    plain = mode == "plain"
    c = local
    cat = sp > 1 and batch > 1  # ``Sizes.gather_cat``
    ev = FsdpEvents(c, units) if units is not None else None
    fl = units is not None and units.float_logits  # FSDP2's bf16 parameters under autocast
    ar = sp == 1  # the blocks' all-reduces (``replay._tp_all_reduce``)
    pe = DTYPE_BYTES[setup.param_dtype]  # the parameters' bytes (z.e: the activations')
    cpu = plain and where[0] == "cpu"  # a plain CPU run: the CPU allocator's own extras (``Sizes.cpu``)
    # on CUDA: its fused attention kernels (``Sizes.lse``, ``merge_copy``, ``flash_scratch_backward``) and, at
    # ``cuda_batch``, the norms' row-sum scratch (``Sizes.norm_grad_scratch``)
    cuda = where[0] == "cuda"
    z = Sizes(c, Affine(1), seq, pe, setup, plain, cpu, where[1], fl, cuda, sp, cat, ar, cuda_batch if cuda else None)
    e, T, d = z.e, z.T, c.d_model
    vl = -(-c.vocab_size // tp)
    pb = parameter_breakdown(c)
    params = (pb.total - 2 * (c.vocab_size - vl) * d) * e  # the embedding and the LM head: Vl rows each
    p = {it.key.removeprefix("layers.*."): it.per_layer * e for it in pb if it.per_layer is not None}
    rope_buffers = 2 * c.context_length * (c.rope_dim // 2) * 4  # partial rotary: narrower tables
    baseline = 3 * params + rope_buffers + adamw_step_counter_bytes(c, setup.optimizer, where[0]) + 2 * 8 * T
    Td, head = z.act(d), vl * d * e  # head: the LM head's local weight (its gradient, in the parameter dtype)
    xe = 4 if (e == 4 or z.amp or fl) else 2  # the logits the loss reads: fp32 (amp: ``logits.float()``) or bf16
    TV = T * vl * xe

    r = _Replay(baseline, traced=not plain)
    if ev:
        ev.root_pre_forward(r)
    r(+8 * seq)  # positions
    if not z.sdpa:
        r(+seq * seq, +seq * seq, -seq * seq)  # the causal mask
    _vocab_embedding_forward(r, z, T, Td)
    cached = setup.checkpoint == "selective"
    if z.amp and setup.checkpoint != "none":
        _layer_runs(r, c, None, False, lambda q, m: _amp_layer_forward_unsaved(q, z, p, cached=cached), ev)
    elif z.amp:
        _layer_runs(r, c, None, False, lambda q, m: _amp_layer_forward(q, z, p), ev)
    elif setup.checkpoint != "none":
        _layer_runs(r, c, None, False, lambda q, m: _layer_forward_unsaved(q, z, cached=cached), ev)
    else:
        _layer_runs(r, c, None, False, lambda q, m: _layer_forward(q, z), ev)
    _norm_forward(r, z, z.rows, d)  # ln_final
    _sp_all_gather(r, z)  # its output gathered for the LM head (saved by it)
    TV2, Td2, head2 = T * vl * 2, z.bf16.act(d), vl * d * 2
    if z.amp:  # the LM head's bf16 weight and input copies, bf16 logits; ln_final's fp32 output(s) die
        r(+head2, +Td2, +TV2, -Td, -z.residual * (sp > 1))
    r(+(TV2 if fl else TV))  # logits (amp: ``logits.float()``; FSDP2's bf16 model: bf16, copied below)
    if sp > 1 and not z.amp:
        r(-z.residual)  # ln_final's own output dies
    if fl:
        r(+TV)  # ``logits.float()``
    if setup.checkpoint == "none":
        r(-8 * seq)  # positions die with forward's locals
    if z.amp or fl:
        r(-TV2)  # the bf16 logits die
    if e != 4:
        r(-z.residual)  # 16-bit: the last residual stream dies (ln_final kept an fp32 copy)
    if ev:
        ev.root_post_forward(r)
    _loss_parallel_forward(r, T, vl, xe, cpu=z.cpu)
    forward = PhaseInBatch(r.peak(), r.live, r.copy_peak())

    r = _Replay(r.live, traced=not plain)
    _loss_parallel_backward(r, T, vl, xe)
    if ev:
        ev.root_pre_backward(r)
    if z.amp:  # logits.float() backward; the LM head: dW, dx (bf16), copies released, dx and dW to fp32
        r(+TV2, -TV)
        r(+head2, +Td2, -TV2, -head2, -Td2, +Td, -Td2, +head, -head2)
    else:  # (FSDP2's bf16 model: logits.float() backward first); LM head: dW, dx; ln_final's output released
        if fl:
            r(+TV2, -TV)
        r(+head, +Td, -(TV2 if fl else TV), -Td)
    if sp > 1:
        _sp_reduce_scatter(r, z, Td)  # dx reduce-scattered to ln_final's T/M rows; the partial dies
    else:
        r(+Td, -Td)  # rule 4: dx all-reduced; the partial dies
    _norm_backward(r, z, z.rows, d, residual=False, sp=sp > 1)  # ln_final
    layer_backward = _amp_layer_backward if z.amp else _layer_backward
    _layer_runs(r, c, None, True, lambda q, m: layer_backward(q, z, p, last=False), ev)
    _block(r, None, 0, lambda q, m: layer_backward(q, z, p, last=True), ev, True)
    if sp > 1:  # the output gradient of this rank's S/M positions gathered to the whole; the local one dies
        _sp_all_gather(r, z)
        r(-z.residual)
    _vocab_embedding_backward(r, c.vocab_size * d * e, Td)
    if ev:
        ev.root_post_backward(r)
    r(-xe, -xe)  # the loss and its total weight (``nll_loss``'s saved divisor)
    backward = PhaseInBatch(r.peak(), r.live, r.copy_peak())
    # the AdamW step is rank_step's (``adamw_temporary``: DTensor and plain groups); here its end only
    step = PhaseInBatch(PeakEnvelope(((r.live.a, r.live.b),)), baseline)
    return StepInBatch(baseline, forward, backward, step)


@lru_cache(maxsize=1024)
def vocab_parallel_step(
    local: ModelConfig,
    seq: int,
    batch: int,
    setup: TrainingSetup,
    mode: str,
    tp: int,
    sp=1,
    units=None,
    where=("meta", 1),
    ring=None,
):
    """``vocab_parallel_replay`` at one batch (a ``StepMemory``), with CUDA's scratch at that batch; ``ring``: the
    context-parallel ring its blocks' fused attention runs as (``ops.aten_ring``; a key of the cache)."""
    from .ops.aten_ring import installed

    cuda_batch = batch if where[0] == "cuda" else None
    with installed(ring):
        return vocab_parallel_replay(local, seq, setup, mode, tp, sp, min(batch, 2), units, where, cuda_batch).at(batch)


def vocab_parallel_head_saved(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, tp: int) -> int:
    """What the vocab-parallel head saves for backward on rank 0, in place of the course LM head's and
    cross-entropy's (``_loss_parallel_forward``): the log-softmax output T·Vl·xe, the loss and the total
    weight (xe each); under amp-bf16 the LM head's bf16 weight copy (Vl·d·2) and input copy (T·d·2),
    which autocast saves for its matmul."""
    vl, t, d = -(-cfg.vocab_size // tp), batch * seq, cfg.d_model
    xe = 2 if setup.param_dtype == "bf16" else 4
    amp = (vl * d + t * d) * 2 if setup.autocast else 0
    return t * vl * xe + 2 * xe + amp


def _vocab_embedding_forward(r, z, T, Td) -> None:
    """Row-wise embedding (DTensor's ``embedding`` strategy: ``_MaskPartial``,
    torch/distributed/tensor/placement_types.py ``_partition_value``/``_reduce_value``): the mask of the
    ids outside this rank's rows (bool, T bytes: ``lt``, ``ge``, ``or``), the local ids (int64, 8T: a
    clone, minus the offset, the clone dies; masked ids set to 0 in place), the lookup (T·d·e), the
    local ids die, the masked rows zeroed in place and the mask dies, then the all-reduce's output
    (T·d·e) replaces the partial (sequence parallel: the reduce-scatter's T/M rows)."""
    from .replay import _sp_reduce_scatter

    r(+T, +T, +T, -T, -T)  # lt, ge, or; the two comparisons die
    r(+8 * T, +8 * T, -8 * T)  # local ids
    r(+Td, -8 * T, -T)  # lookup; the local ids and the mask die
    if z.sp > 1:
        _sp_reduce_scatter(r, z, Td)
    else:
        r(+Td, -Td)  # all-reduce


def _loss_parallel_forward(r, T, vl, xe, keep_logits: bool = False, cpu: bool = False) -> None:
    """``F.cross_entropy`` on (T, Vl) logits under ``loss_parallel`` (torch/distributed/tensor/parallel/
    loss.py): ``_log_softmax`` then ``_nll_loss_forward``, each one DTensor op whose handler runs local
    ops (autograd saves only the op's outputs: the log-softmax result, the loss and the total weight).
    X = T·Vl·xe the logits (xe: 4, or 2 for bf16 logits), X4 = T·Vl·4, R = a (T, 1) fp32 column.

    1. log-softmax: computed in fp32 (``elementwise_dtypes``: bf16 logits are copied, X4); the row max
       (R) and its all-reduce (R; the partial dies); shifted = x − max (X4); exp (X4) summed (R), exp
       dies, all-reduced (R; the partial dies); log (R); result = shifted − log (X4), cast back (X) for
       bf16; then the fp32 temporaries and the three columns die: the result (X) is saved.
    2. NLL: ``target != -100`` (bool T) and the safe target (int64 8T); the target's mask (bool T: lt,
       ge, or) and local index (int64: clone, minus the offset); gather (T·xe); the mask dies; the
       all-reduce (T·xe); negated (T·xe); ``where`` (T·xe, with another bool T); the total weight: a
       bool T, its int64 sum (8; ``cpu``, a plain CPU run: the CPU reduction first copies the bool
       mask to int64, 8T, freed when it returns), cast (xe); the sum (xe) and the mean (xe, the loss);
       then every temporary and the logits die (``keep_logits``: a pipeline stage's schedule still
       holds them)."""
    X, X4, R = T * vl * xe, T * vl * 4, T * 4
    copy = X4 if xe != 4 else 0
    r(+copy, +R, +R, -R)  # fp32 copy; row max; all-reduce
    r(+X4, +X4, +R, -X4, +R, -R, +R, +X4)  # shifted; exp; Σ; exp dies; all-reduce; log; result
    if xe != 4:
        r(+X, -X4)  # cast back; the fp32 result dies
    r(-X4, -copy, -R, -R, -R)  # shifted, the copy and the three columns die
    Tx = T * xe
    r(+T, +8 * T, -T)  # target != -100; safe target
    r(+T, +T, +T, -T, -T, +8 * T, +8 * T, -8 * T)  # mask; local index
    r(+Tx, -T, +Tx, +Tx)  # gather; the mask dies; all-reduce; negated
    r(+T, +Tx, -T, -Tx)  # where; its mask and the negation die
    r(+T, +8, +8 * T * cpu, -8 * T * cpu, -T, +xe, -8, +xe, +xe, -xe)  # total weight; sum; mean (the loss)
    r(-Tx, -8 * T, -8 * T, -Tx, -Tx, -X * (not keep_logits))  # where's output, safe target, local index, gather, …


def _loss_parallel_backward(r, T, vl, xe) -> None:
    """``_nll_loss_and_log_softmax_backward`` (loss.py), the fused NLL + log-softmax backward, then the
    log-softmax node's ``grad.to(input dtype)`` (no copy: the gradient has that dtype already).

    The seed (xe) and its division by the total weight (xe); the safe target (bool T, int64 8T);
    zeros like the logits (X); the target's mask and local index (as forward); the update
    ``mask.to(dtype) − 1`` (T·xe twice, the cast dies); ``arange`` (int64 8T); the update put in place;
    ``where`` on the divided seed (T·xe, with a bool T); the divided seed dies; exp(log-softmax) (X),
    + zeros (X), exp dies, × grad (X), the sum dies; then the temporaries, the seed and the saved
    log-softmax output die: the gradient of the logits (X) is left."""
    X, Tx = T * vl * xe, T * xe
    r(+xe, +xe, +T, +8 * T, -T, +X)  # seed; divided; safe target; zeros
    r(+T, +T, +T, -T, -T, +8 * T, +8 * T, -8 * T)  # mask; local index
    r(+Tx, +Tx, -Tx, +8 * T, +T, +Tx, -T, -xe)  # update; arange; where; the divided seed dies
    r(+X, +X, -X, +X, -X)  # exp; + zeros; exp dies; × grad; the sum dies
    r(-Tx, -8 * T, -X, -T, -8 * T, -Tx, -8 * T, -xe, -X)  # temporaries, zeros, mask, seed; saved output


def _vocab_embedding_backward(r, emb_whole, Td) -> None:
    """``embedding_dense_backward`` on DTensor (torch/distributed/tensor/_ops/_embedding_ops.py): it
    has no row-wise strategy, so with the replicated output gradient it computes the whole (V, d)
    gradient on every rank and leaves it ``Replicate`` as the parameter's ``.grad`` (the optimizer
    redistributes it to the rows); the output gradient dies."""
    r(+emb_whole, -Td)


def vocab_parallel_gradient_extra(cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout) -> int:
    """Gradient bytes a vocab-parallel rank holds beyond its parameters' (``_vocab_embedding_backward``):
    the embedding's gradient is the whole (V, d), not its Vl rows: (V − Vl)·d·e.  Not FSDP2 (it reduces
    and shards each gradient itself)."""
    if not layout.vocab_parallel or layout.fsdp or cfg.tie_embeddings:
        return 0
    vl = -(-cfg.vocab_size // layout.tp)
    return (cfg.vocab_size - vl) * cfg.d_model * DTYPE_BYTES[setup.param_dtype]
