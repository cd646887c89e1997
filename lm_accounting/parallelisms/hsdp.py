"""HSDP (``replicate`` r; torchtitan's ``ParallelDims.dp_replicate``): FSDP2 over a (replicate, shard) mesh,
``init_device_mesh(..., (r, dp // r), mesh_dim_names=("dp_replicate", "dp_shard"))`` (torch 2.13
``_fully_shard/_fsdp_init.py`` ``_get_mesh_info``).  States sharded over the s = dp/r ranks of a shard group and
replicated over the r groups; each unit gathered and reduce-scattered over its shard group, then its shard
all-reduced over the replicas (``analytic.collectives`` rule 12).  Beside expert parallel, torchtitan's MoE mesh
(``ParallelDims._build_mesh_with_ep``: ``dp_replicate`` × ``dp_shard_mod_ep`` × ``dp_shard_in_ep``, ep borrowed from
dp_shard): ``apply_fsdp`` (``torchtitan/models/{llama4,deepseek_v3}/infra/parallelize.py``) shards the dense units over
(dp_replicate, dp_shard) and each expert stack over (dp_replicate, dp_shard_mod_ep): the s/ep shard ranks holding
the same experts, replicated over the r replicas; ep must divide s.  Beside pipeline parallel (torchtitan's (pp,
dp_replicate, dp_shard, tp) mesh) each stage's units over its shard group, as FSDP2's stage over dp = s; not
beside both pipeline and expert parallel: expert parallel needs a mixture of experts, and no mixture of experts is
accounted under pipeline parallel, HSDP or not (``layout.ParallelLayout.check``): the stage replay
(``analytic.pipeline._block_lines``) has dense blocks only.  The fake-PG stage itself runs (``build_rank`` prunes
the stage, then applies expert parallel and FSDP2); docs/limits.md gives what it measured."""

from __future__ import annotations

from ..config import AccountingError


class Hsdp:
    name = "HSDP"
    fields = ("dp", "zero", "replicate", "pp", "ep", "tp")

    def validate(self, layout) -> None:
        r, dp = layout.replicate, layout.dp
        if r == 1:
            return
        if not layout.fsdp:
            raise AccountingError(f"replicate={r} (HSDP) is FSDP2 over a replicate x shard mesh: use --zero 2 or 3")
        if dp % r:
            raise AccountingError(f"replicate={r} does not divide dp={dp}: HSDP's mesh is (replicate, dp / replicate)")
        if layout.shard == 1:  # under context parallel the shard group is dp/r · cp ranks (torchtitan's dp_shard_cp)
            raise AccountingError(
                f"replicate={r} = dp leaves shard groups of one rank: nothing is sharded (use --zero 0, DDP)"
            )
        if layout.pp > 1 and layout.ep > 1:
            raise AccountingError(
                f"replicate={r} (HSDP) beside both pipeline and expert parallel is not accounted: no mixture of "
                "experts is accounted under pipeline parallel (its stage replay has dense blocks only)"
            )
        if layout.shard % layout.ep:
            raise AccountingError(
                f"ep={layout.ep} does not divide HSDP's shard degree {layout.shard} (dp={dp} / replicate={r}): expert "
                "parallel borrows its ranks from dp_shard, as torchtitan does (dp_shard_in_ep)"
            )

    def check(self, layout, cfg, seq) -> None:
        return None

    def label(self, layout) -> str:
        return f"·hsdp{layout.replicate}x{layout.shard}" if layout.replicate > 1 else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """A shard group's ranks are consecutive dp ranks (tp apart); a replica group's, a shard group apart."""
        if layout.replicate == 1:
            return {}
        return {"dp_shard": (layout.shard, layout.tp), "dp_replicate": (layout.replicate, layout.shard * layout.tp)}


HSDP = Hsdp()
