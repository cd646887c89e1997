"""How a model is trained, separate from its shape (``ModelConfig``): attention kernel,
activation checkpointing, precision and AdamW implementation.

No torch import.  The CLI derives its choices from the tuples below; the live model
(``lm_accounting.model.build_model(cfg, device, setup=...)``) honours every combination on
meta, cpu and cuda.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import product

from .config import AccountingError
from .names import ADAMW_IMPLS

ATTENTIONS = ("naive", "sdpa")
"""``naive``: the course's attention, ``softmax(QKᵀ/√d_k) V`` with two ``torch.matmul`` calls and an
explicit boolean causal mask; the (B, h, S, S) scores and probabilities are materialised and saved.
``sdpa``: torch's fused causal attention, one kernel, no S×S tensor kept.  On meta and cpu the
flash kernel is called explicitly, ``aten._scaled_dot_product_flash_attention_for_cpu(q, k, v,
is_causal=True)``, which saves q, k, v, the output (B, h, S, d_head) and the logsumexp (B, h, S)
in fp32; on cuda ``F.scaled_dot_product_attention(..., is_causal=True, enable_gqa=kv < h)`` restricted
to the flash and memory-efficient backends.  K and V keep their kv heads (no expansion to h)."""

CHECKPOINTS = ("none", "full", "selective", "op")
"""``none``: autograd keeps everything the block's ops save.  ``full``: each transformer block runs
under ``torch.utils.checkpoint.checkpoint(block, ..., use_reentrant=False,
preserve_rng_state=False)``: only its inputs are kept, and the whole block is recomputed in
backward (embedding, final norm and LM head are not checkpointed).  ``selective``: the same call with
``context_fn=create_selective_checkpoint_contexts(policy)``; the policy MUST_SAVEs the outputs of
``aten.mm``, ``aten.bmm``, ``aten.addmm`` and the fused-attention ops (``_scaled_dot_product_*``) and
recomputes every other op (norms, RoPE, casts, scaling, mask, softmax, SiLU, gating) in backward.
``op``: torchtitan's per-op selective checkpointing ("selective op AC", ``--activation_checkpoint.mode selective
--activation_checkpoint.selective_ac_option op``; e7c0cae ``parallelize_llama.py`` ``_apply_ac_to_transformer_block``):
the same call with torchtitan's policy (``model.transformer.op_sac_policy``): its ``_save_list`` (``aten.mm``, the
flash and memory-efficient attention, reduce-scatter, ``aten.max``; no ``bmm``) MUST_SAVE, except every second
``aten.mm`` of the block (counted per checkpointed call, separately in the forward and the recompute), which is
recomputed with everything else.  In our blocks the mms run q, k, v, output, w1, w3, w2: k, output and w3 are
recomputed; naive attention's QKᵀ and AV (``bmm``) too.  Our one addition: the CPU flash kernel (meta, cpu) is
saved as CUDA's flash is."""

PRECISIONS = ("fp32", "bf16", "amp-bf16")
"""``fp32``: parameters, activations, gradients and AdamW state in fp32.  ``bf16``: the model is
built in bfloat16, so all of those are bf16 (RMSNorm still computes in fp32 internally).
``amp-bf16``: fp32 parameters, gradients and AdamW state; the forward runs under CUDA's bf16
autocast policy (``torch.autocast("cuda", torch.bfloat16)`` on cuda, an exact emulation of its op
lists on meta and cpu, ``lm_accounting.model.autocast``); the logits are upcast to fp32 at the end of
the forward (``logits.float()``, as transformers' ``ForCausalLMLoss`` does) and the cross-entropy
runs on them in fp32."""

OPTIMIZERS = ADAMW_IMPLS
"""torch.optim.AdamW implementations (``names.ADAMW_KWARGS`` gives their keyword arguments)."""


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """One training setup.  The default is the course's: naive attention, no checkpointing, fp32."""

    attention: str = "naive"
    checkpoint: str = "none"
    precision: str = "fp32"
    optimizer: str = "foreach"

    def __post_init__(self) -> None:
        for name, choices in (
            ("attention", ATTENTIONS),
            ("checkpoint", CHECKPOINTS),
            ("precision", PRECISIONS),
            ("optimizer", OPTIMIZERS),
        ):
            value = getattr(self, name)
            if value not in choices:
                raise AccountingError(f"unknown {name} {value!r}; choose one of {', '.join(choices)}")

    @property
    def param_dtype(self) -> str:
        """The dtype of parameters, gradients and AdamW state: bf16 only for pure bf16."""
        return "bf16" if self.precision == "bf16" else "fp32"

    @property
    def autocast(self) -> bool:
        return self.precision == "amp-bf16"

    def to_dict(self) -> dict[str, str]:
        return {
            "attention": self.attention,
            "checkpoint": self.checkpoint,
            "precision": self.precision,
            "optimizer": self.optimizer,
        }

    @property
    def label(self) -> str:
        """``sdpa+full+amp-bf16+foreach``: one short name for tables and test ids."""
        return f"{self.attention}+{self.checkpoint}+{self.precision}+{self.optimizer}"


def every_setup(optimizers: tuple[str, ...] = ("foreach",)) -> Iterator[TrainingSetup]:
    """Every attention × checkpoint × precision combination (× the given optimizers)."""
    for a, c, p, o in product(ATTENTIONS, CHECKPOINTS, PRECISIONS, optimizers):
        yield TrainingSetup(attention=a, checkpoint=c, precision=p, optimizer=o)


def check_cuda_fused_attention(grouped_kv: bool, fp32: bool) -> None:
    """Refuse the fused attention that CUDA cannot fuse: fp32 with grouped KV heads.  Flash needs
    bf16/fp16 and the memory-efficient kernel takes no GQA, so ``F.scaled_dot_product_attention``
    would fall back to the math path, which holds the S×S scores (measured on an NVIDIA H200, torch 2.11:
    "No available kernel" with the math backend disabled)."""
    if grouped_kv and fp32:
        raise AccountingError(
            "fused attention in fp32 with grouped KV heads has no CUDA kernel in torch (flash needs bf16/fp16, "
            "the memory-efficient kernel takes no GQA; F.scaled_dot_product_attention would fall back to the "
            "math path, S×S): use --precision bf16 or amp-bf16, or --attention naive"
        )
