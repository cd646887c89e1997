"""Our model's checkpointed blocks (``model/transformer.py`` ``_run_block``): ``checkpoint(run, x,
use_reentrant=False)``, and for selective checkpointing with ``context_fn=create_selective_checkpoint_contexts(
selective_policy)``, the policy MUST_SAVE for ``mm``, ``bmm``, ``addmm`` and the fused attention.

torch 2.13, what the matmuls and the fused attention (``saved_op``) do inside a checkpointed block:

1. Autograd packs an op's saved *inputs* before its kernel runs (the generated ``VariableType`` code sets the
   ``SavedVariable``s of inputs, then redispatches); in the backward's recompute the pack of the last saved
   tensor raises the early stop (``torch/utils/checkpoint.py``, ``_recomputation_hook``), so that op (w2's
   ``mm``) never allocates its output (``tensors.record_first``).
2. Selective: in the forward ``_CachingTorchDispatchMode`` keeps a MUST_SAVE op's outputs (detached) in the
   checkpoint's storage; in the recompute ``_CachedTorchDispatchMode`` hands them back instead of running the
   kernel (the entry becomes ``_CONSUMED``).  An entry the early stop never reaches lives on with the frame.
   Replayed by keeping the outputs in a cache per region and, in the recompute, giving the op the cached
   storages (nothing allocated).
3. Which ops the policy saves (``Region.saves``): ``selective`` (``model.transformer.selective_policy``) every op
   that reaches ``saved_op``; ``op``, torchtitan's per-op policy (``model.transformer.op_sac_policy``: e7c0cae
   ``parallelize_llama.py`` ``_get_custom_policy``), counts the ``mm`` calls of each checkpointed call, the forward
   and the recompute apart, and saves the odd-numbered ones and the flash and memory-efficient attention (and the
   CPU flash that stands in for it); an even-numbered ``mm``, a ``bmm`` (naive attention, the experts) and cuDNN's
   attention (not in its ``_save_list``) run again in the recompute as under ``full``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from .. import aten as A
from .. import cuda
from ..tensors import Run, Storage, Tensor, checkpoint, current

SAC_POLICIES = ("selective", "op")
"""The checkpoint modes (``setup.CHECKPOINTS``) that run a selective-checkpoint policy."""

OP_SAC_UNSAVED = (A.bmm, cuda.cudnn_attention)
"""Ops reaching ``saved_op`` that torchtitan's ``_save_list`` lacks (recomputed under ``op``)."""


class Region:
    """One call of a checkpointed block: forward or recompute, the SAC cache (op -> outputs; None: full), the
    policy's ``mm`` count in this call (torchtitan's ``meta[f"{mode}_mm_count"]``, fresh per call)."""

    def __init__(self, recomputing: bool, cache: dict | None, policy: str):
        self.recomputing, self.cache, self.policy, self.mm_count = recomputing, cache, policy, 0

    def saves(self, op: Callable) -> bool:
        """Whether the policy keeps ``op``'s outputs (MUST_SAVE) in this call (module docstring, 3)."""
        if self.cache is None:
            return False
        if self.policy == "selective":
            return True
        if op is A.mm:
            self.mm_count += 1
            return self.mm_count % 2 == 1  # every second mm: PREFER_RECOMPUTE
        return op not in OP_SAC_UNSAVED


_STATE: list[Region | None] = [None]
"""The innermost checkpointed region, or None."""


def saved_op(op: Callable, *args):
    """Run ``op`` (``mm``, ``bmm``, the fused attention: the ops a selective policy may save) as the innermost
    checkpointed region has it."""
    state = _STATE[-1]
    saves = state is not None and state.saves(op)
    if state is None or not state.recomputing:  # no region, or a forward
        out = op(*args)
        if saves:  # the outputs kept in the cache
            state.cache.setdefault(op, []).append([t.detach() for t in _outputs(out)])
        return out
    cache = state.cache
    if not saves:  # recomputed for real (the op packs its saved inputs first: ``tensors.record_first``)
        return op(*args)
    if getattr(op, "takes_storages", False):  # it saves its outputs (never the last op): the cached ones
        return op(*args, storages=[t.storage for t in cache[op].pop(0)])
    with uncharged():
        out = op(*args)  # an early stop raises here, before the cache entry is consumed
    for t, c in zip(_outputs(out), cache[op].pop(0), strict=True):
        t.storage = c.storage
    return out


def _outputs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


@contextmanager
def uncharged():
    """Allocations charged to no run and work recorded by none, with the active run's autograd state (grad mode,
    saved-tensor hooks, sequence numbers): a cached op's run, whose outputs then take the cached storages."""
    run = current()
    quiet = Run(run.traced)
    quiet.grad, quiet.hooks, quiet.seq = run.grad, run.hooks, run.seq
    quiet.work = None  # no kernel runs: ``recording_work`` records none of its work
    with quiet:
        yield


def block_checkpoint(fn: Callable[..., Tensor], x: Tensor, policy: str) -> Tensor:
    """``checkpoint(fn, x)`` (torch's non-reentrant), full or under a selective policy (``SAC_POLICIES``; see the
    module docstring)."""
    cache: dict | None = {} if policy in SAC_POLICIES else None
    calls = [0]

    def region(*inputs):
        _STATE.append(Region(calls[0] > 0, cache, policy))
        calls[0] += 1
        try:
            return fn(*inputs)
        finally:
            _STATE.pop()

    return checkpoint(region, x, preserve_rng_state=False)  # no dropout: our model stashes no RNG state


def mode_wrapped_number() -> Storage | None:
    """Inside a selective region (forward or recompute: torch's caching dispatch modes are on), a plain CPU run
    wraps an op's Python-number operand once more for the mode (8 bytes, ``PythonDispatchMode``, freed when the
    op returns), besides the op's own wrapper; hold the result across the op."""
    state = _STATE[-1]
    return (
        Storage(8, "mode_wrapped_number") if state is not None and state.cache is not None and current().wraps else None
    )
