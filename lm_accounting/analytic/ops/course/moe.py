"""Our mixture of experts (``lm_accounting/model/moe.py``, single rank) as a program of the op library.

``MixtureOfExperts.forward`` line by line: router, softmax, top-k values; every token's k slots
(``repeat_interleave``); slot s to expert s mod E, so q = ⌊T·k/E⌋ slots per expert in one batched part (a view of
the first q·E slots, transposed to (E, q, d)) and the last T·k mod E one each to experts 0.. (a second part);
each part through the experts' SwiGLU (``ExpertLinear``: ``torch.bmm(x, weight[:G].transpose(1, 2))``); the
parts back in slot order; weighted by the top-k scores and summed per token; plus the shared experts.
"""

from __future__ import annotations

from ....config import ModelConfig
from .. import aten as A
from ..aten_index import repeat_interleave, topk
from ..engine import Affine
from ..tensors import Tensor, parameter
from .layers import Linear, SwiGLU, bmm, silu, softmax


class MixtureOfExperts:
    """``MixtureOfExperts`` (moe.py:74; forward :94, ``_finish``; router, balanced top-k routed experts, optional shared experts)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        d, de, self.E, self.k = cfg.d_model, cfg.expert_width, cfg.num_experts, cfg.experts_per_token
        self.router = Linear(d, self.E, dtype, name + ".router")
        self.w1 = parameter((self.E, de, d), dtype, name + ".experts.w1.weight")
        self.w2 = parameter((self.E, d, de), dtype, name + ".experts.w2.weight")
        self.w3 = parameter((self.E, de, d), dtype, name + ".experts.w3.weight")
        self.shared = SwiGLU(d, cfg.shared_width, dtype, name + ".shared", False) if cfg.shared_experts else None

    def params(self) -> list[Tensor]:
        out = self.router.params() + [self.w1, self.w2, self.w3]
        return out + (self.shared.params() if self.shared is not None else [])

    def _linear(self, weight: Tensor, x: Tensor) -> Tensor:
        """``ExpertLinear.forward`` (moe.py:47): ``torch.bmm(x, self.weight[: x.shape[0]].transpose(1, 2))``."""
        w = A.slice_(weight, 0, 0, x.shape[0])
        return bmm(x, A.transpose(w, 1, 2))

    def experts(self, x: Tensor) -> Tensor:
        """``Experts.forward`` (moe.py:66): ``self.w2(silu(self.w1(x)) * self.w3(x))``."""
        return self._linear(self.w2, A.mul(silu(self._linear(self.w1, x)), self._linear(self.w3, x)))

    def __call__(self, x: Tensor) -> Tensor:
        d, k, E = x.shape[-1], self.k, self.E
        flat = A.reshape(x, -1, d)
        T = flat.shape[0]
        weights = topk(softmax(self.router(flat), -1), k)[0]  # .values: the indices die with the tuple
        slots = repeat_interleave(flat, k)
        q, r = ((T * k) // E, 0) if isinstance(T, Affine) else divmod(T * k, E)
        parts = []
        if q:
            full = self.experts(A.transpose(A.view(A.slice_(slots, 0, 0, q * E), q, E, d), 0, 1))
            parts.append(A.reshape(A.transpose(full, 0, 1), q * E, d))
        if r:
            parts.append(A.squeeze(self.experts(A.unsqueeze(A.slice_(slots, 0, q * E, T * k), 1)), 1))
        routed = A.cat(parts, 0) if len(parts) > 1 else parts[0]
        return self._finish(routed, weights, flat, x)

    def _finish(self, routed: Tensor, weights: Tensor, flat: Tensor, x: Tensor) -> Tensor:
        T, d, k = flat.shape[0], flat.shape[1], self.k
        out = A.sum_(A.view(A.mul(routed, A.reshape(weights, T * k, 1)), T, k, d), 1)
        out = A.to(out, flat.dtype)
        if self.shared is not None:
            out = A.add(out, self.shared(flat))
        return A.view(out, *x.shape)


def lines_in_batch(cfg: ModelConfig, seq: int) -> bool:
    """Whether the routed split is the same op sequence for every batch B: E divides S·k and S·k >= 2·E, so
    every expert gets q = B·S·k/E >= 2 slots and none is left over (``analytic.replay.moe_lines_in_batch``)."""
    if not cfg.moe:
        return True
    slots = seq * cfg.experts_per_token
    return slots % cfg.num_experts == 0 and slots >= 2 * cfg.num_experts
