"""Analytic memory: weights, model states, AdamW temporaries, activations and the KV cache.

Every figure is an exact int of bytes.  Sources, by section:

* bytes per element: IEEE 754 binary32/binary16 and bfloat16 storage sizes (``units.DTYPE_BYTES``);
* KV cache: one key and one value vector of ``kv_heads * d_head`` per layer per cached token
  (DESIGN.md section 4: 2 · layers · n_kv · head_dim · S · batch · bytes);
* model states and the optimizer step: torch 2.13, ``torch/optim/adamw.py`` (``AdamW`` is
  ``Adam`` with ``decoupled_weight_decay=True``) and ``torch/optim/adam.py``
  (``Adam._init_group``, ``_single_tensor_adam``, ``_multi_tensor_adam``, ``_fused_adam``);
* course-convention activations: CS336 assignment 1, problem adamwAccounting (a)
  (DESIGN.md sections 4 and 5);
* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer
  Models", section 4.1, eq. 2 (no parallelism).

The implementation-exact activation model (what the live model keeps) lives elsewhere;
the course convention here is a published bookkeeping rule, not a measurement.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..breakdown import Breakdown, Item
from ..config import AccountingError, ModelConfig
from ..units import DTYPE_BYTES
from .flops import check_batch_seq
from .params import ffn_matrix_params, parameter_breakdown


def weight_bytes(n_params: int, dtype: str) -> int:
    """Bytes to hold ``n_params`` parameters in ``dtype``."""
    return n_params * DTYPE_BYTES[dtype]


def kv_cache_bytes(cfg: ModelConfig, seq: int, batch: int, dtype: str) -> int:
    """K and V for every layer and cached token: 2 · L · kv_heads · d_head · S · B · bytes."""
    return 2 * cfg.num_layers * cfg.kv_dim * seq * batch * DTYPE_BYTES[dtype]


# -- model states and the AdamW step -------------------------------------------
TRAINING_DTYPES = ("fp32", "bf16", "fp16")
"""Floating-point storage types a parameter (and so its gradient and AdamW moments) can have."""

ADAMW_IMPLS = ("foreach", "for-loop", "fused")
"""torch.optim.AdamW implementations: ``foreach=True``, ``foreach=False`` and ``fused=True``."""


def _training_dtype_bytes(dtype: str) -> int:
    if dtype not in TRAINING_DTYPES:
        raise AccountingError(f"unknown training dtype '{dtype}' (valid: {', '.join(TRAINING_DTYPES)})")
    return DTYPE_BYTES[dtype]


def parameter_tensor_sizes(cfg: ModelConfig) -> list[int]:
    """numel of each parameter tensor, in the live model's ``model.parameters()`` order.

    Registration order of ``TransformerLM``: token_embeddings (V·d); per layer ln1 (d),
    attn.q_proj (q_dim·d), attn.k_proj (kv_dim·d), attn.v_proj (kv_dim·d),
    attn.output_proj (d·q_dim), [attn.q_norm (d_head), attn.k_norm (d_head) with qk-norm],
    ln2 (d), ffn.w1 (d_ff·d), ffn.w2 (d·d_ff), ffn.w3 (d_ff·d); then ln_final (d) and
    lm_head (V·d).  A tied lm_head is the embedding's tensor, which ``parameters()``
    yields once (first seen, as token_embeddings), so it is left out.
    """
    d, hd = cfg.d_model, cfg.d_head
    layer = [d, cfg.q_dim * d, cfg.kv_dim * d, cfg.kv_dim * d, d * cfg.q_dim]
    if cfg.qk_norm:
        layer += [hd, hd]
    layer += [d, cfg.d_ff * d, d * cfg.d_ff, cfg.d_ff * d]
    sizes = [cfg.vocab_size * d] + layer * cfg.num_layers + [d]
    if not cfg.tie_embeddings:
        sizes.append(cfg.vocab_size * d)
    return sizes


def model_state_breakdown(cfg: ModelConfig, dtype: str = "fp32") -> Breakdown:
    """Parameters, gradients and AdamW's two moments, in bytes: 4 · N · bytes(dtype) in all.

    Assumption: pure-dtype training as ``torch.optim.AdamW`` does it.  ``p.grad`` has the
    parameter's dtype, and ``Adam._init_group`` creates ``exp_avg`` and ``exp_avg_sq`` with
    ``torch.zeros_like(p)``, so both moments have it too (no fp32 master copy: that is
    mixed precision, a different recipe).  The per-parameter ``step`` counter is a 0-dim
    CPU tensor unless ``capturable`` or ``fused`` is set (then 4 bytes per tensor on the
    device), so it is not counted.  A tied weight is one parameter, with one gradient
    and one pair of moments.

    * ``parameters``        N · bytes
    * ``gradients``         N · bytes
    * ``adamw.exp_avg``     N · bytes (first moment m)
    * ``adamw.exp_avg_sq``  N · bytes (second moment v)
    """
    nbytes = _training_dtype_bytes(dtype)
    n = parameter_breakdown(cfg).total
    per = n * nbytes
    formula = f"N·{nbytes}"
    items = (
        Item("parameters", f"parameters ({dtype})", "parameters", per, None, formula),
        Item("gradients", f"gradients ({dtype})", "gradients", per, None, formula),
        Item("adamw.exp_avg", f"AdamW first moment m ({dtype})", "optimizer", per, None, formula),
        Item("adamw.exp_avg_sq", f"AdamW second moment v ({dtype})", "optimizer", per, None, formula),
    )
    return Breakdown(f"model states ({dtype}, AdamW)", "bytes", items)


def adamw_step_temporary_bytes(cfg: ModelConfig, dtype: str = "fp32", impl: str = "foreach") -> int:
    """Peak extra bytes alive during ``AdamW.step()`` beyond params + grads + m + v.

    Read off torch 2.13's ``torch/optim/adam.py`` (AdamW's implementation; weight decay is
    decoupled, ``param.mul_(1 - lr·λ)`` in place, so no copy of the gradient is made)
    and confirmed with an exact allocation tracker:

    * ``foreach`` (``_multi_tensor_adam``; the default on CUDA): ``exp_avg_sq_sqrt =
      torch._foreach_sqrt(device_exp_avg_sqs)`` makes one copy of v for ALL parameters
      at once, then divides/adds/addcdivs in place: N · bytes (20 vs 16 B/param at fp32).
    * ``for-loop`` (``_single_tensor_adam``, ``foreach=False``; the default on cpu and
      meta): per tensor i, ``denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`` holds the
      sqrt result and the quotient together, while the previous tensor's ``denom`` is
      still referenced by the loop variable: max_i (n_{i-1} + 2·n_i) · bytes over
      ``parameter_tensor_sizes`` (n_{-1} = 0).
    * ``fused`` (``_fused_adam``, one kernel per tensor list): 0.
    """
    nbytes = _training_dtype_bytes(dtype)
    if impl not in ADAMW_IMPLS:
        raise AccountingError(f"unknown AdamW implementation '{impl}' (valid: {', '.join(ADAMW_IMPLS)})")
    sizes = parameter_tensor_sizes(cfg)
    if impl == "foreach":
        return sum(sizes) * nbytes
    if impl == "fused":
        return 0
    previous = [0] + sizes[:-1]
    return max(prev + 2 * cur for prev, cur in zip(previous, sizes)) * nbytes


# -- course-convention activations (CS336 assignment 1, adamwAccounting (a)) ---
COURSE_BYTES = DTYPE_BYTES["fp32"]
"""The course question has every tensor in fp32: 4 bytes per element."""


def check_logits_twice(logits_twice: bool) -> None:
    if not isinstance(logits_twice, bool):
        raise AccountingError(f"logits_twice must be true or false, got {logits_twice!r}")


def course_activation_breakdown(cfg: ModelConfig, seq: int, batch: int = 1, logits_twice: bool = True) -> Breakdown:
    """Activation bytes under the course convention: every listed output, fp32 (4 bytes).

    With B = batch, S = seq, h = num_heads, V = vocab, per block (×L):

    * ``layers.*.norms``             RMSNorm ln1 and ln2 outputs      4 · 2·B·S·d
    * ``layers.*.attn.qkv``          Q, K, V projections              4 · B·S·(q_dim + 2·kv_dim)  (3·B·S·d for MHA)
    * ``layers.*.attn.scores``       QᵀK                              4 · B·h·S²
    * ``layers.*.attn.softmax``      softmax                          4 · B·h·S²
    * ``layers.*.attn.weighted_sum`` softmax · V                      4 · B·S·q_dim  (B·S·d for MHA)
    * ``layers.*.attn.output_proj``  output projection                4 · B·S·d
    * ``layers.*.ffn.w1``            W1 matmul                        4 · B·S·d_ff
    * ``layers.*.ffn.silu``          SiLU                             4 · B·S·d_ff
    * ``layers.*.ffn.w2``            W2 matmul                        4 · B·S·d

    so one block is 4·B·(2Sd + 3Sd + 2hS² + Sd + Sd + 2S·d_ff + Sd) = 4·B·(16·S·d + 2·h·S²)
    for MHA with d_ff = 4d; then

    * ``ln_final``       final RMSNorm          4 · B·S·d
    * ``lm_head``        logits                 4 · B·S·V
    * ``cross_entropy``  cross-entropy          4 · B·S·V  (``logits_twice=False``: 4 · B·S,
      one loss value per position, the other convention published answers use)

    The list is the course's (a 2-matrix FFN: W3 and the gating product are not in it).
    """
    check_batch_seq(batch, seq)
    check_logits_twice(logits_twice)
    B, S, L, d, h, V = batch, seq, cfg.num_layers, cfg.d_model, cfg.num_heads, cfg.vocab_size
    c = COURSE_BYTES
    layer = [
        ("norms", "RMSNorms ln1 + ln2", "norms", c * 2 * B * S * d, "4·2·B·S·d"),
        ("attn.qkv", "Q, K, V projections", "attention", c * B * S * (cfg.q_dim + 2 * cfg.kv_dim), "4·B·S·(q_dim+2·kv_dim)"),
        ("attn.scores", "QᵀK scores", "attention", c * B * h * S * S, "4·B·h·S²"),
        ("attn.softmax", "softmax", "attention", c * B * h * S * S, "4·B·h·S²"),
        ("attn.weighted_sum", "weighted sum of V", "attention", c * B * S * cfg.q_dim, "4·B·S·q_dim"),
        ("attn.output_proj", "output projection", "attention", c * B * S * d, "4·B·S·d"),
        ("ffn.w1", "W1 matmul", "ffn", c * B * S * cfg.d_ff, "4·B·S·d_ff"),
        ("ffn.silu", "SiLU", "ffn", c * B * S * cfg.d_ff, "4·B·S·d_ff"),
        ("ffn.w2", "W2 matmul", "ffn", c * B * S * d, "4·B·S·d"),
    ]
    if logits_twice:
        ce = ("cross-entropy (B·S·V)", c * B * S * V, "4·B·S·V")
    else:
        ce = ("cross-entropy (one value per position)", c * B * S, "4·B·S")
    items = (
        *(Item(f"layers.*.{key}", label, group, n * L, n, f"L·{formula}") for key, label, group, n, formula in layer),
        Item("ln_final", "final RMSNorm", "norms", c * B * S * d, None, "4·B·S·d"),
        Item("lm_head", "logits", "lm head", c * B * S * V, None, "4·B·S·V"),
        Item("cross_entropy", ce[0], "loss", ce[1], None, ce[2]),
    )
    convention = "logits twice" if logits_twice else "logits once"
    return Breakdown(f"activations (course convention, fp32, {convention})", "bytes", items)


@dataclass(frozen=True)
class CoursePeak:
    """Peak training memory under the course convention, bytes, all fp32.

    ``parameters`` = gradients = 4·N, ``optimizer`` = 8·N (AdamW m and v),
    ``activations`` = ``course_activation_breakdown(...).total``.
    """

    parameters: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.activations

    def to_dict(self) -> dict[str, int]:
        return {
            "parameters": self.parameters,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "total": self.total,
        }


def course_parameter_count(cfg: ModelConfig, ffn_matrices: int = 3) -> int:
    """Parameters the course answer counts: all of them (SwiGLU: 3 FFN matrices per block), or,
    with ``ffn_matrices=2``, L·d·d_ff fewer (the 2-matrix FFN some published answers assume)."""
    if isinstance(ffn_matrices, bool) or ffn_matrices not in (2, 3):
        raise AccountingError(f"ffn_matrices must be 2 or 3, got {ffn_matrices!r}")
    return parameter_breakdown(cfg).total - (3 - ffn_matrices) * cfg.num_layers * ffn_matrix_params(cfg)


def course_peak(
    cfg: ModelConfig, seq: int, batch: int = 1, *, logits_twice: bool = True, ffn_matrices: int = 3
) -> CoursePeak:
    """adamwAccounting (a): peak = 4·N (params) + 4·N (grads) + 8·N (AdamW m, v) + activations.

    N = ``course_parameter_count(cfg, ffn_matrices)``; activations per
    ``course_activation_breakdown`` (all fp32).  Optimizer temporaries are not in the
    course's model (see ``adamw_step_temporary_bytes``).
    """
    n = course_parameter_count(cfg, ffn_matrices)
    acts = course_activation_breakdown(cfg, seq, batch, logits_twice).total
    c = COURSE_BYTES
    return CoursePeak(parameters=c * n, gradients=c * n, optimizer=2 * c * n, activations=acts)


def course_linear_in_batch(cfg: ModelConfig, seq: int, **conventions) -> tuple[int, int]:
    """adamwAccounting (b): exact (a, b) with ``course_peak(batch=B).total == a·B + b``.

    a = activation bytes of one sequence (every activation term is proportional to B);
    b = 16·N bytes of model states.  ``conventions``: ``logits_twice``, ``ffn_matrices``.
    """
    one = course_peak(cfg, seq, 1, **conventions)
    return one.activations, one.total - one.activations


def max_batch(a: int, b: int, budget_bytes: int) -> int:
    """Largest integer B with a·B + b <= budget_bytes; 0 when not even B = 1 fits."""
    for name, value, low in (("a", a, 1), ("b", b, 0), ("budget_bytes", budget_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            bound = "a positive" if low else "a non-negative"
            raise AccountingError(f"{name} must be {bound} integer number of bytes, got {value!r}")
    return max(0, (budget_bytes - b) // a)


# -- Korthikanti et al. 2022 --------------------------------------------------
def korthikanti_layer_activation_bytes(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """Korthikanti et al. 2022, eq. 2 (no tensor/sequence parallelism, no recomputation).

    s·b·h·(34 + 5·a·s/h) bytes per layer with s = seq, b = batch, h = d_model,
    a = num_heads; computed as s·b·(34·h + 5·a·s), which is the same number and exact.
    It assumes 16-bit activations and one-byte dropout masks (attention and residual
    dropout), and ignores GQA, head_dim and d_ff other than 4h (the paper's GPT shape).
    """
    check_batch_seq(batch, seq)
    return seq * batch * (34 * cfg.d_model + 5 * cfg.num_heads * seq)


def korthikanti_activation_bytes(cfg: ModelConfig, seq: int, batch: int = 1) -> int:
    """All L transformer layers: L·s·b·(34·h + 5·a·s) bytes.  Embedding dropout, the final
    norm and the output layer / loss are outside eq. 2 and not included."""
    return cfg.num_layers * korthikanti_layer_activation_bytes(cfg, seq, batch)
