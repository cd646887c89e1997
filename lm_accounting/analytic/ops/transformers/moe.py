"""transformers 5.24's sparse mixture of experts (``MixtralForCausalLM``, ``Qwen3MoeForCausalLM``), transliterated.

The decoder layers are Llama's (``llama.DecoderLayer``; Qwen3-MoE with its per-head q/k norms) with the MLP
replaced by the sparse block in the layers that have one (Qwen3-MoE: ``decoder_sparse_step`` and
``mlp_only_layers``, ``modeling_qwen3_moe.py`` ``Qwen3MoeDecoderLayer.__init__``).  The block
(``MixtralSparseMoeBlock.forward``, ``Qwen3MoeSparseMoeBlock.forward``): the router, then the experts.

* The router (``MixtralTopKRouter.forward`` / ``Qwen3MoeTopKRouter.forward``): ``F.linear`` to E logits, a
  softmax in fp32 (Mixtral: ``router_logits.float()`` first, a copy in 16-bit), ``topk``, the top-k values
  divided in place by their sum (Mixtral always, Qwen3-MoE when ``norm_topk_prob``: autograd keeps a clone of
  the values, ``div_``'s ``original_self``), then (Qwen3-MoE) cast back to the logits' dtype.
* The experts run transformers' default ``experts_implementation``, ``grouped_mm``
  (``integrations/moe.py`` ``grouped_mm_experts_forward``; ``PreTrainedModel.get_correct_experts_implementation``):
  the T·k (token, expert) slots sorted by expert, the tokens gathered in that order, ``torch._grouped_mm`` over
  all slots for gate_up, the gate (``chunk``, SiLU, product), ``_grouped_mm`` for down, the routing weights, the
  slots put back in token order by an inverse permutation and summed per token.  Every shape is the slot
  count T·k whatever the routing, so the step's memory does not depend on which experts the tokens pick.

``_grouped_mm`` (torch 2.13, ``derivatives.yaml``): saves both operands and the offsets; backward makes the
second operand's gradient first (laid out as the expert weight is, so ``AccumulateGrad`` steals it), then the
first's.  Its meta kernel accepts bf16 only (``_meta_registrations.py`` ``_meta_grouped_mm_common``, which copies
CUDA's fast-path checks), so an fp32 model is measured on cpu tensors.  On a GPU the same program runs with the
CUDA target's facts, not validated: CUDA's bf16 fast path (CUTLASS, sm90/sm100) and its fallback for other dtypes
(``GroupedBlas.cpp``: ``offs.cpu()``, then ``mm_out`` per group) were not run here.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import index, split_with_sizes, topk
from ..aten_pointwise import divide_backward
from ..engine import Affine
from ..tensors import ITEMSIZE, Storage, Tensor, current, empty, no_grad, parameter, record, record_first
from .llama import MLP, DecoderLayer, LlamaForCausalLM, RMSNorm, int_scalar_op

B = Affine(1)


def sort(t: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.sort(t)`` of an integer tensor: (values, int64 indices), no gradient."""
    return empty(t.shape, t.dtype, "sort"), empty(t.shape, "int64", "sort")


def div_(values: Tensor, other: Tensor) -> Tensor:
    """``values /= other`` (``div_.Tensor``): autograd clones ``values`` first (``other``'s gradient reads the
    original self: the codegen's ``original_self``), then the quotient overwrites it; the result shares its
    storage and has ``DivBackward0`` (``aten_pointwise.divide``'s formulas)."""
    original = empty(values.shape, values.dtype, "clone") if other.requires_grad else None
    out = values.detach()
    record("DivBackward0", (values, other), (out,), divide_backward, (original, other))
    return out


def per_expert(slots: Affine | int, experts: int) -> Affine | int | float:
    """S/E, an expert's rows with the routing balanced, for the step-time model's price of ``grouped_mm``: exact
    where E divides the slot count, else the mean (a fraction: Qwen1.5-MoE's 60 experts).  No byte depends on it."""
    if isinstance(slots, Affine):
        exact = slots.a % experts == 0 and slots.b % experts == 0
        return slots // experts if exact else Affine(slots.a / experts, slots.b / experts)
    return slots // experts if slots % experts == 0 else slots / experts


def grouped_mm(a: Tensor, b: Tensor, offs: Tensor) -> Tensor:
    """``torch._grouped_mm(a, b, offs)``: a (S, k) by b (E, k, n), group g taking rows offs[g-1]:offs[g]; out
    (S, n).  Saves a, b and offs; backward: b's gradient (laid out as b), then a's.  Its work, for the step-time
    model: E products of (S/E, k) by (k, n), the routing balanced (``grouped_nt``; the backward's two gradients
    ``grouped_bwd``), priced at the rates ``torch._grouped_mm`` reached (calibration grouped.csv)."""
    experts, (slots, k), n = b.shape[0], a.shape, b.shape[2]
    rows = per_expert(slots, experts)
    current().note("gemm", a.dtype, "grouped_nt", experts, rows, n, k)

    def back(ctx, g, sa, sb, so):
        current().note("gemm", sa.dtype, "grouped_bwd", experts, rows, n, k)
        gb = ga = None
        if ctx.need[1]:
            gb = empty(sb.shape, g[0].dtype, "grouped_mm")
            gb.perm = sb.perm
        if ctx.need[0]:
            ga = empty(sa.shape, g[0].dtype, "grouped_mm")
        return ga, gb

    make = lambda: (empty((a.shape[0], b.shape[2]), a.dtype, "grouped_mm"),)
    return record_first("GroupedMmBackward0", (a, b), make, back, (a, b, offs))[0]


def add_(t: Tensor, other: Tensor) -> Tensor:
    """``t.add_(other)`` of one shape: nothing saved (``AddBackward0``); the sum overwrites t (its storage).  On a
    plain CPU run with a wider ``other`` (Llama 4's fp32 sum under autocast), TensorIterator computes in the common
    dtype: an output of that dtype and a copy of ``t`` (``compute_types``), freed when it returns."""
    common = A.promote(t, other)
    scratch = (
        Storage(t.numel * ITEMSIZE[common], "mixed_dtype_output") if common != t.dtype and current().wraps else None
    )
    copies = A.mixed_copies(common, t, other)
    del scratch, copies
    out = t.detach()
    record("AddBackward0", (t, other), (out,), lambda ctx, g: (g[0], g[0]))
    return out


def grouped_linear(
    input: Tensor, weight: Tensor, offs: Tensor, bias: Tensor | None = None, is_transposed: bool = False
) -> Tensor:
    """``integrations/moe.py`` ``_grouped_linear`` and ``_grouped_mm``: ``grouped_mm(input.to(weight.dtype),
    weight (or its transpose), offs)`` (not an autocast op), then ``out.add_(bias)``."""
    out = grouped_mm(A.to(input, weight.dtype), weight if is_transposed else A.transpose(weight, -2, -1), offs)
    return out if bias is None else add_(out, bias)


class TopKRouter:
    """``MixtralTopKRouter`` / ``Qwen3MoeTopKRouter`` (``forward``): the weight (E, d)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, mixtral: bool):
        self.weight = parameter((cfg.num_experts, cfg.d_model), dtype, name + ".weight")
        self.top_k, self.mixtral, self.norm_topk_prob = cfg.experts_per_token, mixtral, cfg.norm_topk_prob

    def __call__(self, hidden_states: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        hidden_states = A.reshape(hidden_states, -1, hidden_states.shape[-1])
        router_logits = A.linear(hidden_states, self.weight)  # (T, E)
        if self.mixtral:  # softmax(router_logits.float(), dim=-1)
            router_probs = A.softmax(A.to(router_logits, "fp32"), -1)
        else:  # softmax(router_logits, dtype=torch.float, dim=-1)
            router_probs = A.softmax(router_logits, -1, "fp32")
        router_top_value, router_indices = topk(router_probs, self.top_k)  # (T, k)
        if self.mixtral or self.norm_topk_prob:
            router_top_value = div_(router_top_value, A.sum_(router_top_value, -1, keepdim=True))
        if not self.mixtral:
            router_top_value = A.to(router_top_value, router_logits.dtype)
        router_scores = router_top_value
        return router_logits, router_scores, router_indices


class Experts:
    """``MixtralExperts`` / ``Qwen3MoeExperts`` under ``grouped_mm_experts_forward`` (integrations/moe.py),
    line by line, the locals named as there (they die at the return in that order): gate_up_proj (E, 2f, d),
    down_proj (E, d, f).  ``is_transposed`` and ``selected_bias`` are the decorator's ``is_transposed`` and
    ``has_bias`` (a model's own: gpt-oss's)."""

    is_transposed = False

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        e, d, f = cfg.num_experts, cfg.d_model, cfg.expert_width
        self.gate_up_proj = parameter((e, 2 * f, d), dtype, name + ".gate_up_proj")
        self.down_proj = parameter((e, d, f), dtype, name + ".down_proj")
        self.num_experts, self.intermediate_dim = e, f

    def params(self) -> list[Tensor]:
        return [self.gate_up_proj, self.down_proj]

    def selected_bias(self, which: str, expert_ids_g: Tensor) -> Tensor | None:
        """``self.{which}_bias[expert_ids_g]`` with ``has_bias``: the (S, out) bias rows in slot order."""
        return None

    def apply_gate(self, gate_up_out: Tensor) -> Tensor:
        """``_default_apply_gate``: ``gate, up = gate_up_out.chunk(2, dim=-1)``; ``act_fn(gate) * up``."""
        gate, up = split_with_sizes(gate_up_out, [self.intermediate_dim] * 2, -1)
        return A.mul(A.silu(gate), up)

    def __call__(self, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Tensor:
        num_top_k = top_k_index.shape[-1]
        num_tokens = hidden_states.shape[0]
        hidden_dim = hidden_states.shape[-1]
        sample_weights = A.reshape(top_k_weights, -1)  # (S,), S = T·k
        expert_ids = A.reshape(top_k_index, -1)  # (S,)
        expert_ids_g, perm = sort(expert_ids)
        selected_hidden_states_g = index(hidden_states, int_scalar_op(perm.shape, "floor_divide"))  # (S, d)
        sample_weights_g = index(sample_weights, perm)  # (S,)
        histc_input = A.to(expert_ids_g, "fp32")  # noqa: F841 (on cpu histc takes floats; a local until the return)
        tokens_per_expert = empty((self.num_experts,), "fp32", "histc")  # noqa: F841 (a local until the return)
        offsets = empty((self.num_experts,), "int32", "cumsum")
        selected_biases = self.selected_bias("gate_up_proj", expert_ids_g)
        proj_out = grouped_linear(
            selected_hidden_states_g, self.gate_up_proj, offsets, selected_biases, self.is_transposed
        )  # (S, 2f)
        proj_out = self.apply_gate(proj_out)  # (S, f)
        selected_biases = self.selected_bias("down_proj", expert_ids_g)
        proj_out = grouped_linear(proj_out, self.down_proj, offsets, selected_biases, self.is_transposed)  # (S, d)
        weighted_out = A.mul(proj_out, A.unsqueeze(sample_weights_g, -1))  # (S, d)
        with no_grad():  # inv_perm = torch.empty_like(perm); inv_perm[perm] = torch.arange(S): in place
            inv_perm = empty(perm.shape, "int64", "empty_like")
            empty(perm.shape, "int64", "arange")
        weighted_out = index(weighted_out, inv_perm)  # (S, d)
        final_hidden_states = A.sum_(A.view(weighted_out, num_tokens, num_top_k, hidden_dim), 1)  # (T, d)
        return A.to(final_hidden_states, hidden_states.dtype)


class SparseMoeBlock:
    """``MixtralSparseMoeBlock`` (router ``gate`` registered first) / ``Qwen3MoeSparseMoeBlock`` (experts first)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.mixtral = cfg.hf_model_type == "mixtral"
        self.gate = TopKRouter(cfg, dtype, name + ".gate", self.mixtral)
        self.experts = Experts(cfg, dtype, name + ".experts")

    def params(self) -> list[Tensor]:
        if self.mixtral:
            return [self.gate.weight] + self.experts.params()
        return self.experts.params() + [self.gate.weight]

    def __call__(self, hidden_states: Tensor) -> Tensor:
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = A.view(hidden_states, -1, hidden_dim)
        _, top_k_weights, top_k_index = self.gate(hidden_states)
        hidden_states = self.experts(hidden_states, top_k_index, top_k_weights)
        return A.reshape(hidden_states, batch_size, sequence_length, hidden_dim)


class MoeDecoderLayer(DecoderLayer):
    """``MixtralDecoderLayer`` / ``Qwen3MoeDecoderLayer``: Llama's layer, the sparse block where the layer has one
    (``sparse_class``: a model's own, Qwen2-MoE's with its shared expert)."""

    sparse_class = SparseMoeBlock

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, norm: type[RMSNorm], sparse: bool):
        self.mlp_class = self.sparse_class if sparse else MLP
        super().__init__(cfg, dtype, attn, name, norm)


class MoeForCausalLM(LlamaForCausalLM):
    """``MixtralForCausalLM`` / ``Qwen3MoeForCausalLM`` without ``output_router_logits`` (no auxiliary loss);
    ``layer_class`` is a model's own."""

    layer_class = MoeDecoderLayer

    def decoder_layer(self, name: str, norm: type[RMSNorm]) -> MoeDecoderLayer:
        i = int(name.rsplit(".", 1)[1])
        return self.layer_class(self.cfg, self.dtype, self.setup.attention, name, norm, self.cfg.layer_moe(i))


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> MoeForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return MoeForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    return out
