"""Read a Hugging Face ``config.json`` into a ``ModelConfig``, offline, without torch or transformers.

``lm-account path/to/config.json`` (any path ending in ``.json``, see ``config.load_config``) goes through
``load_hf_config``: the file is read with the same safety checks as a TOML config (a small regular UTF-8
file, ``config.read_config_text``), parsed as strict JSON, and mapped field by field.

The rules:

* ``model_type`` picks the mapping.  Supported: ``SUPPORTED_MODEL_TYPES``, mixture-of-experts (mixtral,
  qwen3_moe) and latent-attention (deepseek_v2, deepseek_v3) types included.  A known type with a piece
  not modelled (``LATER_MODEL_TYPES``) is refused with a line saying what; any other type is refused
  naming it and listing the supported ones.
* Every field is one of: *read* (it sets a ``ModelConfig`` field, or is checked to have the one value we
  model, e.g. ``add_cross_attention = false``), *ignored* (it changes no parameter or FLOP count: dropout,
  soft-capping, rope scaling, token ids, generation settings, ...; listed in ``ModelConfig.ignored_fields``
  and so in every JSON result), or *not understood*, which is refused naming the field: we cannot tell
  whether it changes the counts.
* A wrong type (a string where a count goes, a float for an int, ``true`` for a number) or a missing shape
  field is a one-line ``ConfigError`` naming the field.

Defaults when a field is absent are transformers' own (the ``*Config`` class defaults of transformers 5.x,
checked by tests/test_transformers_truth.py): ``num_key_value_heads`` -> ``num_attention_heads``;
``head_dim`` -> ``hidden_size / num_attention_heads``; ``tie_word_embeddings`` -> the class default, True for
gpt2, gemma2 and gemma3_text (and for ``PretrainedConfig`` itself) but False for llama, mistral, qwen2,
qwen3, phi3 and olmo2, whose config classes set it; ``rope_theta`` -> 10,000 (transformers v5 nests it in
``rope_parameters``; both places are read).  Model-type facts that are not fields: Qwen2 has Q/K/V biases
and no output bias; Qwen3 and Gemma 3 normalise Q and K per head, OLMo-2 over the whole projection;
Gemma 2/3 use sandwich norms, a GeGLU MLP and scale the embeddings by √d; OLMo-2 puts its norms after the
sublayers.  Gemma's ``(1 + w)`` RMSNorm gain has the same parameter count as ``w`` and is not modelled
otherwise.  Phi-3's fused ``qkv_proj`` and ``gate_up_proj`` are read as our separate ``q/k/v_proj`` and
``w1``/``w3`` (the same matmuls, split; see ``model.transformer``).  Mixture of experts: Mixtral's experts have
the dense ``intermediate_size`` (``num_local_experts``), Qwen3-MoE's ``moe_intermediate_size``
(``num_experts``; ``decoder_sparse_step``), DeepSeek's ``moe_intermediate_size`` with ``n_shared_experts``
after ``first_k_dense_replace`` dense layers of ``intermediate_size``; routing details (group-limited top-k,
scaling, auxiliary losses) change which experts, not how many, and are ignored.  DeepSeek's ``head_dim`` is
the RoPE part of a head only (checked to equal ``qk_rope_head_dim``), and ``q_lora_rank: null`` means a plain
query projection.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .config import MAX_SIZE, ConfigError, ModelConfig, read_config_text, short_repr

SUPPORTED_MODEL_TYPES = (
    "gpt2",
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo2",
    "deepseek_v2",
    "deepseek_v3",
)
LATER_MODEL_TYPES = {
    "qwen2_moe": "a shared expert behind its own sigmoid gate (shared_expert_gate)",
}
"""Known model types with a piece not modelled yet, refused with a line saying what."""

IGNORED_EVERYWHERE = frozenset(
    [
        "_name_or_path",
        "architectures",
        "auto_map",
        "model_type",
        "transformers_version",
        "dtype",
        "torch_dtype",
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
        "sep_token_id",
        "decoder_start_token_id",
        "id2label",
        "label2id",
        "num_labels",
        "problem_type",
        "tokenizer_class",
        "prefix",
        "task_specific_params",
        "finetuning_task",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "is_decoder",
        "output_attentions",
        "output_hidden_states",
        "return_dict",
        "torchscript",
        "tf_legacy_loss",
        "use_bfloat16",
        "pruned_heads",
        "tie_encoder_decoder",
        "cross_attention_hidden_size",
        "initializer_range",
        "attn_implementation",
        "_attn_implementation",
        "_attn_implementation_autoset",
        "max_length",
        "min_length",
        "do_sample",
        "early_stopping",
        "num_beams",
        "num_beam_groups",
        "diversity_penalty",
        "temperature",
        "top_k",
        "top_p",
        "typical_p",
        "repetition_penalty",
        "length_penalty",
        "no_repeat_ngram_size",
        "encoder_no_repeat_ngram_size",
        "bad_words_ids",
        "num_return_sequences",
        "output_scores",
        "return_dict_in_generate",
        "forced_bos_token_id",
        "forced_eos_token_id",
        "remove_invalid_values",
        "exponential_decay_length_penalty",
        "suppress_tokens",
        "begin_suppress_tokens",
        "cache_implementation",
        "quantization_config",
        "attention_dropout",
        "hidden_dropout",
        "embd_pdrop",
        "resid_pdrop",
        "attn_pdrop",
        "rope_scaling",
        "original_max_position_embeddings",
        "pretraining_tp",
    ]
)
"""Fields that change no parameter or FLOP count in any supported model type: bookkeeping, token ids,
generation settings, initialisation, dropout (off in a forward count), RoPE scaling (changes the angles,
not the shapes), tensor-parallel hints, and the storage format of weights (``quantization_config``: the
parameter count is the same; bytes per parameter are the memory commands' ``--dtype``)."""

_DEEPSEEK_ROUTING = (
    "n_group",
    "topk_group",
    "topk_method",
    "routed_scaling_factor",
    "norm_topk_prob",
    "scoring_func",
    "aux_loss_alpha",
    "seq_aux",
    "output_router_logits",
    "router_aux_loss_coef",
    "ep_size",
    "rope_interleave",
    "num_nextn_predict_layers",
    "num_mtp_layers",
)
"""DeepSeek fields that change which experts a token picks, or how their outputs are scaled, but not how many
(group-limited routing, scaling factors, auxiliary losses, expert-parallel hints, the interleaved RoPE layout),
and the multi-token-prediction module, which transformers does not build (so neither do we: DeepSeek-V3's
671B excludes its 14B MTP layer)."""

IGNORED_BY_TYPE = {
    "gpt2": frozenset(
        [
            "n_ctx",
            "scale_attn_weights",
            "scale_attn_by_inverse_layer_idx",
            "reorder_and_upcast_attn",
            "summary_type",
            "summary_use_proj",
            "summary_activation",
            "summary_proj_to_labels",
            "summary_first_dropout",
        ]
    ),
    "gemma2": frozenset(["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"]),
    "gemma3_text": frozenset(
        ["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "rope_local_base_freq"]
    ),
    "mixtral": frozenset(["router_jitter_noise", "output_router_logits", "router_aux_loss_coef"]),
    "qwen3_moe": frozenset(["norm_topk_prob", "output_router_logits", "router_aux_loss_coef"]),
    "deepseek_v2": frozenset(_DEEPSEEK_ROUTING),
    "deepseek_v3": frozenset(_DEEPSEEK_ROUTING),
}
"""Per model type: soft-capping (a tanh on logits), the attention scale (a different constant), GPT-2's
alternative scalings and its sequence-summary head (used only by GPT2DoubleHeadsModel)."""

GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python")
SILU_ACTIVATIONS = ("silu", "swish")


class _Fields:
    """The config.json object with bookkeeping: what was read, what was ignored, in the file's order."""

    def __init__(self, data: Mapping[str, Any], source: str, model_type: str):
        self.data, self.source, self.model_type = data, source, model_type
        self.used: set[str] = {"model_type"}
        self.ignored_parts: list[str] = []  # ignored entries inside a read object (rope_parameters.factor)

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.used.add(key)
        return self.data.get(key, default)

    def int(self, key: str, default: Any = ..., *, allow_none: bool = False, null: bool = True) -> int | None:
        """An integer field in [1, 10^18]; ``default=...`` makes it required.  ``null=False``: an explicit
        null is refused rather than read as the default (a count whose absence changes the model)."""
        if key not in self.data:
            if default is ...:
                raise self.error(f"missing required field '{key}' (model_type '{self.model_type}')")
            self.used.add(key)
            return default
        value = self.raw(key)
        if value is None and null and (allow_none or default is not ...):
            return default if default is not ... else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"field '{key}' must be an integer, got {short_repr(value)}")
        if not 1 <= value <= MAX_SIZE:
            raise self.error(f"field '{key}' must be between 1 and 10^18, got {short_repr(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(f"field '{key}' must be a number, got {short_repr(value)}")
        try:
            value = float(value)
        except OverflowError:
            value = math.inf
        if not 0 < value < math.inf:
            raise self.error(f"field '{key}' must be a positive finite number, got {short_repr(self.data[key])}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"field '{key}' must be true or false, got {short_repr(value)}")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.raw(key, default)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(f"field '{key}' must be a string, got {short_repr(value)}")
        return value

    def only(self, key: str, allowed: tuple, what: str) -> None:
        """A count-relevant field we model only at ``allowed`` values (absent = the first)."""
        value = self.raw(key, allowed[0])
        if value is None:
            value = allowed[0]
        if type(value) is not type(allowed[0]) or value not in allowed:
            raise self.error(f"field '{key}' = {short_repr(value)} is not supported: {what}")

    def not_understood(self) -> list[str]:
        known = self.used | IGNORED_EVERYWHERE | IGNORED_BY_TYPE.get(self.model_type, frozenset())
        return [k for k in self.data if k not in known]

    def ignored(self) -> tuple[str, ...]:
        return tuple(k for k in self.data if k not in self.used) + tuple(self.ignored_parts)


def _rope_theta(f: _Fields) -> float:
    """``rope_theta`` at the top level (transformers v4) or in ``rope_parameters`` (v5; for Gemma 3 the
    full-attention entry).  RoPE has no parameters: the value only fills the live model's tables."""
    theta = f.number("rope_theta", 10_000.0)
    params = f.raw("rope_parameters")
    if params is None:
        return theta
    if not isinstance(params, Mapping):
        raise f.error(f"field 'rope_parameters' must be an object, got {short_repr(params)}")
    prefix = "rope_parameters."
    if "full_attention" in params and isinstance(params["full_attention"], Mapping):
        f.ignored_parts += [f"{prefix}{k}" for k in params if k != "full_attention"]  # the local layers' theta
        params, prefix = params["full_attention"], f"{prefix}full_attention."
    f.ignored_parts += [f"{prefix}{k}" for k in params if k not in ("rope_theta", "partial_rotary_factor")]
    partial = params.get("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise f.error(
            f"field 'rope_parameters.partial_rotary_factor' = {short_repr(partial)} is not supported: "
            "RoPE on every dimension only"
        )
    value = params.get("rope_theta", theta)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise f.error(f"field 'rope_parameters.rope_theta' must be a positive finite number, got {short_repr(value)}")
    return float(value)


def _window(f: _Fields, *, default_every: int | None) -> dict[str, Any]:
    """``sliding_window`` and which layers use it: ``layer_types`` if given (it must follow the
    ``full_attention_every`` rule), else every layer (``default_every`` None) or every n-th layer full."""
    window = f.int("sliding_window", None, allow_none=True)
    layers = f.data.get("num_hidden_layers")
    every = default_every
    if f.has("sliding_window_pattern") or f.has("_sliding_window_pattern"):
        key = "sliding_window_pattern" if f.has("sliding_window_pattern") else "_sliding_window_pattern"
        every = f.int(key, default_every, allow_none=True)
    types = f.raw("layer_types")
    if types is not None:
        if not isinstance(types, list) or not all(t in ("full_attention", "sliding_attention") for t in types):
            raise f.error("field 'layer_types' must be a list of 'full_attention' / 'sliding_attention'")
        if isinstance(layers, int) and len(types) != layers:
            raise f.error(f"field 'layer_types' lists {len(types)} layers, num_hidden_layers is {layers}")
        if "sliding_attention" not in types:
            return {}
        if window is None:
            raise f.error("field 'layer_types' has sliding_attention layers but 'sliding_window' is null")
        for candidate in (None, *range(2, len(types) + 1)):
            cfg_types = [
                "sliding_attention" if candidate is None or (i + 1) % candidate else "full_attention"
                for i in range(len(types))
            ]
            if cfg_types == types:
                return {"sliding_window": window, "full_attention_every": candidate}
        raise f.error(
            "field 'layer_types' is not understood: lm-accounting models windowed layers as all, or all but every n-th"
        )
    if window is None:
        return {}
    if every == 1:  # a pattern of 1: every layer is full attention
        return {}
    return {"sliding_window": window, "full_attention_every": every}


def _activation(f: _Fields, key: str, default: str) -> str:
    """``hidden_act`` / ``hidden_activation`` of a gated MLP -> ``swiglu`` or ``geglu``."""
    act = f.str(key, default)
    if act in SILU_ACTIVATIONS:
        return "swiglu"
    if act in GELU_ACTIVATIONS:
        return "geglu"
    raise f.error(f"field '{key}' = {short_repr(act)} is not supported: a gated MLP with SiLU or GELU")


def _common(f: _Fields, *, tie_default: bool) -> dict[str, Any]:
    """The Llama-style fields shared by every supported type except gpt2."""
    heads = f.int("num_attention_heads")
    out = dict(
        vocab_size=f.int("vocab_size"),
        d_model=f.int("hidden_size"),
        num_layers=f.int("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=f.int("num_key_value_heads", None),
        head_dim=f.int("head_dim", None),
        d_ff=f.int("intermediate_size"),
        context_length=f.int("max_position_embeddings"),
        rope_theta=_rope_theta(f),
        norm_eps=f.number("rms_norm_eps", 1e-6),
        tie_embeddings=f.bool("tie_word_embeddings", tie_default),
    )
    return out


def _gpt2(f: _Fields) -> dict[str, Any]:
    d = f.int("n_embd")
    positions = f.int("n_positions")
    f.only("add_cross_attention", (False,), "a decoder-only model (no cross-attention)")
    act = f.str("activation_function", "gelu_new")
    if act not in GELU_ACTIVATIONS:
        raise f.error(f"field 'activation_function' = {short_repr(act)} is not supported: a GELU MLP")
    return dict(
        vocab_size=f.int("vocab_size"),
        d_model=d,
        num_layers=f.int("n_layer"),
        num_heads=f.int("n_head"),
        d_ff=f.int("n_inner", 4 * d, allow_none=True),
        context_length=positions,
        max_position_embeddings=positions,
        norm_eps=f.number("layer_norm_epsilon", 1e-5),
        tie_embeddings=f.bool("tie_word_embeddings", True),
        norm="layernorm",
        qkv_bias=True,
        output_bias=True,
        mlp_bias=True,
        mlp="gelu",
        positions="learned",
    )


def _llama(f: _Fields) -> dict[str, Any]:
    out = _common(f, tie_default=False)
    bias = f.bool("attention_bias", False)
    return {
        **out,
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": f.bool("mlp_bias", False),
        "mlp": _only_swiglu(f, "hidden_act"),
    }


def _only_swiglu(f: _Fields, key: str) -> str:
    mlp = _activation(f, key, "silu")
    return mlp


def _mistral(f: _Fields) -> dict[str, Any]:
    return {
        **_common(f, tie_default=False),
        "mlp": _activation(f, "hidden_act", "silu"),
        **_window(f, default_every=None),
    }


def _qwen_window(f: _Fields) -> dict[str, Any]:
    """Qwen2/3: ``use_sliding_window`` (default false) gates ``sliding_window``; when true, transformers
    windows the layers from ``max_window_layers`` on, which we do not model (unless that is none)."""
    use = f.bool("use_sliding_window", False)
    first = f.int("max_window_layers", None, allow_none=True)
    window = f.raw("sliding_window")
    types = f.raw("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        raise f.error("field 'layer_types' is not supported for Qwen: full attention on every layer only")
    if use and window is not None and (first is None or first < f.data.get("num_hidden_layers", 0)):
        raise f.error(
            "field 'use_sliding_window' = true is not supported for Qwen (windows from "
            "max_window_layers on); only use_sliding_window = false"
        )
    return {}


def _qwen2(f: _Fields) -> dict[str, Any]:
    f.only("use_mrope", (False,), "one RoPE over the sequence (multimodal M-RoPE is Qwen2-VL's)")
    return {
        **_common(f, tie_default=False),
        "qkv_bias": True,
        "mlp": _activation(f, "hidden_act", "silu"),
        **_qwen_window(f),
    }


def _qwen3(f: _Fields) -> dict[str, Any]:
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "qk_norm": True,
        "mlp": _activation(f, "hidden_act", "silu"),
        **_qwen_window(f),
    }


def _gemma(f: _Fields, *, every: int, qk_norm: bool) -> dict[str, Any]:
    out = _common(f, tie_default=True)
    key = "hidden_activation" if f.has("hidden_activation") else "hidden_act"
    if f.has("hidden_activation") and f.has("hidden_act"):
        f.raw("hidden_act")  # transformers reads hidden_activation and ignores hidden_act
    bias = f.bool("attention_bias", False)
    f.only("use_bidirectional_attention", (False, None), "a causal LM")
    return {
        **out,
        "mlp": _activation(f, key, "gelu_pytorch_tanh"),
        "qkv_bias": bias,
        "output_bias": bias,
        "norm_placement": "sandwich",
        "scale_embeddings": True,
        "qk_norm": qk_norm,
        **_window(f, default_every=every),
    }


def _phi3(f: _Fields) -> dict[str, Any]:
    out = _common(f, tie_default=False)
    f.only("attention_bias", (False,), "Phi-3's qkv_proj and o_proj have no bias")
    partial = f.raw("partial_rotary_factor", 1.0)
    if partial not in (None, 1, 1.0):
        raise f.error(
            f"field 'partial_rotary_factor' = {short_repr(partial)} is not supported: RoPE on every dimension only"
        )
    return {**out, "mlp": _activation(f, "hidden_act", "silu"), **_window(f, default_every=None)}


def _olmo2(f: _Fields) -> dict[str, Any]:
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "qk_norm": True,
        "qk_norm_scope": "projection",
        "norm_placement": "post",
        "mlp": _activation(f, "hidden_act", "silu"),
    }


def _experts(f: _Fields, count: str, width: str | None, defaults: tuple = (..., ..., ...)) -> dict[str, Any]:
    """The routed experts: ``count`` of them (the field's name differs by family), top-k from
    ``num_experts_per_tok``, each of width ``width`` (absent for Mixtral, whose experts have the dense
    ``intermediate_size``); ``defaults`` (count, top-k, width) are the config class's, ``...`` = required."""
    return {
        "num_experts": f.int(count, defaults[0], null=False),
        "experts_per_token": f.int("num_experts_per_tok", defaults[1], null=False),
        "expert_d_ff": None if width is None else f.int(width, defaults[2], null=False),
    }


def _mixtral(f: _Fields) -> dict[str, Any]:
    return {
        **_common(f, tie_default=False),
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "num_local_experts", None),
        **_window(f, default_every=None),
    }


def _qwen3_moe(f: _Fields) -> dict[str, Any]:
    """Qwen3-MoE: Qwen3 attention; layer i is sparse when (i + 1) % decoder_sparse_step == 0 and i is
    not in mlp_only_layers (only an empty list is modelled); a dense layer has ``intermediate_size``."""
    only = f.raw("mlp_only_layers")
    if only not in (None, []):
        raise f.error("field 'mlp_only_layers' is not supported: only an empty list (every sparse step a MoE layer)")
    return {
        **_qwen3(f),
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "moe_every": f.int("decoder_sparse_step", 1),
    }


def _deepseek(f: _Fields, version: int) -> dict[str, Any]:
    """DeepSeek-V2/V3: latent attention and a mixture of experts with shared experts after
    ``first_k_dense_replace`` dense layers.  Traps: ``head_dim`` here is the RoPE part of a head only
    (transformers sets it to ``qk_rope_head_dim``); ``n_routed_experts`` (alias ``num_local_experts``)."""
    out = _common(f, tie_default=False)
    heads = out["num_heads"]
    if out["num_kv_heads"] not in (None, heads):
        raise f.error("field 'num_key_value_heads' must equal num_attention_heads for latent attention")
    rope = f.int("qk_rope_head_dim", 64, null=False)
    if out["head_dim"] not in (None, rope):
        raise f.error(f"field 'head_dim' = {out['head_dim']} must be qk_rope_head_dim ({rope}) for DeepSeek")
    f.only("attention_bias", (False,), "DeepSeek's projections without biases")
    f.only("mlp_bias", (False,), "DeepSeek's MLPs without biases")
    f.only("moe_layer_freq", (1,), "every layer from first_k_dense_replace on a mixture of experts")
    count = "n_routed_experts" if f.has("n_routed_experts") or not f.has("num_local_experts") else "num_local_experts"
    return {
        **out,
        "num_kv_heads": None,
        "head_dim": None,
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, count, "moe_intermediate_size", (256, 8, 2048) if version == 3 else (64, ..., 1407)),
        "shared_experts": _count(f, "n_shared_experts", 1 if version == 3 else 2),
        "dense_layers_first": _count(f, "first_k_dense_replace", 3 if version == 3 else 0),
        "kv_lora_rank": f.int("kv_lora_rank", 512, null=False),
        "q_lora_rank": None if f.raw("q_lora_rank", 1536) is None else f.int("q_lora_rank", 1536),  # null: q_proj
        "qk_nope_head_dim": f.int("qk_nope_head_dim", 128, null=False),
        "qk_rope_head_dim": rope,
        "v_head_dim": f.int("v_head_dim", 128, null=False),
    }


def _count(f: _Fields, key: str, default: int) -> int:
    """A count that may be 0 (``first_k_dense_replace``)."""
    value = f.raw(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise f.error(f"field '{key}' must be an integer >= 0, got {short_repr(value)}")
    return value


MAPPINGS: dict[str, Callable[[_Fields], dict[str, Any]]] = {
    "gpt2": _gpt2,
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma2": lambda f: _gemma(f, every=2, qk_norm=False),
    "gemma3_text": lambda f: _gemma(f, every=6, qk_norm=True),
    "phi3": _phi3,
    "olmo2": _olmo2,
    "deepseek_v2": lambda f: _deepseek(f, 2),
    "deepseek_v3": lambda f: _deepseek(f, 3),
}
assert tuple(MAPPINGS) == SUPPORTED_MODEL_TYPES


def config_from_hf(data: Any, source: str = "config.json", name: str = "custom") -> ModelConfig:
    """A ``ModelConfig`` from a parsed config.json object (see the module docstring for the rules)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type is None:
        raise ConfigError(
            f"{source}: missing required field 'model_type' (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if not isinstance(model_type, str):
        raise ConfigError(f"{source}: field 'model_type' must be a string, got {short_repr(model_type)}")
    if model_type in LATER_MODEL_TYPES:
        raise ConfigError(
            f"{source}: model_type '{model_type}' has {LATER_MODEL_TYPES[model_type]}, "
            f"which lm-accounting does not model yet (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    if model_type not in MAPPINGS:
        raise ConfigError(
            f"{source}: unsupported model_type {short_repr(model_type)} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
        )
    f = _Fields(data, source, model_type)
    fields = MAPPINGS[model_type](f)
    unknown = f.not_understood()
    if unknown:
        raise ConfigError(
            f"{source}: field {short_repr(unknown[0])} is not understood for model_type "
            f"'{model_type}' (lm-accounting cannot tell whether it changes the counts)"
        )
    keep_none = ("num_kv_heads", "head_dim", "expert_d_ff", "q_lora_rank")
    fields = {k: v for k, v in fields.items() if v is not None or k in keep_none}
    try:
        return ModelConfig(**fields, name=name, ignored_fields=f.ignored())
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def load_hf_config(path: str | os.PathLike) -> ModelConfig:
    """Read ``path`` (a config.json; the same file checks as a TOML config) into a ``ModelConfig``.

    The model's name is the folder's (``.../Llama-3.1-8B/config.json`` -> ``Llama-3.1-8B``) when the file
    is called ``config.json``, else the file's stem."""
    path = Path(path)
    text = read_config_text(path, "JSON")
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        raise ConfigError(f"{path}: malformed JSON: nested too deeply") from None
    except ValueError as err:  # JSONDecodeError, NaN/Infinity, an int over 4,300 digits
        raise ConfigError(f"{path}: not valid JSON: {str(err).splitlines()[0][:200]}") from None
    stem = path.stem if path.stem.lower() != "config" else (path.resolve().parent.name or "custom")
    name = stem.strip() or "custom"
    return config_from_hf(data, str(path), name[:200])
