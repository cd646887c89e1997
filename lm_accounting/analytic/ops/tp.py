"""One rank of transformers' own tensor parallel over its Llama model: its model states and its collectives.
No torch.

The job is what ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=M))`` applies (transformers
5.24 ``distributed/mixin.py`` ``maybe_distribute_model`` -> ``distributed/tensor_parallel.py``
``apply_tensor_parallelism``), run by ``measure.hf_parallel.measure_hf_rank`` on the fake process group.  The plan
(``init_parallel_plans``): the config's ``base_model_tp_plan`` (q/k/v and gate/up ``colwise``, o and down
``rowwise``), ``embedding_rowwise`` on ``embed_tokens`` and the class's ``lm_head: colwise_gather_output``.  Its
parameters are DTensors; in training every sharded layer runs on DTensors (``should_use_local_tensors`` is False
with grad enabled):

1. States.  q/k/v/o and the MLP are Megatron's split (h/M heads, kv/M, d_ff/M); the embedding (``Shard(0)``) and the
   head (``Shard(0)`` of the (V, d) weight) hold ceil(V/M) rows on rank 0 (``torch.chunk``); norms are replicated:
   our layout ``tp=M, vocab_parallel`` (``analytic.parallel.model_states``), whose gradients hold the whole (V, d)
   embedding gradient (``analytic.tensor_parallel.vocab_parallel_gradient_extra``: DTensor's embedding backward has
   no row-wise strategy).  AdamW's moments follow the local parameters.  The rest of the rank's baseline (token ids,
   labels, rotary buffers) is the single-GPU program's (``ops.predict_step``).
2. Forward collectives (``CollectiveRecorder``: the bytes of the largest tensor): the embedding's ``Partial`` output
   all-reduced (T·d in the parameters' dtype: autocast does not touch the lookup), each rowwise output all-reduced
   (``RowwiseParallel.transform_output_post_forward``: T·d in the activations' dtype, bf16 under amp) and the head's
   ``Shard(-1)`` logits all-gathered to ``Replicate`` (T·V in the activations' dtype).
3. Backward collectives: each colwise layer's input gradient, ``Partial``, all-reduced back to its ``Replicate``
   input (``DTensor.from_local``'s backward: 5 per layer, in the order up, gate, v, k, q, and the head's first), T·d
   in the residual stream's dtype (fp32 under amp); Qwen3's per-head q/k norms (``replicated_with_grad_allreduce``)
   all-reduce their gradient in place once accumulated (head_dim elements in the parameters' dtype, before k's
   and q's input gradient); under full checkpointing each layer's recompute all-reduces o_proj's output
   again (T·d, activations' dtype) but not down_proj's: torch's non-reentrant checkpoint stops the recompute once
   the last saved tensor is made (``torch/utils/checkpoint.py`` ``_StopRecomputationError``, ``early_stop``),
   and down_proj saves its input only.

Checked byte for byte against the fake-PG job on real CPU tensors (tests/test_ops_tp.py).  The transient peaks and
the forward's end are not predicted: they need the DTensor ops replayed (the logits' gather, the masked lookup,
each redistribution's copies), which the op library does not do yet.
"""

from __future__ import annotations

import dataclasses

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...names import DTYPE_BYTES
from ...setup import TrainingSetup
from ..parallel import model_states

TP_FAMILIES = ("llama", "qwen3", "mistral")
"""transformers' ``model_type``s whose TP plan is run and checked here: Llama's and Mistral's (the same plan, Mistral's
sliding window aside), Qwen3's (its q/k norms ``replicated_with_grad_allreduce``)."""
ROWWISE_PER_LAYER = 2  # o_proj, down_proj


def check_tp(cfg: ModelConfig, layout: ParallelLayout) -> None:
    """Refuse (``ValueError``, one line) a tensor-parallel job over transformers' model not run or checked here."""
    m = layout.tp
    if cfg.hf_model_type not in TP_FAMILIES:
        raise ValueError(
            f"tensor parallel over transformers' {cfg.hf_model_type} is not run (its plan is checked for "
            f"{', '.join(TP_FAMILIES)} only)"
        )
    if layout.dp > 1 or layout.pp > 1 or layout.ep > 1 or layout.replicate > 1 or layout.cp > 1:
        raise ValueError("transformers' tensor parallel is run alone: --tp only, no --dp, --pp, --ep, --cp or HSDP")
    if layout.sequence_parallel or layout.vocab_parallel:
        raise ValueError(
            "transformers' TP plan shards the embedding and head itself (embedding_rowwise, colwise_gather_output) "
            "and has no sequence parallel (DistributedConfig: not wired up): drop --sp and --vp"
        )
    if cfg.tie_embeddings:
        raise ValueError("transformers' tensor parallel over a tied embedding and head is not run")
    for what, n in (("heads", cfg.num_heads), ("kv heads", cfg.kv_heads), ("d_ff", cfg.d_ff), ("vocab", cfg.vocab_size)):
        if n % m:
            raise ValueError(f"tp={m} does not divide the {what} ({n}) (uneven shards are not checked)")


def hf_layout(layout: ParallelLayout) -> ParallelLayout:
    """Our layout with the same model states: transformers' plan shards the embedding and the head on the vocab."""
    return ParallelLayout(tp=layout.tp, vocab_parallel=True)


@dataclasses.dataclass(frozen=True)
class TpRankStates:
    """Rank 0's bytes at the step's start, at the backward's end and at the step's end."""

    baseline: int
    backward_end: int
    step_end: int


def rank_states(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout) -> TpRankStates:
    """Rule 1 of the module docstring: the single-GPU program's baseline with its parameters and moments replaced
    by the rank's; the backward ends with the rank's gradients added; the step ends where it began."""
    from . import predict_step

    check_tp(cfg, layout)
    one = predict_step(cfg, seq, setup, impl="transformers", batch=batch).at(batch)
    full, local = model_states(cfg, setup, ParallelLayout()), model_states(cfg, setup, hf_layout(layout))
    baseline = one.baseline - full.parameters - full.optimizer + local.parameters + local.optimizer
    return TpRankStates(baseline, baseline + local.gradients, baseline)


def collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout
) -> list[tuple[str, int, str]]:
    """Rules 2 and 3: ``(kind, bytes, phase)`` in call order, as ``measure.distributed.CollectiveRecorder`` records
    the job's."""
    check_tp(cfg, layout)
    t, d, layers = batch * seq, cfg.d_model, cfg.num_layers
    param = DTYPE_BYTES[setup.param_dtype]
    act = 2 if setup.autocast else param  # autocast's linears: bf16 outputs
    residual = param  # amp-bf16: the residual stream (and each colwise input) stays fp32
    forward = [("all_reduce", t * d * param, "forward")]  # the embedding's partial lookup
    for _ in range(layers):
        forward += [("all_reduce", t * d * act, "forward")] * ROWWISE_PER_LAYER
    forward.append(("all_gather", t * cfg.vocab_size * act, "forward"))  # the head's logits
    backward = [("all_reduce", t * d * residual, "backward")]  # the head's input gradient
    for _ in range(layers):
        if setup.checkpoint == "full":
            backward.append(("all_reduce", t * d * act, "backward"))  # the recompute's o_proj
        colwise = ("all_reduce", t * d * residual, "backward")
        norm = [("all_reduce", cfg.d_head * param, "backward")] if cfg.qk_norm else []  # Qwen3's q/k norms
        backward += [colwise] * 3 + (norm + [colwise]) * 2  # up, gate, v; k (its norm first), q (its norm first)
    return forward + backward
