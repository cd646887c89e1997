"""Context parallel (``cp``; torchtitan's ``ParallelDims.cp``): torch 2.13's
``torch.distributed.tensor.experimental.context_parallel``.  Each of the cp ranks holds s = S/cp positions of every
sequence, load-balanced (``_HeadTailLoadBalancer``: chunks i and 2cp − 1 − i of 2·cp, so S must be a multiple of
2·cp) and runs the fused attention as ring attention over the cp group (``_context_parallel/_attention.py``
``_templated_ring_attention``): K and V all-gathered (rotate "allgather", torch's default) and the fp32 dK, dV passed
around the ring (``analytic.collectives`` rule 13; ``analytic.context_parallel``).

The mesh is torchtitan's (pp, dp, cp, tp) (``ParallelDims._build_mesh_without_ep``: cp inside dp, tp innermost):
the cp ranks are tp apart, and FSDP2, DDP and ZeRO-1 run over the flattened dp × cp mesh (``dp_shard_cp``,
``apply_fsdp(model, parallel_dims.get_mesh("dp_shard_cp"))`` in ``torchtitan/models/llama3/infra/parallelize.py``;
DDP's gradients all-reduced over ``dp_cp``), dp·cp ranks tp apart.

Beside tensor parallel (torchtitan's Llama 3 405B layout: TP within a node, CP across): TP splits the heads, CP the
sequence of each rank's h/tp heads (``apply_tp`` then CP on the attention); FSDP2 over dp·cp, TP-sharded.  With
sequence parallel (torchtitan's ``apply_tp``: ``SequenceParallel`` norms) the sequence is split twice: CP gives a rank
s = S/cp positions, SP holds the norms and the residual stream at s/tp of them between the projections; and with vocab
parallel (loss parallel) the embedding, LM head and loss over the vocabulary, on the rank's s positions.

Beside HSDP (``replicate`` r; torchtitan's dp_replicate × dp_shard × cp, ``ParallelDims``: ``apply_fsdp`` over the
2-D ``(dp_replicate, dp_shard_cp)`` mesh): FSDP2's shard group is the flattened dp_shard × cp ranks, s·cp of them
(``ParallelLayout.shard``), the states replicated over the r groups; each unit gathered and reduce-scattered over
dp_shard_cp, its shard all-reduced over dp_replicate (``analytic.collectives`` rule 12 on ``flat_cp``).  The mesh is
(dp_replicate, dp_shard, cp, tp): global rank ((i·s + j)·cp + c)·tp + t.

Not accounted beside CP (refused): pipeline and expert parallel; a mixture of
experts or latent attention; attention other than the fused kernel (CP replaces the SDPA kernels only:
the course's naive attention would run whole on s positions, which is not attention over the sequence)."""

from __future__ import annotations

from ..config import AccountingError

BESIDE = (
    ("pp", "pipeline parallel"),
    ("ep", "expert parallel"),
)
"""The degrees not accounted beside context parallel: (field, what it is)."""


class ContextParallel:
    name = "CP"
    fields = ("cp", "dp", "tp")

    def validate(self, layout) -> None:
        if layout.cp == 1:
            return
        for field, what in BESIDE:
            if getattr(layout, field) > 1:
                raise AccountingError(f"context parallel (cp={layout.cp}) beside {what} ({field}) is not accounted")

    def check(self, layout, cfg, seq) -> None:
        cp = layout.cp
        if cp == 1:
            return
        unsupported = [u for u in ("mixture of experts", "latent attention (MLA)") if u in cfg.unsupported_for_replay()]
        if unsupported:
            raise AccountingError(f"context parallel (cp={cp}) covers dense attention; {cfg.name} has {unsupported[0]}")
        if seq is not None and seq % (2 * cp):
            # torch 2.13 ``_HeadTailLoadBalancer``: the sequence in 2·cp equal chunks
            raise AccountingError(
                f"context parallel load-balances the {seq:,} positions in 2·cp = {2 * cp} chunks: use a multiple of {2 * cp}"
            )

    def label(self, layout) -> str:
        return f"·cp{layout.cp}" if layout.cp > 1 else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """The cp ranks (tp apart: cp inside dp on the mesh) and FSDP2's/DDP's flattened dp × cp ranks; beside
        HSDP, FSDP2's flattened dp_shard × cp ranks (the replicas' group is HSDP's "dp_replicate")."""
        if layout.cp == 1:
            return {}
        if layout.replicate > 1:
            return {"cp": (layout.cp, layout.tp), "dp_shard_cp": (layout.shard, layout.tp)}
        return {"cp": (layout.cp, layout.tp), "dp_cp": (layout.dp * layout.cp, layout.tp)}


def check_attention(layout, attention: str) -> None:
    """CP replaces the fused SDPA kernels only (``_attention.py``'s ``custom_ops``): refuse the naive attention."""
    if layout.cp > 1 and attention != "sdpa":
        raise AccountingError(
            f"context parallel (cp={layout.cp}) runs ring attention in place of the fused kernel: use --attention sdpa"
        )


CP = ContextParallel()
