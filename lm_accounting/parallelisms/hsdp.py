"""HSDP (``replicate`` r; torchtitan's ``ParallelDims.dp_replicate``): FSDP2 over a (replicate, shard) mesh,
``init_device_mesh(..., (r, dp // r), mesh_dim_names=("dp_replicate", "dp_shard"))`` (torch 2.13
``_fully_shard/_fsdp_init.py`` ``_get_mesh_info``).  States sharded over the s = dp/r ranks of a shard group and
replicated over the r groups; each unit gathered and reduce-scattered over its shard group, then its shard
all-reduced over the replicas (``analytic.collectives`` rule 12).  Not beside pipeline or expert parallel."""

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
        if dp == r:
            raise AccountingError(
                f"replicate={r} = dp leaves shard groups of one rank: nothing is sharded (use --zero 0, DDP)"
            )
        if layout.pp > 1 or layout.ep > 1:
            raise AccountingError(f"replicate={r} (HSDP) beside pipeline or expert parallel is not accounted")

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
