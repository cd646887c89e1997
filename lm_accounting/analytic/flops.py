"""Forward, backward and training FLOPs, one function per component.

Convention (CS336 assignment 1, problem transformer_accounting): multiplying an
(m x n) matrix by an (n x p) matrix costs 2·m·n·p FLOPs, and only matrix
multiplies are counted.  Attention counts the full S x S square, as the course,
fvcore, FlopCounterMode and DeepSpeed all do; the causal-halved figure is a
separate, labelled extra.  Elementwise work (norms, softmax, SiLU, RoPE, residual
adds) is estimated by ``nonmatmul_flops`` under its own stated convention and is
never added to the matmul total.

All functions take the batch size B and the sequence length S explicitly; the
number of tokens is T = B·S.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..breakdown import Breakdown, Item
from ..config import ModelConfig, check_positive_int
from .params import matmul_params, parameter_breakdown


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
    """Concatenated heads (T x h·d_head) @ W_Oᵀ (h·d_head x d)."""
    return matmul_flops(tokens, cfg.q_dim, cfg.d_model)


def attention_scores_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """QKᵀ: per sequence and query head, (S x d_head) @ (d_head x S); 2·S²·d for plain MHA.

    With GQA every query head still scores against a full key matrix, so the
    count uses num_heads, not kv_heads.
    """
    return batch * cfg.num_heads * matmul_flops(seq, cfg.d_head, seq)


def attention_values_flops(cfg: ModelConfig, batch: int, seq: int) -> int:
    """AV: per sequence and query head, probabilities (S x S) @ V (S x d_head)."""
    return batch * cfg.num_heads * matmul_flops(seq, seq, cfg.d_head)


def ffn_matrix_flops(cfg: ModelConfig, tokens: int) -> int:
    """One SwiGLU matrix: (T x d) @ (d x d_ff) for W1 and W3, (T x d_ff) @ (d_ff x d) for W2."""
    return matmul_flops(tokens, cfg.d_model, cfg.d_ff)


def lm_head_flops(cfg: ModelConfig, tokens: int) -> int:
    """Final hidden states (T x d) @ (d x V)."""
    return matmul_flops(tokens, cfg.d_model, cfg.vocab_size)


def check_batch_seq(batch: int, seq: int) -> None:
    check_positive_int("batch", batch)
    check_positive_int("context", seq)


def forward_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> Breakdown:
    """Matmul FLOPs of one forward pass over B sequences of S tokens, per component.

    Keys match the live model's module paths; ``layers.*.attn.qk`` and
    ``layers.*.attn.av`` are the two attention matmuls (parameter-free modules).
    """
    check_batch_seq(batch, seq)
    T, L = batch * seq, cfg.num_layers
    layer = [
        ("attn.q_proj", "Q projection", "attention projections", q_proj_flops(cfg, T), "2·T·d·h·d_head"),
        ("attn.k_proj", "K projection", "attention projections", kv_proj_flops(cfg, T), "2·T·d·kv·d_head"),
        ("attn.v_proj", "V projection", "attention projections", kv_proj_flops(cfg, T), "2·T·d·kv·d_head"),
        ("attn.qk", "attention QKᵀ", "attention matmuls", attention_scores_flops(cfg, batch, seq), "2·B·h·S²·d_head"),
        ("attn.av", "attention AV", "attention matmuls", attention_values_flops(cfg, batch, seq), "2·B·h·S²·d_head"),
        ("attn.output_proj", "output projection", "attention projections", output_proj_flops(cfg, T), "2·T·h·d_head·d"),
        ("ffn.w1", "FFN W1 (gate)", "ffn", ffn_matrix_flops(cfg, T), "2·T·d·d_ff"),
        ("ffn.w3", "FFN W3 (up)", "ffn", ffn_matrix_flops(cfg, T), "2·T·d·d_ff"),
        ("ffn.w2", "FFN W2 (down)", "ffn", ffn_matrix_flops(cfg, T), "2·T·d_ff·d"),
    ]
    items = tuple(
        Item(f"layers.*.{key}", label, group, n * L, n, f"L·{formula}") for key, label, group, n, formula in layer
    ) + (Item("lm_head", "LM head", "lm head", lm_head_flops(cfg, T), None, "2·T·d·V"),)
    return Breakdown("forward FLOPs (matmul)", "FLOPs", items)


def causal_attention_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """QKᵀ + AV over all layers if only the causal half of the S x S square were computed.

    Exactly half of the full-square figure (the S diagonal terms are ignored, as in
    FlashAttention's causal FLOP accounting).  A labelled extra, not the default.
    """
    full = attention_scores_flops(cfg, batch, seq) + attention_values_flops(cfg, batch, seq)
    return cfg.num_layers * full // 2


# Elementwise FLOPs per element, by our stated convention: one FLOP per arithmetic
# operation, exp / rsqrt / sigmoid / max-compare counted as one each.  Counters
# disagree here (fvcore counts 0, DeepSpeed 1 per softmax/activation element).
RMSNORM_PER_ELEMENT = 4  # square, accumulate, scale by 1/rms, scale by gain
ROPE_PER_ELEMENT = 3  # x_e·cos − x_o·sin: two multiplies, one add
SCALE_PER_SCORE = 1  # QKᵀ / sqrt(d_head)
SOFTMAX_PER_SCORE = 5  # max-compare, subtract, exp, sum, divide
SILU_PER_ELEMENT = 4  # negate-exp, add 1, divide, multiply by x
GATE_PER_ELEMENT = 1  # SiLU(W1 x) ⊙ W3 x
RESIDUAL_PER_ELEMENT = 1  # x + f(x)


def nonmatmul_flops(cfg: ModelConfig, seq: int, batch: int = 1) -> Breakdown:
    """Elementwise FLOPs of one forward pass (convention above), per component, all layers."""
    check_batch_seq(batch, seq)
    T, L, d, scores = batch * seq, cfg.num_layers, cfg.d_model, batch * cfg.num_heads * seq * seq
    layer = [
        ("ln1", "RMSNorm before attention", RMSNORM_PER_ELEMENT * T * d, "4·T·d"),
        ("attn.rope", "RoPE on Q and K", ROPE_PER_ELEMENT * T * (cfg.q_dim + cfg.kv_dim), "3·T·(h+kv)·d_head"),
        ("attn.scale", "score scaling 1/√d_head", SCALE_PER_SCORE * scores, "B·h·S²"),
        ("attn.softmax", "softmax", SOFTMAX_PER_SCORE * scores, "5·B·h·S²"),
        ("residual.attn", "residual add (attention)", RESIDUAL_PER_ELEMENT * T * d, "T·d"),
        ("ln2", "RMSNorm before FFN", RMSNORM_PER_ELEMENT * T * d, "4·T·d"),
        ("ffn.silu", "SiLU", SILU_PER_ELEMENT * T * cfg.d_ff, "4·T·d_ff"),
        ("ffn.gate", "gating product", GATE_PER_ELEMENT * T * cfg.d_ff, "T·d_ff"),
        ("residual.ffn", "residual add (FFN)", RESIDUAL_PER_ELEMENT * T * d, "T·d"),
    ]
    if cfg.qk_norm:
        qk = RMSNORM_PER_ELEMENT * T * (cfg.q_dim + cfg.kv_dim)
        layer.insert(1, ("attn.qk_norm", "qk-norm on Q and K", qk, "4·T·(h+kv)·d_head"))
    items = tuple(
        Item(f"layers.*.{key}", label, "elementwise", n * L, n, f"L·{formula}") for key, label, n, formula in layer
    ) + (Item("ln_final", "final RMSNorm", "elementwise", RMSNORM_PER_ELEMENT * T * d, None, "4·T·d"),)
    return Breakdown("forward FLOPs (non-matmul, estimate)", "FLOPs", items)


@dataclass(frozen=True)
class TrainingFlops:
    """FLOPs of one training step on B·S tokens, three ways.

    * ``step`` = forward + backward, with backward = 2 x forward (one matmul for the
      input gradient and one for the weight gradient per forward matmul); this is
      what FlopCounterMode measures on the live model.
    * ``six_nd`` = 6·N·D with N = all trainable parameters and D = B·S tokens
      (Kaplan et al. 2020 use non-embedding N; the embedding lookup does no matmul,
      and the attention S² term is ignored, so this is an approximation).
    * ``palm`` = (6·N_matmul + 12·L·h·d_head·S)·D (Chowdhery et al. 2022, app. B) with
      N_matmul = the weights that take part in matmuls; it equals ``step`` exactly.
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
    tokens = batch * seq
    n_params = parameter_breakdown(cfg).total
    attention_term = 12 * cfg.num_layers * cfg.num_heads * cfg.d_head * seq
    return TrainingFlops(
        forward=forward,
        backward=2 * forward,
        six_nd=6 * n_params * tokens,
        palm=(6 * matmul_params(cfg) + attention_term) * tokens,
    )
