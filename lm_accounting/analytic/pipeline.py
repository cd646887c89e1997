"""Pipeline parallel (1F1B): the worst stage's memory.  No torch.

The peaks are ESTIMATES (``pipeline_stages``).  One stage of the real job (torch 2.13's
``PipelineStage`` + ``Schedule1F1B`` on the fake process group, ``measure.pipeline.measure_stage``)
is measured in ``tests/test_pipeline_measured.py``: its baseline (``stage_baseline``) and the
schedule's receive buffers (``schedule_buffers``) are exact; the estimated peaks are within the
bound stated there, for the reasons given there.
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
    """1F1B over P stages and m micro-batches (an ESTIMATE: see the module docstring).  Stage s keeps the saved activations of k = min(P − s, m)
    micro-batches at once (1F1B's warm-up depth); one micro-batch saves its blocks' share of the
    per-layer activations, plus on the last stage the final norm's, LM head's and cross-entropy's.
    Peak ESTIMATE per stage: baseline (its model states, ``model_states`` over its parameters) +
    k × its activations + the last stage's cross-entropy transient (the single-GPU replay's forward
    peak above its forward end).  Returns (stage, plain step, traced step, states, activations) of
    the stage with the highest peak: stage 0 (the most micro-batches in flight, the first L mod P
    stages one block more) or the last (the head); a middle stage has fewer of both."""
    best = None
    for s in sorted({0, layout.pp - 1}):  # stage 0 keeps the most micro-batches; the last, the head
        step, st, act = stage_step(cfg, seq, batch, setup, layout, s)
        if best is None or step.peak > best[1].peak:
            best = (s, step, step, st, act)
    return best


def stage_step(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int):
    """(step ESTIMATE, model states, saved activations) of pipeline stage ``stage`` (see ``pipeline_stages``)."""
    flat = ParallelLayout(
        dp=layout.dp, zero=layout.zero, tp=layout.tp, sequence_parallel=layout.sequence_parallel,
        vocab_parallel=layout.vocab_parallel,
    )  # fmt: skip
    per_layer, head = _activation_split(cfg, seq, batch, setup, flat)
    r = single_rank_step(cfg, seq, batch, setup, flat, "plain")
    states = dataclasses.replace(flat, pp=layout.pp, micro_batches=layout.pp)  # the states ignore m: one cache key
    st = model_states(cfg, setup, states, stage=stage)
    last = stage == layout.pp - 1
    one = len(stage_layers(cfg.num_layers, layout.pp, stage)) * per_layer + (head if last else 0)
    k = min(layout.pp - stage, layout.micro_batches)
    base = st.total + 2 * 8 * batch * seq
    act = k * one
    transient = (r.forward.peak - r.forward.end) if last else 0
    fwd = PhaseBytes(base + act + transient, base + act)
    bwd = PhaseBytes(base + act + st.gradients + transient, base + st.gradients)
    opt = PhaseBytes(base + st.gradients + st.owned_elements * element_bytes(setup), base)
    return StepMemory(base, fwd, bwd, opt), st, act


def stage_baseline(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int):
    """Bytes live when stage ``stage``'s step starts (exact against the measured stage, pipeline
    parallel alone): its parameters and AdamW moments, the RoPE tables, and the whole step's int64
    token ids (m·B·S, stage 0) or targets (the last stage); a middle stage holds neither."""
    st = model_states(cfg, setup, layout, stage=stage)
    rope = 2 * cfg.context_length * (cfg.d_head // 2) * 4 if cfg.positions == "rope" else 0  # fp32 cos, sin
    ends = (stage == 0) + (stage == layout.pp - 1)
    return st.parameters + st.optimizer + rope + ends * 8 * layout.micro_batches * batch * seq


def schedule_buffers(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, stage: int):
    """Bytes of the receive buffers torch's ``PipelineStage`` allocates at its first step and keeps
    (exact against the measured stage): one (B, S, d) activation buffer per micro-batch on every stage
    but the first (``_setup_forward_recv_info``), one (B, S, d) gradient buffer per micro-batch on every
    stage but the last (``_setup_backward_recv_info``), in the parameters' dtype."""
    sides = (stage > 0) + (stage < layout.pp - 1)
    return sides * layout.micro_batches * batch * seq * cfg.d_model * element_bytes(setup)


@lru_cache(maxsize=1024)
def _activation_split(cfg, seq, batch, setup, layout) -> tuple[int, int]:
    """(saved bytes per block, saved bytes of everything else) of one micro-batch on one rank."""
    total = saved_activations(cfg, seq, batch, setup, layout)
    one = dataclasses.replace(cfg, num_layers=1)
    two = dataclasses.replace(cfg, num_layers=2)
    per_layer = saved_activations(two, seq, batch, setup, layout) - saved_activations(one, seq, batch, setup, layout)
    return per_layer, total - cfg.num_layers * per_layer
