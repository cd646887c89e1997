"""A mixture-of-experts FFN (Mixtral, Qwen3-MoE, DeepSeek) with a deterministic, balanced routing.

Module paths (the component registry's keys): ``moe.router`` (d -> E; with ``router_bias`` its
``moe.router.bias``, gpt-oss), ``moe.score_bias`` (Ernie 4.5's frozen score bias), ``moe.experts.w1``, ``.w2``, ``.w3`` (the routed experts' SwiGLU matrices, each
stacked over the E experts, as transformers v5 stores ``gate_up_proj``/``down_proj``; with ``expert_bias`` each has
an ``ExpertBias``, gpt-oss's ``gate_up_proj_bias``/``down_proj_bias``; with ``swiglu_limit`` the activation is
gpt-oss's clamped SwiGLU), ``moe.shared.w1/w2/w3`` (the shared experts as one SwiGLU of width
``shared_experts · shared_expert_d_ff``, as DeepSeek builds them) and ``moe.shared_gate`` (Qwen2-MoE's
σ-gate on the shared output).

Routing.  Which experts a token picks depends on the router's values, which a ``meta`` tensor does not
have, and a data-dependent split cannot be traced.  So every token is sent to exactly ``k`` experts by
a fixed, balanced rule that does not look at the scores: slot ``s = t·k + j`` (token t's j-th choice)
goes to expert ``s mod E``.  Each token then reaches k distinct experts (k <= E), every expert gets
⌊T·k/E⌋ or ⌈T·k/E⌉ tokens, and the expert matmuls do exactly the top-k convention's work, 2·(T·k)·d·d_e
per matrix, on any device.  The router still runs on every token (its 2·T·d·E FLOPs are real), and its
top-k *values* weight the expert outputs, so the arithmetic (and autograd's graph) is the real one;
only the choice of experts is fixed.  Trained routers are not balanced: per-expert work on a real batch
varies, its sum does not.

Expert parallel (``expert_parallel``; torchtitan's ``ExpertParallel``, ``torchtitan/distributed/
expert_parallel.py``): rank j of an ep-rank group keeps experts j·E/ep … (j+1)·E/ep − 1.  Its T·k slots,
sorted by expert, go to the experts' ranks in one ``all_to_all_single`` (dispatch); each rank runs its
experts on the rows it received from every rank and sends them back in a second one (combine).  The
routing is the same balanced rule, so the splits are known without exchanging counts (torchtitan
exchanges them in a first, small all-to-all): expert e gets n_e = ⌊T·k/E⌋ + [e < T·k mod E] slots from
every rank, and rank j receives ep · Σ_{e of j} n_e rows (``analytic.expert_parallel``).
"""

from __future__ import annotations

import torch
from torch import nn

from lm_accounting.analytic.expert_parallel import expert_parallel_plan
from lm_accounting.model.layers import Linear, SwiGLU, silu, softmax

Tensor = torch.Tensor


class ExpertBias(nn.Module):
    """The biases of E stacked linear maps, ``bias`` (E, out), zeros (gpt-oss's ``gate_up_proj_bias`` and
    ``down_proj_bias``): a child module, as ``layers.Bias``, so the registry accounts for it on its own."""

    def __init__(self, experts: int, features: int, device=None, dtype=None):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(experts, features, device=device, dtype=dtype))

    def forward(self, y: Tensor) -> Tensor:
        """y (G, n, out) of experts 0..G-1 -> y + their biases."""
        return y + self.bias[: y.shape[0]].unsqueeze(1)  # (G, out) -> (G, 1, out), over the n rows


class ScoreBias(nn.Module):
    """Ernie 4.5's router score bias (``moe_statics.e_score_correction_bias``): E values added to the router's
    probabilities to pick the top k, frozen (``requires_grad=False``: no gradient, no optimizer state)."""

    def __init__(self, experts: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(experts, device=device, dtype=dtype), requires_grad=False)


class ExpertLinear(nn.Module):
    """E stacked linear maps, ``weight`` (E, out, in): one batched matmul over the experts (with ``bias``, an
    ``ExpertBias`` added after it)."""

    def __init__(self, experts: int, in_features: int, out_features: int, device=None, dtype=None, bias=False):
        super().__init__()
        std = (2 / (in_features + out_features)) ** 0.5
        weight = torch.empty(experts, out_features, in_features, device=device, dtype=dtype)
        self.weight = nn.Parameter(nn.init.trunc_normal_(weight, std=std, a=-3 * std, b=3 * std))
        self.bias = ExpertBias(experts, out_features, device, dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        """x (G, n, in), rows of experts 0..G-1 (G <= E) -> (G, n, out)."""
        w = self.weight[: x.shape[0]]  # (G, out, in)
        y = torch.bmm(x, w.transpose(1, 2))  # (G, n, in) @ (G, in, out) -> (G, n, out)
        return y if self.bias is None else self.bias(y)

    def extra_repr(self) -> str:
        e, out, inp = self.weight.shape
        return f"experts={e}, in_features={inp}, out_features={out}"


GPT_OSS_ALPHA = 1.702
"""The sigmoid's gain in gpt-oss's clamped SwiGLU (``GptOssConfig.swiglu_alpha``'s default; no count depends on it)."""


def clamped_swiglu(gate: Tensor, up: Tensor, limit: float) -> Tensor:
    """gpt-oss's expert activation (transformers' ``GptOssExperts._apply_gate``):
    ``(clamp(up, ±l) + 1) · g·σ(α·g)`` with ``g = min(gate, l)``."""
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    return (up + 1) * (gate * torch.sigmoid(gate * GPT_OSS_ALPHA))


class Experts(nn.Module):
    """The routed experts' SwiGLU, ``w2(SiLU(w1 x) ⊙ w3 x)`` per expert (``limit``: gpt-oss's clamped form,
    ``clamped_swiglu``; ``bias``: every matrix with an ``ExpertBias``)."""

    def __init__(self, experts: int, d_model: int, d_ff: int, device=None, dtype=None, bias=False, limit=None):
        super().__init__()
        self.w1 = ExpertLinear(experts, d_model, d_ff, device, dtype, bias)
        self.w2 = ExpertLinear(experts, d_ff, d_model, device, dtype, bias)
        self.w3 = ExpertLinear(experts, d_model, d_ff, device, dtype, bias)
        self.limit = limit

    def _one(self, x: Tensor) -> Tensor:
        if self.limit is None:
            return self.w2(silu(self.w1(x)) * self.w3(x))
        return self.w2(clamped_swiglu(self.w1(x), self.w3(x), self.limit))

    def forward(self, x: Tensor, *more: Tensor) -> Tensor | tuple[Tensor, ...]:
        """x (G, n, d): n token rows for each of experts 0..G-1 -> (G, n, d).  With ``more`` parts (each
        (G', n', d)), every part in turn, in one call (one FSDP2 unit pass under expert parallel)."""
        if not more:
            return self._one(x)
        return tuple(self._one(p) for p in (x, *more))


class MixtureOfExperts(nn.Module):
    """Router, top-k routed experts (balanced, see the module docstring) and optional shared experts."""

    def __init__(self, cfg, device=None, dtype=None):
        super().__init__()
        self.num_experts, self.top_k = cfg.num_experts, cfg.experts_per_token
        self.router = Linear(cfg.d_model, cfg.num_experts, device=device, dtype=dtype, bias=cfg.router_bias)
        self.score_bias = ScoreBias(cfg.num_experts, device, dtype) if cfg.router_score_bias else None
        self.experts = Experts(
            cfg.num_experts, cfg.d_model, cfg.expert_width, device, dtype, cfg.expert_bias, cfg.swiglu_limit
        )
        self.shared = None
        if cfg.shared_experts:  # with ``mlp_bias``, biases on its three matrices (Ernie 4.5's ``use_bias``)
            self.shared = SwiGLU(cfg.d_model, cfg.shared_width, device=device, dtype=dtype, bias=cfg.mlp_bias)
        # Qwen2-MoE: the shared experts' output × σ(x·w_g), w_g a d -> 1 map (``shared_expert_gate``)
        self.shared_gate = Linear(cfg.d_model, 1, device=device, dtype=dtype) if cfg.shared_expert_gate else None
        self.ep = None  # (group, ranks, rank) under expert parallel

    def expert_parallel(self, group, ranks: int, rank: int) -> None:
        """Keep only this rank's E/ranks experts (fresh stacks on the same device) and route the slots to
        their ranks over ``group`` (module docstring)."""
        local = self.num_experts // ranks
        for w in (self.experts.w1, self.experts.w2, self.experts.w3):
            shape = (local, *w.weight.shape[1:])
            w.weight = nn.Parameter(torch.empty(shape, device=w.weight.device, dtype=w.weight.dtype))
            if w.bias is not None:
                b = w.bias.bias
                w.bias.bias = nn.Parameter(torch.zeros((local, *b.shape[1:]), device=b.device, dtype=b.dtype))
        self.ep = (group, ranks, rank)

    def forward(self, x: Tensor) -> Tensor:
        """x (..., S, d) -> (..., S, d)."""
        d, k = int(x.shape[-1]), self.top_k
        flat = x.reshape(-1, d)  # (..., S, d) -> (T, d)
        T = int(flat.shape[0])  # a Python int also under the jit trace (fvcore): the split is static
        if self.score_bias is None:
            weights = softmax(self.router(flat), -1).topk(k, dim=-1).values  # (T, E) -> (T, k): the top-k scores
        else:  # Ernie 4.5: the top k of the probabilities + the frozen bias pick; the probabilities weight
            probs = softmax(self.router(flat), -1)
            weights = probs.gather(-1, (probs + self.score_bias.weight).topk(k, dim=-1).indices)
        slots = flat.repeat_interleave(k, dim=0)  # (T, d) -> (T·k, d): slot s = t·k + j
        if self.ep is not None:
            return self._finish(self._routed_expert_parallel(slots), weights, flat, x)
        E = self.num_experts
        q, r = divmod(T * k, E)  # experts 0..r-1 get q + 1 slots, the others q
        parts = []  # (the locals live to the return, as the memory replay has it)
        if q:  # slot a·E + e -> expert e: (q·E, d) -> (q, E, d) -> (E, q, d)
            full = self.experts(slots[: q * E].view(q, E, d).transpose(0, 1))
            parts.append(full.transpose(0, 1).reshape(q * E, d))  # (E, q, d) -> (q·E, d), slot order
        if r:  # the last r slots, one each to experts 0..r-1: (r, d) -> (r, 1, d)
            parts.append(self.experts(slots[q * E :].unsqueeze(1)).squeeze(1))  # (r, 1, d) -> (r, d)
        routed = torch.cat(parts) if len(parts) > 1 else parts[0]  # (T·k, d)
        return self._finish(routed, weights, flat, x)

    def _finish(self, routed: Tensor, weights: Tensor, flat: Tensor, x: Tensor) -> Tensor:
        """The routed outputs (T·k, d) weighted by the top-k scores and summed per token, plus the shared
        experts on every token (T, d) -> x's shape."""
        T, d, k = int(flat.shape[0]), int(flat.shape[1]), self.top_k
        out = (routed * weights.reshape(T * k, 1)).view(T, k, d).sum(1)  # weighted sum over each token's k
        # in the input's dtype, as transformers' MoE blocks return it (Mixtral, Qwen3-MoE, DeepSeek-V3
        # in transformers 5.24: ``index_add_`` of ``.to(final_hidden_states.dtype)`` into
        # ``zeros_like(hidden_states)``).  A no-op (no copy) except under autocast with bf16 parameters
        # (FSDP2's MixedPrecisionPolicy): the top-k weights are fp32 there (exp runs in fp32) and autocast
        # sums in fp32, and without it the residual stream would turn fp32 after the first MoE block
        out = out.to(flat.dtype)
        if self.shared is not None and self.shared_gate is None:
            out = out + self.shared(flat)
        elif self.shared is not None:  # (T, 1) gate values, broadcast over the d features
            out = out + torch.sigmoid(self.shared_gate(flat)) * self.shared(flat)
        return out.view(x.shape)

    def _routed_expert_parallel(self, slots: Tensor) -> Tensor:
        """Dispatch the slots to their experts' ranks, run this rank's experts, combine (module docstring)."""
        from torch.distributed._functional_collectives import all_to_all_single_autograd

        group, ranks, rank = self.ep
        d = int(slots.shape[1])
        plan = expert_parallel_plan(int(slots.shape[0]), self.num_experts, ranks, rank)
        index = lambda rows: torch.tensor(rows, device=slots.device)
        send = slots.index_select(0, index(plan.by_expert))  # (T·k, d), sorted by expert
        got = all_to_all_single_autograd(send, plan.received, plan.sent, group)  # (ranks·c, d), by source
        local = got.index_select(0, index(plan.local_order))  # by local expert, then source
        G, per, extra = self.num_experts // ranks, plan.full_rows, plan.extra_experts
        parts = []
        if per:  # every local expert's first ranks·q rows: (G·per, d) -> (G, per, d)
            parts.append(local[: G * per].view(G, per, d))
        if extra:  # one more row from every source for local experts 0..extra-1: (extra, ranks, d)
            parts.append(local[G * per :].view(extra, ranks, d))
        outs = self.experts(*parts)  # one call: the experts' FSDP2 unit is gathered once per pass
        outs = (outs,) if len(parts) == 1 else outs
        out = torch.cat([o.reshape(-1, d) for o in outs]) if len(outs) > 1 else outs[0].reshape(-1, d)
        back = out.index_select(0, index(_inverse(plan.local_order)))  # by source again
        returned = all_to_all_single_autograd(back, plan.sent, plan.received, group)  # (T·k, d), by expert
        return returned.index_select(0, index(_inverse(plan.by_expert)))  # slot order


def _inverse(perm: list[int]) -> list[int]:
    out = [0] * len(perm)
    for i, p in enumerate(perm):
        out[p] = i
    return out
