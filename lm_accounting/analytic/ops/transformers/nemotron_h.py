"""transformers 5.24's ``NemotronHForCausalLM`` training step, transliterated (``models/nemotron_h/
modeling_nemotron_h.py``, line numbers of transformers 5.24).

One ``NemotronHBlock`` (:934-993) per letter of the layer pattern: ``x + mixer(norm(x))``, the norm a
``NemotronHRMSNorm`` (:617-636: the weight multiplied in fp32, the product cast back) and the mixer

* ``M``: ``NemotronHMamba2Mixer`` (:390-614) on its PyTorch path, the one training takes without the CUDA kernels
  (``mamba2.Mamba2Mixer``: the chunked SSD scan);
* ``*``: ``NemotronHAttention`` (:871-931): Llama's attention without RoPE and without biases (``llama.Attention``
  with ``use_rope`` off), eager or sdpa;
* ``-``: ``NemotronHMLP`` (:639-651): ``up_proj``, the activation (``relu2``: ``torch.square`` of the ReLU),
  ``down_proj``;
* ``E``: ``NemotronHMoE`` (:715-756): DeepSeek-V3's router (``deepseek.TopkRouter``), gate-less experts under
  grouped_mm between the latent projections (``moe_latent_size``), a shared ``NemotronHMLP``.

The model (:1076-1155): the embedding, ``position_ids`` = ``arange(S) + 0``, ``create_causal_mask`` (with the
packed-sequence check) for the attention layers and ``create_recurrent_attention_mask`` (None without a padding
mask) for the Mamba2 ones, the blocks, ``norm_f``; ``NemotronHForCausalLM`` (:1158-1227): ``lm_head(h).float()``
then ``ForCausalLMLoss``.

On a GPU (the plain cuda run) the same program takes the CUDA target's kernel facts (``ops.cuda``): transformers'
PyTorch path as it runs where the mamba_ssm and causal-conv1d packages are not installed (with them transformers
takes their fused kernels, not modelled); not validated on a GPU.

amp-bf16 (``llama.LlamaForCausalLM.loss``'s autocast region): CUDA's lists as ``model.autocast`` emulates them,
``einsum`` and ``conv1d`` lower-precision ops (``aten_scan``), ``softplus`` an fp32 op, relu²'s ``torch.square`` none.
Not transliterated (``unsupported``): transformers' selective checkpointing (it has none).
"""

from __future__ import annotations

from dataclasses import replace

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_activation import relu
from ..engine import Affine
from ..tensors import Tensor, empty, no_grad, parameter, repeated, split_runs
from . import deepseek, llama, mamba2, moe, nemotron
from .llama import B, Linear


class RMSNorm:
    """``NemotronHRMSNorm`` (:617-636)."""

    def __init__(self, size: int, dtype: str, name: str):
        self.weight = parameter((size,), dtype, name + ".weight")

    def __call__(self, hidden_states: Tensor) -> Tensor:
        input_dtype = hidden_states.dtype  # :627
        hidden_states = A.to(hidden_states, "fp32")
        variance = A.mean(A.pow_(hidden_states, 2), -1, keepdim=True)
        hidden_states = A.mul(hidden_states, A.rsqrt(A.add(variance, 1e-6)))
        return A.to(A.mul(A.to(self.weight, "fp32"), hidden_states), input_dtype)  # :633


class Attention(llama.Attention):
    """``NemotronHAttention`` (:871-931): Llama's without RoPE and without biases."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str):
        super().__init__(cfg, dtype, attn, name)
        self.use_rope = False

    def __call__(self, hidden_states: Tensor, position_embeddings, attention_mask) -> tuple[Tensor, Tensor | None]:
        input_shape = hidden_states.shape[:-1]  # :896
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = A.transpose(A.view(self.q_proj(hidden_states), *hidden_shape), 1, 2)  # :899-901
        key_states = A.transpose(A.view(self.k_proj(hidden_states), *hidden_shape), 1, 2)
        value_states = A.transpose(A.view(self.v_proj(hidden_states), *hidden_shape), 1, 2)
        attn_output, attn_weights = self.attend(query_states, key_states, value_states, attention_mask)  # :910
        attn_output = A.contiguous(A.reshape(attn_output, *input_shape, -1))  # :920
        attn_output = self.o_proj(attn_output)  # :921 (the attention's output dies here, then q, k, v at return)
        return attn_output, attn_weights


class MLP(nemotron.MLP):
    """``NemotronHMLP`` (:639-651): ``down_proj(act(up_proj(x)))``, width ``intermediate_size`` (a shared expert's
    ``moe_shared_expert_intermediate_size``)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        super().__init__(cfg, dtype, name)
        self.act = nemotron.relu2 if cfg.mlp == "relu2" else relu


class Experts(moe.Experts):
    """``NemotronHExperts`` (:654-712) under ``grouped_mm`` (``@use_experts_implementation(has_gate=False)``):
    ``up_proj`` (E, f, d_in) then the activation (``relu2``) in place of the gate, ``down_proj`` (E, d_in, f)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        e, d, f = cfg.num_experts, cfg.expert_in, cfg.expert_width
        self.up_proj = parameter((e, f, d), dtype, name + ".up_proj")
        self.down_proj = parameter((e, d, f), dtype, name + ".down_proj")
        self.gate_up_proj = self.up_proj  # ``selected_weights = self.up_proj`` without a gate
        self.num_experts, self.intermediate_dim = e, f
        self.act = nemotron.relu2 if cfg.mlp == "relu2" else relu

    def params(self) -> list[Tensor]:
        return [self.up_proj, self.down_proj]

    def apply_gate(self, gate_up_out: Tensor) -> Tensor:
        return self.act(gate_up_out)  # ``proj_out = self.act_fn(proj_out)``


class MoE:
    """``NemotronHMoE`` (:715-756): DeepSeek-V3's router (``NemotronHTopkRouter`` = ``deepseek.TopkRouter``: an fp32
    weight kept in fp32, ``_keep_in_fp32_modules_strict``), the experts between the latent projections when
    ``moe_latent_size`` is set, and a shared ``NemotronHMLP``; registered experts, gate, shared experts, latents."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str):
        self.experts = Experts(cfg, dtype, name + ".experts")
        self.gate = deepseek.TopkRouter(cfg, name + ".gate")
        self.shared_experts = MLP(replace(cfg, d_ff=cfg.shared_width), dtype, name + ".shared_experts")
        latent = cfg.expert_latent
        self.fc1_latent_proj = Linear(cfg.d_model, latent, cfg.mlp_bias, dtype, name + ".fc1") if latent else None
        self.fc2_latent_proj = Linear(latent, cfg.d_model, cfg.mlp_bias, dtype, name + ".fc2") if latent else None

    def params(self) -> list[Tensor]:
        out = self.experts.params() + [self.gate.weight] + self.shared_experts.params()
        if self.fc1_latent_proj is not None:
            out += self.fc1_latent_proj.params() + self.fc2_latent_proj.params()
        return out

    def __call__(self, hidden_states: Tensor) -> Tensor:
        residuals = hidden_states  # :744
        orig_shape = hidden_states.shape
        _, topk_weights, topk_indices = self.gate(hidden_states)
        hidden_states = A.view(hidden_states, -1, hidden_states.shape[-1])
        if self.fc1_latent_proj is not None:
            hidden_states = self.fc1_latent_proj(hidden_states)  # :751
        hidden_states = self.experts(hidden_states, topk_indices, topk_weights)
        if self.fc2_latent_proj is not None:
            hidden_states = self.fc2_latent_proj(hidden_states)
        hidden_states = A.view(hidden_states, *orig_shape)
        return A.add(hidden_states, self.shared_experts(residuals))  # :755


class Block(llama.GradientCheckpointingLayer):
    """``NemotronHBlock`` (:934-993)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, name: str, kind: str):
        self.norm = RMSNorm(cfg.d_model, dtype, name + ".norm")
        self.kind = kind
        if kind == "M":
            self.mixer = mamba2.Mamba2Mixer(cfg, dtype, name + ".mixer")
        elif kind == "*":
            self.mixer = Attention(cfg, dtype, attn, name + ".mixer")
        elif kind == "E":
            self.mixer = MoE(cfg, dtype, name + ".mixer")
        else:
            self.mixer = MLP(cfg, dtype, name + ".mixer")

    def params(self) -> list[Tensor]:
        return [self.norm.weight] + self.mixer.params()

    def forward(self, hidden_states: Tensor, attention_mask=None, position_ids=None) -> Tensor:
        residual = hidden_states  # :969
        hidden_states = self.norm(A.to(hidden_states, self.norm.weight.dtype))
        if self.kind == "*":
            hidden_states, _ = self.mixer(hidden_states, None, attention_mask)  # :979-986
        else:
            hidden_states = self.mixer(hidden_states)
        return A.add(residual, hidden_states)  # :990


class NemotronHForCausalLM:
    """``NemotronHForCausalLM`` with ``NemotronHModel`` (:1076-1227), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B):
        dtype = llama.DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "embeddings.weight")
        self.layers = [
            Block(cfg, dtype, setup.attention, f"layers.{i}", cfg.layer_kind(i)) for i in range(cfg.num_layers)
        ]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm_f = RMSNorm(cfg.d_model, dtype, "norm_f")
        self.lm_head = parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embeddings]
        for layer in self.layers:
            out += layer.params()
        return out + [self.norm_f.weight, self.lm_head]

    def runs(self) -> list[tuple[int, int]]:
        return split_runs(mamba2.layer_runs(self.cfg))  # FSDP2's units cut runs of one letter

    def model(self) -> Tensor:
        """``NemotronHModel.forward`` (:1096-1155)."""
        inputs_embeds = A.embedding(self.embeddings, self.input_ids)  # :1110
        hidden_states = inputs_embeds
        position_ids = A.unsqueeze(llama.arange_plus(self.seq), 0)  # :1118-1120
        with no_grad():  # create_causal_mask's packed-sequence check
            llama.find_packed_sequence_indices(A.expand(position_ids, self.batch, -1))
        if self.setup.attention == "naive":
            mask = llama.eager_mask(self.batch, self.seq, self.dtype, None)
        else:
            mask = llama.sdpa_mask(self.batch, self.seq, None, allow_is_causal_skip=True)
        for first, times in self.runs():
            with repeated(times):
                layer = self.layers[first]
                # a checkpointed block's kwargs (the mask, position_ids) live until its recomputation
                kwargs = dict(attention_mask=mask if layer.kind == "*" else None, position_ids=position_ids)
                hidden_states = layer(hidden_states, **kwargs)
                del kwargs
        hidden_states = self.norm_f(hidden_states)  # :1148
        del mask  # the mask mapping dies before the mask arguments holding position_ids
        return hidden_states

    def forward(self) -> tuple[Tensor, Tensor]:
        """:1197-1210: ``self.lm_head(hidden_states).float()``, then ``ForCausalLMLoss``: (logits, loss)."""
        hidden_states = self.model()
        logits = A.to(A.linear(A.view(hidden_states, *hidden_states.shape), self.lm_head), "fp32")
        loss = llama.for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        return logits, loss  # ``hidden_states`` dies here (under autocast the head saved its bf16 copy)

    loss = llama.fp32_logits_loss


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B) -> NemotronHForCausalLM:
    """The program of ``ops.transformers.predict_step``."""
    return NemotronHForCausalLM(cfg, seq, setup, batch)


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """The routers' weights (E, d) of the ``E`` layers: fp32 in a 16-bit model (``_keep_in_fp32_modules_strict``:
    ``gate.weight``; ``e_score_correction_bias`` is a buffer)."""
    return cfg.num_experts * cfg.d_model * (cfg.layer_pattern or "").count("E") if cfg.moe else 0


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = mamba2.unproven_sizes(cfg) if cfg.mamba_layers else []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    if cfg.mlp not in ("relu2", "relu"):
        out.append(f"mlp_hidden_act {cfg.hf_activation or cfg.mlp} (relu2 and relu are transliterated)")
    return out
