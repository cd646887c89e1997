"""Pipeline parallel (1F1B), analytic only: the worst stage's memory.  No torch.

torch 2.13's ``torch.distributed.pipelining`` does not run on the fake process group (its stages
exchange pickled metadata with ``send_object_list``/``recv_object_list``, which the fake backend
leaves empty), so nothing here is measured: every peak is an ESTIMATE.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

from ..config import ModelConfig
from ..layout import ParallelLayout
from ..phases import PhaseBytes, StepMemory
from ..setup import TrainingSetup
from .parallel import element_bytes, model_states, saved_activations, single_rank_step, stage_layers


def pipeline_stages(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout):
    """1F1B over P stages and m micro-batches (analytic only: torch.distributed.pipelining is not run
    on the fake process group here).  Stage s keeps the saved activations of k = min(P − s, m)
    micro-batches at once (1F1B's warm-up depth); one micro-batch saves its blocks' share of the
    per-layer activations, plus on the last stage the final norm's, LM head's and cross-entropy's.
    Peak ESTIMATE per stage: baseline (its model states, ``model_states`` over its parameters) +
    k × its activations + the last stage's cross-entropy transient (the single-GPU replay's forward
    peak above its forward end).  Returns (stage, plain step, traced step, states, activations) of
    the stage with the highest peak: stage 0 (the most micro-batches in flight, the first L mod P
    stages one block more) or the last (the head); a middle stage has fewer of both."""
    flat = ParallelLayout(
        dp=layout.dp, zero=layout.zero, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
        vocab_parallel=layout.vocab_parallel,
    )  # fmt: skip
    per_layer, head = _activation_split(cfg, seq, batch, setup, flat)
    r = single_rank_step(cfg, seq, batch, setup, flat, "plain")
    best = None
    states = dataclasses.replace(flat, pp=layout.pp, micro_batches=layout.pp)  # the states ignore m: one cache key
    for s in sorted({0, layout.pp - 1}):  # stage 0 keeps the most micro-batches; the last, the head
        st = model_states(cfg, setup, states, stage=s)
        last = s == layout.pp - 1
        one = len(stage_layers(cfg.num_layers, layout.pp, s)) * per_layer + (head if last else 0)
        k = min(layout.pp - s, layout.micro_batches)
        base = st.total + 2 * 8 * batch * seq
        act = k * one
        transient = (r.forward.peak - r.forward.end) if last else 0
        fwd = PhaseBytes(base + act + transient, base + act)
        bwd = PhaseBytes(base + act + st.gradients + transient, base + st.gradients)
        opt = PhaseBytes(base + st.gradients + st.owned_elements * element_bytes(setup), base)
        step = StepMemory(base, fwd, bwd, opt)
        if best is None or step.peak > best[1].peak:
            best = (s, step, step, st, act)
    return best


@lru_cache(maxsize=1024)
def _activation_split(cfg, seq, batch, setup, layout) -> tuple[int, int]:
    """(saved bytes per block, saved bytes of everything else) of one micro-batch on one rank."""
    total = saved_activations(cfg, seq, batch, setup, layout)
    one = dataclasses.replace(cfg, num_layers=1)
    two = dataclasses.replace(cfg, num_layers=2)
    per_layer = saved_activations(two, seq, batch, setup, layout) - saved_activations(one, seq, batch, setup, layout)
    return per_layer, total - cfg.num_layers * per_layer
