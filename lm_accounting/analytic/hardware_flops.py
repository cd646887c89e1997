"""Model FLOPs and hardware FLOPs of one training step under a ``TrainingSetup`` (no torch).

Model FLOPs are the work the model needs, whatever the implementation: forward + backward
= 3 × forward (matmuls only, full S×S square; ``training_flops``).  Hardware FLOPs are the matmul
FLOPs the step really executes, which is what FlopCounterMode counts over a whole step:

1. forward F = ``forward_flops(cfg, seq, batch).total``;
2. backward 2·F: one matmul for the input gradient and one for the weight gradient per forward
   matmul (for QKᵀ and AV: dQ, dK and dP, dV);
3. + recompute, by checkpoint mode:
   * ``none``: 0;
   * ``full``: each block's forward again, *except its last matmul* ``ffn.w2``.  Non-reentrant
     ``torch.utils.checkpoint`` stops the recompute as soon as the last tensor the block saved has
     been re-saved (early stop, ``torch.utils.checkpoint.set_checkpoint_early_stop``, default on);
     the last saves are w2's inputs, packed before w2's matmul runs, and the residual add after it
     saves nothing.  So recompute = Σ ``layers.*`` − ``layers.*.ffn.w2``.  A mixture-of-experts layer
     ends the same way with shared experts (``moe.shared.w2``, its output only added); without them
     its last matmul, the routed ``experts.w2``, is rerun: the router-weight multiply saves its output.
     Embedding, final norm and LM head are not checkpointed;
   * ``selective``: 0 matmul FLOPs: the policy keeps every mm/bmm/fused-attention output, so the
     recompute runs only elementwise ops (norms, RoPE, casts, softmax, SiLU, gating), which have no
     FLOP formula in FlopCounterMode and are outside the matmul convention;
   * ``op`` (torchtitan's per-op SAC, ``setup.CHECKPOINTS``): the matmuls its policy does not keep, rerun up to the
     early stop.  Walking the block's matmuls in the order our model runs them (``BLOCK_MATMULS``), the ``aten.mm``
     calls are numbered from 1 and the even ones are recomputed; the ``bmm`` calls (naive attention's QKᵀ and AV,
     the routed experts' ``ExpertLinear``) are not in its ``_save_list`` and are all recomputed; the fused
     attention is kept (0).  The early-stopped matmul of ``full`` is subtracted where it is among them (its kernel
     never runs).  For a Llama block, q k v o w1 w3 w2 = mm 1..7: k, o and w3 are rerun (and QKᵀ, AV if naive);
4. + with ``sdpa``: the fused backward recomputes the scores QKᵀ (FlashAttention backward, torch's
   ``sdpa_backward_flop_count``: 5 matmuls, 10·b·h·s²·d, instead of autograd's 4, 8·b·h·s²·d), i.e.
   one more ``layers.*.attn.qk`` per backward (and a full-checkpoint recompute runs the fused
   forward, 4·b·h·s²·d, counted in step 3 as ``attn.qk`` + ``attn.av``).

DeepSeek Sparse Attention's indexer runs under ``torch.no_grad()`` (transformers' ``DeepseekV32Indexer``): step 2
has no backward for it, so the hardware FLOPs are 2 × its forward (``flops.indexer_flops``) less; the model FLOPs
keep the 3 × forward convention.

Precision and the AdamW implementation change no matmul FLOPs (AdamW's are elementwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from ..setup import TrainingSetup
from .flops import forward_flops, indexer_flops

LAST_BLOCK_MATMUL = "layers.*.ffn.w2"
"""The block's last matmul, which the early-stopping full-checkpoint recompute never reaches."""
LAST_MATMULS = (LAST_BLOCK_MATMUL, "layers.*.ffn.proj", "layers.*.moe.shared.w2")
"""The last matmul of a dense block (gated, 2-matrix) and of a mixture of experts with shared experts."""


BLOCK_MATMULS = (
    ("attn.q_proj", "mm"),
    ("attn.q_a_proj", "mm"),
    ("attn.q_b_proj", "mm"),
    ("attn.k_proj", "mm"),
    ("attn.kv_a_proj", "mm"),
    ("attn.kv_b_proj", "mm"),
    ("attn.v_proj", "mm"),
    ("attn.qk", "attention"),
    ("attn.av", "attention"),
    ("attn.output_proj", "mm"),
    ("ffn.w1", "mm"),
    ("ffn.fc", "mm"),
    ("ffn.w3", "mm"),
    ("ffn.w2", "mm"),
    ("ffn.proj", "mm"),
    ("moe.router", "mm"),
    ("moe.experts.w1", "bmm"),
    ("moe.experts.w3", "bmm"),
    ("moe.experts.w2", "bmm"),
    ("moe.shared_gate", "mm"),
    ("moe.shared.w1", "mm"),
    ("moe.shared.w3", "mm"),
    ("moe.shared.w2", "mm"),
)
"""A block's matmuls (``forward_flops`` keys less ``layers.*.``) in the order our live model runs them
(``model/transformer.py`` ``CausalSelfAttention.forward``: q, k, v, attention, output; ``model/mla.py``: q (or q_a,
q_b), kv_a, kv_b; the FFN's ``w2(silu(w1 x) * w3 x)``, ``proj(act(fc x))``; ``model/moe.py``: the router, the
experts (``torch.bmm``), the shared gate, the shared experts), each with its aten op: ``mm`` (a Linear's
``torch.matmul`` folds to one), ``bmm``, or ``attention`` (``bmm`` when naive, the fused kernel with sdpa)."""


def op_sac_recomputed(cfg: ModelConfig, attention: str = "naive") -> tuple[str, ...]:
    """The block matmuls (``forward_flops`` keys) torchtitan's per-op policy does not keep (step 3, ``op``)."""
    fwd = {key.removeprefix("layers.*.") for key in (item.key for item in forward_flops(cfg, 1))}
    out = []
    for ffn in ("ffn.", "moe."):  # a dense block, a mixture-of-experts block (each counts its own mms)
        mm = 0
        for key, op in BLOCK_MATMULS:
            if key not in fwd or key.startswith(("ffn.", "moe.")) and not key.startswith(ffn):
                continue
            if op == "mm":
                mm += 1
            if (op == "mm" and mm % 2 == 0) or op == "bmm" or (op == "attention" and attention == "naive"):
                out.append("layers.*." + key)
    return tuple(dict.fromkeys(out))  # the attention's, once


def _early_stopped_matmul(cfg: ModelConfig, fwd) -> int:
    """FLOPs of the blocks' last matmuls, which the early-stopping recompute skips: ``ffn.w2`` (``ffn.proj``
    for the 2-matrix GELU MLP) of every dense block, ``moe.shared.w2`` of every mixture-of-experts block
    with shared experts; a bias add after it saves nothing.  With a norm after the FFN (``cfg.post_norms``:
    sandwich, post) that norm saves the matmul's output, so the matmul is rerun: 0."""
    if cfg.post_norms:
        return 0
    return sum(fwd[key].total for key in LAST_MATMULS if key in fwd and (cfg.gated_mlp or key != LAST_BLOCK_MATMUL))


@dataclass(frozen=True)
class StepFlops:
    """Matmul FLOPs of one training step: ``model`` = 3 × forward, ``hardware`` = what runs."""

    forward: int
    recompute: int  # step 3
    attention_recompute: int  # step 4: the fused backward's extra QKᵀ
    no_backward: int = 0  # forward matmuls no backward reaches: DSA's indexer, run under torch.no_grad()

    @property
    def model(self) -> int:
        return 3 * self.forward  # steps 1 + 2

    @property
    def hardware(self) -> int:
        return self.model - 2 * self.no_backward + self.recompute + self.attention_recompute


def step_flops(cfg: ModelConfig, seq: int, batch: int = 1, setup: TrainingSetup | None = None) -> StepFlops:
    """Model and hardware FLOPs of one training step over B sequences of S tokens (derivation above)."""
    setup = setup or TrainingSetup()
    fwd = forward_flops(cfg, seq, batch)
    blocks = sum(item.total for item in fwd if item.key.startswith("layers.*."))
    recompute = 0
    if setup.checkpoint == "full":
        recompute = blocks - _early_stopped_matmul(cfg, fwd)
    elif setup.checkpoint == "op":
        rerun = op_sac_recomputed(cfg, setup.attention)
        stopped = [key for key in rerun if key in LAST_MATMULS] if not cfg.post_norms else []
        recompute = sum(fwd[key].total for key in rerun) - sum(fwd[key].total for key in stopped)
    attention = fwd["layers.*.attn.qk"].total if setup.attention == "sdpa" and "layers.*.attn.qk" in fwd else 0
    no_backward = indexer_flops(cfg, seq, batch)
    return StepFlops(forward=fwd.total, recompute=recompute, attention_recompute=attention, no_backward=no_backward)
