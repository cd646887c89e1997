"""transformers 5.24's ``Mamba2ForCausalLM`` training step, transliterated (``models/mamba2/modeling_mamba2.py``, line
numbers of transformers 5.24).

``Mamba2Mixer`` (:374-606) is ``NemotronHMamba2Mixer`` line for line in its forward (``torch_forward``, the PyTorch
path training takes without the CUDA kernels) and in ``mamba2_chunk_scan`` and the gated norm (``MambaRMSNormGated``
= ``NemotronHRMSNormGated``): ``mamba2.Mamba2Mixer``.  Its time-step clamp takes both bounds of
``time_step_limit`` (:280, default (0, inf)), as Nemotron-H's; ``use_bias`` False and ``use_conv_bias`` True are the
only ones the config reader takes.  What differs from Nemotron-H is the block and the model:

* ``Mamba2Block`` (:626-651): ``norm(x.to(norm.weight.dtype))`` with ``Mamba2RMSNorm`` (:609-623, Llama's: the weight
  times the cast-back states, ``llama.RMSNorm``), then with ``residual_in_fp32`` the residual cast to fp32 (a copy in
  a 16-bit model: the hidden states between blocks are then fp32, and each block's input cast back to the weights'
  dtype), the mixer, ``residual + mixer``;
* ``Mamba2Model`` (:738-839): the embedding, ``create_recurrent_attention_mask`` (None without a padding mask), no
  positions and no causal mask (no packed-sequence check), the blocks, ``norm_f``;
* ``Mamba2ForCausalLM`` (:842-939): ``lm_head(hidden_states.to(lm_head.weight.dtype)).float()`` (tied to the
  embeddings by ``tie_word_embeddings``, default false), then ``ForCausalLMLoss``.

amp-bf16 as Nemotron-H's (``nemotron_h``).  Not transliterated (``unsupported``): transformers' selective
checkpointing (it has none), a Mamba2 size of 1 (``mamba2.unproven_sizes``).
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..engine import Affine
from ..tensors import Tensor, empty, parameter, repeated
from . import llama, mamba2
from .llama import B


class Block(llama.GradientCheckpointingLayer):
    """``Mamba2Block`` (:626-651)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.norm = llama.RMSNorm(cfg.d_model, dtype, name + ".norm")
        self.mixer = mamba2.Mamba2Mixer(cfg, dtype, name + ".mixer")
        self.residual_in_fp32 = cfg.residual_in_fp32

    def params(self) -> list[Tensor]:
        return [self.norm.weight] + self.mixer.params()

    def forward(self, hidden_states: Tensor, attention_mask=None) -> Tensor:
        residual = hidden_states  # :644
        hidden_states = self.norm(A.to(hidden_states, self.norm.weight.dtype))
        if self.residual_in_fp32:
            residual = A.to(residual, "fp32")  # :647
        hidden_states = self.mixer(hidden_states)
        return A.add(residual, hidden_states)  # :650


class Mamba2ForCausalLM:
    """``Mamba2ForCausalLM`` with ``Mamba2Model`` (:738-939), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        dtype = llama.DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "embeddings.weight")
        self.layers = [Block(cfg, dtype, f"layers.{i}") for i in range(cfg.num_layers)]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm_f = llama.RMSNorm(cfg.d_model, dtype, "norm_f")
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embeddings]
        for layer in self.layers:
            out += layer.params()
        return out + [self.norm_f.weight] + ([self.lm_head] if self.lm_head is not None else [])

    def model(self) -> Tensor:
        """``Mamba2Model.forward`` (:765-839)."""
        inputs_embeds = A.embedding(self.embeddings, self.input_ids)  # :796
        hidden_states = inputs_embeds  # :810
        for first, times in mamba2.layer_runs(self.cfg):
            with repeated(times):
                hidden_states = self.layers[first](hidden_states, attention_mask=None)
        return self.norm_f(hidden_states)  # :822

    def forward(self) -> tuple[Tensor, Tensor]:
        """:918-925: the head on the states cast to its weight's dtype, ``.float()``, then ``ForCausalLMLoss``."""
        hidden_states = self.model()
        weight = self.lm_head if self.lm_head is not None else self.embeddings
        hidden_states = A.view(hidden_states, *hidden_states.shape)  # slice_logits_to_keep(.., 0)
        logits = A.to(A.linear(A.to(hidden_states, weight.dtype), weight), "fp32")
        loss = llama.for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss

    loss = llama.fp32_logits_loss


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> Mamba2ForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return Mamba2ForCausalLM(cfg, seq, setup, batch)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = mamba2.unproven_sizes(cfg)
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    return out
