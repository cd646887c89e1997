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
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager

from ..tensors import Run, Storage, Tensor, checkpoint, current

_STATE: list[tuple[bool, dict | None] | None] = [None]
"""The innermost checkpointed region: (recomputing, the selective cache of op -> outputs, or None), or None."""


def saved_op(op: Callable, *args):
    """Run ``op`` (``mm``, ``bmm``, the fused attention: the selective policy's MUST_SAVE ops) as the innermost
    checkpointed region has it."""
    state = _STATE[-1]
    if state is None or not state[0]:  # no region, or a forward
        out = op(*args)
        if state is not None and state[1] is not None:  # selective: the outputs kept in the cache
            state[1].setdefault(op, []).append([t.detach() for t in _outputs(out)])
        return out
    cache = state[1]
    if cache is None:  # recomputed for real (the op packs its saved inputs first: ``tensors.record_first``)
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


def block_checkpoint(fn: Callable[..., Tensor], x: Tensor, selective: bool) -> Tensor:
    """``checkpoint(fn, x)`` (torch's non-reentrant), selective or full (see the module docstring)."""
    cache: dict | None = {} if selective else None
    calls = [0]

    def region(*inputs):
        _STATE.append((calls[0] > 0, cache))
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
    return Storage(8, "mode_wrapped_number") if state is not None and state[1] is not None and current().wraps else None
