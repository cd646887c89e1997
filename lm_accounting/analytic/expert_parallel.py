"""Which slot rows go where under expert parallel (torchtitan's ``ExpertParallel``).  No torch.

The one source of the row counts: the live model's dispatch (``model/moe.py``
``MixtureOfExperts._routed_expert_parallel``) builds its index lists with ``expert_parallel_plan``, and
the analytic side (FLOPs, collectives, the memory replay) reads the counts from ``expert_parallel_split``.

Balanced routing (``model/moe.py``): slot s = t·k + j goes to expert s mod E, so of one rank's n = T·k
slots expert e gets c_e = q + [e < n mod E], q = ⌊n/E⌋.  ep rank j holds experts j·G … j·G + G − 1
(G = E/ep):

1. sent to rank j: Σ_{e of j} c_e rows (the same from every rank: every rank routes alike);
2. received by rank j: ep · Σ_{e of j} c_e rows, source-major, then by expert;
3. its experts run them in at most two parts: a batched (G, ep·q, d) one (every local expert's q rows
   from each source) and, for the local experts with c_e = q + 1 (a prefix of them), an (extra, ep, d)
   one (the one more row from each source); rows in all: ep·G·q + ep·extra = E·q + ep·extra.
"""

from __future__ import annotations

from typing import NamedTuple


class ExpertParallelSplit(NamedTuple):
    """One rank's row counts (module docstring, items 1–3)."""

    sent: tuple[int, ...]  # rows sent to each ep rank (item 1)
    received: int  # rows received from all ep ranks together (item 2)
    full_rows: int  # rows of every local expert in the batched part: ep·q (item 3)
    extra_experts: int  # local experts with one more row from every source (item 3)


def expert_counts(n: int, experts: int) -> list[int]:
    """c_e = ⌊n/E⌋ + [e < n mod E]: the slots of expert e among n."""
    q, rem = divmod(n, experts)
    return [q + (e < rem) for e in range(experts)]


def _clamp(x: int, hi: int) -> int:
    return min(max(x, 0), hi)


def expert_parallel_split(n: int, experts: int, ranks: int, rank: int) -> ExpertParallelSplit:
    """The counts of ep rank ``rank`` (of ``ranks``) routing n slots over ``experts`` (module docstring), in
    closed form (no list of E counts): with q, r = divmod(n, E), rank j's G = E/ep experts are j·G … j·G + G − 1,
    of which min(max(r − j·G, 0), G) have c_e = q + 1, so it is sent G·q + that many rows."""
    G, (q, rem) = experts // ranks, divmod(n, experts)
    sent = tuple(G * q + _clamp(rem - j * G, G) for j in range(ranks))
    return ExpertParallelSplit(sent, ranks * sent[rank], ranks * q, _clamp(rem - rank * G, G))


class ExpertParallelPlan(NamedTuple):
    by_expert: list[int]  # the slots sorted by expert (stable): what is sent, in order
    sent: list[int]  # rows sent to each rank
    received: list[int]  # rows received from each rank
    local_order: list[int]  # the received rows, expert-major (see ``expert_parallel_plan``)
    full_rows: int  # rows of every local expert in the batched part: ranks·⌊n/E⌋
    extra_experts: int  # local experts with one more row from every source (a prefix)


def expert_parallel_plan(n: int, experts: int, ranks: int, rank: int) -> ExpertParallelPlan:
    """The index lists of one rank's n = T·k slots (``expert_parallel_split``'s counts): ``by_expert``
    sorts the slots by expert; the received rows come source-major, then by expert, and ``local_order``
    puts them expert-major: for each local expert, q rows from every source (the batched part), then for
    the experts with c_e = q + 1 (a prefix) one more from every source."""
    split = expert_parallel_split(n, experts, ranks, rank)
    G, q, count = experts // ranks, n // experts, expert_counts(n, experts)
    by_expert = [a * experts + e for e in range(experts) for a in range(count[e])]
    block = split.sent[rank]  # rows from each source
    mine = count[rank * G : (rank + 1) * G]
    start = [sum(mine[:i]) for i in range(G)]  # local expert i's first row in each source's block
    full = [s * block + start[i] + a for i in range(G) for s in range(ranks) for a in range(q)]
    extra = [s * block + start[i] + q for i in range(G) if mine[i] > q for s in range(ranks)]
    return ExpertParallelPlan(
        by_expert, list(split.sent), [block] * ranks, full + extra, split.full_rows, split.extra_experts
    )
