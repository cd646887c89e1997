"""One rank of transformers' own tensor parallel over its Llama-plan models (``TP_PLANS``: Llama, Mistral, Qwen2,
Qwen3, Granite, OLMo, StarCoder2, Gemma 1-3, Cohere, EXAONE 4 and Llama's other classes), alone or beside FSDP2: its
training step and its collectives.  No torch.

The job is what ``from_pretrained(..., distributed_config=DistributedConfig(tp_size=M))`` applies (transformers
5.24 ``distributed/mixin.py`` ``maybe_distribute_model`` -> ``distributed/tensor_parallel.py``
``apply_tensor_parallelism``), run by ``measure.hf_parallel.measure_hf_rank`` on the fake process group.  The plan
(``init_parallel_plans``): the config's ``base_model_tp_plan`` (q/k/v and gate/up ``colwise``, o and down
``rowwise``; StarCoder2's c_fc ``colwise``, c_proj ``rowwise``), ``embedding_rowwise`` on ``embed_tokens`` and the class's ``lm_head: colwise_gather_output``.  Its
parameters are DTensors; in training every sharded layer runs on DTensors (``should_use_local_tensors`` is False
with grad enabled):

1. States.  q/k/v/o and the MLP are Megatron's split (h/M heads, kv/M, d_ff/M); the embedding (``Shard(0)``) and the
   head (``Shard(0)`` of the (V, d) weight) hold V/M rows each; norms are replicated: the states of our layout
   ``tp=M, vocab_parallel``, whose gradients hold the whole (V, d) embedding gradient (rule 4a).
2. Forward collectives (``CollectiveRecorder``: the bytes of the largest tensor): the embedding's ``Partial`` output
   all-reduced (T·d in the parameters' dtype: autocast does not touch the lookup), each rowwise output all-reduced
   (``RowwiseParallel.transform_output_post_forward``: T·d in the activations' dtype, bf16 under amp) and the head's
   ``Shard(-1)`` logits all-gathered to ``Replicate`` (T·V in the activations' dtype).
3. Backward collectives: each colwise layer's input gradient, ``Partial``, all-reduced back to its ``Replicate``
   input (``DTensor.from_local``'s backward: 5 per layer, in the order up, gate, v, k, q, and the head's first;
   StarCoder2's 4: c_fc, v, k, q), T·d in the residual stream's dtype (fp32 under amp); the per-head q/k norms
   (``replicated_with_grad_allreduce``: Qwen3's, Gemma 3's, EXAONE 4's) all-reduce their gradient in place once
   accumulated (head_dim elements in the parameters' dtype; Qwen3's each before k's and q's input gradient,
   ``NORMS_AFTER_PROJECTIONS``' both before v's); under full checkpointing each layer's recompute all-reduces
   o_proj's output again (T·d, activations' dtype) but not down_proj's: torch's non-reentrant checkpoint stops the
   recompute once the last saved tensor is made (``torch/utils/checkpoint.py`` ``_StopRecomputationError``,
   ``early_stop``), and down_proj saves its input only, unless a norm reads its output (sandwich and post norms:
   Gemma 2 and 3, EXAONE 4, HyperCLOVA X), where both are re-run.  A rowwise bias (StarCoder2's, Seed-OSS's) is
   replicated and adds no collective.

4. The step (``TensorParallelPlan``, a ``step.Sharding``): the TP-local program (``analytic.parallel.local_config``,
   Vl = V/M rows of the embedding and head) with what DTensor adds, in program order:

   a. the embedding (``_MaskPartial``, as ``analytic.tensor_parallel._vocab_embedding_forward``): the ids outside
      the rank's rows (bool T: ``lt``, ``ge``, ``or``), the local ids (int64 8T: a clone, minus the offset), the
      lookup (T·d), the local ids and the mask die, the all-reduce's output replaces the partial; its backward the
      whole (V, d) gradient from the saved token ids (``embedding_dense_backward`` on DTensor has no row-wise
      strategy), kept as the parameter's ``.grad`` until ``zero_grad``;
   b. a colwise layer's input is ``DTensor.from_local`` (an alias); in backward its Partial gradient is
      all-reduced into a new tensor once the layer's own backward is done, and the partial dies;
   c. a rowwise layer's Partial output is all-reduced into a new tensor (the functional all-reduce), the partial
      dies; its backward (Replicate to Partial) copies nothing;
   d. the head's Shard(-1) logits (T·Vl) are all-gathered into a (M·T, Vl) buffer and concatenated on the vocab
      into the (T, V) logits the loss reads (the buffer, then the local logits die); in backward the (T, V)
      gradient's Shard(-1) chunk is cloned (T·Vl) and the whole dies;
   e. AdamW, one parameter group at a time, the DTensor one (embedding, projections, head) then the plain one
      (the norms): ``measure.parallelize.param_groups``, as the HF Trainer's decay and no-decay groups split
      Llama's (transformers 5.24 trainer.py ``create_optimizer``; foreach refuses to mix the two); in the first, the embedding's whole gradient is redistributed to
      its Shard(0) rows (a Vl·d clone) for ``_foreach_lerp_`` and twice for ``_foreach_addcmul_``, each freed
      when the op returns; each group's ``_foreach_sqrt`` copies die when its step returns;
   f. a tied head (Gemma's, SmolLM3's, Qwen3-0.6B's): ``from_pretrained`` builds the model untied
      (``get_init_context``: ``no_tie_weights``), shards the embedding and the head each as above (both ``Shard(0)``
      of a (V, d) weight), then ``tie_weights`` (``_finalize_model_loading``) makes the head's weight the embedding's
      DTensor: one (Vl, d) parameter, read by the lookup and the head; the head's (Vl, d) gradient is accumulated
      first, then the lookup's whole (V, d) gradient redistributed to those rows (a Vl·d clone) and added (a new
      Vl·d tensor; the clone, the old sum and the whole die: ``tensors._accumulate_grad``), so AdamW redistributes
      nothing.  Beside FSDP2 it is refused: ``from_pretrained`` ties after ``fully_shard``, whose root keeps the
      head's own shard.

5. Beside FSDP2 (``--dp N --zero 2|3``: ``fully_shard`` on each decoder layer, then the root, over the dp dimension
   of the (dp, tp) mesh, after the TP plan, as ``measure.hf_parallel`` runs it; torchtitan's order): FSDP2's events
   over the TP-local units (``ops.fsdp.FullyShard``), every parameter a DTensor (one AdamW group, sharded
   gradients), and the embedding's whole gradient redistributed to its Vl rows (a clone) as it is accumulated, the
   whole dying at once; under amp-bf16 the policy's pure-bf16 program.  FSDP2's own all-gathers and
   reduce-scatters are not in ``collectives``.

Checked byte for byte against the fake-PG job on real CPU tensors (tests/test_ops_tp.py): every phase's peak and
end, the states and the collectives.
"""

from __future__ import annotations

import dataclasses

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...names import DTYPE_BYTES
from ...setup import TrainingSetup
from ..parallel import local_config
from . import aten as A
from .engine import Affine, StepInBatch
from .fsdp import FullyShard, fake_pg_program
from .step import adamw_step, training_step
from .tensors import AccumulateGrad, Tensor, current, empty, parameter, record

LLAMA_PLAN = {
    "self_attn": {"q_proj": "colwise", "k_proj": "colwise", "v_proj": "colwise", "o_proj": "rowwise"},
    "mlp": {"gate_proj": "colwise", "up_proj": "colwise", "down_proj": "rowwise"},
}
"""Llama's ``base_model_tp_plan`` (``configuration_llama.py``) per decoder layer, each module in call order; the
norms are replicated (the per-head q/k norms ``replicated_with_grad_allreduce``: ``QK_NORM_FAMILIES``)."""
TP_PLANS = dict.fromkeys(
    ("llama", "mistral", "ministral", "ministral3", "qwen2", "qwen3", "granite", "hyperclovax", "olmo", "smollm3"),
    LLAMA_PLAN,
)
TP_PLANS |= dict.fromkeys(("gemma", "gemma2", "gemma3_text", "vaultgemma", "cohere", "cohere2", "exaone4"), LLAMA_PLAN)
TP_PLANS |= dict.fromkeys(("helium", "ernie4_5", "seed_oss", "iquestcoder"), LLAMA_PLAN)
TP_PLANS["starcoder2"] = LLAMA_PLAN | {"mlp": {"c_fc": "colwise", "c_proj": "rowwise"}}
"""transformers' ``model_type``s whose TP plan (each ``configuration_*.py``'s ``base_model_tp_plan``, Llama's but for
StarCoder2's MLP) is run and checked here (tests/test_ops_tp.py, tests/test_ops_tp_families.py)."""
TP_FAMILIES = tuple(TP_PLANS)
QK_NORM_FAMILIES = ("qwen3", "gemma3_text", "exaone4")
"""Families whose plan makes the per-head q/k norms ``replicated_with_grad_allreduce`` (each ``configuration_*.py``)."""
NORMS_AFTER_PROJECTIONS = ("gemma3_text", "exaone4")
"""Families whose per-head q/k norms run once q, k and v are all projected (``Gemma3Attention.forward``), not each
right after its projection (``Qwen3Attention.forward``): both norms' gradients are ready before v's, k's and q's
inputs' (measured: tests/test_ops_tp_families.py)."""


def check_tp(cfg: ModelConfig, layout: ParallelLayout) -> None:
    """Refuse (``ValueError``, one line) a tensor-parallel job over transformers' model not run or checked here."""
    m = layout.tp
    if cfg.hf_model_type not in TP_FAMILIES:
        raise ValueError(
            f"tensor parallel over transformers' {cfg.hf_model_type} is not run (its plan is checked for "
            f"{', '.join(TP_FAMILIES)} only; the gathered attention or MLP of phi3, olmo2, glm and the MoE plans' "
            "packed experts are not modelled)"
        )
    if layout.pp > 1 or layout.ep > 1 or layout.replicate > 1 or layout.cp > 1 or (layout.dp > 1 and not layout.fsdp):
        raise ValueError(
            "transformers' tensor parallel is run alone or beside FSDP2 (--dp N --zero 2|3): no DDP or ZeRO-1 "
            "(torch's DDP takes no DTensor parameters), no --pp, --ep, --cp or HSDP"
        )
    if layout.sequence_parallel or layout.vocab_parallel:
        raise ValueError(
            "transformers' TP plan shards the embedding and head itself (embedding_rowwise, colwise_gather_output) "
            "and has no sequence parallel (DistributedConfig: not wired up): drop --sp and --vocab-parallel"
        )
    if cfg.tie_embeddings and layout.fsdp:
        raise ValueError(
            "transformers' tensor parallel over a tied embedding and head beside FSDP2 is not run: from_pretrained "
            "ties the head after fully_shard (_finalize_model_loading), and FSDP2 keeps the head's own shard"
        )
    if cfg.qk_norm and cfg.hf_model_type not in QK_NORM_FAMILIES:
        raise ValueError(
            f"transformers' TP plan for {cfg.hf_model_type} leaves its q/k norms' weights whole (no "
            "replicated_with_grad_allreduce entry) while q and k hold heads/tp heads: not run (Cohere's per-head "
            "gains fail in transformers' own forward)"
        )
    for what, n in (
        ("heads", cfg.num_heads),
        ("kv heads", cfg.kv_heads),
        ("d_ff", cfg.d_ff),
        ("vocab", cfg.vocab_size),
    ):
        if n % m:
            raise ValueError(f"tp={m} does not divide the {what} ({n}) (uneven shards are not checked)")


def collectives(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout
) -> list[tuple[str, int, str]]:
    """Rules 2 and 3: ``(kind, bytes, phase)`` in call order, as ``measure.distributed.CollectiveRecorder`` records
    the job's."""
    check_tp(cfg, layout)
    if layout.fsdp and setup.autocast:  # FSDP2's bf16 policy: the pure-bf16 program (rule 5)
        setup = dataclasses.replace(setup, precision="bf16")
    t, d, layers = batch * seq, cfg.d_model, cfg.num_layers
    param = DTYPE_BYTES[setup.param_dtype]
    act = 2 if setup.autocast else param  # autocast's linears: bf16 outputs
    residual = param  # amp-bf16: the residual stream (and each colwise input) stays fp32
    plan = TP_PLANS[cfg.hf_model_type]
    rowwise = sum(list(styles.values()).count("rowwise") for styles in plan.values())  # o_proj, down_proj
    forward = [("all_reduce", t * d * param, "forward")]  # the embedding's partial lookup
    for _ in range(layers):
        forward += [("all_reduce", t * d * act, "forward")] * rowwise
    forward.append(("all_gather", t * cfg.vocab_size * act, "forward"))  # the head's logits
    backward = [("all_reduce", t * d * residual, "backward")]  # the head's input gradient
    colwise = ("all_reduce", t * d * residual, "backward")
    norm = [("all_reduce", cfg.d_head * param, "backward")] if cfg.qk_norm else []  # Qwen3's q/k norms
    mlp = [colwise] * list(plan["mlp"].values()).count("colwise")  # up, gate
    if cfg.hf_model_type in NORMS_AFTER_PROJECTIONS:
        attention = norm * 2 + [colwise] * 3  # both norms; v, k, q
    else:
        attention = [colwise] + (norm + [colwise]) * 2  # v; k (its norm first), q (its norm first)
    # the recompute stops at the last saved tensor: o_proj's output (the post-attention norm's input), and
    # down_proj's too where a norm reads it (sandwich and post norms)
    recomputed = rowwise if cfg.norm_placement in ("sandwich", "post") else rowwise - 1
    for _ in range(layers):
        if setup.checkpoint == "full":
            backward += [("all_reduce", t * d * act, "backward")] * recomputed
        backward += mlp + attention
    return forward + backward


# -- the step ---------------------------------------------------------------------------------------------------


def all_reduced(x: Tensor) -> Tensor:
    """The functional all-reduce's output (a new tensor of ``x``'s layout)."""
    return empty(x.shape, x.dtype, "all_reduce", like=x)


def replicate_input(x: Tensor) -> Tensor:
    """Rule 4b: ``DTensor.from_local(x, [Replicate()])``, whose backward all-reduces the Partial gradient."""
    out = x.alias()
    record("FromLocal", (x,), (out,), lambda ctx, grads: (all_reduced(grads[0]),))
    return out


def reduce_partial(partial: Tensor) -> Tensor:
    """Rule 4c: a Partial output redistributed to Replicate; the backward passes the gradient on."""
    out = all_reduced(partial)
    record("Redistribute", (partial,), (out,), lambda ctx, grads: (grads[0],))
    return out


class Colwise:
    """A ``colwise`` linear (its local weight: the program's, built TP-local)."""

    def __init__(self, linear):
        self.linear = linear

    def params(self) -> list[Tensor]:
        return self.linear.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.linear(replicate_input(x))


class Rowwise(Colwise):
    """A ``rowwise`` linear: its input already sharded on the last dim, its output all-reduced."""

    def __call__(self, x: Tensor) -> Tensor:
        return reduce_partial(self.linear(x))


STYLES = {"colwise": Colwise, "rowwise": Rowwise}


class TensorParallelPlan:
    """Rank 0 of transformers' TP plan over the TP-local Llama program (rule 4; a ``step.Sharding``)."""

    def __init__(self, cfg: ModelConfig, layout: ParallelLayout, fsdp: FullyShard | None = None):
        self.cfg, self.m, self.fsdp = cfg, layout.tp, fsdp
        self.whole: Tensor | None = None  # the embedding's whole (V, d) gradient's leaf
        self.groups: tuple[list[int], list[int]] = ([], [])  # DTensor parameters, then plain ones

    def shard(self, program) -> list[Tensor]:
        v, d = self.cfg.vocab_size, self.cfg.d_model
        self.whole = parameter((v, d), program.embed_tokens.dtype, "embed_tokens (whole gradient)")
        current().charge(-self.whole.nbytes, "the whole embedding's leaf: its gradient only")
        self.tied = program.lm_head is None  # the head's weight is the embedding's Shard(0) DTensor
        head = program.embed_tokens if self.tied else program.lm_head
        split = [program.embed_tokens] + ([] if self.tied else [program.lm_head])
        for layer in program.layers:
            for child, styles in TP_PLANS[self.cfg.hf_model_type].items():
                module = getattr(layer, child)
                for name, style in styles.items():
                    linear = STYLES[style](getattr(module, name))
                    setattr(module, name, linear)
                    split += linear.params()
        program.lookup = lambda: self.embed(program)
        program.lm_head_logits = lambda hidden_states: self.head(hidden_states, head)
        if self.fsdp is not None or self.tied:  # rules 5, 4f: the whole gradient added to the rows' gradient
            self.whole.acc = AccumulateGrad(program.embed_tokens, redistribute=True)
        if self.fsdp is not None:
            return self.fsdp.shard(program)
        params = program.parameters()
        dtensor = {id(p) for p in split}
        self.groups = (
            [i for i, p in enumerate(params) if id(p) in dtensor],
            [i for i, p in enumerate(params) if id(p) not in dtensor],
        )
        return params

    def embed(self, program) -> Tensor:
        """Rule 4a."""
        ids = program.input_ids
        lt, ge = empty(ids.shape, "bool", "lt"), empty(ids.shape, "bool", "ge")
        mask = empty(ids.shape, "bool", "or")
        del lt, ge
        clone = empty(ids.shape, "int64", "clone")
        local = empty(ids.shape, "int64", "sub")
        del clone
        partial = A.embedding(self.whole, ids)
        del local, mask
        return reduce_partial(partial)

    def head(self, hidden_states: Tensor, lm_head: Tensor) -> Tensor:
        """Rule 4d: the ``lm_head`` module's output, ``colwise_gather_output``."""
        local = A.linear(replicate_input(hidden_states), lm_head)
        b, s, vl = local.shape
        gathered = empty((self.m * b, s, vl), local.dtype, "all_gather_into_tensor")
        logits = empty((b, s, self.cfg.vocab_size), local.dtype, "cat")
        del gathered
        record("Gather", (local,), (logits,), lambda ctx, grads: (empty((b, s, vl), grads[0].dtype, "clone"),))
        del local
        return logits

    def adamw(self, params: list[Tensor], v: list[Tensor], optimizer: str) -> None:
        """Rule 4e (rule 5: every parameter a DTensor, one group)."""
        if self.fsdp is not None:
            return adamw_step(params, v, optimizer)
        rows = self.cfg.vocab_size // self.m * self.cfg.d_model
        for group in self.groups:
            # the embedding (untied): its whole gradient redistributed for lerp_, then twice for addcmul_
            if 0 in group and not self.tied:
                lerp = empty((rows,), params[0].dtype, "clone")
                del lerp
                pair = (empty((rows,), params[0].dtype, "clone"), empty((rows,), params[0].dtype, "clone"))
                del pair
            adamw_step([params[i] for i in group], [v[i] for i in group], optimizer)

    def forward_end(self, loss: Tensor) -> Tensor:
        """The loss as the forward returns it (FSDP2's root hands it on unchanged too)."""
        return loss

    def backward_end(self) -> None:
        if self.fsdp is not None:
            self.fsdp.backward_end()

    def zero_grad(self) -> None:
        self.whole.grad = None
        if self.fsdp is not None:
            self.fsdp.zero_grad()


def predict_rank(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
) -> StepInBatch:
    """Rank 0 of transformers' TP job ``layout`` (rule 4), as the fake-PG job's tracker sees it on real CPU tensors
    (``measure.hf_parallel``: the CPU's kernel facts); ``batch`` as ``ops.predict_step``'s."""
    check_tp(cfg, layout)
    if mode != "traced" or device not in ("meta", "cpu"):
        raise ValueError("transformers' tensor parallel is replayed as the tracker sees it (traced, meta or cpu)")
    if setup.optimizer != "foreach":
        raise ValueError(f"transformers' tensor parallel is replayed with foreach AdamW only, not {setup.optimizer}")
    local = dataclasses.replace(local_config(cfg, layout), vocab_size=cfg.vocab_size // layout.tp)
    b, fsdp, run, facts = 1 if batch == 1 else Affine(1), None, setup, {}
    if layout.fsdp:  # rule 5; under amp-bf16 FSDP2's policy runs the pure-bf16 program (``ops.fsdp.predict_rank``)
        fsdp = FullyShard(local, setup, layout)
        if setup.autocast:
            run, facts = dataclasses.replace(setup, precision="bf16"), {"buffer_dtype": "fp32"}
    return training_step(
        fake_pg_program(local, seq, run, b, **facts),
        optimizer=setup.optimizer,
        device=device,
        sharding=TensorParallelPlan(cfg, layout, fsdp),
    )
