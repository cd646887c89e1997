"""One rank of an FSDP2 job (``fully_shard`` on every decoder layer, then on the root) over an op-library
program: data parallel ZeRO-2 (``reshard_after_forward=False``) or ZeRO-3, with a
``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` under amp-bf16 (``measure.hf_parallel``,
``measure.parallelize``).  ``predict_rank`` is ``ops.predict_step(..., layout=...)``; its meta run is the fake-PG
job's, whose FakeTensors are cpu tensors (the CPU's kernel facts).  No torch.

``FullyShard`` does to a program what ``fully_shard`` does to the module tree (torch 2.13
``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``, ``_fsdp_param_group.py``):

* each layer's ``forward`` and the program's root ``forward`` are wrapped: the forward pre-hook (unshard), the
  ``RegisterPostBackwardFunction`` on the inputs that require grad (an identity node whose backward is the
  post-backward: reshard, reduce-scatter), the forward hook (reshard under ZeRO-3) and a tensor hook on every
  output that requires grad (the pre-backward: unshard, prefetch; once per backward);
* a unit whose pre-backward ran skips both forward hooks (``_pre_forward``/``_post_forward`` under
  ``TrainingState.PRE_BACKWARD``): a checkpoint's recompute gathers nothing;
* the root's post-backward runs in the final callback (its input, the token ids, needs no gradient).

Each block's unit is its own parameters' (``FsdpUnits``: one unit per distinct block signature, the blocks' index
into them): a patterned hybrid's Mamba2, attention and MLP layers are units of unlike buffers, and the hybrids'
programs (``nemotron_h``, ``bamba``, ``granitemoehybrid``, ``lfm2``, ``lfm2_moe``, ``jamba``) and the Llama-derived
ones (``llama.LlamaForCausalLM.run_layers``: Llama 4's and Qwen's dense layers between sparse ones) cut a run of
alike layers where the units before or after them differ (``tensors.split_runs``); any other program's run of
unlike events is refused (``_check_run``: the course model's dense-first mixtures of experts).

The bytes each event allocates and frees are ``analytic.fsdp.FsdpEvents``' (rules 1–6, checked against the
fake-PG job for our model), with the units' buffers from the program's own parameters
(``analytic.fsdp.shard_unit``).  The program's parameters are the unsharded ones: they are charged only by the
events (the all-gather copy-out), and their gradients, which autograd makes as it would without FSDP2, are
handed to the reduce-scatter's copy-in (the events free them).  The rank's sharded parameters (padded dim-0
chunks of ceil(rows/D) rows), AdamW's moments of its real rows and its sharded gradients (the reduce-scatter
outputs, freed by ``zero_grad``) are the step's (``step.training_step``).  Rank 0 (every chunk full) is
replayed: the worst.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

from ...config import ModelConfig
from ...layout import ParallelLayout
from ...setup import TrainingSetup
from ..fsdp import FsdpEvents, FsdpUnits, Unit, shard_unit
from ..parallel import fsdp_chunk_rows
from . import aten as A
from .engine import Affine, StepInBatch
from .step import training_step
from .tensors import Tensor, current, empty, numel, record

DATA_PARALLEL_ONLY = (
    "the op library replays programs under data parallel only: FSDP2 (dp >= 2, zero 2 or 3) or, over transformers' "
    "programs, DDP and ZeRO-1 (dp >= 2, zero 0 or 1) or their own TP alone (--tp); no PP, EP, CP or HSDP"
)
PARAM_DTYPES = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "fp32"}
FLOATING = ("fp32", "fp16", "bf16", "fp64")
POLICY_EXACT = (
    *("llama", "gpt2", "phi3", "moe", "gemma", "olmo2", "llama4"),
    *("starcoder2", "exaone4", "interleaved", "glm", "ministral3", "granite", "olmo", "stablelm"),
    *("gpt_bigcode", "opt", "bloom", "falcon", "nemotron"),
    *("nemotron_h", "bamba", "granitemoehybrid", "qwen3_next", "qwen3_5", "falcon_h1"),
    *("mamba", "mamba2_lm", "jamba", "lfm2", "lfm2_moe"),
)
"""transformers' programs (``ops.transformers.PROGRAMS``' modules) whose pure-bf16 build, with the fp32 model's
buffers (``buffer_dtype``: Gemma's ``embed_scale`` stays fp32 and is cast each forward; Falcon-H1's ``mup_vector``
stays fp32, and its product promotes the mixer's projections to fp32), is what FSDP2's bf16 policy runs over the
fp32 model, with each layer's floating inputs cast to bf16 (``cast_floating``): checked on the fake process group at
ZeRO-2 and ZeRO-3 (tests/test_ops_fsdp.py; starcoder2, exaone4, interleaved, glm, ministral3, granite, olmo and
stablelm: tests/test_ops_transformers_zoo.py; gpt_bigcode, opt, bloom and falcon:
tests/test_ops_transformers_dense_zoo.py; llama4: tests/test_ops_transformers_llama4.py; the hybrids nemotron_h, bamba, granitemoehybrid, qwen3_next, qwen3_5 and
falcon_h1, and mamba (Falcon-Mamba's unused norm buffers stay fp32), mamba2_lm, jamba, lfm2 and lfm2_moe:
tests/test_ops_transformers_fsdp_hybrid.py).  A program added later is refused under the policy until it is checked
and listed here."""


def charge(*deltas: int) -> None:
    """The replay's ``r(+a, -b, ...)`` for FSDP2's events, on the active run (logged with its other charges)."""
    run = current()
    for delta in deltas:
        run.charge(delta, "FSDP2")


def cast_floating(x):
    """``_cast_fp_tensor(param_dtype, ...)`` over a unit's inputs (``FSDPState._pre_forward`` under a
    ``MixedPrecisionPolicy`` with ``cast_forward_inputs``, before the unshard): every floating tensor not yet bf16
    is copied to bf16, in tuples too (transformers' ``position_embeddings``: OLMo-2's fp32 cos and sin, one bf16
    copy per layer).  transformers checkpoints a layer's ``forward``, so the hook, and its copies, stay outside the
    checkpoint (``GradientCheckpointingLayer.__call__``): the recompute does not cast again, and the checkpoint
    holds the copies until the backward."""
    if isinstance(x, tuple | list):
        return type(x)(cast_floating(v) for v in x)
    if isinstance(x, Tensor) and x.dtype in FLOATING and x.dtype != "bf16":
        return A.to(x, "bf16")
    return x


def cuda_metadata(shapes: list[tuple[int, int]], d: int, setup: TrainingSetup) -> dict[str, int]:
    """``analytic.fsdp`` rule 9 (a dim-0 unit over d >= 2 ranks on a CUDA GPU): the copy-out's and the copy-in's
    launch metadata, of each parameter's padded shard in the all-gather and the reduce dtype (as
    ``analytic.fsdp.fsdp_units``)."""
    from ..cuda_kernels import chunk_cat_metadata, split_copy_metadata
    from ..parallel import element_bytes

    gather_e = 2 if setup.autocast else element_bytes(setup)
    reduce_e = 4 if setup.autocast else gather_e
    shards = [fsdp_chunk_rows(r, d) * c for r, c in shapes]
    return {
        "gather_meta": split_copy_metadata([s * gather_e for s in shards], d),
        "reduce_meta": chunk_cat_metadata([s * reduce_e for s in shards]),
    }


def rows_cols(t: Tensor) -> tuple[int, int]:
    """(the rows FSDP2 shards, the rest): dim 0, and the product of the others (1 for a vector)."""
    return t.shape[0], numel(t.shape[1:])


class FullyShard:
    """FSDP2 over one program on rank 0 of ``layout.dp`` (see the module docstring).  ``shard(program)``
    installs the hooks and returns the sharded parameters AdamW steps; ``backward_end`` is the final callback;
    ``zero_grad`` frees the sharded gradients."""

    def __init__(
        self, cfg: ModelConfig, setup: TrainingSetup, layout: ParallelLayout, cpu: bool = False, cuda: bool = False
    ):
        if not layout.fsdp or layout.dp < 2 or layout.pp > 1 or layout.ep > 1 or layout.replicate > 1:
            raise ValueError(DATA_PARALLEL_ONLY)  # TP: ``ops.tp`` composes it over its TP-local program
        self.cfg, self.setup, self.layout, self.cpu, self.cuda = cfg, setup, layout, cpu, cuda
        self.events: FsdpEvents | None = None
        self.units: FsdpUnits | None = None
        self.backward_units: set = set()  # units whose pre-backward ran (TrainingState.PRE_BACKWARD)

    # -- sharding ------------------------------------------------------------------------------------------
    def shard(self, program) -> list[Tensor]:
        run, d = current(), self.layout.dp
        layers = program.layers if hasattr(program, "layers") else program.h  # GPT-2: ``transformer.h``
        blocks = [layer.params() for layer in layers]
        inside = {id(p) for params in blocks for p in params}
        params = program.parameters()
        root = [p for p in params if id(p) not in inside]
        for unit in (root, *blocks):  # torch 2.13 ``FSDPParamGroup._init_mp_dtypes``: one dtype per unit
            dtypes = sorted({p.dtype for p in unit if p.requires_grad})
            if len(dtypes) > 1:
                raise ValueError(
                    f"torch's fully_shard refuses a unit whose trainable parameters mix {' and '.join(dtypes)} "
                    "(FSDP expects uniform original parameter dtype): FSDP2 over this model cannot run"
                )
        self.root_params, self.block_params = root, blocks
        # the unsharded parameters exist only while gathered: the events charge them (rule 1)
        run.charge(-sum(p.nbytes for p in params), "unsharded parameters (gathered by FSDP2's events)")
        units = [self._unit(b) for b in blocks]  # a block's signature: its unit's buffers
        distinct = tuple(dict.fromkeys(units))  # dense and sparse blocks; a hybrid's Mamba2, attention, MLP blocks
        kinds = tuple(distinct.index(u) for u in units)
        self.units = FsdpUnits(self.layout.zero == 3, self.setup.autocast, self._unit(root), distinct, kinds)
        self.events = FsdpEvents(self.cfg, self.units, self.cpu)
        run.layer_key = lambda i: (self.events.key(i, False), self.events.key(i, True))  # ``tensors.split_runs``
        for i, layer in enumerate(layers):
            layer.forward = self._wrap(layer.forward, i)
            if self.setup.autocast:  # the policy's cast_forward_inputs (our blocks' inputs are bf16 already)
                layer.cast_inputs = cast_floating
        program.forward = self._wrap(program.forward, None)
        dtype = PARAM_DTYPES[self.setup.precision]  # the sharded parameters keep the model's dtype
        return [empty((fsdp_chunk_rows(r, d), c), dtype, "shard") for r, c in map(rows_cols, params)]

    def _unit(self, params: list[Tensor]) -> Unit:
        shapes, d = [rows_cols(p) for p in params], self.layout.dp
        return shard_unit(shapes, d, self.setup, **(cuda_metadata(shapes, d, self.setup) if self.cuda else {}))

    # -- the hooks -----------------------------------------------------------------------------------------
    def _wrap(self, forward, i: int | None):
        """``forward`` of block ``i`` (None: the root) between FSDP2's forward hooks."""
        ev = self.events

        def call(*args, **kwargs):
            if i in self.backward_units:  # a checkpoint's recompute (TrainingState.PRE_BACKWARD)
                return forward(*args, **kwargs)
            if i is None:
                ev.root_pre_forward(charge)
            else:
                self._check_run(i)
                ev.block_pre_forward(charge, i)
            args = tuple(self._post_backward_node(a, i) for a in args)
            out = forward(*args, **kwargs)
            if i is None:
                ev.root_post_forward(charge)
            else:
                ev.block_post_forward(charge, i)
            for t in out if isinstance(out, tuple) else (out,):
                if isinstance(t, Tensor) and t.grad_fn is not None:
                    t.grad_fn.pre_hooks.append(lambda: self._pre_backward(i))
            return out

        return call

    def _check_run(self, i: int) -> None:
        """A repeated block stands for blocks of equal events only (``KeyedHooks.key``)."""
        seg = current().segment
        for backward in (False, True) if seg is not None else ():
            if len({self.events.key(j, backward) for j in range(i, i + seg.times)}) > 1:
                raise ValueError(
                    f"FSDP2 over this program's layers of unlike kinds is not replayed (blocks {i}..{i + seg.times - 1}"
                    " of one replayed run meet unlike FSDP2 units: not checked against the fake process group)"
                )

    def _pre_backward(self, i: int | None) -> None:
        if i in self.backward_units:  # once per backward
            return
        self.backward_units.add(i)
        if i is None:
            self.events.root_pre_backward(charge)
        else:
            self.events.block_pre_backward(charge, i)

    def _post_backward_node(self, x, i: int | None):
        """``RegisterPostBackwardFunction.apply`` on an input that requires grad: an identity whose backward
        runs the unit's post-backward."""
        if not isinstance(x, Tensor) or not x.requires_grad or i is None:
            return x
        segment = current().segment
        out = x.alias()

        def back(ctx, grads):
            self.events.block_post_backward(charge, i)
            handed = self._hand_over(self.block_params[i])
            if segment is not None:  # a repeated block's gradients are reduced, not kept (``Run.virtual_grads``)
                segment.grads = segment.grads - handed
            return (grads[0],)

        record("RegisterPostBackwardFunctionBackward", (x,), (out,), back)
        return out

    @staticmethod
    def _hand_over(params: list[Tensor]) -> int:
        """The unit's unsharded gradients go to the reduce-scatter's copy-in, whose bytes the events free:
        drop them without a charge.  Returns their bytes."""
        handed = 0
        for p in params:
            if p.grad is not None:
                handed = p.grad.nbytes + handed
                p.grad.storage.nbytes = 0
                p.grad = None
        return handed

    def forward_end(self, loss: Tensor) -> Tensor:
        """FSDP2 hands the root's output on as it is."""
        return loss

    def backward_end(self) -> None:
        """The final callback: the root's post-backward (``_root_post_backward_final_callback``)."""
        self.events.root_post_backward(charge)
        self._hand_over(self.root_params)
        self.backward_units.clear()

    def zero_grad(self) -> None:
        """``zero_grad(set_to_none=True)``: the sharded gradients (each unit's reduce-scatter output) die."""
        blocks = sum(self.events.block(i).reduce_out for i in range(len(self.block_params)))
        current().charge(-(self.units.root.reduce_out + blocks), "sharded gradients")


def fake_pg_program(cfg: ModelConfig, seq: int, setup: TrainingSetup, b, **facts):
    """``make`` of transformers' program of ``cfg`` as a fake-PG job runs it: on cpu tensors (FakeTensors on
    meta), so with the CPU's kernel facts (GPT-2's LayerNorm statistics), and ``facts`` (``buffer_dtype``) where
    the program takes them."""
    from .transformers import PROGRAMS

    module = importlib.import_module(f"{__package__}.transformers.{PROGRAMS[cfg.hf_model_type]}")
    params = inspect.signature(module.causal_lm).parameters
    given = {k: v for k, v in {"device": "cpu", **facts}.items() if k in params}
    return lambda: module.causal_lm(cfg, seq, setup, b, **given)


def predict_rank(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    layout: ParallelLayout,
    *,
    impl: str,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
) -> StepInBatch:
    """Rank 0 of the FSDP2 job ``layout`` over ``impl``'s program (``ops.predict_step(..., layout=...)``).

    Under amp-bf16 the ``MixedPrecisionPolicy`` hands the forward bf16 parameters: transformers' step then runs
    the pure-bf16 program (no autocast: ``measure.hf_parallel``), ours its amp program (autocast on, which
    copies nothing) over bf16 parameters (``measure.parallelize``).  ``batch`` 1: the step at B = 1; any other
    value the lines in B, exact for every B >= 2."""
    if device == "cuda" and impl != "course":  # transformers' CUDA facts under FSDP2 are not checked yet
        raise ValueError(f"FSDP2 over --impl {impl} on a CUDA target is not replayed (traced on meta or cpu)")
    shard = FullyShard(cfg, setup, layout, cpu=mode == "plain" and device == "cpu", cuda=device == "cuda")
    b = 1 if batch == 1 else Affine(1)
    if impl == "transformers":
        from .transformers import PROGRAMS

        if PROGRAMS[cfg.hf_model_type] in ("deepseek", "deepseek_v2", "deepseek_v32"):
            raise ValueError(
                f"FSDP2 over transformers' {cfg.hf_model_type} is not replayed (torch's fully_shard refuses its fp32 "
                "router beside bf16 weights; in fp32 the fake-PG job differs from the replay, not derived)"
            )
        if setup.autocast and PROGRAMS[cfg.hf_model_type] not in POLICY_EXACT:
            raise ValueError(
                f"FSDP2's bf16 policy over transformers' {cfg.hf_model_type} is not checked against the fake "
                "process group yet (ops.fsdp.POLICY_EXACT: fp32 buffers stay fp32 under the policy)"
            )
        run = dataclasses.replace(setup, precision="bf16") if setup.autocast else setup
        # the policy casts parameters, not buffers
        make = fake_pg_program(cfg, seq, run, b, **({"buffer_dtype": "fp32"} if setup.autocast else {}))
    elif impl == "course":
        from .course.model import TransformerLM

        make = lambda: TransformerLM(cfg, seq, setup, b, "bf16" if setup.autocast else None)
    else:
        raise ValueError(f"FSDP2 over --impl {impl}'s program is not replayed by the op library")
    return training_step(
        make,
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
        cpu_threads=cpu_threads,
        sharding=shard,
        cuda_batch=batch,
    )
