"""The one model description shared by the analytic calculator and the live model.

A ``ModelConfig`` is a frozen dataclass.  ``num_kv_heads`` and ``head_dim`` may be
left as ``None``; the resolved values are the properties ``kv_heads`` and
``d_head`` (defaults: ``num_heads`` and ``d_model // num_heads``).  Keeping the
raw ``None`` means ``dataclasses.replace(cfg, d_model=...)`` re-derives the head
size instead of silently keeping a stale one.

Presets are TOML files in the top-level ``presets/`` folder; a user's own TOML file has
the same flat keys.  This module imports nothing heavy (no torch, no pandas).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import re
import stat
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any


def _preset_dir() -> Path:
    """The shipped presets: top-level ``presets/`` in a checkout, ``lm_accounting/presets`` in a wheel.

    pyproject.toml maps the data package ``lm_accounting.presets`` onto ``presets/``, so the import
    system knows where it is in both cases (editable or not)."""
    spec = importlib.util.find_spec("lm_accounting.presets")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    return Path(__file__).resolve().parent.parent / "presets"  # a bare checkout on sys.path


PRESET_DIR = _preset_dir()
MAX_SIZE = 10**18
MAX_WORLD = 2**20
"""The most GPUs a parallel layout takes (1,048,576: beyond any cluster built; ZeRO-1's owner assignment and
the worst-rank search are linear in the ranks)."""
MAX_LAYERS = 10_000
"""The deepest model taken: the step replay, the KV cache and the FSDP units walk the layers one by one
(a billion layers would take minutes and gigabytes); the deepest published models have about 130."""
"""Largest accepted dimension, context, batch or step count: far beyond any real model, and small
enough that every derived figure (up to ~10^90) still converts to a float for printing."""


MAX_CONFIG_BYTES = 1 << 20
"""Largest config file read (1 MiB): a preset is under 1 KiB; anything bigger is refused unread."""

MAX_NAME_CHARS = 200
"""Longest model name: it is printed in titles and (sanitised) in file names."""


class AccountingError(ValueError):
    """Bad input from the user.  The CLI prints ``str(err)`` on one line and exits 2."""


class ConfigError(AccountingError):
    """An impossible or malformed model description."""


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for an error message, never longer than about ``limit`` characters.

    Integers too long to print are shown by their first digits and their length,
    ``1234…(5000 digits)``; this never converts the int to a string beyond Python's
    4,300-digit limit, nor to a float (an int beyond ~1.8e308 overflows a float)."""
    if isinstance(value, int) and not isinstance(value, bool):
        digits = _digit_count(value)
        if digits <= 30:
            return str(value)
        sign = "-" if value < 0 else ""
        lead = abs(value) // 10 ** (digits - 4)
        return f"{sign}{lead}…({digits:,} digits)"
    text = repr(value)
    if len(text) > limit:
        text = text[: limit - 1] + f"…({len(text):,} characters)"
    return text


def _digit_count(value: int) -> int:
    """Decimal digits of ``abs(value)`` without ``str()`` (which refuses ints over 4,300 digits)."""
    value = abs(value)
    if value == 0:
        return 1
    digits = int(value.bit_length() * 0.30102999566398114) + 1  # log10(2); may overshoot by 1
    return digits if value >= 10 ** (digits - 1) else digits - 1


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Shape of a pre-norm decoder-only Transformer LM (the CS336 course architecture).

    Field names follow the course's ``TransformerLM`` constructor; ``num_kv_heads``
    (grouped-query attention), ``head_dim`` (Qwen3-style explicit head size),
    ``tie_embeddings`` and ``qk_norm`` cover the Llama-3 and Qwen3 variants.  The architecture
    options (``norm`` ... ``scale_embeddings``, see ``ARCHITECTURE_CHOICES``) default to the course
    architecture, so a config that leaves them out is the course model; set, they describe the
    original GPT-2, Qwen2, Mistral, Phi-3, Gemma 2/3 and OLMo-2 (``hf_config`` reads their config.json); the
    ``LINEAR_FIELDS`` and ``attention_output_gate`` describe the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5).
    Every field is keyword-only, and a wrong type or value for any of them raises ``ConfigError``.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False
    # -- architecture options (defaults: the course architecture; see ARCHITECTURE_OPTIONS) --
    norm: str = "rmsnorm"
    norm_placement: str = "pre"
    qkv_bias: bool = False
    output_bias: bool = False
    mlp_bias: bool = False
    mlp: str = "swiglu"
    positions: str = "rope"
    rotary_dim: int | None = None
    max_position_embeddings: int | None = None
    position_offset: int = 0
    qk_norm_scope: str = "head"
    sliding_window: int | None = None
    full_attention_every: int | None = None
    scale_embeddings: bool = False
    attention_sinks: bool = False
    norm_weights: bool = True
    embedding_norm: bool = False
    lm_head_bias: bool = False
    parallel_block: str = "none"
    norm_bias: bool = True
    # -- mixture of experts (None: a dense FFN in every layer; see MOE_FIELDS) --
    num_experts: int | None = None
    experts_per_token: int | None = None
    expert_d_ff: int | None = None
    shared_experts: int = 0
    shared_expert_d_ff: int | None = None
    dense_layers_first: int = 0
    moe_every: int = 1
    router_bias: bool = False
    router_score_bias: bool = False
    expert_bias: bool = False
    shared_expert_gate: bool = False
    swiglu_limit: float | None = None
    # -- multi-head latent attention, DeepSeek-V2/V3 (None: Q/K/V projections; see MLA_FIELDS) --
    kv_lora_rank: int | None = None
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # -- Gated DeltaNet hybrids, Qwen3-Next / Qwen3.5 (None: every layer full attention; see LINEAR_FIELDS) --
    full_attention_interval: int | None = None
    linear_key_heads: int | None = None
    linear_value_heads: int | None = None
    linear_key_head_dim: int | None = None
    linear_value_head_dim: int | None = None
    linear_conv_kernel: int | None = None
    attention_output_gate: bool = False
    # -- DeepSeek Sparse Attention's indexer, DeepSeek-V3.2 / GLM-5 (None: no indexer; see DSA_FIELDS) --
    index_heads: int | None = None
    index_head_dim: int | None = None
    index_topk: int | None = None
    indexer_pattern: str | None = None
    # -- layer patterns and Mamba2 mixers: Nemotron-H, Bamba, Granite-4.0-H, Falcon-H1 (None: none; PATTERN_FIELDS) --
    layer_pattern: str | None = None
    mixer_ffn: bool = False
    mamba_norm: bool = True
    mamba_heads: int | None = None
    mamba_head_dim: int | None = None
    mamba_state_size: int | None = None
    mamba_groups: int | None = None
    mamba_conv_kernel: int | None = None
    mamba_chunk_size: int | None = None
    expert_latent: int | None = None
    short_conv_kernel: int | None = None
    short_conv_bias: bool = False
    # -- Mamba (v1) selective-scan mixers: Mamba, Falcon-Mamba, Jamba (None: none; the S of layer_pattern; SSM_FIELDS) --
    ssm_inner: int | None = None
    ssm_state_size: int | None = None
    ssm_dt_rank: int | None = None
    ssm_conv_kernel: int | None = None
    ssm_norms: str = "none"
    name: str = "custom"
    hf_model_type: str | None = dataclasses.field(default=None, compare=False)
    """The Hugging Face ``model_type`` whose modeling code this config is (``llama``, ``qwen3_moe``,
    ``gemma3_text`` for a Gemma 3 wrapper's text model), set by ``hf_config`` from a config.json and by the
    presets of published models; None for the course presets.  It names which transformers class
    ``--impl transformers`` builds (``hf_config.to_hf_dict``) and changes no parameter or FLOP figure:
    provenance, like ``ignored_fields``, so it takes no part in equality."""
    ignored_fields: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    """Fields of a Hugging Face config.json that were read and ignored because they change no count
    (dropout, soft-capping, rope scaling, token ids, ...): provenance, not shape (``hf_config``)."""
    dropout: tuple[tuple[str, float], ...] = dataclasses.field(default=(), compare=False)
    """A config.json's dropout probabilities as given (``attention_dropout``, GPT-2's ``attn_pdrop``, ...): they
    change no count, but in training transformers applies them and keeps their masks for the backward, so
    ``--impl transformers`` refuses a probability its program does not model (``hf_config.DROPOUT_MODELLED``).
    Provenance, like ``ignored_fields``; empty for a preset or a TOML file."""
    norm_topk_prob: bool = dataclasses.field(default=False, compare=False)
    """Whether the router divides its top-k weights by their sum (a config.json's ``norm_topk_prob``, Qwen3-MoE;
    Mixtral's router always does).  It changes no count, but transformers' training step keeps a copy of the
    weights for that division's backward (``analytic.ops.transformers.moe``): provenance, no part in equality."""
    expert_groups: int = dataclasses.field(default=1, compare=False)
    """DeepSeek's group-limited routing: the routed experts split into this many groups (a config.json's
    ``n_group``), of which each token's router keeps ``expert_groups_per_token`` (``topk_group``) before its
    top-k.  No count changes, but the router's tensors have these widths (``analytic.ops.transformers.deepseek``):
    provenance, no part in equality."""
    expert_groups_per_token: int = dataclasses.field(default=1, compare=False)
    """The groups a token's router keeps (a config.json's ``topk_group``; see ``expert_groups``)."""
    topk_method: str | None = dataclasses.field(default=None, compare=False)
    """DeepSeek-V2's router (a config.json's ``topk_method``): "greedy" (the top-k of all experts) or
    "group_limited_greedy" (within the ``expert_groups_per_token`` best groups); None for other routers.  No count
    changes, the router's tensors do: provenance, no part in equality."""
    rope_interleave: bool = dataclasses.field(default=False, compare=False)
    """Whether RoPE rotates interleaved pairs (a config.json's ``rope_interleave``, DeepSeek-V3: strided slices,
    ``apply_rotary_pos_emb_interleave``) rather than halves: the same count, other saved tensors in training."""
    hf_activation: str | None = dataclasses.field(default=None, compare=False)
    """The config.json's activation name (``hidden_act``) of a 2-matrix GELU MLP (GPT-NeoX's ``gelu``, Phi's
    ``gelu_new``): every GELU has the same count; a transformers program replays the named one's ops."""
    router_buffer_bias: bool = dataclasses.field(default=False, compare=False)
    """Whether the router adds a bias buffer of E (no parameter) to its sigmoid scores to pick the top k, then
    gathers the unbiased scores (a config.json's ``use_expert_bias``, LFM2-MoE's ``Lfm2MoeTopKRouter``,
    models/lfm2_moe/modeling_lfm2_moe.py): no count changes, the training step's router tensors do
    (``analytic.ops.transformers.lfm2_moe``).  Provenance, no part in equality."""
    residual_in_fp32: bool = dataclasses.field(default=False, compare=False)
    """Whether each block casts its residual to fp32 before adding the mixer's output (a config.json's
    ``residual_in_fp32``, Mamba2's ``Mamba2Block``, models/mamba2/modeling_mamba2.py; ``Mamba2Config`` defaults to
    true): no count changes, but a 16-bit model's hidden states between blocks are then fp32 in training
    (``analytic.ops.transformers.mamba2_lm``).  Provenance, no part in equality."""
    nope_layers: tuple[int, ...] = dataclasses.field(default=(), compare=False)
    """The 0-based layers whose attention skips RoPE (SmolLM3's ``no_rope_layers`` zeros, configuration_smollm3.py:
    by default every ``no_rope_layer_interval``-th layer): the same count (the table is built once for all layers),
    fewer elementwise ops and saved tensors in training.  Provenance, no part in equality."""
    all_experts_run: bool = False
    """Llama 4 (transformers' ``Llama4TextMoe``, models/llama4/modeling_llama4.py): every token goes through every
    routed expert (``hidden_states.repeat(E, 1)``, one ``torch.bmm`` over all E experts in ``Llama4TextExperts``),
    the unchosen ones weighted by σ(−∞) = 0.  The forward FLOPs then count T·E expert rows, as transformers computes
    and FlopCounterMode counts; what the model means, the routed top-k (T·k rows), is a labelled extra
    (``flops.routed_top_k_forward_flops``).  No parameter changes.  Needs a mixture of experts."""
    attention_chunk: int | None = None
    """Llama 4's chunked attention (``attention_chunk_size``; ``create_chunked_causal_mask``, masking_utils.py): on
    the layers that use RoPE (not ``nope_layers``) a query sees only the keys of its own chunk of that many
    positions, up to itself.  transformers' eager attention computes the full S x S square and masks the rest, so
    the totals count the square; the chunked pairs are a labelled extra (``flops.chunked_attention_flops``)."""
    l2_qk_norm: bool = dataclasses.field(default=False, compare=False)
    """Llama 4's ``use_qk_norm`` (``Llama4TextL2Norm``, models/llama4/modeling_llama4.py): an RMS norm without a weight
    on the RoPE layers' Q and K after RoPE: no parameter, no count; its fp32 copies and saved tensors in training
    (``analytic.ops.transformers.llama4``).  Provenance, no part in equality."""
    attn_temperature_tuning: bool = dataclasses.field(default=False, compare=False)
    """Llama 4's ``attn_temperature_tuning``: the NoPE layers scale Q by ``log1p(floor((pos + 1) / floor_scale)) *
    attn_scale + 1`` (``Llama4TextAttention.forward``): elementwise, no count; a product and its saved factor in
    training.  Provenance, no part in equality."""
    moe_fp32_combine: bool = dataclasses.field(default=False, compare=False)
    """Whether the sparse block sums the routed and the shared experts' outputs in fp32 and casts back (a config.json's
    ``enable_moe_fp32_combine``, Hunyuan v3, its class's default true): the same count, two fp32 copies and a cast
    in training (``analytic.ops.transformers.hy_v3``).  Provenance, no part in equality."""
    mamba_norm_before_gate: bool = dataclasses.field(default=True, compare=False)
    """Falcon-H1's gated RMSNorm (``mamba_norm`` true: a config.json's ``mamba_rms_norm``): whether it norms the
    scan's output before multiplying by SiLU of the gate (a config.json's ``mamba_norm_before_gate``, the class's
    default true) or after (``FalconH1RMSNormGated``, models/falcon_h1/modeling_falcon_h1.py).  The same count, other
    tensors in training (``analytic.ops.transformers.falcon_h1``).  Provenance, no part in equality."""

    def __hash__(self) -> int:
        """The compared fields' hash (as the dataclass's), computed once: the analytic caches are keyed on the
        config and hash it at every look-up (``plan``: hundreds of thousands).  Left out of a pickle: a
        string's hash differs from process to process."""
        got = self.__dict__.get("_hash")
        if got is None:
            got = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.compare))
            object.__setattr__(self, "_hash", got)
        return got

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    def __post_init__(self) -> None:
        for key in ("vocab_size", "context_length", "num_layers", "d_model", "num_heads", "d_ff"):
            check_positive_int(key, getattr(self, key), ConfigError)
        for key in ("expert_groups", "expert_groups_per_token"):
            check_positive_int(key, getattr(self, key), ConfigError)
        if self.hf_activation is not None and not isinstance(self.hf_activation, str):
            raise ConfigError(f"hf_activation must be an activation name, got {short_repr(self.hf_activation)}")
        if self.topk_method not in (None, "greedy", "group_limited_greedy"):
            raise ConfigError(f"topk_method must be greedy or group_limited_greedy, got {short_repr(self.topk_method)}")
        if self.num_layers > MAX_LAYERS:
            raise ConfigError(
                f"num_layers = {self.num_layers:,} is beyond the supported {MAX_LAYERS:,} "
                "(the step replay walks the layers; the deepest published models have about 130)"
            )
        for key in ("num_kv_heads", "head_dim"):
            if getattr(self, key) is not None:
                check_positive_int(key, getattr(self, key), ConfigError)
        for key in ("rope_theta", "norm_eps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key} must be a positive finite number, got {short_repr(value)}")
            try:
                finite = 0 < float(value) < math.inf
            except OverflowError:  # an int beyond the float range
                finite = False
            if not finite:
                raise ConfigError(f"{key} must be a positive finite number, got {short_repr(value)}")
        for key in (
            "tie_embeddings",
            "qk_norm",
            "qkv_bias",
            "output_bias",
            "mlp_bias",
            "scale_embeddings",
            "attention_sinks",
            "norm_weights",
            "embedding_norm",
            "lm_head_bias",
            "attention_output_gate",
            "norm_bias",
            "mixer_ffn",
            "mamba_norm",
            "short_conv_bias",
            *MOE_FLAGS,
        ):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{key} must be true or false, got {short_repr(getattr(self, key))}")
        for key, allowed in ARCHITECTURE_CHOICES.items():
            if getattr(self, key) not in allowed:
                raise ConfigError(f"{key} must be one of {', '.join(allowed)}, got {short_repr(getattr(self, key))}")
        for key in ("max_position_embeddings", "sliding_window", "full_attention_every", *MOE_FIELDS, *MLA_FIELDS):
            if key in ("shared_experts", "dense_layers_first"):
                check_nonnegative_int(key, getattr(self, key))
                continue
            if key in MOE_FLAGS:
                continue
            if key == "swiglu_limit":
                if self.swiglu_limit is not None:
                    positive_number(self.swiglu_limit, "swiglu_limit")
                continue
            if getattr(self, key) is not None:
                check_positive_int(key, getattr(self, key), ConfigError)
        if self.hf_model_type is not None and (
            not isinstance(self.hf_model_type, str) or not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", self.hf_model_type)
        ):
            raise ConfigError(
                f"hf_model_type must be a Hugging Face model_type name, got {short_repr(self.hf_model_type)}"
            )
        if not isinstance(self.ignored_fields, tuple) or not all(isinstance(f, str) for f in self.ignored_fields):
            raise ConfigError(f"ignored_fields must be a tuple of field names, got {short_repr(self.ignored_fields)}")
        if not isinstance(self.dropout, tuple) or not all(
            isinstance(d, tuple) and len(d) == 2 and isinstance(d[0], str) and isinstance(d[1], float)
            for d in self.dropout
        ):
            raise ConfigError(f"dropout must be a tuple of (field, probability) pairs, got {short_repr(self.dropout)}")
        if not isinstance(self.nope_layers, tuple) or not all(  # an index past num_layers names no layer (a stage)
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in self.nope_layers
        ):
            raise ConfigError(f"nope_layers must be a tuple of layer indices, got {short_repr(self.nope_layers)}")
        self._check_architecture()
        self._check_llama4()
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigError(f"name must be a non-empty string, got {short_repr(self.name)}")
        if len(self.name) > MAX_NAME_CHARS:
            raise ConfigError(f"name is {len(self.name):,} characters long; at most {MAX_NAME_CHARS} are allowed")
        if any(ord(ch) < 32 or ord(ch) == 127 for ch in self.name):
            raise ConfigError(f"name must not contain control characters, got {short_repr(self.name)}")
        self._check_pattern()  # before the experts: a pattern's E layers are its mixture-of-experts layers
        self._check_ssm()
        self._check_moe()
        self._check_mla()  # before d_head and rope_dim, which read the latent-attention fields
        self._check_linear()
        self._check_dsa()
        if self.head_dim is None and not self.mla and self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; give head_dim explicitly"
            )
        if self.num_heads % self.kv_heads:
            raise ConfigError(f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.kv_heads}")
        if self.rotary_dim is not None:
            check_positive_int("rotary_dim", self.rotary_dim, ConfigError)
            if self.positions != "rope" or self.mla:
                raise ConfigError(
                    "rotary_dim applies only with positions = rope, without latent attention (qk_rope_head_dim)"
                )
            if self.rotary_dim > self.d_head:
                raise ConfigError(f"rotary_dim={self.rotary_dim} exceeds head_dim={self.d_head}")
        if self.positions == "rope" and self.rope_dim % 2:
            which = "rotary_dim" if self.rotary_dim is not None else "qk_rope_head_dim" if self.mla else "head_dim"
            raise ConfigError(f"{which}={self.rope_dim} is odd; RoPE rotates pairs of dimensions")

    def _check_moe(self) -> None:
        moe = [k for k in MOE_FIELDS if getattr(self, k) != MOE_DEFAULTS[k]]
        if self.num_experts is None:
            if moe:
                raise ConfigError(f"{moe[0]} applies only to a mixture of experts (set num_experts)")
            return
        if self.experts_per_token is None:
            raise ConfigError("a mixture of experts needs experts_per_token (top-k)")
        if self.experts_per_token > self.num_experts:
            raise ConfigError(f"experts_per_token={self.experts_per_token} exceeds num_experts={self.num_experts}")
        if self.shared_expert_d_ff is not None and not self.shared_experts:
            raise ConfigError("shared_expert_d_ff applies only with shared_experts >= 1")
        if self.mlp != "swiglu" and not self.pattern_experts:
            raise ConfigError(
                "a mixture of experts is modelled with SwiGLU experts only (mlp = swiglu), or with a layer pattern's "
                "E layers (Nemotron-H's experts of the config's 2-matrix mlp)"
            )
        if self.shared_expert_gate and not self.shared_experts:
            raise ConfigError("shared_expert_gate gates the shared experts' output: it needs shared_experts >= 1")
        extras = ("dense_layers_first", "moe_every", "router_bias", "expert_bias", "shared_expert_gate", "swiglu_limit")
        if self.pattern_experts and (
            self.shared_experts > 1 or self.gated_mlp or any(getattr(self, k) != MOE_DEFAULTS[k] for k in extras)
        ):
            raise ConfigError(
                "a layer pattern's E layers are modelled as Nemotron-H's: experts of a 2-matrix mlp (relu2, relu, "
                "gelu), at most one shared expert, no dense_layers_first or moe_every (the pattern places them), no "
                "router or expert biases, shared-expert gate or clamp"
            )
        if not self.moe_layers:
            raise ConfigError(
                f"no layer is a mixture of experts (num_layers={self.num_layers}, "
                f"dense_layers_first={self.dense_layers_first}, moe_every={self.moe_every})"
            )

    def _check_mla(self) -> None:
        mla = [k for k in MLA_FIELDS if getattr(self, k) is not None]
        if self.kv_lora_rank is None:
            if mla:
                raise ConfigError(f"{mla[0]} applies only to latent attention (set kv_lora_rank)")
            return
        for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
            if getattr(self, key) is None:
                raise ConfigError(f"latent attention (kv_lora_rank) needs {key}")
        if self.head_dim is not None:
            raise ConfigError(
                "latent attention sizes its heads with qk_nope_head_dim, qk_rope_head_dim and v_head_dim; "
                "leave head_dim out"
            )
        if self.kv_heads != self.num_heads:
            raise ConfigError("latent attention has one key/value head per query head (leave num_kv_heads out)")
        if self.positions != "rope" or self.qk_norm or self.qkv_bias or self.sliding_window is not None:
            raise ConfigError(
                "latent attention is modelled as DeepSeek's: RoPE, no qk-norm, no Q/K/V biases, no sliding window"
            )

    def _check_linear(self) -> None:
        """The Gated DeltaNet fields (``LINEAR_FIELDS``) all or none, and the gated attention output, as Qwen3-Next
        builds them."""
        if self.attention_output_gate and (self.mla or self.qkv_bias):
            raise ConfigError(
                "attention_output_gate is modelled as Qwen3-Next's gated attention: no latent attention, no Q/K/V "
                "biases"
            )
        given = [k for k in LINEAR_FIELDS if getattr(self, k) is not None]
        for key in given:
            check_positive_int(key, getattr(self, key), ConfigError)
        if self.full_attention_interval is None:
            if given:
                raise ConfigError(f"{given[0]} applies only to a Gated DeltaNet hybrid (set full_attention_interval)")
            return
        missing = [k for k in LINEAR_FIELDS if getattr(self, k) is None]
        if missing:
            raise ConfigError(f"a Gated DeltaNet hybrid (full_attention_interval) needs {missing[0]}")
        if self.full_attention_interval < 2:
            raise ConfigError(
                "full_attention_interval must be at least 2 (1 would make every layer full attention; "
                "leave the linear-attention fields out instead)"
            )
        if self.linear_value_heads % self.linear_key_heads:
            raise ConfigError(
                f"linear_value_heads={self.linear_value_heads} is not divisible by "
                f"linear_key_heads={self.linear_key_heads}"
            )
        if self.mla or self.sliding_window is not None or self.positions != "rope":
            raise ConfigError(
                "a Gated DeltaNet hybrid is modelled as Qwen3-Next's: RoPE attention layers, no latent "
                "attention, no sliding window"
            )

    def _check_dsa(self) -> None:
        """The indexer's fields (``DSA_FIELDS``) all or none, on latent attention with a query bottleneck, as
        transformers' ``DeepseekV32Indexer`` builds it (its ``wq_b`` reads ``q_lora_rank``)."""
        given = [k for k in DSA_FIELDS if getattr(self, k) is not None]
        for key in given:
            check_positive_int(key, getattr(self, key), ConfigError)
        if not given:
            if self.indexer_pattern is not None:
                raise ConfigError("indexer_pattern applies only to a sparse-attention indexer (set index_heads)")
            return
        missing = [k for k in DSA_FIELDS if getattr(self, k) is None]
        if missing:
            raise ConfigError(f"a sparse-attention indexer ({given[0]}) needs {missing[0]}")
        if not self.mla or self.q_lora_rank is None:
            raise ConfigError(
                "a sparse-attention indexer is modelled as DeepSeek-V3.2's: latent attention with a query "
                "bottleneck (set kv_lora_rank and q_lora_rank)"
            )
        pattern = self.indexer_pattern
        if pattern is not None and (
            not isinstance(pattern, str)
            or len(pattern) != self.num_layers
            or set(pattern) - {"F", "S"}
            or not pattern.startswith("F")
        ):
            raise ConfigError(
                f"indexer_pattern must be one letter per layer ({self.num_layers}), F (an indexer) or S (the previous "
                f"F layer's top-k), starting with F; got {short_repr(pattern)}"
            )
        if self.qk_rope_head_dim > self.index_head_dim:
            raise ConfigError(
                f"index_head_dim = {self.index_head_dim} is narrower than its RoPE part qk_rope_head_dim = "
                f"{self.qk_rope_head_dim}"
            )

    def _check_pattern(self) -> None:
        """``layer_pattern`` and its fields (``PATTERN_FIELDS``), as Nemotron-H, Bamba, Granite-4.0-H and Falcon-H1
        build them: one letter per layer from ``PATTERN_LETTERS`` (``-`` and ``E`` without ``mixer_ffn``, ``H`` with
        it), the Mamba2 sizes all given when a layer has a Mamba2 mixer (and only then), the heads in whole groups,
        ``E`` layers exactly when there are experts (without ``mixer_ffn``), and none of the options these blocks do
        not have."""
        given = [k for k in MAMBA_FIELDS if getattr(self, k) is not None]
        for key in given:
            check_positive_int(key, getattr(self, key), ConfigError)
        pattern = self.layer_pattern
        if pattern is None:
            if given:
                raise ConfigError(f"{given[0]} applies only to Mamba2 layers (set layer_pattern with M layers)")
            if self.expert_latent is not None:
                raise ConfigError("expert_latent applies only to a layer pattern's E layers (Nemotron-H's experts)")
            if self.mixer_ffn:
                raise ConfigError("mixer_ffn applies only to a layer pattern (set layer_pattern)")
            if not self.mamba_norm:
                raise ConfigError("mamba_norm applies only to Mamba2 layers (set layer_pattern with M layers)")
            if self.short_conv_kernel is not None or self.short_conv_bias:
                raise ConfigError("short_conv_kernel and short_conv_bias apply only to a layer pattern's C layers")
            return
        letters = set(PATTERN_LETTERS) - ({"-", "E"} if self.mixer_ffn else {"H", "C"})
        if not isinstance(pattern, str) or len(pattern) != self.num_layers or set(pattern) - letters:
            kinds = (
                "M (Mamba2), S (Mamba), * (attention), C (a short convolution) or H (both in parallel; with mixer_ffn "
                "every layer has its FFN)"
                if self.mixer_ffn
                else "M (Mamba2), S (Mamba), * (attention), - (MLP) or E (mixture of experts)"
            )
            raise ConfigError(
                f"layer_pattern must be one letter per layer ({self.num_layers}): {kinds}; got {short_repr(pattern)}"
                + (f" ({len(pattern)} letters)" if isinstance(pattern, str) else "")
            )
        if ("E" in pattern) != (self.moe and not self.mixer_ffn):
            raise ConfigError(
                "a layer pattern's E layers need num_experts, and a mixture of experts needs E layers (or mixer_ffn, "
                "an FFN sublayer in every layer: Granite-4.0-H's)"
            )
        if self.expert_latent is not None:
            check_positive_int("expert_latent", self.expert_latent, ConfigError)
            if "E" not in pattern:
                raise ConfigError("expert_latent applies only to a layer pattern's E layers (Nemotron-H's experts)")
        if not self.mamba_layers:
            if given:
                raise ConfigError(f"{given[0]} applies only to Mamba2 layers (an M in layer_pattern)")
            if not self.mamba_norm:
                raise ConfigError("mamba_norm applies only to Mamba2 layers (an M in layer_pattern)")
        else:
            missing = [k for k in MAMBA_FIELDS if getattr(self, k) is None]
            if missing:
                raise ConfigError(f"Mamba2 layers (M or H in layer_pattern) need {missing[0]}")
            if self.mamba_heads % self.mamba_groups:
                raise ConfigError(
                    f"mamba_heads={self.mamba_heads} is not divisible by mamba_groups={self.mamba_groups}"
                )
        if self.short_conv_kernel is not None:
            check_positive_int("short_conv_kernel", self.short_conv_kernel, ConfigError)
        if not self.short_conv_layers:
            if self.short_conv_kernel is not None or self.short_conv_bias:
                raise ConfigError("short_conv_kernel and short_conv_bias apply only to short-convolution layers (C)")
        elif self.short_conv_kernel is None:
            raise ConfigError("short-convolution layers (C in layer_pattern) need short_conv_kernel")
        if (
            self.mla
            or self.hybrid
            or self.indexer
            or self.sliding_window is not None
            or self.parallel_block != "none"
            or self.norm_placement != "pre"
            or self.attention_output_gate
        ):
            raise ConfigError(
                "a layer pattern is modelled as Nemotron-H's and Bamba's: pre-norm blocks, with no latent attention, "
                "Gated DeltaNet, sliding window, output gate or parallel block"
            )

    def _check_ssm(self) -> None:
        """The Mamba (v1) fields (``SSM_FIELDS``) all given when ``layer_pattern`` has an ``S`` (and only then), and
        ``ssm_norms`` one of ``SSM_NORMS``."""
        given = [k for k in SSM_FIELDS if getattr(self, k) is not None]
        for key in given:
            check_positive_int(key, getattr(self, key), ConfigError)
        if self.ssm_norms not in SSM_NORMS:
            raise ConfigError(f"ssm_norms must be one of {', '.join(SSM_NORMS)}; got {short_repr(self.ssm_norms)}")
        if not self.ssm_layers:
            if given:
                raise ConfigError(f"{given[0]} applies only to Mamba layers (an S in layer_pattern)")
            if self.ssm_norms != "none":
                raise ConfigError("ssm_norms applies only to Mamba layers (an S in layer_pattern)")
            return
        missing = [k for k in SSM_FIELDS if getattr(self, k) is None]
        if missing:
            raise ConfigError(f"Mamba layers (S in layer_pattern) need {missing[0]}")

    def _check_architecture(self) -> None:
        """The options that only make sense together (one line each)."""
        if self.max_position_embeddings is not None and self.positions != "learned":
            raise ConfigError(
                "max_position_embeddings sizes the learned position table; it applies only with positions = learned"
            )
        check_nonnegative_int("position_offset", self.position_offset)
        if self.position_offset and self.positions != "learned":
            raise ConfigError("position_offset applies only with positions = learned")
        if self.positions == "learned" and self.context_length > self.max_positions:
            rows = "" if not self.position_offset else f" ({self.position_rows:,} rows less {self.position_offset})"
            raise ConfigError(
                f"context {self.context_length:,} exceeds the {self.max_positions:,} learned positions{rows} "
                f"(max_position_embeddings): the model cannot run past its position table; a context up to "
                f"{self.max_positions:,} runs, or a variant with a longer table (a different model) needs "
                f"max_position_embeddings = {self.context_length + self.position_offset} too"
            )
        if self.qk_norm_scope != "head" and not self.qk_norm:
            raise ConfigError(f"qk_norm_scope = {self.qk_norm_scope} applies only with qk_norm = true")
        if self.parallel_block != "none" and self.norm_placement != "pre":
            raise ConfigError(
                f"parallel_block = {self.parallel_block} runs attention and the MLP side by side on pre-norms; "
                f"it needs norm_placement = pre, got {self.norm_placement}"
            )
        if not self.norm_bias and (self.norm != "layernorm" or not self.norm_weights):
            raise ConfigError("norm_bias = false applies only to a LayerNorm with weights (norm = layernorm)")
        if self.full_attention_every is not None:
            if self.sliding_window is None:
                raise ConfigError("full_attention_every applies only with a sliding_window")
            if self.full_attention_every < 2:
                raise ConfigError(
                    "full_attention_every must be at least 2 (1 would make every layer full attention; "
                    "leave sliding_window out instead)"
                )

    def _check_llama4(self) -> None:
        """Llama 4's two options (``all_experts_run``, ``attention_chunk``): a flag on a mixture of experts, a
        positive chunk without a sliding window."""
        if not isinstance(self.all_experts_run, bool):
            raise ConfigError(f"all_experts_run must be true or false, got {short_repr(self.all_experts_run)}")
        if self.all_experts_run and self.num_experts is None:
            raise ConfigError("all_experts_run applies only to a mixture of experts (set num_experts)")
        if self.attention_chunk is not None:
            check_positive_int("attention_chunk", self.attention_chunk, ConfigError)
            if self.sliding_window is not None or self.hybrid or self.mla:
                raise ConfigError(
                    "attention_chunk is modelled as Llama 4's chunked attention: no sliding window, no latent or "
                    "linear attention"
                )

    def layer_chunked(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends within chunks of ``attention_chunk``: every layer that uses
        RoPE (``Llama4TextConfig.__post_init__``: ``"chunked_attention" if no_rope and attention_chunk_size is not
        None``, where a 1 in ``no_rope_layers`` means RoPE)."""
        return self.attention_chunk is not None and layer not in self.nope_layers

    @property
    def chunked_layers(self) -> int:
        """How many layers attend within chunks (0 without ``attention_chunk``)."""
        return sum(self.layer_chunked(i) for i in range(self.num_layers)) if self.attention_chunk else 0

    # -- resolved dimensions -------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``num_kv_heads``, default ``num_heads``: plain MHA)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def d_head(self) -> int:
        """Size of one query/key head (``head_dim``, default ``d_model // num_heads``; with latent attention
        ``qk_nope_head_dim + qk_rope_head_dim``)."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def v_head(self) -> int:
        """Size of one value head: ``d_head``, or ``v_head_dim`` with latent attention."""
        return self.v_head_dim if self.mla else self.d_head

    @property
    def o_dim(self) -> int:
        """Width of the attention output (the output projection's input), ``num_heads * v_head``."""
        return self.num_heads * self.v_head

    @property
    def rope_dim(self) -> int:
        """Dimensions of a head that RoPE rotates: ``d_head``, ``rotary_dim`` (the first ones, partial rotary), or
        ``qk_rope_head_dim`` with latent attention."""
        if self.mla:
            return self.qk_rope_head_dim
        return self.d_head if self.rotary_dim is None else self.rotary_dim

    @property
    def partial_rotary(self) -> bool:
        """RoPE rotates only the first ``rotary_dim`` dimensions of each Q and K head (GLM, MiniMax-M2, StableLM)."""
        return self.rotary_dim is not None and self.rotary_dim < self.d_head

    @property
    def mla(self) -> bool:
        """Multi-head latent attention (DeepSeek-V2/V3): ``kv_lora_rank`` is set."""
        return self.kv_lora_rank is not None

    @property
    def kv_cache_width(self) -> int:
        """Elements cached per token per layer at inference: K and V, ``2 · kv_heads · d_head``; with latent
        attention the compressed latent and the shared RoPE key, ``kv_lora_rank + qk_rope_head_dim``
        (DeepSeek-V2 §2.1.2; transformers v5 caches exactly these, before ``kv_b_proj``)."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.kv_dim

    @property
    def indexer(self) -> bool:
        """DeepSeek Sparse Attention: every layer's attention has a lightning indexer (``index_heads`` is set)."""
        return self.index_heads is not None

    def layer_indexer(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) runs its own indexer: every layer, or GLM-5's ``F`` layers of
        ``indexer_pattern`` (an ``S`` layer reuses the previous ``F`` layer's top-k: transformers'
        ``GlmMoeDsaAttention`` with ``indexer_types[i] == "shared"`` has no indexer)."""
        return self.indexer and (self.indexer_pattern is None or self.indexer_pattern[layer] == "F")

    @property
    def indexer_layers(self) -> int:
        """Layers with an indexer: all, or the ``F`` layers of ``indexer_pattern`` (0 without DSA)."""
        if not self.indexer:
            return 0
        return self.num_layers if self.indexer_pattern is None else self.indexer_pattern.count("F")

    @property
    def cached_width(self) -> int:
        """Elements a cache holds per token per attention layer: ``kv_cache_width``, and with DSA's indexer its
        key too, ``index_head_dim`` (transformers' ``DynamicIndexedLayer.indexer_keys``, (B, S, d_I)); the same on
        every layer only without ``indexer_pattern`` (``infer`` refuses one; ``kv_cache`` counts each layer)."""
        return self.kv_cache_width + (self.index_head_dim if self.indexer else 0)

    # -- Gated DeltaNet hybrids ----------------------------------------------
    @property
    def hybrid(self) -> bool:
        """Some layers are Gated DeltaNet linear attention (``full_attention_interval`` is set)."""
        return self.full_attention_interval is not None

    def layer_attention(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has (softmax) attention: every layer, or in a hybrid every
        ``full_attention_interval``-th, transformers' ``layer_types`` rule ``"linear_attention" if (i + 1) % n
        else "full_attention"`` (``Qwen3NextConfig.__post_init__``); with ``layer_pattern`` its ``*`` and ``H``
        layers."""
        if self.layer_pattern is not None:
            return self.layer_pattern[layer] in "*H"
        return not self.hybrid or (layer + 1) % self.full_attention_interval == 0

    @property
    def attention_layers(self) -> int:
        """Layers with attention: all, ⌊L/n⌋ in a hybrid, or the ``*`` and ``H`` of ``layer_pattern``."""
        if self.layer_pattern is not None:
            return self.layer_pattern.count("*") + self.layer_pattern.count("H")
        return self.num_layers if not self.hybrid else self.num_layers // self.full_attention_interval

    @property
    def linear_layers(self) -> int:
        """Gated DeltaNet layers: ``num_layers - attention_layers`` (0 without a hybrid)."""
        return self.num_layers - self.attention_layers

    @property
    def linear_key_dim(self) -> int:
        """Width of the linear layers' queries (and keys): ``linear_key_heads · linear_key_head_dim``."""
        return self.linear_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        """Width of the linear layers' values (and of their gate z): ``linear_value_heads · linear_value_head_dim``."""
        return self.linear_value_heads * self.linear_value_head_dim

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the depthwise causal conv1d, q, k and v together: ``2·key_dim + value_dim``."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    # -- layer patterns and Mamba2 mixers, Nemotron-H ------------------------
    def layer_kind(self, layer: int) -> str | None:
        """Layer ``layer``'s letter of ``layer_pattern`` (``PATTERN_LETTERS``), or None without a pattern."""
        return None if self.layer_pattern is None else self.layer_pattern[layer]

    def layer_mamba(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a Mamba2 mixer (an ``M`` or ``H`` of ``layer_pattern``)."""
        return self.layer_kind(layer) in ("M", "H")

    def layer_dense(self, layer: int) -> bool:
        """Whether layer ``layer`` has a dense FFN: every layer not a mixture of experts, or with a pattern its
        ``-`` layers (Nemotron-H's ``NemotronHMLP`` blocks; with ``mixer_ffn`` every layer not a mixture of
        experts, as without a pattern)."""
        if self.layer_pattern is not None and not self.mixer_ffn:
            return self.layer_pattern[layer] == "-"
        return not self.layer_moe(layer)

    @property
    def pattern_experts(self) -> bool:
        """The mixture of experts is a layer pattern's ``E`` layers (Nemotron-H's ``NemotronHMoE``): experts of the
        config's 2-matrix ``mlp`` (``up_proj``, ``down_proj``; no gate), over ``expert_latent`` features when set."""
        return self.moe and self.layer_pattern is not None and not self.mixer_ffn

    @property
    def expert_in(self) -> int:
        """The width a routed expert reads and writes: ``expert_latent`` (Nemotron-H's ``moe_latent_size``: the
        tokens go through ``fc1_latent_proj`` first), else ``d_model``."""
        return self.d_model if self.expert_latent is None else self.expert_latent

    def layer_short_conv(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a short-convolution mixer (a ``C`` of ``layer_pattern``, LFM2's)."""
        return self.layer_kind(layer) == "C"

    @property
    def short_conv_layers(self) -> int:
        """Short-convolution layers: the ``C`` of ``layer_pattern`` (0 without one)."""
        return 0 if self.layer_pattern is None else self.layer_pattern.count("C")

    @property
    def mamba_layers(self) -> int:
        """Mamba2 layers: the ``M`` and ``H`` of ``layer_pattern`` (0 without one)."""
        return 0 if self.layer_pattern is None else self.layer_pattern.count("M") + self.layer_pattern.count("H")

    def layer_ssm(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has a Mamba (v1) mixer (an ``S`` of ``layer_pattern``)."""
        return self.layer_kind(layer) == "S"

    @property
    def ssm_layers(self) -> int:
        """Mamba (v1) layers: the ``S`` of ``layer_pattern`` (0 without one)."""
        return 0 if self.layer_pattern is None else self.layer_pattern.count("S")

    @property
    def ssm_x_width(self) -> int:
        """Outputs of a Mamba mixer's ``x_proj``: dt's rank and B and C, ``R + 2·N``."""
        return self.ssm_dt_rank + 2 * self.ssm_state_size

    @property
    def mamba_inner(self) -> int:
        """Width of a Mamba2 mixer's x (and of its gate z): ``mamba_heads · mamba_head_dim`` (transformers'
        ``intermediate_size`` of the mixer)."""
        return self.mamba_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the Mamba2 depthwise conv1d, x, B and C together: ``inner + 2·groups·state_size``."""
        return self.mamba_inner + 2 * self.mamba_groups * self.mamba_state_size

    @property
    def mamba_in_width(self) -> int:
        """Outputs of a Mamba2 mixer's ``in_proj``: the gate z, x·B·C and one dt per head,
        ``inner + conv_dim + heads``."""
        return self.mamba_inner + self.mamba_conv_dim + self.mamba_heads

    # -- mixture of experts --------------------------------------------------
    @property
    def moe(self) -> bool:
        return self.num_experts is not None

    def layer_moe(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) has the mixture of experts instead of a dense FFN: from
        ``dense_layers_first`` on (DeepSeek's ``first_k_dense_replace``), every ``moe_every``-th layer
        (Qwen's ``decoder_sparse_step``: ``(i + 1) % step == 0``)."""
        if self.pattern_experts:
            return self.layer_pattern[layer] == "E"
        return self.moe and layer >= self.dense_layers_first and (layer + 1) % self.moe_every == 0

    @property
    def moe_layers(self) -> int:
        """How many layers ``layer_moe``: the i in [first, L) with (i + 1) % n == 0, counted as
        ⌊L/n⌋ − ⌊first/n⌋ (0 for a dense model)."""
        if not self.moe:
            return 0
        if self.pattern_experts:
            return self.layer_pattern.count("E")
        first = min(self.dense_layers_first, self.num_layers)
        return self.num_layers // self.moe_every - first // self.moe_every

    @property
    def dense_layers(self) -> int:
        """Layers with a dense FFN: ``num_layers - moe_layers``, or the ``-`` of ``layer_pattern`` (without
        ``mixer_ffn``)."""
        if self.layer_pattern is not None and not self.mixer_ffn:
            return self.layer_pattern.count("-")
        return self.num_layers - self.moe_layers

    @property
    def expert_width(self) -> int:
        """Hidden width of one routed expert (``expert_d_ff``, default ``d_ff``)."""
        return self.d_ff if self.expert_d_ff is None else self.expert_d_ff

    @property
    def shared_width(self) -> int:
        """Hidden width of all shared experts together, ``shared_experts · shared_expert_d_ff`` (each
        defaulting to ``expert_width``): DeepSeek runs them as one MLP of that width."""
        each = self.expert_width if self.shared_expert_d_ff is None else self.shared_expert_d_ff
        return self.shared_experts * each

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads, ``num_heads * d_head``."""
        return self.num_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads, ``kv_heads * d_head``."""
        return self.kv_heads * self.d_head

    @property
    def group_size(self) -> int:
        """Query heads sharing one key/value head (1 for plain MHA)."""
        return self.num_heads // self.kv_heads

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table: ``max_position_embeddings``, default ``context_length``."""
        return self.context_length if self.max_position_embeddings is None else self.max_position_embeddings

    @property
    def max_positions(self) -> int:
        """The positions the learned table serves: its rows less ``position_offset`` (OPT's 2 leading rows)."""
        return self.position_rows - self.position_offset

    @property
    def gated_mlp(self) -> bool:
        """Three FFN matrices (w1 gate, w3 up, w2 down) for SwiGLU/GeGLU; two (fc, proj) for the GELU, ReLU and
        squared-ReLU MLPs."""
        return self.mlp in ("swiglu", "geglu")

    @property
    def pre_norms(self) -> bool:
        """``ln1``/``ln2`` before each sublayer (pre-norm and sandwich; not OLMo-2's post-norm)."""
        return self.norm_placement in ("pre", "sandwich")

    @property
    def post_norms(self) -> bool:
        """``post_attn_norm``/``post_ffn_norm`` on each sublayer's output (sandwich and post)."""
        return self.norm_placement in ("sandwich", "post")

    def layer_windowed(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends over a sliding window of ``sliding_window`` keys.

        Every layer is windowed when ``full_attention_every`` is None (Mistral, Phi-3); otherwise
        layers ``n-1, 2n-1, ...`` keep full attention (Gemma 2: n = 2; Gemma 3: n = 6), the rule of
        transformers' ``layer_types``: ``"sliding_attention" if (i + 1) % n else "full_attention"``."""
        if self.sliding_window is None:
            return False
        return self.full_attention_every is None or (layer + 1) % self.full_attention_every != 0

    @property
    def windowed_layers(self) -> int:
        """How many layers attend over a sliding window (0 without one)."""
        if self.sliding_window is None:
            return 0
        if self.full_attention_every is None:
            return self.num_layers
        return self.num_layers - self.num_layers // self.full_attention_every

    def unsupported_for_replay(self) -> list[str]:
        """The architecture options the implementation-exact memory replay does not model yet
        (it covers the course architecture: pre-RMSNorm, SwiGLU, RoPE, no biases; with GQA,
        head_dim, per-head qk-norm, tied embeddings and Qwen2's q/k/v biases).  Empty for the course
        architecture."""
        out = []
        if self.norm != "rmsnorm":
            out.append("LayerNorm")
        if self.norm_placement != "pre":
            out.append(f"{self.norm_placement} norms")
        if self.output_bias or self.mlp_bias:
            out.append("output or MLP biases")
        if self.mlp != "swiglu":
            out.append(f"{self.mlp} MLP")
        if self.positions == "learned":
            out.append("learned positions")
        if self.positions == "alibi":
            out.append("ALiBi")
        if self.embedding_norm:
            out.append("embedding norm")
        if self.lm_head_bias:
            out.append("LM-head bias")
        if self.qk_norm and self.qk_norm_scope == "projection":
            out.append("whole-projection qk-norm")
        if self.qk_norm and self.qk_norm_scope == "head_weights":
            out.append("per-head qk-norm gains")
        if self.qk_norm and self.norm == "layernorm":
            out.append("LayerNorm qk-norm")
        if self.sliding_window is not None:
            out.append("sliding-window attention")
        if self.scale_embeddings:
            out.append("scaled embeddings")
        if self.attention_sinks:
            out.append("attention sinks")
        if not self.norm_weights:
            out.append("norms without weights")
        if not self.norm_bias:
            out.append("LayerNorm without bias")
        if self.parallel_block != "none":
            out.append("parallel attention and MLP")
        if self.moe:
            out.append("mixture of experts")
        if self.expert_bias:
            out.append("expert biases")
        if self.moe and self.shared_experts and self.mlp_bias:
            out.append("shared-expert biases")
        if self.router_bias:
            out.append("router bias")
        if self.router_score_bias:
            out.append("frozen router score bias")
        if self.shared_expert_gate:
            out.append("shared-expert gate")
        if self.swiglu_limit is not None:
            out.append("clamped SwiGLU experts")
        if self.mla:
            out.append("latent attention (MLA)")
        if self.hybrid:
            out.append("Gated DeltaNet linear attention")
        if self.attention_output_gate:
            out.append("attention output gate")
        if self.indexer:
            out.append("sparse-attention indexer")
        if self.all_experts_run:
            out.append("every expert on every token (Llama 4)")
        if self.attention_chunk is not None:
            out.append("chunked attention (Llama 4)")
        if self.layer_pattern is not None:
            out.append("a layer pattern (hybrid blocks: Mamba, Mamba2, short convolutions)")
        if self.mamba_layers:
            out.append("Mamba2 mixer layers")
        if self.ssm_layers:
            out.append("Mamba (v1) mixer layers")
        if self.short_conv_layers:
            out.append("short-convolution layers (LFM2)")
        if self.positions == "none":
            out.append("no positions (NoPE)")
        return out

    def course_twin(self) -> ModelConfig:
        """The course architecture at this config's shapes (every architecture option at its default):
        what the memory replay can model, used to bound a live run of a variant before it is built."""
        arch = (
            "norm",
            "norm_placement",
            "qkv_bias",
            "output_bias",
            "mlp_bias",
            "mlp",
            "positions",
            "rotary_dim",
            "max_position_embeddings",
            "position_offset",
            "qk_norm_scope",
            "sliding_window",
            "full_attention_every",
            "scale_embeddings",
            "attention_sinks",
            "norm_weights",
            "embedding_norm",
            "lm_head_bias",
            "parallel_block",
            "norm_bias",
            *MOE_FIELDS,
            *MLA_FIELDS,
            *LINEAR_FIELDS,
            "attention_output_gate",
            *DSA_FIELDS,
            "indexer_pattern",
            "all_experts_run",
            "attention_chunk",
            *PATTERN_FIELDS,
            "hf_model_type",  # the twin is no published model's code
        )
        defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.name in arch}
        return dataclasses.replace(self, **defaults)

    @property
    def course_architecture(self) -> bool:
        """True when every architecture option is the course's (nothing ``unsupported_for_replay()``, and no
        q/k/v biases or partial rotary, which the replay models too)."""
        return not self.unsupported_for_replay() and not self.qkv_bias and not self.partial_rotary

    @property
    def architecture(self) -> str:
        """One short line naming the architecture options, e.g. ``pre-RMSNorm · SwiGLU · RoPE``."""
        norm = {"rmsnorm": "RMSNorm", "layernorm": "LayerNorm"}[self.norm]
        parts = [
            {"pre": f"pre-{norm}", "sandwich": f"sandwich {norm}", "post": f"post-{norm}"}[self.norm_placement],
            *([MLP_NAMES[self.mlp]] if self.dense_layers or self.moe else []),  # none in a pure Mamba2
            {"rope": "RoPE", "learned": "learned positions", "alibi": "ALiBi", "none": "no positions"}[self.positions],
        ]
        if self.partial_rotary:
            parts[-1] += f" (first {self.rotary_dim} of {self.d_head})"
        biases = [
            n
            for n, on in (
                ("qkv", self.qkv_bias),
                ("out", self.output_bias),
                ("mlp", self.mlp_bias),
                ("lm head", self.lm_head_bias),
            )
            if on
        ]
        if biases:
            parts.append("biases " + "/".join(biases))
        if self.qk_norm:
            scope = {"head": "", "projection": " (whole projection)", "head_weights": " (per-head gains)"}
            parts.append("qk-norm" + scope[self.qk_norm_scope])
        if self.sliding_window is not None:
            every = "all layers" if self.full_attention_every is None else f"full every {self.full_attention_every}"
            parts.append(f"window {self.sliding_window:,} ({every})")
        if self.attention_chunk is not None:
            parts.append(
                f"chunked attention {self.attention_chunk:,} ({self.chunked_layers} of {self.num_layers} layers)"
            )
        if self.scale_embeddings:
            parts.append("embeddings ×√d")
        if self.attention_sinks:
            parts.append("attention sinks")
        if not self.norm_weights:
            parts[0] += " (no weights)"
        if not self.norm_bias:
            parts[0] += " (no bias)"
        if self.parallel_block != "none":
            norms = "one norm" if self.parallel_block == "one_norm" else "two norms"
            parts.insert(1, f"parallel attention + MLP ({norms})")
        if self.embedding_norm:
            parts.append("embedding norm")
        if self.mla:
            q = f"q rank {self.q_lora_rank:,}, " if self.q_lora_rank else ""
            parts.append(f"MLA ({q}kv rank {self.kv_lora_rank:,})")
        if self.hybrid:
            parts.append(
                f"Gated DeltaNet hybrid (full attention every {self.full_attention_interval}; "
                f"{self.linear_key_heads}/{self.linear_value_heads} k/v heads)"
            )
        if self.attention_output_gate:
            parts.append("gated attention output")
        if self.layer_pattern is not None:
            mamba = (
                f"; Mamba2 {self.mamba_heads} heads × {self.mamba_head_dim}, state {self.mamba_state_size}"
                if self.mamba_layers
                else ""
            )
            if self.ssm_layers:
                norms = "" if self.ssm_norms == "none" else f", {self.ssm_norms} dt/B/C norms"
                mamba += (
                    f"; Mamba E {self.ssm_inner:,}, state {self.ssm_state_size:,}, dt rank {self.ssm_dt_rank:,}{norms}"
                )
            kinds = " / ".join(f"{self.layer_pattern.count(c)} {c}" for c in PATTERN_LETTERS if c in self.layer_pattern)
            ffn = ", an FFN in every layer" if self.mixer_ffn else ""
            if self.short_conv_layers:
                bias = ", biases" if self.short_conv_bias else ""
                mamba += f"; short convolutions of {self.short_conv_kernel} taps{bias}"
            parts.append(f"layer pattern {kinds}{ffn}{mamba}")
        if self.indexer:
            where = "" if self.indexer_pattern is None else f", on {self.indexer_layers} of {self.num_layers} layers"
            parts.append(
                f"DSA indexer ({self.index_heads} heads × {self.index_head_dim}, top-{self.index_topk:,}{where})"
            )
        if self.moe:
            shared = f" + {self.shared_experts} shared" if self.shared_experts else ""
            extras = [
                n
                for n, on in (
                    ("router bias", self.router_bias),
                    ("frozen score bias", self.router_score_bias),
                    ("expert biases", self.expert_bias),
                    ("sigmoid-gated shared", self.shared_expert_gate),
                    ("every expert run on every token", self.all_experts_run),
                    (f"SwiGLU clamped at {self.swiglu_limit:g}" if self.swiglu_limit else "", self.swiglu_limit),
                )
                if on
            ]
            more = f" ({', '.join(extras)})" if extras else ""
            parts.append(f"MoE {self.num_experts} experts, top-{self.experts_per_token}{shared}{more}")
        return " · ".join(parts)

    @property
    def family(self) -> str:
        """The architecture family in words: which published model these options describe."""
        if self.all_experts_run or self.attention_chunk is not None:
            return "Llama 4-style (chunked attention, NoPE layers, shared + routed experts)"
        if self.layer_pattern is not None and set(self.layer_pattern) == {"M"}:
            return "Mamba2 (state-space: every layer a Mamba2 mixer, no attention, no MLP)"
        if self.layer_pattern is not None and set(self.layer_pattern) == {"S"}:
            return "Mamba (state-space: every layer a Mamba selective-scan mixer, no attention, no MLP)"
        if self.ssm_layers:
            return "Jamba-style (Mamba + attention hybrid" + (" + MoE)" if self.moe else ")")
        if self.layer_pattern is not None:
            if self.short_conv_layers:
                return (
                    "LFM2-style (short-convolution hybrid + MoE)"
                    if self.moe
                    else "LFM2-style (short-convolution hybrid)"
                )
            style = "Nemotron-H-style"
            if self.mixer_ffn:
                style = "Falcon-H1-style" if "H" in self.layer_pattern else "Bamba-style"
            return f"{style} (Mamba2 hybrid)" if self.mamba_layers else f"{style} (layer pattern)"
        if self.indexer:
            return f"DeepSeek-V3.2-style (MLA + sparse-attention indexer{' + MoE' if self.moe else ''})"
        if self.mla:
            return "DeepSeek-style (MLA + MoE)" if self.moe else "DeepSeek-style (MLA)"
        if self.hybrid:
            return (
                "Qwen3-Next-style (Gated DeltaNet hybrid + MoE)"
                if self.moe
                else "Qwen3.5-style (Gated DeltaNet hybrid)"
            )
        if self.attention_sinks:
            return "gpt-oss-style (attention sinks + MoE)" if self.moe else "custom (attention sinks)"
        if self.shared_expert_gate:
            return "Qwen2-MoE-style (sigmoid-gated shared expert)"
        if self.partial_rotary and not [u for u in self.unsupported_for_replay() if u != "mixture of experts"]:
            return "GLM-style (partial rotary + MoE)" if self.moe else "GLM-style (partial rotary)"
        if self.moe and self.unsupported_for_replay() == ["mixture of experts"]:
            return "MoE (Mixtral-style)" if not self.qk_norm else "MoE (Qwen3-MoE-style)"
        if self.qkv_bias and not self.unsupported_for_replay():
            return "Qwen2-style (QKV bias)"
        if self.course_architecture:
            return "course (Llama-style)" if not self.qk_norm else "course + qk-norm (Qwen3-style)"
        if self.positions == "alibi" and self.embedding_norm:
            return "BLOOM-style (ALiBi + embedding norm)"
        if self.parallel_block != "none":
            return "parallel block (GPT-J, GPT-NeoX, Phi, Cohere, Falcon-style)"
        if self.positions == "learned" and self.norm == "layernorm" and self.mlp == "gelu":
            return "GPT-2"
        if self.mlp in ("relu", "relu2"):
            return "OPT-style (ReLU MLP)" if self.mlp == "relu" else "Nemotron-style (squared-ReLU MLP)"
        if self.norm_placement == "sandwich":
            return "Gemma 2/3-style"
        if self.norm_placement == "post":
            return "OLMo-2-style"
        if self.sliding_window is not None and self.unsupported_for_replay() == ["sliding-window attention"]:
            return "Mistral-style (sliding window)"
        return "custom"

    def resolved(self) -> dict[str, Any]:
        """All fields with ``num_kv_heads``/``head_dim`` filled in (for printing and JSON)."""
        out = dataclasses.asdict(self)
        out["num_kv_heads"] = self.kv_heads
        out["head_dim"] = self.d_head
        out["ignored_fields"] = list(self.ignored_fields)
        # provenance and routing details kept out of the pinned JSON key set (json_keys.json)
        del out["hf_model_type"], out["dropout"], out["norm_topk_prob"]
        del out["expert_groups"], out["expert_groups_per_token"], out["rope_interleave"], out["topk_method"]
        del out["hf_activation"], out["nope_layers"], out["moe_fp32_combine"], out["residual_in_fp32"]
        del out["router_buffer_bias"], out["mamba_norm_before_gate"], out["l2_qk_norm"], out["attn_temperature_tuning"]
        for key in ("all_experts_run", "attention_chunk"):  # Llama 4's keys appear on a model that sets them only
            if not out[key]:
                del out[key]
        if not self.indexer:  # the indexer's keys appear on a DeepSeek Sparse Attention model only
            for key in (*DSA_FIELDS, "indexer_pattern"):
                del out[key]
        if self.layer_pattern is None:  # the pattern's keys appear on a Nemotron-H-style model only
            for key in PATTERN_FIELDS:
                del out[key]
        return out

    def with_context(self, context_length: int) -> ModelConfig:
        return dataclasses.replace(self, context_length=context_length)

    def with_layers(self, num_layers: int) -> ModelConfig:
        """The same model with ``num_layers`` blocks (a pipeline stage's, one block's segment): one object per
        (config, count), so that the replays and FLOP counts asking thousands of times make and check it once."""
        return _with_layers(self, num_layers)


@lru_cache(maxsize=4096)
def _with_layers(cfg: ModelConfig, num_layers: int) -> ModelConfig:
    return dataclasses.replace(cfg, num_layers=num_layers)


def _key_types() -> dict[str, type]:
    """Each ``ModelConfig`` field's annotation, ``| None`` dropped, where that is int, float, bool or str."""
    hints, out = typing.get_type_hints(ModelConfig), {}
    for f in fields(ModelConfig):
        hint = hints[f.name]
        if typing.get_origin(hint) in (types.UnionType, typing.Union):
            hint = next(t for t in typing.get_args(hint) if t is not type(None))
        if hint in (int, float, bool, str):
            out[f.name] = hint
    return out


FIELD_TYPES: dict[str, type] = _key_types()
"""Type of each ``ModelConfig`` field as written in TOML or ``--set``, in field order, read off the dataclass's
annotations (one entry per field of a scalar type; ``ignored_fields``, a tuple, is provenance from a
config.json, not a key; ``hf_model_type`` is a key, so a preset of a published model names its transformers
class)."""

ARCHITECTURE_CHOICES: dict[str, tuple[str, ...]] = {
    "norm": ("rmsnorm", "layernorm"),
    "norm_placement": ("pre", "sandwich", "post"),
    "mlp": ("swiglu", "geglu", "gelu", "relu", "relu2"),
    "positions": ("rope", "learned", "alibi", "none"),
    "qk_norm_scope": ("head", "projection", "head_weights"),
    "parallel_block": ("none", "one_norm", "two_norms"),
}
"""The allowed values of the string architecture options; the first is the course's.

* ``norm``: RMSNorm (Zhang & Sennrich 2019; gain only) or LayerNorm (Ba et al. 2016; gain and bias).
* ``norm_placement``: ``pre`` = ``x + f(norm(x))`` (the course, Llama); ``sandwich`` = pre-norm plus a norm
  on each sublayer's output, ``x + norm(f(norm(x)))`` (Gemma 2/3); ``post`` = ``x + norm(f(x))``, no pre-norm
  (OLMo-2).
* ``mlp``: ``swiglu`` = ``W2(SiLU(W1 x) ⊙ W3 x)``; ``geglu`` = the same with GELU (tanh approximation,
  Gemma's ``gelu_pytorch_tanh``); ``gelu`` = the 2-matrix ``proj(GELU(fc x))`` of GPT-2; ``relu`` = the same with
  ReLU (OPT's ``fc1``/``fc2``, transformers' models/opt); ``relu2`` = the same with squared ReLU, ``ReLU(x)²`` (So et
  al. 2021, "Primer"; Nemotron's ``up_proj``/``down_proj``, transformers' ``ReLUSquaredActivation``).
* ``positions``: ``rope`` (no parameters), ``learned`` (a ``max_position_embeddings x d_model`` table added
  to the token embeddings, GPT-2; ``position_offset`` rows before position 0, OPT's 2, serve no position) or ``alibi`` (Press et al. 2022: head i adds ``m_i · j`` to its score for key
  j, no parameters; BLOOM, transformers' ``build_alibi_tensor``) or ``none`` (NoPE: attention sees no position,
  Nemotron-H's ``NemotronHAttention`` applies no rotary embedding; order comes from its Mamba2 layers).
* ``qk_norm_scope``: ``head`` = one RMSNorm of ``head_dim`` on every Q and K head (Qwen3, Gemma 3);
  ``projection`` = one RMSNorm over the whole Q (``h·head_dim``) and K (``kv·head_dim``) projection (OLMo-2);
  ``head_weights`` = each head normalised over its ``head_dim`` with a gain of its own, ``(h, head_dim)`` and
  ``(kv, head_dim)`` (Cohere's ``use_qk_norm``).  With ``norm = layernorm`` the q/k norms are LayerNorms like the
  block's (a bias unless ``norm_bias = false``: Phi's ``qk_layernorm``, Cohere's), else RMSNorms.
* ``parallel_block``: ``none`` = attention then the MLP, each on its own residual step; ``one_norm`` =
  ``x + attn(ln1(x)) + mlp(ln1(x))``, one norm feeding both (GPT-J, Phi-1/2, Cohere, Falcon: transformers'
  ``GPTJBlock``, ``PhiDecoderLayer``, ``CohereDecoderLayer``); ``two_norms`` = ``x + attn(ln1(x)) +
  mlp(ln2(x))`` (GPT-NeoX/Pythia with ``use_parallel_residual``).  The same matmuls; ``one_norm`` has no ln2.

Booleans: ``qkv_bias`` (Q, K and V projections), ``output_bias`` (attention output projection),
``mlp_bias`` (every FFN matrix), ``scale_embeddings`` (Gemma: token embeddings × √d_model), ``norm_bias``
(false: LayerNorms with a gain and no bias, Cohere's ``CohereLayerNorm``).
``sliding_window`` (keys a windowed query sees, itself included) with ``full_attention_every`` (None:
every layer windowed, Mistral; n: every n-th layer full, Gemma 2 n = 2, Gemma 3 n = 6).
``attention_sinks`` (gpt-oss): one learned logit per query head joins every row of the attention softmax
as an extra column and is dropped after it (``GptOssAttention.sinks``, ``eager_attention_forward``): h
parameters per layer, no matmul.  ``norm_weights = false`` (OLMo): the block norms and the final norm have no
gain and no bias (``OlmoLayerNorm``: ``F.layer_norm(x, shape, None, None)``); a qk-norm keeps its gain.
``embedding_norm`` (BLOOM's ``word_embeddings_layernorm``): a norm of the config's kind on the token embeddings,
before the first block.  ``lm_head_bias``: the LM head has a bias of V (Ernie 4.5-MoE's ``use_bias``, Phi's,
CTRL's; a tied head shares its weight only).  ``rotary_dim`` (partial rotary; GLM-4.5, MiniMax-M2,
StableLM): RoPE rotates the first ``rotary_dim`` dimensions of each Q and K head (even, at most ``head_dim``; None:
all), the rest pass through and are concatenated back (``Glm4MoeAttention``: ``q_rot``/``q_pass``); no parameter,
no matmul."""


MLP_NAMES = {"swiglu": "SwiGLU", "geglu": "GeGLU", "gelu": "GELU MLP", "relu": "ReLU MLP", "relu2": "squared-ReLU MLP"}
"""Each ``mlp`` value in words (``ModelConfig.architecture``)."""


MOE_DEFAULTS: dict[str, Any] = {
    "num_experts": None,
    "experts_per_token": None,
    "expert_d_ff": None,
    "shared_experts": 0,
    "shared_expert_d_ff": None,
    "dense_layers_first": 0,
    "moe_every": 1,
    "router_bias": False,
    "router_score_bias": False,
    "expert_bias": False,
    "shared_expert_gate": False,
    "swiglu_limit": None,
}
"""The mixture-of-experts options and their defaults (a dense model).  ``num_experts`` routed experts, each a
SwiGLU of width ``expert_d_ff`` (default ``d_ff``); a router (a d -> E linear map on every token) picks
``experts_per_token`` (top-k) of them per token; ``shared_experts`` run on every token (together one SwiGLU of
width ``shared_experts · shared_expert_d_ff``, as DeepSeek builds them); the first ``dense_layers_first``
layers keep a dense FFN of width ``d_ff`` (DeepSeek's ``first_k_dense_replace``), and from there every
``moe_every``-th layer is sparse (Qwen's ``decoder_sparse_step``).  ``router_bias``: the router has a bias of
E (gpt-oss's ``GptOssTopKRouter.bias``); ``router_score_bias``: a frozen bias of E added to the router's probabilities
to pick the top k (Ernie 4.5's ``moe_statics.e_score_correction_bias``, ``requires_grad=False``: a parameter with no
gradient and no optimizer state); ``shared_expert_gate``: the shared experts' output is scaled per token
by σ(x·w_g), a d -> 1 linear map behind a sigmoid (Qwen2-MoE's ``shared_expert_gate``); ``swiglu_limit``: the
routed experts run gpt-oss's clamped SwiGLU, ``(clamp(up, ±l) + 1) · g·σ(1.702·g)`` with ``g = min(gate, l)``
(``GptOssExperts._apply_gate``; the same matmuls as SwiGLU); ``expert_bias`` puts a bias on every routed
expert's W1, W3 (gpt-oss's ``gate_up_proj_bias``) and W2 (``down_proj_bias``); ``mlp_bias`` is the dense FFNs'
and the shared experts' (Ernie 4.5's ``use_bias``)."""
MOE_FIELDS = tuple(MOE_DEFAULTS)
MOE_FLAGS = ("router_bias", "router_score_bias", "expert_bias", "shared_expert_gate")
"""The true/false mixture-of-experts options."""

LINEAR_FIELDS = (
    "full_attention_interval",
    "linear_key_heads",
    "linear_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel",
)
"""Gated DeltaNet hybrids (Yang et al. 2024, arXiv:2412.06464; transformers' ``Qwen3NextGatedDeltaNet``, models/
qwen3_next/modeling_qwen3_next.py, and ``Qwen3_5GatedDeltaNet``): layer i has softmax attention when (i + 1) %
``full_attention_interval`` == 0, the others a Gated DeltaNet: projections of q, k (``linear_key_heads`` heads of
``linear_key_head_dim``), v and the output gate z (``linear_value_heads`` of ``linear_value_head_dim``), β and α
(one per value head), a depthwise causal conv1d of ``linear_conv_kernel`` taps over q, k, v, the per-head
``dt_bias`` and ``A_log``, the gated delta rule, a gated RMSNorm of ``linear_value_head_dim`` and ``out_proj``.
``attention_output_gate`` (Qwen3-Next's gated attention): ``q_proj`` also gives a per-element gate,
``o_proj(attn · σ(gate))``, doubling its width (our ``attn.q_gate``)."""

MAMBA_FIELDS = (
    "mamba_heads",
    "mamba_head_dim",
    "mamba_state_size",
    "mamba_groups",
    "mamba_conv_kernel",
    "mamba_chunk_size",
)
"""Mamba2 mixer layers (Dao & Gu 2024, arXiv:2405.21060; transformers' ``NemotronHMamba2Mixer``, models/nemotron_h/
modeling_nemotron_h.py, config ``NemotronHConfig``): ``in_proj`` (d -> the gate z and x of ``mamba_heads ·
mamba_head_dim``, B and C of ``mamba_groups · mamba_state_size`` each, one dt per head; no bias), a depthwise causal
conv1d of ``mamba_conv_kernel`` taps with a bias over x, B, C, the per-head ``dt_bias``, ``A_log`` and ``D``, the
chunked SSD scan (chunks of ``mamba_chunk_size``), a gated RMSNorm of ``heads · head_dim`` (normalised per group)
and ``out_proj`` (no bias)."""
PATTERN_LETTERS = ("M", "*", "-", "E", "H", "C", "S")
"""``layer_pattern``'s letters, Nemotron-H's ``hybrid_override_pattern``: ``M`` a Mamba2 mixer, ``*`` attention,
``-`` an MLP; each layer is one pre-norm block ``x + mixer(norm(x))`` (``NemotronHBlock``), so a layer has no
second norm and no second residual add; ``E`` a mixture of experts (``NemotronHMoE``: a router of E sigmoid scores,
routed experts of the config's 2-matrix ``mlp`` without a gate, ``up_proj`` and ``down_proj``, over
``expert_latent`` features when set, between ``fc1_latent_proj`` and ``fc2_latent_proj``, and one always-on shared
expert, a ``NemotronHMLP`` of ``shared_expert_d_ff``).  With
``mixer_ffn`` (Bamba's ``BambaDecoderLayer``, models/bamba/modeling_bamba.py) every layer is a Llama block whose
attention is replaced by its mixer: ``x + mixer(ln1(x))``, then ``+ ffn(ln2(x))``; its letters are ``M``, ``*`` and
``H``, attention and a Mamba2 mixer side by side on the same norm, their outputs summed (Falcon-H1's
``FalconH1DecoderLayer``, models/falcon_h1/modeling_falcon_h1.py), and ``C``, a short convolution (LFM2's
``Lfm2ShortConv``, models/lfm2/modeling_lfm2.py: ``in_proj`` d -> 3·d, the gates B and C and the input x; B·x through a
depthwise causal conv1d of ``short_conv_kernel`` taps (``conv_L_cache``); C times its output; ``out_proj`` d -> d;
with ``short_conv_bias`` (``conv_bias``) a bias on all three).  ``mamba_norm`` false: the Mamba2 mixers have no
gated RMSNorm (Falcon-H1's ``mamba_rms_norm``; the gate still multiplies).  ``S`` a Mamba (v1) selective-scan mixer
(``SSM_FIELDS``), in a block of its own (``MambaBlock``) or, with ``mixer_ffn``, as a Jamba layer's mixer."""
SSM_FIELDS = ("ssm_inner", "ssm_state_size", "ssm_dt_rank", "ssm_conv_kernel")
"""Mamba (v1) selective-scan mixer layers (Gu & Dao 2023, arXiv:2312.00752; transformers' ``MambaMixer``,
models/mamba/modeling_mamba.py, config ``MambaConfig``): ``in_proj`` (d -> x and the gate z, ``ssm_inner`` = E each;
no bias), a depthwise causal conv1d of ``ssm_conv_kernel`` taps with a bias over x, ``x_proj`` (E -> dt's rank
``ssm_dt_rank`` = R and B and C of ``ssm_state_size`` = N each; no bias), ``dt_proj`` (R -> E, with a bias),
``A_log`` (E x N), ``D`` (E), the selective scan, ``out_proj`` (E -> d, no bias)."""
SSM_NORMS = ("none", "weightless", "rmsnorm")
"""RMSNorms on a Mamba mixer's dt, B and C after ``x_proj``: ``none`` (Mamba's), ``weightless`` (Falcon-Mamba's
``FalconMambaWeightlessRMSNorm``: no parameter, ``mixer_rms_eps``), ``rmsnorm`` (Jamba's ``dt_layernorm``,
``b_layernorm``, ``c_layernorm``: gains of R, N and N)."""
PATTERN_FIELDS = (
    *("layer_pattern", "mixer_ffn", "mamba_norm", *MAMBA_FIELDS, "expert_latent"),
    *("short_conv_kernel", "short_conv_bias", *SSM_FIELDS, "ssm_norms"),
)

DSA_FIELDS = ("index_heads", "index_head_dim", "index_topk")
"""DeepSeek Sparse Attention (DeepSeek-V3.2-Exp; transformers' ``DeepseekV32Indexer``, models/deepseek_v32/
modeling_deepseek_v32.py, and GLM-5's ``GlmMoeDsaIndexer``): beside each layer's latent attention a lightning
indexer projects the query latent to ``index_heads`` heads of ``index_head_dim`` (``wq_b``), the hidden state to
one key of ``index_head_dim`` (``wk``, then a LayerNorm ``k_norm``) and to one weight per head
(``weights_proj``), scores every query against every key (ReLU, weighted sum over the heads) and keeps the
``index_topk`` best keys per query, which become the attention mask (config.json's ``index_n_heads``,
``index_head_dim``, ``index_topk``).  ``indexer_pattern`` (GLM-5's ``indexer_types``, optional): one letter per
layer, ``F`` a layer with its indexer, ``S`` one without, reusing the previous ``F`` layer's top-k."""

MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1): queries through an optional low-rank
``q_lora_rank`` bottleneck (with an RMSNorm), keys and values from one ``kv_lora_rank`` latent (with an
RMSNorm) plus one shared RoPE key of ``qk_rope_head_dim``; per head, Q and K have
``qk_nope_head_dim + qk_rope_head_dim`` dimensions and V has ``v_head_dim``."""


def check_nonnegative_int(name: str, value: Any, error: type[AccountingError] = ConfigError) -> None:
    """An int in [0, 10^18]."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an integer, got {short_repr(value)}")
    if value < 0:
        raise error(f"{name} must be zero or positive, got {short_repr(value)}")
    if value > MAX_SIZE:
        raise error(f"{name} = {_sci(value)} is beyond the supported {_sci(MAX_SIZE)}")


def check_positive_int(
    name: str, value: Any, error: type[AccountingError] = AccountingError, limit: int | None = MAX_SIZE
) -> None:
    """The one check for every count the user gives: an int, >= 1 and (by default) <= 10^18.

    Safe for ints of any length: the message shows at most a few digits (``short_repr``)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an integer, got {short_repr(value)}")
    if value <= 0:
        raise error(f"{name} must be positive, got {short_repr(value)}")
    if limit is not None and value > limit:
        raise error(f"{name} = {_sci(value)} is beyond the supported {_sci(limit)}")


def _sci(value: int) -> str:
    """``1e+18`` or ``1.234e+4999``: an int of any length in short scientific notation, no float."""
    if value == 10**18:
        return "10^18"
    digits = _digit_count(value)
    if digits <= 4:
        return str(value)
    lead = value // 10 ** (digits - 4)
    return f"{lead // 1000}.{lead % 1000:03d}e+{digits - 1}"


# -- building configs from TOML and overrides --------------------------------
def config_from_mapping(data: Mapping[str, Any], source: str) -> ModelConfig:
    """Build a config from flat ``key = value`` pairs; ``source`` names the file in errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected key = value pairs, got {type(data).__name__}")
    unknown = [k for k in data if k not in FIELD_TYPES]
    if unknown:
        valid = ", ".join(FIELD_TYPES)
        raise ConfigError(f"{source}: unknown key {short_repr(unknown[0])} (valid keys: {valid})")
    missing = [f.name for f in fields(ModelConfig) if f.default is dataclasses.MISSING and f.name not in data]
    if missing:
        raise ConfigError(f"{source}: missing key '{missing[0]}'")
    clean = {}
    for key, value in data.items():
        want = FIELD_TYPES[key]
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = positive_number(value, f"{source}: key '{key}'"), True  # 10^400 overflows a float
        if not ok:
            raise ConfigError(f"{source}: key '{key}' must be {want.__name__}, got {short_repr(value)}")
        clean[key] = value
    try:
        return ModelConfig(**clean)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML config file, refusing anything that is not a small regular UTF-8 file
    (``read_config_text``).  Every failure is a one-line ``ConfigError``."""
    text = read_config_text(path, "TOML")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: malformed TOML: {err}") from None
    except ValueError:  # tomllib passes on int()'s refusal of integers over 4,300 digits
        raise ConfigError(
            f"{path}: an integer has more than 4,300 digits (every count must be at most 10^18)"
        ) from None
    except RecursionError:
        raise ConfigError(f"{path}: malformed TOML: nested too deeply") from None


def read_config_text(path: Path, kind: str = "TOML") -> str:
    """The text of a config file, refusing anything that is not a small regular UTF-8 file.

    The file is opened non-blocking (a FIFO cannot hang the open) and checked with ``fstat``
    before a byte is read: a directory, FIFO, socket or device (``/dev/zero``) is refused, and so
    is a file over ``MAX_CONFIG_BYTES`` (1 MiB).  ``kind`` names the expected format in errors.
    Every failure is a one-line ``ConfigError``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a {kind} file") from None
    except PermissionError:
        raise ConfigError(f"{path}: cannot read: permission denied") from None
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        raise ConfigError(f"{path}: cannot read: {getattr(err, 'strerror', None) or err}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{path}: is a directory, not a {kind} file")
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: not a regular file ({_file_kind(info.st_mode)}); give a {kind} file")
        if info.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(
                f"{path}: {info.st_size:,} bytes is too large for a config file (at most {MAX_CONFIG_BYTES:,} bytes)"
            )
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            raw = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from None
    finally:
        if fd >= 0:
            os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:  # it grew after the check
        raise ConfigError(f"{path}: too large for a config file (at most {MAX_CONFIG_BYTES:,} bytes)")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None


def _file_kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return kind
    return "not a regular file"


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]+")


def file_label(path: Path, stem: str) -> str:
    """The model name of a config read from the file ``path`` when the file gives none: ``stem`` (the file's,
    or a config.json's folder's) with control characters (a tab in a folder name) as spaces and at most
    ``MAX_NAME_CHARS`` long; the path itself when that name is a preset's (a local ``gpt2-xl.toml`` is labelled
    as the file it is, not as the preset)."""
    name = _CONTROL_CHARS.sub(" ", stem).strip()[:MAX_NAME_CHARS].strip() or "custom"
    if name in preset_names():
        name = _CONTROL_CHARS.sub(" ", str(path)).strip()[-MAX_NAME_CHARS:].strip()
    return name


def positive_number(value: Any, what: str) -> float:
    """``value`` (an int of any length or a float) as a positive finite float, or a one-line ``ConfigError``
    naming ``what``: an int past the float range (310+ digits) is refused, never an ``OverflowError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what} must be a number, got {short_repr(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not 0 < number < math.inf:
        raise ConfigError(f"{what} must be a positive finite number, got {short_repr(value)}")
    return number


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


CONFIG_SUFFIXES = (".toml", ".json")
"""File name endings that make an argument a file path: a TOML config or a Hugging Face config.json."""


def is_config_path(name_or_path: str | os.PathLike) -> bool:
    """The preset-name vs file-path rule (see ``load_config``)."""
    if isinstance(name_or_path, os.PathLike):
        return True
    seps = {"/", os.sep} | ({os.altsep} if os.altsep else set())
    return any(sep in name_or_path for sep in seps) or name_or_path.lower().endswith(CONFIG_SUFFIXES)


def load_config(name_or_path: str | os.PathLike) -> ModelConfig:
    """A preset by name (``gpt2-xl``) or a user's TOML file.

    The rule, decided from the argument alone, never from what happens to exist on disk:

    - a ``pathlib.Path`` (any ``os.PathLike``) is a file path;
    - a ``str`` is a file path if it contains a path separator (``/``) or ends in ``.toml`` or
      ``.json`` (``./gpt2-xl``, ``configs/big.toml``, ``big.toml``, ``config.json``);
    - a path ending in ``.json`` is a Hugging Face config.json (``hf_config.load_hf_config``); any
      other path is a TOML file;
    - any other ``str`` is a preset name (``gpt2-xl``).  A file or folder in the current
      directory never replaces a preset: a bare name that is not a preset but exists as a
      local file is refused with a hint to write ``./name``.

    A config file must be a regular, UTF-8 file of at most 1 MiB (``read_config_text``)."""
    if isinstance(name_or_path, os.PathLike):
        path = Path(name_or_path)
    elif isinstance(name_or_path, str):
        path = None
    else:
        raise ConfigError(
            f"load_config expects a preset name or a path (str or pathlib.Path), "
            f"got {type(name_or_path).__name__} {short_repr(name_or_path)}"
        )
    if path is not None or is_config_path(name_or_path):
        path = path if path is not None else Path(name_or_path)
        if path.name.lower().endswith(".json"):  # a Hugging Face config.json (lm_accounting.hf_config)
            from .hf_config import load_hf_config

            return load_hf_config(path)
        data = read_toml(path)
        if "name" not in data:
            data["name"] = file_label(path, path.stem)
        return config_from_mapping(data, str(path))
    if not name_or_path.strip():
        raise ConfigError("empty preset name; give a preset (see `lm-account presets`) or a path to a .toml file")
    names = preset_names()
    if name_or_path not in names:
        shown = short_repr(name_or_path)
        try:
            local = os.path.lexists(name_or_path)
        except (OSError, ValueError):
            local = False
        if local:
            raise ConfigError(
                f"{shown} is not a preset (`lm-account presets` lists them); to read the local file, "
                f"write it as a path: ./{name_or_path}"
            )
        close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.4)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"unknown preset {shown}{hint} (valid presets: {', '.join(names)}; or give a path to a Hugging Face "
            "config.json or a .toml file, e.g. ./config.json)"
        )
    preset = PRESET_DIR / f"{name_or_path}.toml"
    data = read_toml(preset)
    data.setdefault("name", name_or_path)
    return config_from_mapping(data, str(preset))


_INT_TEXT = re.compile(r"[+-]?[0-9][0-9_]*")


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line, typed by the field it sets.

    Integers of any length are handled: more than 30 digits is refused without ``int()``
    (whose 4,300-digit limit would raise) and echoed shortened."""
    if not isinstance(text, str):
        raise ConfigError(f"--set expects key=value, got {short_repr(text)}")
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got {short_repr(text)}")
    if key not in FIELD_TYPES:
        raise ConfigError(f"--set: unknown key {short_repr(key)} (valid keys: {', '.join(FIELD_TYPES)})")
    want = FIELD_TYPES[key]
    try:
        if want is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return key, raw.lower() in ("true", "1", "yes")
        if want is int:
            if not _INT_TEXT.fullmatch(raw):
                raise ValueError
            digits = raw.lstrip("+-").replace("_", "").lstrip("0")
            if len(digits) > 30:
                raise ConfigError(f"--set: {key} = {digits[:4]}…({len(digits):,} digits) is beyond the supported 10^18")
            return key, int(raw.replace("_", ""))
        if want is float:
            value = float(raw)
            if not 0 < value < math.inf:
                raise ConfigError(f"--set: {key} must be a positive finite number, got {short_repr(raw)}")
            return key, value
        return key, raw
    except ValueError as err:
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"--set: key '{key}' must be {want.__name__}, got {short_repr(raw)}") from None


def apply_overrides(cfg: ModelConfig, overrides: Mapping[str, Any]) -> ModelConfig:
    """Replace fields; re-runs validation so an override cannot produce an impossible shape."""
    if not overrides:
        return cfg
    if not isinstance(cfg, ModelConfig):
        raise ConfigError(f"apply_overrides expects a ModelConfig, got {type(cfg).__name__}")
    if not isinstance(overrides, Mapping):
        raise ConfigError(f"overrides must be a mapping of field names to values, got {type(overrides).__name__}")
    unknown = [k for k in overrides if k not in FIELD_TYPES]
    if unknown:
        raise ConfigError(f"unknown field {short_repr(unknown[0])} (valid keys: {', '.join(FIELD_TYPES)})")
    data = {f.name: getattr(cfg, f.name) for f in fields(ModelConfig)}
    data.update(overrides)
    try:
        return ModelConfig(**data)
    except ConfigError as err:
        shown = ", ".join(f"{k}={short_repr(v)}" for k, v in overrides.items())
        raise ConfigError(f"after overrides {{{shown}}}: {err}") from None
