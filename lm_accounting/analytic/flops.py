"""Forward, backward and training FLOPs, one function per component.

Convention (CS336 assignment 1, problem transformer_accounting): multiplying an
(m x n) matrix by an (n x p) matrix costs 2·m·n·p FLOPs, and only matrix
multiplies are counted.  Attention counts the full S x S square, as the course,
fvcore, FlopCounterMode and DeepSpeed all do; the causal-halved figure is a
separate, labelled extra.  Llama 4 is counted as transformers' code runs it and FlopCounterMode
counts it: every routed expert on every token (``expert_rows``: T·E rows) and the full square on its
chunked layers; the routed top-k (what its router selects) and the chunked pairs are labelled extras
(``routed_top_k_forward_flops``, ``chunked_attention_flops``).  Elementwise work (norms, softmax, SiLU, RoPE, residual
adds) is estimated by ``nonmatmul_flops`` under its own stated convention and is
never added to the matmul total.

All functions take the batch size B and the sequence length S explicitly; the
number of tokens is T = B·S.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache

from ..breakdown import Breakdown
from ..config import ModelConfig
from .params import (
    active_parameter_count,
    indexer_k_params,
    indexer_q_params,
    indexer_weights_params,
    matmul_params,
)
from .sizes import Sizes, check_batch_seq  # noqa: F401  (check_batch_seq re-exported)


def matmul_flops(m: int, n: int, p: int) -> int:
    """(m x n) @ (n x p): 2·m·n·p (one multiply and one add per term)."""
    return 2 * m * n * p


def q_proj_flops(cfg: ModelConfig, tokens: int) -> int:
    """x (T x d) @ W_Qᵀ (d x h·d_head)."""
    return matmul_flops(tokens, cfg.d_model, cfg.q_dim)


def kv_proj_flops(cfg: ModelConfig, tokens: int) -> int:
    """x (T x d) @ W_Kᵀ or W_Vᵀ (d x kv·d_head); with plain MHA this is 2·T·d²."""
    return matmul_flops(tokens, cfg.d_model, cfg.kv_dim)


def output_proj_flops(cfg: ModelConfig, tokens: int) -> int:
    """Concatenated heads (T x h·v_head) @ W_Oᵀ (h·v_head x d)."""
    return matmul_flops(tokens, cfg.o_dim, cfg.d_model)


def projection_flops(tokens: int, params: int) -> int:
    """Any bias-free linear map applied to every token: 2·T·(in·out) = 2·T·params (MLA's
    low-rank projections, the router, the shared experts)."""
    return 2 * tokens * params


def routed_expert_flops(cfg: ModelConfig, tokens: int) -> int:
    """One matrix (W1, W2 or W3) of the routed experts: each token goes to k experts,
    (T·k x d) @ (d x d_e) in all; the E − k others do nothing for it (``expert_rows``: T·E under
    ``all_experts_run``)."""
    return matmul_flops(expert_rows(cfg, tokens), cfg.d_model, cfg.expert_width)


def expert_rows(cfg: ModelConfig, tokens: int) -> int:
    """Token rows the routed experts multiply: T·k, each token's top k; with ``all_experts_run`` (Llama 4) T·E,
    as transformers runs them: ``Llama4TextMoe.forward`` repeats the T tokens E times and ``Llama4TextExperts``
    multiplies them by all E experts in one ``torch.bmm`` (E x T x d)(E x d x 2·d_e), then (E x T x d_e)(E x d_e x
    d), the unchosen rows weighted by σ(−∞) = 0 (models/llama4/modeling_llama4.py)."""
    return tokens * (cfg.num_experts if cfg.all_experts_run else cfg.experts_per_token)


def routed_top_k_forward_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """Forward matmul FLOPs if the routed experts ran only each token's top k (T·k rows): what a mixture of
    experts means, and what Llama 4's routing (top-1 of E) selects.  Under ``all_experts_run`` the totals count
    transformers' T·E rows (``expert_rows``), and this is the labelled extra beside them, the total less
    L_moe · 3 · 2·T·(E − k)·d·d_e; without it, the total itself."""
    if not cfg.all_experts_run:
        return forward_flops(cfg, seq, batch).total
    return forward_flops(dataclasses.replace(cfg, all_experts_run=False), seq, batch).total


def chunked_pairs(seq: int, chunk: int) -> int:
    """Query-key pairs of one causal sequence of S tokens in which query i sees the keys j <= i of its own chunk
    (transformers' ``chunked_causal_mask_function``: j // C == i // C, no left padding): n = ⌊S/C⌋ whole chunks
    of C(C+1)/2 pairs and a last one of r = S − n·C, r(r+1)/2."""
    n, r = divmod(seq, chunk)
    return n * chunk * (chunk + 1) // 2 + r * (r + 1) // 2


def chunked_attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """QKᵀ + AV over all layers if each chunked layer (Llama 4's RoPE layers, ``ModelConfig.layer_chunked``)
    computed only its chunked causal pairs (``chunked_pairs``), 2·B·h·pairs·(d_head + v_head) per layer; the
    other (NoPE) layers keep the full S x S square.  A labelled extra: transformers' eager attention computes the
    full square on every layer and masks the rest, as the totals and FlopCounterMode count."""
    full = attention_scores_flops(cfg, batch, seq) + attention_values_flops(cfg, batch, seq)
    if cfg.attention_chunk is None:
        return cfg.attention_layers * full
    pairs = chunked_pairs(seq, cfg.attention_chunk)
    band = batch * cfg.num_heads * matmul_flops(1, cfg.d_head + cfg.v_head, 1) * pairs
    chunked = cfg.chunked_layers
    return (cfg.attention_layers - chunked) * full + chunked * band


def attention_scores_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """QKᵀ: per sequence and query head, (S x d_head) @ (d_head x S); 2·S²·d for plain MHA.

    With GQA every query head still scores against a full key matrix, so the
    count uses num_heads, not kv_heads.
    """
    return batch * cfg.num_heads * matmul_flops(seq, cfg.d_head, seq)


def attention_values_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """AV: per sequence and query head, probabilities (S x S) @ V (S x v_head; v_head = d_head but
    under latent attention)."""
    return batch * cfg.num_heads * matmul_flops(seq, seq, cfg.v_head)


def ffn_matrix_flops(cfg: ModelConfig, tokens: int) -> int:
    """One FFN matrix: (T x d) @ (d x d_ff) for W1, W3 and GELU's fc; (T x d_ff) @ (d_ff x d) for W2 and proj."""
    return matmul_flops(tokens, cfg.d_model, cfg.d_ff)


def lm_head_flops(cfg: ModelConfig, tokens: int) -> int:
    """Final hidden states (T x d) @ (d x V)."""
    return matmul_flops(tokens, cfg.d_model, cfg.vocab_size)


# -- Gated DeltaNet linear attention (transformers' Qwen3NextGatedDeltaNet on its torch path) --------------------
DELTA_CHUNK = 64
"""``torch_chunk_gated_delta_rule``'s ``chunk_size`` (models/qwen3_next/modeling_qwen3_next.py): the sequence is
padded with zeros to a multiple of it, ``pad_size = (64 - S % 64) % 64``, and every matmul runs on whole chunks."""


def delta_chunks(seq: int) -> int:
    """Chunks of the padded sequence: ⌈S / 64⌉."""
    return -(-seq // DELTA_CHUNK)


def gated_delta_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The chunked gated delta rule (``torch_chunk_gated_delta_rule``, what transformers runs without the fla
    kernels), per value head (the query/key heads are repeated to ``linear_value_heads``), C = 64, N = ⌈S/C⌉
    chunks, d_k and d_v the head sizes: before the scan ``k_beta @ keyᵀ`` and ``query @ keyᵀ``, each
    (C x d_k)(d_k x C) per chunk; in the scan over chunks ``k_cumdecay @ state`` and ``query @ state``
    ((C x d_k)(d_k x d_v) each), ``intra_chunk_attn @ v_new`` ((C x C)(C x d_v)) and ``keyᵀ @ v_new``
    ((d_k x C)(C x d_v)).  In all 2·B·H_v·N·C·(2·C·d_k + 3·d_k·d_v + C·d_v), the padded rows included
    (FlopCounterMode counts them: tests/test_arch_qwen3_next.py).  The two unit-triangular solves
    (``torch.linalg.solve_triangular``) have no FlopCounterMode formula and are not matmul FLOPs here either:
    they are an elementwise estimate (``delta_solve_flops``)."""
    c, dk, dv = DELTA_CHUNK, cfg.linear_key_head_dim, cfg.linear_value_head_dim
    return 2 * batch * cfg.linear_value_heads * delta_chunks(seq) * c * (2 * c * dk + 3 * dk * dv + c * dv)


def delta_solve_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The chunked rule's two unit-lower-triangular solves per chunk and value head (``solve_triangular`` of the
    C x C system against ``v_beta``, d_v columns, and ``decayed_k_beta``, d_k columns): C(C−1)/2 multiply-adds
    per column, C(C−1)·(d_k + d_v) FLOPs; an estimate (no counter has a formula for them)."""
    c = DELTA_CHUNK
    return (
        batch
        * cfg.linear_value_heads
        * delta_chunks(seq)
        * c
        * (c - 1)
        * (cfg.linear_key_head_dim + cfg.linear_value_head_dim)
    )


def causal_conv_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The depthwise causal conv1d over q, k and v (``causal_conv1d_fn``'s torch path: ``F.conv1d`` with
    ``padding = K - 1`` on both sides, the output then cut to S): S + K − 1 outputs per channel of K taps each,
    2·B·conv_dim·(S + K − 1)·K (torch's convolution FLOP formula, 2 · out elements · taps per output)."""
    k = cfg.linear_conv_kernel
    return 2 * batch * cfg.linear_conv_dim * (seq + k - 1) * k


def conv_update_flops(cfg: ModelConfig, batch: int) -> int:
    """One cached decode step of the conv (``causal_conv1d_update``: the K cached inputs and the new one,
    ``F.conv1d`` without padding, 2 outputs per channel, the last kept): 2·B·conv_dim·2·K."""
    return 2 * batch * cfg.linear_conv_dim * 2 * cfg.linear_conv_kernel


# -- Mamba2 mixers (transformers' NemotronHMamba2Mixer; config.MAMBA_FIELDS) --
def mamba_chunks(cfg: ModelConfig, seq: int) -> int:
    """Chunks of the SSD scan's padded sequence: ⌈S / chunk_size⌉ (``mamba2_chunk_scan`` pads S up to a multiple)."""
    return -(-seq // cfg.mamba_chunk_size)


def mamba_conv_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The Mamba2 depthwise causal conv1d over x, B and C (``causal_conv1d_fn``'s torch path, as
    ``causal_conv_flops``): 2·B·conv_dim·(S + K − 1)·K; its bias add is elementwise."""
    k = cfg.mamba_conv_kernel
    return 2 * batch * cfg.mamba_conv_dim * (seq + k - 1) * k


def mamba_conv_update_flops(cfg: ModelConfig, batch: int) -> int:
    """One cached decode step of the Mamba2 conv (``causal_conv1d_update``, as ``conv_update_flops``):
    2·B·conv_dim·2·K."""
    return 2 * batch * cfg.mamba_conv_dim * 2 * cfg.mamba_conv_kernel


def ssd_scan_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The chunked SSD scan (Dao & Gu 2024, §6; ``mamba2_chunk_scan``, transformers' torch path without the
    mamba_ssm kernels): with H heads of P, state N, chunks of C and K = ⌈S/C⌉ chunks (B and C repeated from their
    groups to every head first), its five einsums, each a batched matmul of 2 · the product of its index sizes:
    ``C·Bᵀ`` within a chunk (bclhn,bcshn: K·C²·N), the masked scores times x (bclsh,bcshp: K·C²·P), each chunk's
    end state (bclhn,bclhp: K·C·P·N), the recurrence over chunk boundaries (bzch,bzhpn: (K+1)²·P·N, the initial
    state included) and the states read out by C (bclhn,bchpn: K·C·P·N).  In all
    2·B·H·(K·C²·(N + P) + 2·K·C·P·N + (K+1)²·P·N), the padded rows included (FlopCounterMode counts them:
    tests/test_arch_mamba2.py); the discretisation, the decays (exp of segment sums) and the D skip are
    elementwise and not estimated."""
    c, n, p, k = cfg.mamba_chunk_size, cfg.mamba_state_size, cfg.mamba_head_dim, mamba_chunks(cfg, seq)
    return 2 * batch * cfg.mamba_heads * (k * c * c * (n + p) + 2 * k * c * p * n + (k + 1) ** 2 * p * n)


def ssd_step_flops(cfg: ModelConfig, batch: int) -> int:
    """One cached decode step of the SSM (``mamba2_selective_state_update``): the state (P x N per head) read out by
    C, ``torch.bmm`` of (B·H, P, N) by (B·H, N, 1): 2·B·H·P·N; the state update is elementwise."""
    return 2 * batch * cfg.mamba_heads * cfg.mamba_head_dim * cfg.mamba_state_size


# -- short convolutions (LFM2's Lfm2ShortConv; config.PATTERN_LETTERS' C) --
def short_conv_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """LFM2's depthwise causal conv1d over B·x, d channels of K = ``short_conv_kernel`` taps
    (``causal_conv1d_fn``'s torch path in models/lfm2/modeling_lfm2.py: ``F.conv1d`` with ``padding = K - 1`` on
    both sides, the output then cut to S): torch's convolution formula over the S + K − 1 outputs,
    2·B·d·(S + K − 1)·K; its bias add and the gates B·x and C·y are elementwise."""
    k = cfg.short_conv_kernel
    return 2 * batch * cfg.d_model * (seq + k - 1) * k


def short_conv_update_flops(cfg: ModelConfig, batch: int) -> int:
    """One cached decode step of LFM2's conv (``causal_conv1d_update``: the K cached inputs and the new one,
    ``F.conv1d`` without padding, 2 outputs per channel, the last kept): 2·B·d·2·K."""
    return 2 * batch * cfg.d_model * 2 * cfg.short_conv_kernel


def short_conv_gate_flops(tokens: int, width: int) -> int:
    """LFM2's two gates, ``B * x`` before the conv and ``C * conv_out`` after it: 2·T·d multiplications."""
    return 2 * tokens * width


# -- Mamba (v1) mixers (transformers' MambaMixer, models/mamba/modeling_mamba.py; config.SSM_FIELDS) --
def ssm_conv_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The Mamba depthwise causal conv1d over x (``causal_conv1d_fn``'s torch path, as ``causal_conv_flops``):
    2·B·E·(S + K − 1)·K; its bias add is elementwise."""
    k = cfg.ssm_conv_kernel
    return 2 * batch * cfg.ssm_inner * (seq + k - 1) * k


def ssm_conv_update_flops(cfg: ModelConfig, batch: int) -> int:
    """One cached decode step of the Mamba conv (``causal_conv1d_update``, as ``conv_update_flops``): 2·B·E·2·K."""
    return 2 * batch * cfg.ssm_inner * 2 * cfg.ssm_conv_kernel


def dt_proj_flops(cfg: ModelConfig, tokens: int) -> int:
    """``dt_proj.weight @ time_step`` (E x R by R x T per sequence; ``MambaMixer.forward`` calls the weight, not the
    module, so FlopCounterMode books it under the mixer): 2·T·R·E; its bias is added inside the scan."""
    return matmul_flops(tokens, cfg.ssm_dt_rank, cfg.ssm_inner)


def selective_scan_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The selective scan as transformers' torch path runs it (``mamba_selective_scan`` without mamba_ssm, mambapy or
    a compiled associative scan: the sequential loop over the S positions): each step reads its state out by C,
    ``torch.matmul`` of (B, E, N) by (B, N, 1), 2·B·E·N, so 2·B·S·E·N in all (a decode step's
    ``mamba_selective_state_update`` is the same read-out at S = 1).  The discretisation and the recurrence are
    elementwise (``selective_scan_elementwise``)."""
    return 2 * batch * seq * cfg.ssm_inner * cfg.ssm_state_size


SCAN_PER_STATE = 6  # per (token, channel, state) element: 1. A·dt, 2. exp, 3. dt·B, 4. ·x, 5. Ā·h, 6. + B̄x
SCAN_PER_CHANNEL = 9  # per (token, channel): 1. dt + bias, 2. softplus, 3-4. the D skip (·D, +), 5-8. SiLU(z), 9. ·


def selective_scan_elementwise(cfg: ModelConfig, tokens: int) -> int:
    """The selective scan's elementwise work, our estimate: the discretisation and the recurrence per state element,
    ``SCAN_PER_STATE``·T·E·N, and per channel the dt bias and softplus, the D skip and the SiLU gate,
    ``SCAN_PER_CHANNEL``·T·E (FlopCounterMode counts 0 for all of it)."""
    e = cfg.ssm_inner
    return SCAN_PER_STATE * tokens * e * cfg.ssm_state_size + SCAN_PER_CHANNEL * tokens * e


@lru_cache(maxsize=1024)
def forward_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> Breakdown:
    """Matmul FLOPs of one forward pass over B sequences of S tokens, per component.

    Keys match the live model's module paths; ``layers.*.attn.qk`` and ``layers.*.attn.av``
    are the two attention matmuls (parameter-free modules).  Built from ``components.REGISTRY``.
    Cached (a ``Breakdown`` is immutable): ``plan`` asks for each stage's blocks under every checkpointing.
    """
    from ..components import breakdown

    return breakdown("flops", Sizes.of(cfg, seq, batch))


def indexer_scores_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The DSA indexer's scores, q·kᵀ for every query, head and key: per sequence, (S·H_I x d_I) @ (d_I x S)
    (``torch.matmul(q, k.transpose(-1, -2).unsqueeze(1))`` in ``DeepseekV32Indexer.forward``), the full S x S
    square like the attention's: the causal mask is added after, to the head-summed scores."""
    return batch * matmul_flops(seq * cfg.index_heads, cfg.index_head_dim, seq)


def indexer_head_sum_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """The weighted sum of the ReLU'd scores over the indexer's heads: per query, (1 x H_I) @ (H_I x S)
    (``torch.matmul(weights.unsqueeze(-2), scores)``), 2·B·S²·H_I."""
    return batch * seq * matmul_flops(1, cfg.index_heads, seq)


def indexer_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """All the indexers' forward matmul FLOPs (projections, scores, head sums) over the layers that run one
    (``ModelConfig.indexer_layers``; a GLM-5 ``S`` layer reuses the previous top-k, no FLOP): transformers
    runs the indexer under ``torch.no_grad()``, so a training step has no backward for it
    (``training_flops``)."""
    if not cfg.indexer:
        return 0
    tokens = batch * seq
    projections = projection_flops(tokens, indexer_q_params(cfg) + indexer_k_params(cfg) + indexer_weights_params(cfg))
    scores = indexer_scores_flops(cfg, batch, seq) + indexer_head_sum_flops(cfg, batch, seq)
    return cfg.indexer_layers * (projections + scores)


def sparse_attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """QKᵀ + AV over all layers if each query attended only to the keys DSA selects: the top ``index_topk`` of
    the keys its causal mask allows, Σ_i min(i+1, k) pairs per sequence (``attended_pairs``), 2·B·h·pairs·
    (d_qk + d_v) per layer.  A labelled extra: transformers' eager and sdpa paths compute the full S x S square and
    mask the unselected keys (``DeepseekV32Attention.forward``: ``index_mask`` folded into the attention mask), and
    that square is what the totals and FlopCounterMode count; only a sparse kernel (FlashMLA's) skips the rest."""
    pairs = attended_pairs(seq, cfg.index_topk)
    return cfg.attention_layers * batch * cfg.num_heads * matmul_flops(1, cfg.d_head + cfg.v_head, 1) * pairs


def causal_attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """QKᵀ + AV over all layers if only the causal half of the S x S square were computed.

    Exactly half of the full-square figure (the S diagonal terms are ignored, as in
    FlashAttention's causal FLOP accounting).  A labelled extra, not the default.
    """
    full = attention_scores_flops(cfg, batch, seq) + attention_values_flops(cfg, batch, seq)
    return cfg.attention_layers * full // 2


def attended_pairs(seq: int, window: int | None) -> int:
    """Query-key pairs of one causal sequence of S tokens in which query i sees the last ``window`` keys,
    itself included (transformers' ``sliding_window_causal_mask_function``: i - w < j <= i):
    Σ_{i=0}^{S-1} min(i+1, w) = w(w+1)/2 + (S-w)·w for S > w, else S(S+1)/2 (the causal triangle)."""
    if window is None or seq <= window:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


def windowed_attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """QKᵀ + AV over all layers if each windowed layer computed only its sliding-window band of
    query-key pairs (``attended_pairs``): 4·B·h·pairs·d_head per windowed layer; full-attention layers
    keep the full S x S square.  A labelled extra: the totals count the full square on every layer,
    as transformers' eager attention and every counter do (the mask zeroes the rest, it does not skip it)."""
    full = attention_scores_flops(cfg, batch, seq) + attention_values_flops(cfg, batch, seq)
    band = batch * cfg.num_heads * matmul_flops(1, cfg.d_head + cfg.v_head, 1) * attended_pairs(seq, cfg.sliding_window)
    windowed = cfg.windowed_layers
    return (cfg.num_layers - windowed) * full + windowed * band


# -- elementwise (non-matmul) FLOPs ----------------------------------------------------
# Our stated convention: one FLOP per arithmetic operation on one element; exp, rsqrt, sigmoid
# and a max-compare count one each.  Counters disagree here (fvcore counts 0, DeepSpeed 1 per
# softmax or activation element), so these are never added to the matmul totals.
RMSNORM_PER_ELEMENT = 4  # 1. square, 2. accumulate into the mean, 3. scale by 1/rms, 4. scale by the gain
ROPE_PER_ELEMENT = 3  # per output element: x_e·cos − x_o·sin = 1. multiply, 2. multiply, 3. add
SCALE_PER_SCORE = 1  # QKᵀ / sqrt(d_head): one multiply per score
SOFTMAX_PER_SCORE = 5  # 1. max-compare, 2. subtract the max, 3. exp, 4. add into the sum, 5. divide
SILU_PER_ELEMENT = 4  # x·σ(x) = x / (1 + exp(−x)): 1. negate-exp, 2. add 1, 3. divide, 4. multiply by x
GATE_PER_ELEMENT = 1  # SiLU(W1 x) ⊙ W3 x: one multiply
RESIDUAL_PER_ELEMENT = 1  # x + f(x): one add
LAYERNORM_PER_ELEMENT = 7  # 1. add into the mean, 2. subtract it, 3. square, 4. add into the variance,
#                            5. scale by 1/σ, 6. scale by the gain, 7. add the bias
NORM_AFFINE_PER_ELEMENT = 1  # a norm's gain (× g) and LayerNorm's bias (+ b): one each, skipped without weights
BIAS_PER_ELEMENT = 1  # a projection's bias: one add per output element (not a matmul FLOP: counters skip it)
GELU_PER_ELEMENT = 9  # tanh form 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))): 1-2. x³, 3. ·0.044715,
#                       4. + x, 5. ·√(2/π), 6. tanh, 7. + 1, 8. · x, 9. · 0.5
CLAMPED_SWIGLU_PER_ELEMENT = 9  # gpt-oss (GptOssExperts._apply_gate), before the gating product: 1. clamp the
#                                gate above, 2-3. clamp up below and above, 4. ·α (1.702), 5-7. σ as in SiLU
#                                (negate-exp, add 1, divide), 8. · the gate, 9. up + 1
RELU_PER_ELEMENT = 1  # max(x, 0): one compare (OPT's ReLU)
RELU2_PER_ELEMENT = 2  # ReLU(x)²: 1. compare, 2. square (Nemotron's relu2, ReLUSquaredActivation)
SIGMOID_PER_ELEMENT = 3  # 1 / (1 + exp(−x)): 1. negate-exp, 2. add 1, 3. divide (Qwen2-MoE's shared-expert gate)
OUTPUT_GATE_PER_ELEMENT = 4  # gated attention, attn · σ(gate): σ (3) and the multiply (1)
GATED_NORM_PER_ELEMENT = 9  # Gated DeltaNet's RMSNormGated: RMSNorm (4) then · SiLU(z) (SiLU 4, multiply 1)
EMBED_SCALE_PER_ELEMENT = 1  # Gemma: token embeddings × √d_model, one multiply
POSITION_ADD_PER_ELEMENT = 1  # learned positions: token + position embedding, one add
ALIBI_PER_SCORE = 1  # ALiBi: the head's slope × the key's position, added to each score (one add; the bias table
#                      itself is built once per forward, h·S products, not counted)


def rmsnorm_flops(rows: int, width: int) -> int:
    """RMSNorm over ``rows`` vectors of ``width``: 4 per element."""
    return RMSNORM_PER_ELEMENT * rows * width


def layernorm_flops(rows: int, width: int) -> int:
    """LayerNorm over ``rows`` vectors of ``width``: 7 per element."""
    return LAYERNORM_PER_ELEMENT * rows * width


def norm_flops(cfg: ModelConfig, rows: int, width: int) -> int:
    """The config's norm (``cfg.norm``) over ``rows`` vectors of ``width``; without weights (``norm_weights =
    false``) the gain's multiply and LayerNorm's bias add are not done (``NORM_AFFINE_PER_ELEMENT`` less); a
    LayerNorm without bias (``norm_bias = false``, Cohere) skips the bias add only."""
    full = layernorm_flops(rows, width) if cfg.norm == "layernorm" else rmsnorm_flops(rows, width)
    if cfg.norm_weights:
        return full - (0 if cfg.norm_bias or cfg.norm != "layernorm" else NORM_AFFINE_PER_ELEMENT * rows * width)
    return full - (2 if cfg.norm == "layernorm" else 1) * NORM_AFFINE_PER_ELEMENT * rows * width


def qk_norm_flops(cfg: ModelConfig, rows: int, width: int) -> int:
    """A q/k norm over ``rows`` vectors of ``width`` (it always has a gain): RMSNorm, or with ``norm = layernorm``
    a LayerNorm (less the bias add when ``norm_bias = false``)."""
    if cfg.norm != "layernorm":
        return rmsnorm_flops(rows, width)
    return layernorm_flops(rows, width) - (0 if cfg.norm_bias else NORM_AFFINE_PER_ELEMENT * rows * width)


def bias_add_flops(tokens: int, width: int) -> int:
    """Adding a bias to a (T x width) projection output: 1 per element."""
    return BIAS_PER_ELEMENT * tokens * width


def gelu_flops(tokens: int, width: int) -> int:
    """GELU (tanh approximation) on a (T x width) activation: 9 per element."""
    return GELU_PER_ELEMENT * tokens * width


def relu_flops(tokens: int, width: int, squared: bool = False) -> int:
    """ReLU (1 per element) or squared ReLU (2 per element) on a (T x width) activation."""
    return (RELU2_PER_ELEMENT if squared else RELU_PER_ELEMENT) * tokens * width


def embedding_scale_flops(tokens: int, d_model: int) -> int:
    """Gemma's embedding scaling by √d_model: 1 per element."""
    return EMBED_SCALE_PER_ELEMENT * tokens * d_model


def position_add_flops(tokens: int, d_model: int) -> int:
    """Adding the learned position embedding to the token embedding: 1 per element."""
    return POSITION_ADD_PER_ELEMENT * tokens * d_model


def alibi_flops(scores: int) -> int:
    """ALiBi: one add per attention score (``ALIBI_PER_SCORE``)."""
    return ALIBI_PER_SCORE * scores


def rope_flops(tokens: int, width: int) -> int:
    """RoPE on a (T x width) projection (Q: h·d_head, K: kv·d_head): 3 per element."""
    return ROPE_PER_ELEMENT * tokens * width


def indexer_score_flops(scores: int) -> int:
    """The DSA indexer's scores, each scaled by 1/√d_I and then ReLU'd: 1 + 1 each."""
    return (SCALE_PER_SCORE + RELU_PER_ELEMENT) * scores


def score_scale_flops(scores: int) -> int:
    """Scaling every attention score by 1/√d_head: 1 each."""
    return SCALE_PER_SCORE * scores


def softmax_flops(scores: int) -> int:
    """Softmax over the scores (max, subtract, exp, sum, divide): 5 each."""
    return SOFTMAX_PER_SCORE * scores


def silu_flops(tokens: int, d_ff: int) -> int:
    """SiLU on the (T x d_ff) gate projection: 4 per element."""
    return SILU_PER_ELEMENT * tokens * d_ff


def clamped_swiglu_flops(rows: int, width: int) -> int:
    """gpt-oss's clamped SwiGLU activation on (rows x width) gate and up halves, before the gating product:
    9 per element (``CLAMPED_SWIGLU_PER_ELEMENT``)."""
    return CLAMPED_SWIGLU_PER_ELEMENT * rows * width


def sink_flops(batch: int, heads: int, seq: int) -> int:
    """Attention sinks: each of the B·h·S softmax rows has one more column (the head's sink logit), so the
    softmax does ``SOFTMAX_PER_SCORE`` more per row; the sink joins no matmul (it is dropped before AV)."""
    return SOFTMAX_PER_SCORE * batch * heads * seq


def shared_gate_flops(tokens: int, d_model: int) -> int:
    """Qwen2-MoE's shared-expert gate after its d -> 1 matmul: σ on T values (3 each) and the (T x d) shared
    output scaled by it (1 each)."""
    return SIGMOID_PER_ELEMENT * tokens + tokens * d_model


def output_gate_flops(tokens: int, width: int) -> int:
    """Gated attention's output gate on the (T x h·d_head) attention output: σ and a multiply, 4 per element."""
    return OUTPUT_GATE_PER_ELEMENT * tokens * width


def gated_norm_flops(tokens: int, width: int) -> int:
    """Gated DeltaNet's gated RMSNorm on (T x H_v·d_v): 9 per element (``GATED_NORM_PER_ELEMENT``)."""
    return GATED_NORM_PER_ELEMENT * tokens * width


def gate_flops(tokens: int, d_ff: int) -> int:
    """The gating product SiLU(W1 x) ⊙ W3 x: 1 per element."""
    return GATE_PER_ELEMENT * tokens * d_ff


def expert_combine_flops(tokens: int, cfg: ModelConfig) -> int:
    """Combining a mixture of experts' outputs: each of the T·k expert outputs (d wide) is scaled by its
    router weight and summed into its token, 2·T·k·d (T·E rows under ``all_experts_run``, ``expert_rows``); the
    shared experts' output is one more add, T·d."""
    routed = 2 * expert_rows(cfg, tokens) * cfg.d_model  # Llama 4's T·E rows: scaled by their weights, summed
    return routed + (tokens * cfg.d_model if cfg.shared_experts else 0)


def residual_add_flops(tokens: int, d_model: int) -> int:
    """One residual add x + f(x) on the (T x d) stream: 1 per element."""
    return RESIDUAL_PER_ELEMENT * tokens * d_model


def nonmatmul_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> Breakdown:
    """Elementwise FLOPs of one forward pass (convention above), per component, all layers."""
    from ..components import breakdown

    return breakdown("elementwise", Sizes.of(cfg, seq, batch))


@dataclass(frozen=True)
class TrainingFlops:
    """FLOPs of one training step on B·S tokens, three ways.

    * ``step`` = forward + backward, with backward = 2 x forward (one matmul for the
      input gradient and one for the weight gradient per forward matmul); this is
      what FlopCounterMode measures on the live model.
    * ``six_nd`` = 6·N·D with N = all trainable parameters, the active ones for a mixture of
      experts (``active_parameter_count``), and D = B·S tokens (Kaplan et al. 2020 use
      non-embedding N; the embedding lookup does no matmul, and the attention S² term is
      ignored, so this is an approximation).
    * ``palm`` = (6·N_matmul + 6·L·h·(d_head + v_head)·S)·D (Chowdhery et al. 2022, app. B, whose
      12·L·h·d_head·S assumes v_head = d_head) with N_matmul = the weights one token multiplies by
      (``matmul_params``); it equals ``step`` exactly.  A Gated DeltaNet hybrid's attention term counts its
      attention layers only, and its linear layers' chunked core and conv add 3 x their forward FLOPs (a Mamba2
      layer's SSD scan and conv likewise, and a Mamba layer's selective scan and conv).
      DeepSeek Sparse Attention's indexer runs under ``torch.no_grad()`` (``DeepseekV32Indexer.forward``): it
      has no backward, so it enters both ``step`` and ``palm`` once, at its forward FLOPs (``indexer_flops``).
    """

    forward: int
    backward: int
    six_nd: int
    palm: int

    @property
    def step(self) -> int:
        return self.forward + self.backward


def training_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> TrainingFlops:
    forward = forward_flops(cfg, seq, batch).total
    no_grad = indexer_flops(cfg, seq, batch)  # DSA's indexer runs under torch.no_grad(): no backward
    tokens = batch * seq
    n_params = active_parameter_count(cfg)
    attention_term = 6 * cfg.attention_layers * cfg.num_heads * (cfg.d_head + cfg.v_head) * seq
    linear = 0
    if cfg.hybrid:  # PaLM's formula has no such layers: their core and conv enter as 3 x their forward
        linear = 3 * cfg.linear_layers * (gated_delta_flops(cfg, batch, seq) + causal_conv_flops(cfg, batch, seq))
    if cfg.mamba_layers:  # nor Mamba2 layers: their SSD scan and conv enter as 3 x their forward too
        linear += 3 * cfg.mamba_layers * (ssd_scan_flops(cfg, batch, seq) + mamba_conv_flops(cfg, batch, seq))
    if cfg.short_conv_layers:  # nor LFM2's short convolutions: their conv enters as 3 x its forward too
        linear += 3 * cfg.short_conv_layers * short_conv_flops(cfg, batch, seq)
    if cfg.ssm_layers:  # nor Mamba layers: their selective scan and conv likewise
        linear += 3 * cfg.ssm_layers * (selective_scan_flops(cfg, batch, seq) + ssm_conv_flops(cfg, batch, seq))
    if cfg.indexer:  # the indexer enters once (forward only), not as 6·N_matmul's 3 x its projections
        projections = indexer_q_params(cfg) + indexer_k_params(cfg) + indexer_weights_params(cfg)
        linear += no_grad - 3 * cfg.indexer_layers * projection_flops(tokens, projections)
    return TrainingFlops(
        forward=forward,
        backward=2 * (forward - no_grad),
        six_nd=6 * n_params * tokens,
        palm=(6 * matmul_params(cfg) + attention_term) * tokens + linear,
    )
