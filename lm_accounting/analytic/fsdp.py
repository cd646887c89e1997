"""FSDP2's own allocations in one training step, as events in the memory replay.  No torch.

``fully_shard`` (torch 2.13, ``torch/distributed/fsdp/_fully_shard/``) wraps each block and the root
(embedding, final norm, LM head) as one unit.  What each unit allocates and frees, in program order,
read from ``_fsdp_param_group.py`` and ``_fsdp_collectives.py`` and checked byte for byte against the
real job on the fake process group (``tests/test_fsdp_replay.py``):

1. Unshard (``foreach_all_gather`` + ``foreach_all_gather_copy_out``): under a MixedPrecisionPolicy
   with ``param_dtype``, a flat bf16 copy of this rank's shards (``_get_param_all_gather_inputs``),
   then the all-gather output (the padded unit × D), the copy freed; then each parameter's unsharded
   storage (padded, resized back from 0) and the copy-out.
2. In forward the all-gather output is kept in ``comm_ctx.all_gather_state`` until the *next*
   unit's copy-out (so two units' outputs are live across a block boundary, and each block runs
   with its own); the root's post-forward frees the last one.  In backward it is freed at once.
3. Post-forward (``reshard_after_forward=True``, zero 3, the root too): the unsharded storages are
   resized to 0.  Zero 2 keeps them until the unit's post-backward.
4. Pre-backward (zero 3): the unit is unsharded, unless prefetched, and the next unit in reverse
   post-forward order is prefetched (its all-gather output allocated; copied out at its own
   pre-backward).  The root's pre-backward fires on the logits' gradient.
5. Post-backward (``foreach_reduce``): reshard; the previous unit's reduce-scatter input
   (``comm_ctx.reduce_scatter_state``) is freed; the reduce-scatter input (padded, reduce dtype) is
   allocated and the unsharded gradients are copied in and freed, except the unit's last
   parameter's, which the loop variable ``unsharded_grad`` of the dim-0 check holds (D > 1) until
   ``foreach_reduce`` returns: after the reduce-scatter output (the padded shard, which becomes the
   sharded gradients' storage) is allocated.  The end of backward frees the last reduce-scatter input.
6. A plain CPU run only (the CPU allocator's own events): the copy-in ``torch._chunk_cat`` runs
   its CPU fallback, which first makes a padded copy of every gradient whose rows D does not divide
   (held to the end of the copy-in) and, under mixed precision (bf16 gradients into the fp32 input),
   goes through an ``aten::cat`` temporary of each (padded) gradient, freed at once.  No dispatch
   mode sees them (they are inside one CPU kernel).  A GPU runs torch's fused CUDA ``_chunk_cat``
   instead (not measured here: no GPU), so GPU predictions leave them out.
7. Expert parallel (``layout``): each MoE block's expert stacks are their own unit inside the block's
   (``fully_shard(block.moe.experts)`` over the dp/ep ranks holding the same experts), unsharded when
   the experts run (rule 1; freeing the block's all-gather output, rule 2) and resharded after them
   (rule 3).  In backward the block's pre-backward prefetches its experts (the next unit in reverse
   post-forward order), whose pre-backward prefetches block i − 1; the experts are reduced (rule 5)
   before their block.  With dp = ep each expert unit's mesh has one rank: FSDP2 all-gathers nothing
   (no all-gather output; each shard is copied straight into its unsharded storage).  With dp > E the
   stacks are sharded on dim 1 (torchtitan), and the copy-out goes through a temporary of each stack's
   unsharded size, all freed when it ends.  The replay calls these events from the MoE block
   (``replay._MoeSplit.events``).
8. Vocab parallel (FSDP2 × TP): torch 2.13 leaves the embedding's gradient whole, a (V, d) Replicate
   DTensor (``tensor_parallel._vocab_embedding_backward``).  The root's post-backward reads it as the
   parameter's placement (``FSDPParam._get_grad_inner_tensor``: ``redistribute`` to Shard(0), a clone of
   this rank's Vl rows) and drops ``.grad``, freeing the whole, before it reshards and reduces (rule 5).
9. CUDA only: the copy-out's and the copy-in's kernels copy their launch metadata to the GPU, freed
   when they return (``analytic.cuda_kernels``: ``split_copy_metadata``, ``chunk_cat_metadata``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from .hooks import KeyedHooks


@dataclass(frozen=True)
class Unit:
    """Bytes of one FSDP unit's buffers on one rank."""

    gathered: int  # the all-gather output = the unsharded parameters (padded; all-gather dtype)
    copy_in: int  # the flat bf16 copy of this rank's shards (mixed precision only, else 0)
    grads: int  # the unsharded gradients autograd computes (unpadded; compute dtype)
    last_grad: int  # the unit's last parameter's gradient, freed after the reduce-scatter output
    reduce_in: int  # the reduce-scatter input (padded; reduce dtype)
    reduce_out: int  # the reduce-scatter output: this rank's sharded gradients
    cpu_padded: int  # rule 6: the CPU copy-in's padded copies of the gradients whose rows D does not divide
    cpu_cast: int  # rule 6: its largest cast temporary (mixed precision)
    alone: bool = False  # rule 7: a mesh of one rank (dp = ep): no all-gather output
    dim1: int = 0  # rule 7: the unsharded bytes of the parameters sharded on dim 1 (the copy-out's temporaries)
    vocab_rows: int = 0  # rule 8: vocab parallel's embedding gradient, this rank's rows (its clone)
    vocab_extra: int = 0  # rule 8: the rest of that gradient's whole (V, d)
    gather_meta: int = 0  # rule 9: CUDA's copy-out launch metadata
    reduce_meta: int = 0  # rule 9: CUDA's copy-in launch metadata

    @property
    def output(self) -> int:
        """The all-gather output's bytes: the unsharded parameters', or 0 on a one-rank mesh, where FSDP2
        copies each shard straight into its unsharded storage (rule 7)."""
        return 0 if self.alone else self.gathered

    def unshard(self, r) -> None:
        """Rule 1: copy-in, all-gather output, unsharded storages."""
        r(+self.copy_in, +self.output, -self.copy_in)
        self.copy_out(r)

    def copy_out(self, r) -> None:
        """Rule 1's copy-out into the unsharded storages; a dim-1 shard goes through a temporary of its
        unsharded size (``empty_like``), all freed together when the copy-out's ``cat`` ends (rule 7)."""
        r(+self.gathered, +self.dim1, +self.gather_meta, -self.gather_meta, -self.dim1)


@dataclass(frozen=True)
class FsdpUnits:
    """The root unit and one block unit per distinct block signature of a rank (dense and mixture-of-experts
    blocks; a patterned hybrid's Mamba2, attention and MLP layers), with each block's index into them."""

    reshard_after_forward: bool  # zero 3
    float_logits: bool  # amp-bf16: the parameters are bf16, so the model's ``logits.float()`` copies
    root: Unit | None  # None: a middle pipeline stage's root, which holds no parameter
    blocks: tuple[Unit, ...]  # one unit per distinct block signature
    kinds: tuple[int, ...]  # block i's unit: ``blocks[kinds[i]]``
    experts: Unit | None = None  # expert parallel: each MoE block's expert stacks, their own unit (rule 7)


class FsdpEvents(KeyedHooks):
    """The events of rules 1–5 at the replay's unit boundaries.  Each block's events depend only on
    its unit and its neighbours' (``key``), so the replay can still repeat equal blocks in O(1)."""

    def __init__(self, cfg: ModelConfig, units: FsdpUnits, cpu: bool = False):
        self.cfg, self.units = cfg, units
        self.zero3 = units.reshard_after_forward
        self.cpu = cpu  # rule 6: a plain run on the CPU

    def block(self, i: int) -> Unit:
        return self.units.blocks[self.units.kinds[i]]

    def experts(self, i: int) -> Unit | None:
        """Block i's expert unit (rule 7; None: a dense block, or no expert parallel)."""
        return self.units.experts if self.cfg.layer_moe(i) else None

    def _last_in(self, i: int) -> Unit:
        """The unit whose forward runs last in block i: its experts' (rule 7), else the block's."""
        return self.experts(i) or self.block(i)

    def _before(self, i: int) -> Unit:
        """The unit whose forward ran just before block i's (the root's pre-forward for block 0)."""
        return self.units.root if i == 0 else self._last_in(i - 1)

    def key(self, i: int, backward: bool) -> tuple:
        after = self.block(i + 1) if i + 1 < self.cfg.num_layers else None
        return (self._before(i), after) if backward else (self._before(i),)

    # forward
    def root_pre_forward(self, r) -> None:
        self.units.root.unshard(r)

    def block_pre_forward(self, r, i: int) -> None:
        unit = self.block(i)
        unit.unshard(r)
        r(-self._before(i).output)  # rule 2: the previous unit's all-gather output

    def block_post_forward(self, r, i: int) -> None:
        if self.zero3:
            r(-self.block(i).gathered)  # rule 3

    def root_post_forward(self, r) -> None:
        if self.zero3:
            r(-self.units.root.gathered)
        r(-self._last_in(self.cfg.num_layers - 1).output)  # rule 2: the last unit's all-gather output

    def experts_pre_forward(self, r, i: int) -> None:
        """Rule 7: the expert unit unsharded inside block i, whose all-gather output it frees (rule 2)."""
        self.experts(i).unshard(r)
        r(-self.block(i).output)

    def experts_post_forward(self, r, i: int) -> None:
        if self.zero3:
            r(-self.experts(i).gathered)  # rule 3

    # backward
    def root_pre_backward(self, r) -> None:
        if self.zero3:  # rule 4: unshard the root, prefetch the last block
            root, last = self.units.root, self.block(self.cfg.num_layers - 1)
            root.unshard(r)
            r(-root.output)
            r(+last.copy_in, +last.output, -last.copy_in)

    def block_pre_backward(self, r, i: int) -> None:
        if self.zero3:  # rule 4: copy out the prefetched unit, prefetch the next one
            unit = self.block(i)
            unit.copy_out(r)
            r(-unit.output)
            nxt = self.experts(i) or (self.block(i - 1) if i > 0 else None)  # rule 7: the block's experts first
            if nxt is not None:
                r(+nxt.copy_in, +nxt.output, -nxt.copy_in)

    def experts_pre_rerun(self, r, i: int) -> None:
        """Rule 7, a checkpoint's rerun in backward (zero 3): the experts' pre-forward copies out the unit
        their block prefetched; the all-gather output stays until their post-forward."""
        if self.zero3:
            self.experts(i).copy_out(r)

    def experts_post_rerun(self, r, i: int) -> None:
        """Rule 7: the rerun's post-forward frees the all-gather output and reshards nothing (zero 3)."""
        if self.zero3:
            r(-self.experts(i).output)

    def experts_pre_backward(self, r, i: int, rerun: bool = False) -> None:
        """Rules 4 and 7 (zero 3): copy out the prefetched expert unit (unless a checkpoint's rerun did),
        prefetch block i − 1."""
        if self.zero3:
            unit = self.experts(i)
            if not rerun:
                unit.copy_out(r)
                r(-unit.output)
            if i > 0:
                nxt = self.block(i - 1)
                r(+nxt.copy_in, +nxt.output, -nxt.copy_in)

    def experts_post_backward(self, r, i: int) -> None:
        """Rules 5 and 7: reduced before their block, after block i + 1."""
        self._reduce(r, self.experts(i), self.block(i + 1) if i + 1 < self.cfg.num_layers else None)

    def _reduce(self, r, unit: Unit, previous: Unit | None) -> None:
        """Rule 5 (and rule 7's dim-1 gradients: ``_dim1_regrid``; rule 8's vocab-parallel embedding)."""
        r(+unit.vocab_rows, -(unit.vocab_rows + unit.vocab_extra))  # rule 8
        r(-unit.gathered)  # reshard
        if previous is not None:
            r(-previous.reduce_in)
        self._dim1_regrid(r, unit)
        pad = unit.cpu_padded if self.cpu else 0  # rule 6
        tmp = unit.cpu_cast if self.cpu and self.units.float_logits else 0
        r(+unit.reduce_in, +pad, +tmp, +unit.reduce_meta, -unit.reduce_meta, -tmp, -pad)
        copied = unit.grads if unit.dim1 else unit.grads - unit.last_grad  # what the copy-in frees
        r(-copied, +unit.reduce_out, -unit.last_grad)

    @staticmethod
    def _dim1_regrid(r, unit: Unit) -> None:
        """Rule 7, dim-1 shards (the expert unit's three stacks, each s = G·d·d_e elements): before the
        copy-in ``foreach_reduce`` re-lays each gradient as its dim-1 chunks cat along dim 0 (s each); the
        first two originals die after the second re-laid one, the last one's is held to the end by the
        loop (``last_grad``), and the copy-in then frees all three re-laid ones."""
        if unit.dim1:
            s = unit.last_grad
            r(+s, +s, -s, -s, +s)

    def block_post_backward(self, r, i: int) -> None:
        after = self.block(i + 1) if i + 1 < self.cfg.num_layers else None
        self._reduce(r, self.block(i), self.experts(i) or after)  # rule 7: the block's experts reduced just before

    def root_post_backward(self, r) -> None:
        self._reduce(r, self.units.root, self.block(0))
        r(-self.units.root.reduce_in)  # the end of backward


def shard_unit(shapes: list[tuple[int, int]], shards: int, setup, **extra) -> Unit:
    """The buffers of one unit of parameters of ``shapes`` ((rows FSDP2 shards, the rest), in registration
    order) over ``shards`` ranks (rules 1, 5, 6): gathered and computed in bf16 under amp-bf16 (reduced in
    fp32), else in the parameters' dtype.  ``extra``: the fields of rules 7–9."""
    from .parallel import element_bytes, fsdp_chunk_rows

    d = shards
    gather_e = 2 if setup.autocast else element_bytes(setup)
    reduce_e = 4 if setup.autocast else gather_e
    padded = sum(fsdp_chunk_rows(rows, d) * cols for rows, cols in shapes)  # one shard
    rows, cols = shapes[-1]
    return Unit(
        gathered=padded * d * gather_e,
        copy_in=padded * gather_e if setup.autocast else 0,
        grads=sum(rows * cols for rows, cols in shapes) * gather_e,
        last_grad=rows * cols * gather_e if d > 1 else 0,
        reduce_in=padded * d * reduce_e,
        reduce_out=padded * reduce_e,
        cpu_padded=sum(fsdp_chunk_rows(r, d) * d * c for r, c in shapes if r % d) * gather_e,
        cpu_cast=max(fsdp_chunk_rows(r, d) * d * c for r, c in shapes) * gather_e,
        alone=d == 1,
        **extra,
    )


def fsdp_units(
    cfg: ModelConfig, setup, layout, stage: tuple[int, int] | None = None, cuda: bool = False, dim1: bool | None = None
) -> FsdpUnits:
    """The units of one rank (``layout.dp`` shards, TP-local shapes): every rank's buffers are the
    padded ones, so the rank does not matter.  Under amp-bf16 the MixedPrecisionPolicy gathers and
    computes in bf16 and reduces in fp32; otherwise everything is in the parameters' dtype.  Expert
    parallel (rule 7): an MoE block's unit without its expert stacks, and the stacks' own unit over the
    dp/ep ranks holding the same experts (``analytic.parallel`` rule 6: dim 0, or dim 1 when dp > E).
    ``stage``: (P, s), the root of pipeline stage s's model (None where it holds no parameter).
    ``cuda``: on a CUDA GPU, with the copy-out's and copy-in's launch metadata (rule 9).  ``dim1``: whether
    the expert stacks are sharded on dim 1, where not ``layout``'s own rule (an HSDP shard group's layout
    takes the whole job's: ``analytic.parallel.experts_on_dim1``)."""
    from .cuda_kernels import chunk_cat_metadata, split_copy_metadata
    from .parallel import _params, element_bytes, experts_on_dim1, fsdp_chunk_rows, local_shape, parameter_shapes

    gather_e = 2 if setup.autocast else element_bytes(setup)
    reduce_e = 4 if setup.autocast else gather_e
    ep, dim1 = layout.ep, experts_on_dim1(cfg, layout) if dim1 is None else dim1
    # an expert mesh of one shard rank (HSDP with s = ep) neither copies out nor re-lays a dim-1 gradient: torch
    # 2.13's ``wait_for_unshard`` and ``foreach_reduce`` take their ``world_size == 1`` paths
    dim1 = dim1 and layout.dp > ep

    def shape(p) -> tuple[int, int]:
        """(the rows FSDP2 shards, the rest): dim 0, or an expert stack's dim 1 ((G, out, in) -> (out, G·in))."""
        rows, cols = local_shape(p, layout)
        return (p.shape[1], rows * cols // p.shape[1]) if dim1 and p.expert else (rows, cols)

    def unit(n: int, experts: bool = False) -> Unit | None:
        d = layout.dp // ep if experts else layout.dp
        params = _params(cfg, stage) if n == 0 else parameter_shapes(cfg)
        shapes = [shape(p) for p in params if p.unit == n and (p.expert and ep > 1) == experts]
        if not shapes:
            return None
        emb = [p for p in params if p.unit == n and p.name == "token_embeddings.weight" and layout.vocab_parallel]
        shards = [fsdp_chunk_rows(r, d) * c for r, c in shapes]  # rule 9: on CUDA, a dim-0 unit of D > 1 ranks
        meta = cuda and d > 1 and not (experts and dim1)
        return shard_unit(
            shapes,
            d,
            setup,
            dim1=sum(fsdp_chunk_rows(r, d) * d * c for r, c in shapes) * gather_e if experts and dim1 else 0,
            vocab_rows=sum(local_shape(p, layout)[0] * cfg.d_model for p in emb) * gather_e,
            vocab_extra=sum((p.rows - local_shape(p, layout)[0]) * cfg.d_model for p in emb) * gather_e,
            gather_meta=split_copy_metadata([s * gather_e for s in shards], d) if meta else 0,
            reduce_meta=chunk_cat_metadata([s * reduce_e for s in shards]) if meta else 0,
        )

    first = {cfg.layer_moe(i): i for i in reversed(range(cfg.num_layers))}  # kind (sparse or not) -> its first block
    order = sorted(first, key=first.get)
    return FsdpUnits(
        reshard_after_forward=layout.zero == 3,
        float_logits=setup.autocast,
        root=unit(0),
        blocks=tuple(unit(first[k] + 1) for k in order),
        kinds=tuple(order.index(cfg.layer_moe(i)) for i in range(cfg.num_layers)),
        experts=unit(first[True] + 1, experts=True) if True in first and ep > 1 else None,
    )
