"""The replay hooks of one training step: where a data-parallel wrapper acts between the model's modules.

FSDP2 (``fully_shard``, torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_state.py``) registers, per
unit (each block, then the root): a forward pre-hook (unshard), a forward hook (reshard), a tensor hook on
the unit's outputs (pre-backward: unshard, prefetch) and an autograd function on its inputs that requiring
grad (post-backward: reshard, reduce-scatter); the root's last post-backward runs in a final callback at the
end of backward.  ``StepHooks`` names those places; ``r`` is the replay being charged (``engine.Replay``,
called with signed byte counts) and ``i`` the block's index.  Implemented by ``fsdp.FsdpEvents`` (one rank of
an FSDP2 job) and ``pipeline``'s stage events; called by ``replay``'s skeleton and by the op library's
programs (``ops.fsdp``).  No torch.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol


class StepHooks(Protocol):
    """What a wrapper does at each module boundary of one training step (see the module docstring)."""

    def root_pre_forward(self, r) -> None: ...

    def block_pre_forward(self, r, i: int) -> None: ...

    def block_post_forward(self, r, i: int) -> None: ...

    def root_post_forward(self, r) -> None: ...

    def root_pre_backward(self, r) -> None: ...

    def block_pre_backward(self, r, i: int) -> None: ...

    def block_post_backward(self, r, i: int) -> None: ...

    def root_post_backward(self, r) -> None: ...


class KeyedHooks(StepHooks, Protocol):
    """Hooks whose events at block i depend only on ``key(i, backward)``: blocks of equal keys in a row may be
    replayed once for all (``replay._layer_runs``, ``ops.tensors.repeated``)."""

    def key(self, i: int, backward: bool) -> Hashable: ...
