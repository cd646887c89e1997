"""Building blocks of the CS336 assignment-1 Transformer LM, written from scratch.

Every matrix product goes through ``torch.matmul`` (never ``nn.Linear``, ``F.linear`` or
``einsum``), so FLOP counters see plain ``mm``/``bmm`` calls that can be matched one for one
with the analytic counts.  The one exception is opt-in: ``FusedAttention`` (the ``sdpa``
training setup) calls torch's fused attention kernel, whose FLOP formulas
``lm_accounting.measure.attention_flops`` registers.  Section numbers refer to the
CS336 (Spring 2025) assignment-1 handout, "Transformer LM Architecture" (section 3).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

Tensor = torch.Tensor


class Bias(nn.Module):
    """A projection's bias, ``y + b`` (one per output feature; initialised to zeros, as GPT-2 does).

    A child module of its ``Linear`` (path ``<projection>.bias``, parameter ``<projection>.bias.bias``)
    so that the registry can account for it as its own component: the add is elementwise work,
    never a matmul FLOP (fvcore and FlopCounterMode count a plain ``add`` as 0)."""

    def __init__(self, features: int, device=None, dtype=None):
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(features, device=device, dtype=dtype))

    def forward(self, y: Tensor) -> Tensor:
        return y + self.bias


class Sinks(nn.Module):
    """gpt-oss's attention sinks: one learned logit per query head (``weight`` (h,), zeros here), which joins
    every row of the attention softmax as one more column and is dropped after it
    (transformers' ``GptOssAttention.sinks`` and ``eager_attention_forward``).  No matmul."""

    def __init__(self, heads: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(heads, device=device, dtype=dtype))

    def forward(self, scores: Tensor) -> Tensor:
        """Scores (..., h, S_q, S_k) -> probabilities (..., h, S_q, S_k) of a softmax over S_k + 1 columns."""
        h, s_q = int(scores.shape[-3]), int(scores.shape[-2])
        column = self.weight.to(scores.dtype).view(h, 1, 1).expand(*scores.shape[:-3], h, s_q, 1)
        return softmax(torch.cat([scores, column], -1), -1)[..., :-1]  # (..., h, S_q, S_k + 1), the sink dropped


class Linear(nn.Module):
    """``y = x Wᵀ`` (+ ``b`` with ``bias=True``); ``W`` is stored as (out, in) (handout 3.4.2).

    Init (handout 3.4.1): truncated normal, mean 0, σ² = 2 / (d_in + d_out), clipped at ±3σ.
    Without a bias (the course) the forward is the one ``matmul``.
    """

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None, bias: bool = False):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        # 1. σ² = 2 / (d_in + d_out) (handout 3.4.1, Glorot-style fan average); 2. clip at ±3σ.
        std = math.sqrt(2.0 / (in_features + out_features))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        self.bias = Bias(out_features, device=device, dtype=dtype) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        y = torch.matmul(x, self.weight.t())  # (..., in) @ (in, out) -> (..., out)
        return y if self.bias is None else self.bias(y)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


class Embedding(nn.Module):
    """A (vocab, d_model) lookup table (handout 3.4.3); init truncated normal (0, 1) at ±3."""

    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x²) + eps) * g`` (Zhang & Sennrich 2019; handout 3.5.1).

    Computed in float32 and cast back to the input dtype, as the handout asks; the gain
    ``g`` is initialised to ones.
    """

    def __init__(self, d: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = x.to(torch.float32)
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # mean over d: (..., d) -> (..., 1)
        if self.weight is None:  # no gain (``make_norm(weights=False)``)
            return y.to(in_dtype)
        return (y * self.weight.to(torch.float32)).to(in_dtype)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


class LayerNorm(nn.Module):
    """``(x - mean) / sqrt(var + eps) * g + b`` over the last dim (Ba et al. 2016; GPT-2's ln_1/ln_2/ln_f).

    Computed in float32 and cast back, as our RMSNorm; gain ones, bias zeros.  Written out op by op
    (mean, centre, variance, rsqrt) rather than ``F.layer_norm``: fvcore's ``aten::layer_norm`` handle
    counts 5 MACs per element, which would put non-matmul FLOPs into the matmul cross-check."""

    def __init__(self, d: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.d, self.eps = d, eps
        self.weight = nn.Parameter(torch.ones(d, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(d, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = x.to(torch.float32)
        centred = x32 - x32.mean(-1, keepdim=True)  # (..., d) - (..., 1)
        y = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + self.eps)  # biased variance, as torch
        if self.weight is None:  # no gain and no bias (OLMo's ``OlmoLayerNorm``, ``make_norm(weights=False)``)
            return y.to(in_dtype)
        if self.bias is None:  # a gain and no bias (Cohere's ``CohereLayerNorm``, ``make_norm(bias=False)``)
            return (y * self.weight.to(torch.float32)).to(in_dtype)
        return (y * self.weight.to(torch.float32) + self.bias.to(torch.float32)).to(in_dtype)

    def extra_repr(self) -> str:
        return f"{self.d}, eps={self.eps}"


def alibi_slopes(heads: int) -> Tensor:
    """ALiBi's per-head slopes m_i (Press et al. 2022), as transformers' BLOOM computes them
    (``_get_alibi_slopes``): 2^(-8·i/n) for i = 1..n with n the largest power of 2 <= h, then the odd powers of
    the 2n sequence for the remaining heads.  fp32, (h,)."""
    closest = 2 ** math.floor(math.log2(heads))
    base = 2 ** (-(2 ** -(math.log2(closest) - 3)))
    slopes = [base**p for p in range(1, 1 + closest)]
    if closest != heads:
        extra = 2 ** (-(2 ** -(math.log2(2 * closest) - 3)))
        slopes += [extra**p for p in range(1, 1 + 2 * min(closest, heads - closest), 2)]
    return torch.tensor(slopes, dtype=torch.float32)


def make_norm(
    kind: str, d: int, eps: float, device=None, dtype=None, weights: bool = True, bias: bool = True
) -> nn.Module:
    """``kind`` = ``ModelConfig.norm``: ``"rmsnorm"`` or ``"layernorm"``; ``weights`` False: no gain and no
    bias (``ModelConfig.norm_weights``, OLMo's ``OlmoLayerNorm``); ``bias`` False: a LayerNorm's gain only
    (``ModelConfig.norm_bias``, Cohere's ``CohereLayerNorm``)."""
    norm = (LayerNorm if kind == "layernorm" else RMSNorm)(d, eps=eps, device=device, dtype=dtype)
    if kind == "layernorm" and not bias:
        norm.bias = None
    if not weights:
        norm.weight = None
        if kind == "layernorm":
            norm.bias = None
    return norm


def gelu_tanh(x: Tensor) -> Tensor:
    """GELU, tanh approximation (Hendrycks & Gimpel 2016): GPT-2's ``gelu_new``, Gemma's ``gelu_pytorch_tanh``."""
    return F.gelu(x, approximate="tanh")


def silu(x: Tensor) -> Tensor:
    """SiLU / swish, ``x · σ(x)`` (handout 3.5.2)."""
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    """``W2(SiLU(W1 x) ⊙ W3 x)`` (Shazeer 2020, "GLU Variants Improve Transformer"; handout 3.5.2)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None, bias: bool = False):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype, bias=bias)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype, bias=bias)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class GeGLU(SwiGLU):
    """``W2(GELU(W1 x) ⊙ W3 x)`` (Shazeer 2020), GELU in its tanh form: Gemma's MLP
    (gate_proj = W1, up_proj = W3, down_proj = W2)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(gelu_tanh(self.w1(x)) * self.w3(x))


class GeluMLP(nn.Module):
    """``proj(GELU(fc x))``, the 2-matrix MLP of GPT-2 (``c_fc``, ``c_proj``; Radford et al. 2019)."""

    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None, bias: bool = False):
        super().__init__()
        self.fc = Linear(d_model, d_ff, device=device, dtype=dtype, bias=bias)
        self.proj = Linear(d_ff, d_model, device=device, dtype=dtype, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(gelu_tanh(self.fc(x)))


class ReluMLP(GeluMLP):
    """``proj(ReLU(fc x))``: OPT's ``fc1``/``fc2`` (transformers' models/opt/modeling_opt.py, ``OPTDecoderLayer``)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.relu(self.fc(x)))


class Relu2MLP(GeluMLP):
    """``proj(ReLU(fc x)²)``: Nemotron's ``up_proj``/``down_proj`` with ``relu2`` (transformers' activations.py,
    ``ReLUSquaredActivation``: ``torch.square(relu(x))``, which ATen runs as ``pow(x, 2)``; written as the pow so
    that the autocast emulation upcasts it as CUDA's autocast does, ``pow`` being an fp32 op)."""

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(torch.pow(F.relu(self.fc(x)), 2))


class RotaryPositionalEmbedding(nn.Module):
    """RoPE (Su et al. 2021, "RoFormer"; handout 3.5.3), no learned parameters.

    Pair k (0-based) of the vector at position i is rotated by θ_{i,k} = i / Θ^{2k/d_k}
    (the handout's (2k-2)/d with 1-based k).  Pairs are *adjacent* elements
    (x[2k], x[2k+1]).  cos/sin tables of shape (max_seq_len, d_k/2) are fp32,
    non-persistent buffers, meant to be shared by all layers.
    """

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None):
        super().__init__()
        if d_k % 2:
            raise ValueError(f"RoPE needs an even d_k, got {d_k}")
        self.theta, self.d_k, self.max_seq_len = theta, d_k, max_seq_len
        if torch.device(device or "cpu").type == "meta":  # values do not exist on meta: no CPU work
            cos, sin = (torch.empty(max_seq_len, d_k // 2, device="meta") for _ in "cs")
        else:  # computed on the CPU and moved: the same values on every device
            k = torch.arange(0, d_k, 2, dtype=torch.float32)
            inv_freq = 1.0 / (theta ** (k / d_k))  # Θ^(-2k/d) for pair k = 0 .. d/2-1: (d_k/2,)
            angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (max_seq_len, d_k/2)
            cos, sin = angles.cos().to(device), angles.sin().to(device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: Tensor, token_positions: Tensor) -> Tensor:
        """x: (..., seq, d_k); token_positions: integer, broadcastable to (..., seq)."""
        cos = self.cos[token_positions].to(x.dtype)  # (*positions.shape, d_k/2)
        sin = self.sin[token_positions].to(x.dtype)  # (*positions.shape, d_k/2)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]  # (..., seq, d_k) -> two strided (..., seq, d_k/2) views
        out_even = x_even * cos - x_odd * sin
        out_odd = x_even * sin + x_odd * cos
        # (..., seq, d_k/2) x 2 -> (..., seq, d_k/2, 2) -> (..., seq, d_k): pairs interleaved back
        return torch.stack((out_even, out_odd), dim=-1).flatten(-2)

    def extra_repr(self) -> str:
        return f"theta={self.theta}, d_k={self.d_k}, max_seq_len={self.max_seq_len}"


def softmax(x: Tensor, dim: int) -> Tensor:
    """Numerically stable softmax (handout 3.5.4): subtract the max along ``dim`` first.

    The max is taken on ``x.detach()``: softmax is shift-invariant, so the result and its
    gradient are exact, and autograd need not keep ``x`` alive for amax's backward.
    """
    z = x - x.detach().amax(dim, keepdim=True)
    e = z.exp()
    return e / e.sum(dim, keepdim=True)


class MatMul(nn.Module):
    """Parameter-free ``a @ b``; a module only so FLOP counters attribute QKᵀ and AV to a path."""

    def forward(self, a: Tensor, b: Tensor) -> Tensor:
        return torch.matmul(a, b)


def scaled_dot_product_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    mask: Tensor | None = None,
    *,
    qk: Callable[[Tensor, Tensor], Tensor] = torch.matmul,
    av: Callable[[Tensor, Tensor], Tensor] = torch.matmul,
    sinks: Callable[[Tensor], Tensor] | None = None,
    bias: Tensor | None = None,
) -> Tensor:
    """``softmax(Q Kᵀ / √d_k) V`` (Vaswani et al. 2017; handout 3.5.4), with GQA.

        query (..., h, S_q, d_k); key, value (..., kv, S_k, d_k / d_v) with h % kv == 0
        (grouped-query attention, Ainslie et al. 2023: query heads j·g .. j·g+g-1 share KV
        head j, g = h / kv).  ``mask`` is boolean, True = attend, broadcastable to
        (..., h, S_q, S_k).  ``sinks`` (gpt-oss, a ``Sinks``) replaces the softmax; ``bias`` (ALiBi, broadcastable
    to the scores) is added to the scaled scores before the mask.  Returns (..., h, S_q, d_v).

        The g query heads of a group are stacked along the row axis, (..., kv, g·S_q, d_k),
        so each product is one plain batched matmul against the kv K/V heads.  Broadcasting
        K/V over a size-g axis instead would make ``torch.matmul`` materialise K and V
        expanded to h heads (a hidden ``repeat_interleave``) and save those copies for backward.
    """
    *lead, h, s_q, d_k = query.shape
    kv, s_k = key.shape[-3], key.shape[-2]
    if h % kv:
        raise ValueError(f"{h} query heads cannot be grouped over {kv} key/value heads")
    q = query.reshape(*lead, kv, (h // kv) * s_q, d_k)  # (..., h, S_q, d_k) -> (..., kv, g·S_q, d_k)
    # (..., kv, g·S_q, d_k) @ (..., kv, d_k, S_k) -> (..., kv, g·S_q, S_k); 1/√d_k keeps the logits' variance ~1
    scores = qk(q, key.transpose(-2, -1)) * (1.0 / math.sqrt(d_k))
    scores = scores.reshape(*scores.shape[:-3], h, s_q, s_k)  # -> (..., h, S_q, S_k), a view
    if bias is not None:  # ALiBi: (h, 1, S_k), one add per score
        scores = scores + bias
    if mask is not None:
        scores = torch.where(mask, scores, float("-inf"))
    probs = softmax(scores, -1) if sinks is None else sinks(scores)
    # (..., h, S_q, S_k) -> (..., kv, g·S_q, S_k); @ (..., kv, S_k, d_v) -> (..., kv, g·S_q, d_v)
    out = av(probs.reshape(*probs.shape[:-3], kv, (h // kv) * s_q, s_k), value)
    return out.reshape(*out.shape[:-3], h, s_q, out.shape[-1])  # -> (..., h, S_q, d_v), a view


class FusedAttention(nn.Module):
    """Causal ``softmax(QKᵀ/√d_k) V`` in one fused kernel; a module so that FLOP counters attribute
    its QKᵀ and AV to one path (``layers.*.attn.sdpa``).

    q (B, h, S, d); k, v (B, kv, S, d) with h % kv == 0, passed with their kv heads: both kernels
    broadcast them over the h/kv query heads of a group, so no K/V copy expanded to h heads is made
    or saved.  Returns (B, h, S, d).

    * meta and cpu: ``aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal=True)``
      (torch/_C/_VariableFunctions, aten/src/ATen/native/transformers/attention.cpp), called
      explicitly because ``F.scaled_dot_product_attention`` may take the math path there, which
      materialises S×S.  It returns the output (B, h, S, d) contiguous in the input dtype and the
      logsumexp (B, h, S) in fp32 (stored as (B, S, h)); autograd saves q, k, v, output and
      logsumexp for ``_scaled_dot_product_flash_attention_for_cpu_backward``.
    * cuda: ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=kv < h)`` limited to
      the flash and memory-efficient backends (flash needs fp16/bf16; fp32 takes memory-efficient,
      which takes no GQA: fp32 with kv < h is refused, measured on an H100 with torch 2.11).
    """

    def forward(self, q: Tensor, k: Tensor, v: Tensor, causal: bool = True) -> Tensor:
        """``causal`` False: every query sees every key (an inference decode step: one new token per
        sequence against the cached keys, ``model.kv_cache``)."""
        if q.device.type == "cuda":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            from ..setup import check_cuda_fused_attention

            gqa = int(k.shape[-3]) != int(q.shape[-3])  # ints: jit tracing (fvcore) makes shape comparisons tensors
            # under autocast the kernel gets bf16 copies even of fp32 q, k, v (Qwen2's biases add in fp32)
            check_cuda_fused_attention(gqa, q.dtype == torch.float32 and not torch.is_autocast_enabled("cuda"))
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa)
        out, _logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
        return out


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean of ``-log softmax(logits)[target]`` over all positions (handout 4.1).

    Stable form: with z = logits - max, loss = log Σ exp(z) - z[target].
    """
    z = logits - logits.detach().amax(-1, keepdim=True)
    log_sum_exp = z.exp().sum(-1).log()
    picked = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1)  # (..., V) at (..., 1) -> (...)
    return (log_sum_exp - picked).mean()
