"""Published activation-memory conventions: the CS336 course answer and Korthikanti et al.

* course convention: CS336 (Stanford, spring 2025) assignment 1, problem adamwAccounting (a):
  the listed activations of each block, the final norm, the logits and the cross-entropy, all
  fp32, with the peak = parameters + gradients + AdamW m and v + activations;
* Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  section 4.1, eq. 2 (no parallelism).

These are bookkeeping rules, not measurements; the implementation-exact activations of our
live model are in ``activations.py`` and ``replay.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..breakdown import Breakdown, Item
from ..config import AccountingError, ModelConfig
from ..names import DTYPE_BYTES
from .flops import check_batch_seq
from .params import ffn_matrix_params, parameter_breakdown

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
        (
            "attn.qkv",
            "Q, K, V projections",
            "attention",
            c * B * S * (cfg.q_dim + 2 * cfg.kv_dim),
            "4·B·S·(q_dim+2·kv_dim)",
        ),
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
