"""The causal-LM skeleton GPT-NeoX, Phi and GPT-J share in transformers 5.24 (``modeling_gpt_neox.py``,
``modeling_phi.py``, ``modeling_gptj.py``): the embedding (kept until the forward returns), Llama's position ids,
packed-sequence check and one causal mask (StarCoder2's over its window: ``window``), dropout with p = 0 (its input returned), the layers, a final LayerNorm
with its bias, then the head (Phi's and GPT-J's with a bias) on an alias of the normed states
(``slice_logits_to_keep(.., 0)``) and ``ForCausalLMLoss``.  Each subclass names its modules, its layer and its
rotary embedding (``rotary``).  No torch."""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, parameter
from .gpt2 import LayerNorm
from .llama import (
    DTYPES,
    B,
    LlamaForCausalLM,
    arange_plus,
    eager_mask,
    find_packed_sequence_indices,
    for_causal_lm_loss,
    sdpa_mask,
)


class LayerNormCausalLM(LlamaForCausalLM):
    """The shared skeleton (module docstring); a subclass sets the class attributes and ``rotary``."""

    layer_class: type
    names = ("embed_tokens", "layers", "norm")  # the embedding's, the layers' and the final norm's module names
    head_bias = False

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="meta"):
        dtype = DTYPES[setup.precision]
        embed, layers, norm = self.names
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embed_tokens = parameter((cfg.vocab_size, cfg.d_model), dtype, f"{embed}.weight")
        self.layers = [
            self.layer_class(cfg, dtype, setup.attention, device, f"{layers}.{i}") for i in range(cfg.num_layers)
        ]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm = LayerNorm(cfg.d_model, dtype, device, norm)
        self.buffers = self.rotary_buffers()
        self.lm_head = None if cfg.tie_embeddings else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.lm_head_bias = parameter((cfg.vocab_size,), dtype, "lm_head.bias") if self.head_bias else None
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def rotary_buffers(self) -> list[Tensor]:
        """The rotary embedding's buffers: ``inv_freq`` and ``original_inv_freq`` of the rotated pairs."""
        half = (self.cfg.rope_dim + 1) // 2  # arange(0, dim, 2)
        self.inv_freq = empty((half,), "fp32", "inv_freq")
        return [self.inv_freq, empty((half,), "fp32", "original_inv_freq")]

    def rotary(self, hidden_states: Tensor, position_ids: Tensor):
        raise NotImplementedError

    def window(self) -> int | None:
        """The window of the one mask (``create_sliding_window_causal_mask``), None for ``create_causal_mask``."""
        return None

    def parameters(self) -> list[Tensor]:
        out = [self.embed_tokens]
        for layer in self.layers:
            out += layer.params()
        out += self.norm.params()
        return out + [t for t in (self.lm_head, self.lm_head_bias) if t is not None]

    def model(self) -> Tensor:
        inputs_embeds = self.lookup()  # kept until the forward returns
        position_ids = A.unsqueeze(arange_plus(self.seq), 0)
        with no_grad():
            find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        if self.setup.attention == "naive":
            causal = eager_mask(self.batch, self.seq, self.dtype, self.window())
        else:
            causal = sdpa_mask(self.batch, self.seq, self.window(), allow_is_causal_skip=True)
        hidden_states = inputs_embeds  # the embedding dropout (p = 0) returns its input
        position_embeddings = self.rotary(hidden_states, position_ids)
        kwargs = dict(attention_mask=causal, position_embeddings=position_embeddings, position_ids=position_ids)
        hidden_states = self.run_layers(hidden_states, lambda i: kwargs)
        return self.norm(hidden_states)

    def forward(self) -> tuple[Tensor, Tensor]:
        hidden_states = self.model()
        hidden_states = A.view(hidden_states, *hidden_states.shape)  # slice_logits_to_keep(.., 0): an alias
        logits = self.lm_head_logits(hidden_states)
        loss = for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss
