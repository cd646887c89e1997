"""Expert parallel (``ep``), torchtitan's convention (``torchtitan/distributed/expert_parallel.py``
``ExpertParallel``; ``apply_fsdp`` in ``torchtitan/models/*/infra/parallelize.py``): the ep ranks are borrowed from
the data-parallel ones (ep divides dp and E), each holds E/ep routed experts, tokens reach them by an all-to-all
dispatch and combine; FSDP2 shards the expert stacks over the dp/ep ranks that hold the same experts
(``analytic.collectives`` rule 6; ``analytic.expert_parallel``).  Under HSDP the ep ranks come from a shard
group and the expert stacks are sharded over the s/ep shard ranks holding the same experts (torchtitan's
``dp_shard_mod_ep``), replicated over the replicas (``parallelisms.hsdp``; ``analytic.collectives`` rule 12)."""

from __future__ import annotations

from ..config import AccountingError


class ExpertParallel:
    name = "EP"
    fields = ("ep", "dp", "zero", "tp", "replicate")

    def validate(self, layout) -> None:
        if layout.ep == 1:
            return
        if not layout.fsdp:
            raise AccountingError(
                f"ep={layout.ep} needs FSDP2 (--zero 2 or 3, got {layout.zero}): expert parallel borrows its ranks"
                " from FSDP2's data-parallel ranks, as torchtitan does"
            )
        if layout.dp % layout.ep:
            raise AccountingError(
                f"ep={layout.ep} does not divide dp={layout.dp}: expert parallel borrows its ranks from dp, "
                "as torchtitan does"
            )

    def check(self, layout, cfg, seq) -> None:
        if layout.ep > 1 and not cfg.moe:
            raise AccountingError(f"ep={layout.ep}: expert parallel needs a mixture of experts; {cfg.name} is dense")
        if layout.ep > 1 and cfg.num_experts % layout.ep:
            raise AccountingError(f"ep={layout.ep} does not divide the {cfg.num_experts} experts")

    def label(self, layout) -> str:
        return f"·ep{layout.ep}" if layout.ep > 1 else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        """The all-to-alls' ep ranks (consecutive dp ranks, tp apart) and the expert units' dp/ep ranks (the ranks
        holding the same experts, ep·tp apart); under HSDP the expert units' shard group, the s/ep ranks of a
        shard group holding the same experts (torchtitan's ``dp_shard_mod_ep``), ep·tp apart."""
        if layout.ep == 1:
            return {}
        if layout.replicate > 1:
            return {"ep": (layout.ep, layout.tp), "dp_shard/ep": (layout.shard // layout.ep, layout.ep * layout.tp)}
        return {"ep": (layout.ep, layout.tp), "dp/ep": (layout.dp // layout.ep, layout.ep * layout.tp)}


EP = ExpertParallel()
