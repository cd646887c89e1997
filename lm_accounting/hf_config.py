"""Read a Hugging Face ``config.json`` into a ``ModelConfig``, offline, without torch or transformers.

``lm-account path/to/config.json`` (any path ending in ``.json``, see ``config.load_config``) goes through
``load_hf_config``: the file is read with the same safety checks as a TOML config (a small regular UTF-8
file, ``config.read_config_text``), parsed as strict JSON, and mapped field by field.

The rules:

* ``model_type`` picks the mapping.  Supported: ``SUPPORTED_MODEL_TYPES``, mixture-of-experts (mixtral, qwen3_moe)
  and latent-attention (deepseek_v2, deepseek_v3) types included; after the first 13, the model zoo (issue 30):
  types whose modeling file is one of those blocks under other names (Granite, Helium, InternLM3, EXAONE 3/4,
  ERNIE 4.5, Seed-OSS, Ministral, SmolLM3, HunYuan-Dense, Gemma, OLMo-3, OLMoE, Phi-3.5-MoE, Hunyuan v3,
  HunYuan-MoE, IQuest-Coder, Sarvam-M, Youtu, VaultGemma, HyperCLOVA X, GLM-4.7-Flash, StarCoder2, GPTBigCode;
  GPT-SW3 as GPT-2), and new pieces (gpt_oss, qwen2_moe, olmo, bloom, ernie4_5_moe; partial rotary: glm4_moe,
  minimax_m2, glm4, glm, stablelm; Gated DeltaNet hybrids: qwen3_next, qwen3_5_text, qwen3_5_moe_text; parallel
  attention + MLP blocks: cohere, cohere2, phi, gpt_neox, gptj, falcon, tests/test_arch_parallel_block.py; ReLU-family
  MLPs: opt, nemotron, tests/test_arch_relu.py; DeepSeek Sparse Attention's indexer: deepseek_v32, glm_moe_dsa,
  tests/test_arch_dsa.py; Llama 4's text model: llama4_text, tests/test_arch_llama4.py; Mamba2 hybrids: nemotron_h, bamba,
  granitemoehybrid, falcon_h1, tests/test_arch_mamba2.py; LFM2's short-convolution hybrids: lfm2, lfm2_moe,
  tests/test_arch_lfm2.py; state-space models and the Mamba hybrid: mamba2, mamba, falcon_mamba, jamba,
  tests/test_arch_mamba.py), each proven
  in tests/test_hf_zoo.py and listed in docs/model_types.md.  A multimodal wrapper
  with a ``text_config`` (``WRAPPERS``: Gemma 3's ``gemma3``, Mistral 3's ``mistral3``, Kimi K2.5's ``kimi_k25``,
  Qwen3.5's ``qwen3_5`` and ``qwen3_5_moe``, Llama 4's ``llama4``)
  is read through its text model, and the model's name says so: "(text model of a gemma3 wrapper; the vision tower
  is not counted)".  Every other causal-LM type transformers registers is refused with a line naming what it lacks
  (``hf_refusals.REFUSED_MODEL_TYPES``; a wrapper whose text model is refused names that text model,
  ``hf_refusals.REFUSED_WRAPPERS``); an unknown type is refused naming it and listing the supported ones.
* Every field is one of: *read* (it sets a ``ModelConfig`` field, or is checked to have the one value we
  model, e.g. ``add_cross_attention = false``), *ignored*, or *not understood*, which is refused naming the
  field (every such field, in one line).  Ignored are the fields that change no parameter or FLOP count
  (dropout, soft-capping, rope scaling, token ids, generation settings, ...) and the fields transformers'
  configuration class for the type does not define (``hf_fields.DEFINED_FIELDS``: GPT-2's ``n_special``, a
  fine-tuning tool's ``unsloth_version``), which nothing in transformers reads; they are listed in
  ``ModelConfig.ignored_fields`` (every JSON result, and ``--verbose``).  Not understood is a field the class
  defines that we neither read nor know to be harmless: we cannot tell whether it changes the counts.
* Both the hub's spelling and what ``save_pretrained`` writes with transformers 5.x are read: either name
  of the class's ``attribute_map`` (Qwen3-MoE's ``num_experts`` / ``num_local_experts``; two that disagree
  are refused), ``rope_parameters``, and the values ``__post_init__`` derives (DeepSeek's ``qk_head_dim``
  and ``head_dim``, checked).
* A wrong type (a string where a count goes, a float for an int, ``true`` for a number), a number past the
  float range, or a missing shape field is a one-line ``ConfigError`` naming the field.

Defaults when a field is absent are transformers' own: the ``*Config`` class defaults of transformers 5.x,
committed as ``hf_fields.CLASS_DEFAULTS`` (tied to the classes by tests/test_hf_roundtrip.py), e.g.
``num_key_value_heads`` -> ``num_attention_heads`` (Llama; but 8 for Mistral, 32 for Qwen2/3, 4 for Gemma);
``head_dim`` -> ``hidden_size / num_attention_heads`` (but 128 for Qwen3, 256 for Gemma); ``sliding_window`` ->
4,096 for Mistral and Gemma; ``tie_word_embeddings`` -> True for gpt2, gemma2 and gemma3_text, False for the
others; ``rope_theta`` -> the class's ``default_theta`` (10,000; 1,000,000 for Mixtral and Gemma 3;
transformers v5 nests it in ``rope_parameters``; both places are read).  The shape fields (sizes, layers,
heads, vocabulary, positions) and Mixtral's and Qwen3-MoE's expert counts are required: a file without them
is refused, except in a wrapper's ``text_config``, where the text class's defaults fill them
(``hf_fields.WRAPPED_TEXT_DEFAULTS``).  Model-type facts that are not fields: Qwen2 has Q/K/V biases
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
query projection.  gpt-oss (``_gpt_oss``) and Qwen2-MoE (``_qwen2_moe``) bring pieces of their own (attention
sinks, router and expert biases, the clamped SwiGLU; the sigmoid-gated shared expert), see their readers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .config import (
    MAX_NAME_CHARS,
    MAX_SIZE,
    ConfigError,
    ModelConfig,
    file_label,
    positive_number,
    read_config_text,
    short_repr,
)
from .hf_fields import (
    ALIASES,
    CLASS_DEFAULTS,
    COMMON_FIELDS,
    CONFIG_CLASSES,
    DEFINED_FIELDS,
    SAME_CLASSES,
    WRAPPED_TEXT_DEFAULTS,
    WRAPPERS,
    WRAPPERS_OF_ANY_TEXT,
)
from .hf_refusals import REFUSED_MODEL_TYPES, REFUSED_WRAPPERS

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
    "granite",
    "granitemoe",
    "granitemoeshared",
    "helium",
    "internlm3",
    "exaone",
    "ernie4_5",
    "seed_oss",
    "ministral",
    "ministral3",
    "smollm3",
    "hunyuan_v1_dense",
    "gemma",
    "olmo3",
    "exaone4",
    "olmoe",
    "phimoe",
    "hy_v3",
    "hunyuan_v1_moe",
    "iquestcoder",
    "sarvam_mla",
    "youtu",
    "vaultgemma",
    "hyperclovax",
    "glm4_moe_lite",
    "starcoder2",
    "gpt_bigcode",
    "gpt_oss",
    "qwen2_moe",
    "olmo",
    "bloom",
    "ernie4_5_moe",
    "glm4_moe",
    "minimax_m2",
    "glm4",
    "glm",
    "stablelm",
    "qwen3_next",
    "qwen3_5_text",
    "qwen3_5_moe_text",
    "cohere",
    "cohere2",
    "phi",
    "gpt_neox",
    "gptj",
    "falcon",
    "opt",
    "nemotron",
    "deepseek_v32",
    "glm_moe_dsa",
    "llama4_text",
    "nemotron_h",
    "bamba",
    "granitemoehybrid",
    "falcon_h1",
    "lfm2",
    "lfm2_moe",
    "mamba2",
    "mamba",
    "falcon_mamba",
    "jamba",
)


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
        "_commit_hash",
        "name_or_path",
        "experts_implementation",
        "_experts_implementation",
        "ignore_keys_at_rope_validation",
        "allow_global_per_layer_attribute_access",
        "serialize_explicit_per_layer_config",
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
(group-limited routing, scaling factors, scoring functions, auxiliary losses, expert-parallel hints; V3's
``topk_method``, which its class never reads), and the multi-token-prediction module, which transformers does
not build (so neither do we: DeepSeek-V3's 671B excludes its 14B MTP layer).  ``n_group``, ``topk_group``,
``norm_topk_prob``, ``rope_interleave`` and V2's ``topk_method`` change no count either, but shape the training
step's tensors: ``_deepseek`` reads them (``ModelConfig.expert_groups`` ...); a read field is never listed as
ignored, and a type that shares this list without the reader (GLM-4-MoE) ignores them."""

_MAMBA_IGNORED = (
    "intermediate_size",
    "time_step_scale",
    "time_step_min",
    "time_step_max",
    "time_step_init_scheme",
    "time_step_floor",
    "rescale_prenorm_residual",
    "use_mambapy",
    "use_associative_scan",
)
"""Mamba's and Falcon-Mamba's fields that change no count: ``intermediate_size`` (``MambaConfig.__post_init__``
overwrites it with ``expand · hidden_size``), the time step's initialisation, and the scan's
alternatives to the sequential loop (mambapy's ``pscan``, a compiled associative scan: the same read-out matmul by C,
2·B·S·E·N, and elementwise work otherwise)."""

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
    "vaultgemma": frozenset(["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar"]),
    "youtu": frozenset(["embedding_initializer_range"]),
    "gemma3_text": frozenset(
        ["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "rope_local_base_freq"]
    ),
    "mixtral": frozenset(["router_jitter_noise", "output_router_logits", "router_aux_loss_coef"]),
    "qwen3_moe": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "deepseek_v2": frozenset(_DEEPSEEK_ROUTING),
    "deepseek_v3": frozenset(_DEEPSEEK_ROUTING),
    "glm4_moe_lite": frozenset(_DEEPSEEK_ROUTING),
    "sarvam_mla": frozenset(_DEEPSEEK_ROUTING),
    "deepseek_v32": frozenset(_DEEPSEEK_ROUTING),
    "glm_moe_dsa": frozenset(_DEEPSEEK_ROUTING),
    "granitemoe": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "granitemoeshared": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "olmoe": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "phimoe": frozenset(["router_jitter_noise", "input_jitter_noise", "output_router_logits", "router_aux_loss_coef"]),
    "hy_v3": frozenset(["router_scaling_factor", "output_router_logits"]),
    "hunyuan_v1_dense": frozenset(["eod_token_id"]),
    "hunyuan_v1_moe": frozenset(["eod_token_id", "output_router_logits"]),
    "seed_oss": frozenset(["residual_dropout"]),
    "starcoder2": frozenset(["residual_dropout", "embedding_dropout"]),
    "gpt_bigcode": frozenset(["scale_attn_weights", "attention_softmax_in_fp32", "scale_attention_softmax_in_fp32"]),
    "mistral3": DEFINED_FIELDS["mistral3"] - COMMON_FIELDS - {"text_config"},
    "kimi_k25": DEFINED_FIELDS["kimi_k25"] - COMMON_FIELDS - {"text_config"},
    "gpt_oss": frozenset(["hidden_act", "swiglu_alpha", "output_router_logits", "router_aux_loss_coef"]),
    "qwen2_moe": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "olmo": frozenset(["clip_qkv"]),
    "bloom": frozenset(["pretraining_tp", "slow_but_exact"]),
    "gpt_neox": frozenset(["classifier_dropout"]),
    "opt": frozenset(["dropout", "layerdrop", "init_std"]),
    "ernie4_5_moe": frozenset(["moe_norm_min", "output_router_logits", "router_aux_loss_coef"]),
    "glm4_moe": frozenset(_DEEPSEEK_ROUTING) - {"n_group", "topk_group", "norm_topk_prob"},  # those three read
    "minimax_m2": frozenset(["output_router_logits", "router_aux_loss_coef", "router_jitter_noise"]),
    "qwen3_next": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "bamba": frozenset(["time_step_limit", "z_loss_coefficient", "num_logits_to_keep"]),
    "lfm2_moe": frozenset(["output_router_logits"]),
    "granitemoehybrid": frozenset(["time_step_limit", "output_router_logits", "router_aux_loss_coef"]),
    "falcon_h1": frozenset(
        [
            "time_step_limit",
            "num_logits_to_keep",
            "lm_head_multiplier",
            "embedding_multiplier",
            "mlp_multipliers",
            "key_multiplier",
            "attention_out_multiplier",
            "attention_in_multiplier",
            "ssm_multipliers",
            "ssm_in_multiplier",
            "ssm_out_multiplier",
        ]
    ),
    "nemotron_h": frozenset(
        [
            "expand",
            "mamba_expand",
            "mamba_proj_bias",
            "time_step_min",
            "time_step_max",
            "time_step_limit",
            "time_step_floor",
            "mamba_dt_min",
            "mamba_dt_max",
            "mamba_dt_limit",
            "mamba_dt_init_floor",
            "residual_in_fp32",
            "rescale_prenorm_residual",
            "use_mamba_kernels",
            "mamba_ssm_cache_dtype",
            "num_logits_to_keep",
            "attention_bias",
            "output_router_logits",
            "num_nextn_predict_layers",
            "mtp_layers_block_type",
            "mtp_hybrid_override_pattern",
        ]
    ),
    "qwen3_5_moe_text": frozenset(["output_router_logits", "router_aux_loss_coef"]),
    "mamba2": frozenset(
        [
            "time_step_rank",
            "time_step_min",
            "time_step_max",
            "time_step_floor",
            "time_step_limit",
            "rescale_prenorm_residual",
        ]
    ),
    "mamba": frozenset(_MAMBA_IGNORED),
    "falcon_mamba": frozenset([*_MAMBA_IGNORED, "mixer_rms_eps", "use_falcon_mambapy"]),
    "jamba": frozenset(
        [
            "use_mamba_kernels",
            "use_mambapy",
            "use_associative_scan",
            "output_router_logits",
            "router_aux_loss_coef",
            "attention_dropout",
        ]
    ),
    "qwen3_5": DEFINED_FIELDS["qwen3_5"] - COMMON_FIELDS - {"text_config"},
    "qwen3_5_moe": DEFINED_FIELDS["qwen3_5_moe"] - COMMON_FIELDS - {"text_config"},
    "llama4": DEFINED_FIELDS["llama4"] - COMMON_FIELDS - {"text_config"} | {"tie_word_embeddings"},  # TIED_BY_TEXT
    "llama4_text": frozenset(
        [
            "floor_scale",
            "attn_scale",
            "router_jitter_noise",
            "output_router_logits",
            "router_aux_loss_coef",
        ]
    ),
    "gemma3": frozenset(
        [
            "vision_config",
            "mm_tokens_per_image",
            "image_token_index",
            "image_token_id",
            "boi_token_index",
            "boi_token_id",
            "eoi_token_index",
            "eoi_token_id",
        ]
    ),
}
"""Per model type: soft-capping (a tanh on logits), the attention scale (a different constant), gpt-oss's
``hidden_act`` (its experts run their own clamped SwiGLU, ``GptOssExperts._apply_gate``, and nothing else reads
it) and ``swiglu_alpha`` (the sigmoid's gain: a constant), GPT-2's
alternative scalings and its sequence-summary head (used only by GPT2DoubleHeadsModel); a multimodal wrapper's
vision tower and image-token settings (its text model alone is counted); Llama 4's attention temperature tuning
(``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``: an elementwise scaling of Q on the NoPE layers) and
router noise and losses."""

GELU_ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "gelu_python")
SILU_ACTIVATIONS = ("silu", "swish")


class _Fields:
    """The config.json object with bookkeeping: what was read, what was ignored, in the file's order.

    ``defaults`` (the configuration class's, ``CLASS_DEFAULTS``) fill an absent field before the reader's own
    default; a name of the class's ``attribute_map`` finds the field under either spelling (``ALIASES``)."""

    def __init__(self, data: Mapping[str, Any], source: str, model_type: str, defaults: Mapping[str, Any] = ()):
        self.data, self.source, self.model_type = data, source, model_type
        self.defaults = {**CLASS_DEFAULTS.get(model_type, {}), **dict(defaults)}
        self.aliases = ALIASES.get(model_type, {})
        self.used: set[str] = {"model_type"}
        self.ignored_parts: list[str] = []  # ignored entries inside a read object (rope_parameters.factor)
        harmless = IGNORED_EVERYWHERE | IGNORED_BY_TYPE.get(model_type, frozenset())
        for alias, target in self.aliases.items():
            if alias in data and target in data and data[alias] != data[target] and alias not in harmless:
                raise self.error(
                    f"fields '{alias}' and '{target}' are two names for one setting "
                    f"(transformers' attribute_map) and disagree: {short_repr(data[alias])} vs {short_repr(data[target])}"
                )

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def key(self, name: str) -> str:
        """The spelling of ``name`` present in the file (``name`` itself, or its ``attribute_map`` partner)."""
        if name not in self.data:
            for alias, target in self.aliases.items():
                other = target if name == alias else alias if name == target else None
                if other is not None and other in self.data:
                    return other
        return name

    def has(self, key: str) -> bool:
        return self.key(key) in self.data

    def default(self, key: str, default: Any) -> Any:
        """The class's default for ``key``, else ``default`` (a class default of None is derived: the reader's)."""
        value = self.defaults.get(key)
        return default if value is None else value

    def raw(self, key: str, default: Any = None) -> Any:
        present = self.key(key)
        self.used |= {key, present} | {n for pair in self.aliases.items() if key in pair for n in pair}
        if present in self.data:
            return self.data[present]
        return self.default(key, default)

    def int(self, key: str, default: Any = ..., *, allow_none: bool = False, null: bool = True) -> int | None:
        """An integer field in [1, 10^18]; ``default=...`` makes it required (unless the class has a default).
        ``null=False``: an explicit null is refused rather than read as the default (a count whose absence
        changes the model)."""
        present = self.key(key)
        if present not in self.data:
            default = self.default(key, default)
            if default is ...:
                raise self.error(f"missing required field '{key}' (model_type '{self.model_type}')")
            self.used.add(key)
            return default
        value = self.raw(key)
        if value is None and null and (allow_none or default is not ...):
            return default if default is not ... else None  # an explicit null: derived, as transformers does
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"field '{present}' must be an integer, got {short_repr(value)}")
        if not 1 <= value <= MAX_SIZE:
            raise self.error(f"field '{present}' must be between 1 and 10^18, got {short_repr(value)}")
        return value

    def number(self, key: str, default: float) -> float:
        value = self.raw(key, default)
        return default if value is None else positive_number(value, f"{self.source}: field '{self.key(key)}'")

    def bool(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if value is None:
            return self.default(key, default)
        if not isinstance(value, bool):
            raise self.error(f"field '{self.key(key)}' must be true or false, got {short_repr(value)}")
        return value

    def str(self, key: str, default: str) -> str:
        value = self.raw(key, default)
        if value is None:
            return self.default(key, default)
        if not isinstance(value, str):
            raise self.error(f"field '{self.key(key)}' must be a string, got {short_repr(value)}")
        return value

    def only(self, key: str, allowed: tuple, what: str) -> None:
        """A count-relevant field we model only at ``allowed`` values (absent = the first)."""
        value = self.raw(key, allowed[0])
        if value is None:
            value = allowed[0]
        if type(value) is not type(allowed[0]) or value not in allowed:
            raise self.error(f"field '{self.key(key)}' = {short_repr(value)} is not supported: {what}")

    def not_understood(self) -> list[str]:
        """Fields the configuration class defines (so they may change what transformers builds) that were
        neither read nor known to change no count."""
        defined = DEFINED_FIELDS.get(self.model_type, frozenset())
        known = self.used | IGNORED_EVERYWHERE | IGNORED_BY_TYPE.get(self.model_type, frozenset())
        return [k for k in self.data if k in defined and k not in known]

    def ignored(self, prefix: str = "") -> tuple[str, ...]:
        """Every field not read, in the file's order: the ones known to change no count, and the ones the
        configuration class does not define (``n_special``, ``unsloth_version``: nothing reads them)."""
        return tuple(prefix + k for k in self.data if k not in self.used) + tuple(
            prefix + k for k in self.ignored_parts
        )


def _rope_theta(f: _Fields, *, partial: bool = False) -> float:
    """``rope_theta`` at the top level (transformers v4) or in ``rope_parameters`` (v5; for Gemma 3 the
    full-attention entry).  RoPE has no parameters: the value only fills the live model's tables.  A
    ``partial_rotary_factor`` (at the top level or in ``rope_parameters``) other than 1 is refused, unless
    ``partial`` (the type's reader reads it, ``_rotary``)."""
    theta = f.number("rope_theta", 10_000.0)
    if not partial:
        _full_rotary(f.raw("partial_rotary_factor"), f"{f.source}: field 'partial_rotary_factor'")
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
    if not partial:
        _full_rotary(params.get("partial_rotary_factor"), f"{f.source}: field '{prefix}partial_rotary_factor'")
    value = params.get("rope_theta", theta)
    return positive_number(value, f"{f.source}: field '{prefix}rope_theta'")


def _rotary(f: _Fields, out: dict[str, Any], default: float, *, sliced: bool = False) -> dict[str, Any]:
    """Partial rotary: RoPE on the first dimensions of each head, as many as the cos table is wide
    (``apply_rotary_pos_emb``: ``rotary_dim = cos.shape[-1]``), 2·⌈n/2⌉ for n = ``int(head_dim · factor)``
    (``_compute_default_rope_parameters``, modeling_rope_utils.py: one frequency per pair from 0 to n).  ``sliced``
    (StableLM: ``q[..., :rotary_ndims]`` with rotary_ndims = n) cannot run an odd n: refused.  The factor is
    ``rope_parameters``' own, else the top-level field, else ``default`` (the class's: GLM's ``__post_init__`` sets
    0.5, StableLM's 0.25), the precedence of ``convert_rope_params_to_dict``."""
    top, params = f.raw("partial_rotary_factor"), f.raw("rope_parameters")
    nested = params.get("partial_rotary_factor") if isinstance(params, Mapping) else None
    field = "rope_parameters.partial_rotary_factor" if nested is not None else "partial_rotary_factor"
    factor = nested if nested is not None else default if top is None else top
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise f.error(f"field '{field}' must be a number in (0, 1], got {short_repr(factor)}")
    head_dim = out["head_dim"] or out["d_model"] // out["num_heads"]
    n = int(head_dim * factor)
    if n == 0 or (sliced and n % 2):
        raise f.error(
            f"field '{field}' = {factor} rotates int({head_dim} · {factor}) = {n} dimensions of a head: "
            "RoPE rotates pairs (an even, positive count)"
        )
    dim = n + n % 2
    return {} if dim >= head_dim else {"rotary_dim": dim}


def _full_rotary(value: Any, what: str) -> None:
    """RoPE on every dimension of a head: ``partial_rotary_factor`` absent, null or 1."""
    if value is not None and (isinstance(value, bool) or value != 1):
        raise ConfigError(f"{what} = {short_repr(value)} is not supported: RoPE on every dimension only")


def _window(f: _Fields, *, default_every: int | None, pattern: bool = False) -> dict[str, Any]:
    """``sliding_window`` and which layers use it: ``layer_types`` if given (it must follow the
    ``full_attention_every`` rule), else every layer (``default_every`` None) or every n-th layer full
    (``sliding_window_pattern`` where the class reads it, ``pattern``: Gemma 3).

    The ``layer_types`` check is one pass: the first full-attention layer fixes the only n the rule allows
    (layer n-1 is the first full one), and every entry is then compared with the rule once."""
    window = f.int("sliding_window", None, allow_none=True)
    layers = f.data.get("num_hidden_layers")
    every = f.int("sliding_window_pattern", default_every, allow_none=True) if pattern else default_every
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
        first_full = next((i for i, t in enumerate(types) if t == "full_attention"), None)
        candidate = None if first_full is None else first_full + 1  # None: every layer windowed
        for i, t in enumerate(types):
            if (t == "full_attention") != (candidate is not None and (i + 1) % candidate == 0):
                raise f.error(
                    "field 'layer_types' is not understood: lm-accounting models windowed layers as all, "
                    "or all but every n-th"
                )
        return {"sliding_window": window, "full_attention_every": candidate}
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


def _common(f: _Fields, *, tie_default: bool, partial: bool = False) -> dict[str, Any]:
    """The Llama-style fields shared by every supported type except gpt2 (``partial``: see ``_rope_theta``)."""
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
        rope_theta=_rope_theta(f, partial=partial),
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
    """Gemma 2/3: the MLP's activation is ``hidden_activation`` (the classes define no ``hidden_act``, so one
    in the file is ignored); Gemma 3 alone reads ``sliding_window_pattern``."""
    out = _common(f, tie_default=True)
    bias = f.bool("attention_bias", False)
    f.only("use_bidirectional_attention", (False, None), "a causal LM")
    return {
        **out,
        "mlp": _activation(f, "hidden_activation", "gelu_pytorch_tanh"),
        "qkv_bias": bias,
        "output_bias": bias,
        "norm_placement": "sandwich",
        "scale_embeddings": True,
        "qk_norm": qk_norm,
        **_window(f, default_every=every, pattern=qk_norm),
    }


def _phi3(f: _Fields) -> dict[str, Any]:
    out = _common(f, tie_default=False)
    f.only("attention_bias", (False,), "Phi-3's qkv_proj and o_proj have no bias")
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


def _experts(f: _Fields, count: str, width: str | None) -> dict[str, Any]:
    """The routed experts: ``count`` of them (the field's name differs by family; either spelling of the
    class's ``attribute_map`` is read), top-k from ``num_experts_per_tok``, each of width ``width`` (absent for
    Mixtral, whose experts have the dense ``intermediate_size``).  Absent: the class's default where
    ``CLASS_DEFAULTS`` has one (DeepSeek), else refused; an explicit null is refused."""
    return {
        "num_experts": f.int(count, null=False),
        "experts_per_token": f.int("num_experts_per_tok", null=False),
        "expert_d_ff": None if width is None else f.int(width, null=False),
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
    not in mlp_only_layers (only an empty list is modelled); a dense layer has ``intermediate_size``.
    The hub writes ``num_experts``, ``save_pretrained`` its ``attribute_map`` target ``num_local_experts``."""
    only = f.raw("mlp_only_layers")
    if only not in (None, []):
        raise f.error("field 'mlp_only_layers' is not supported: only an empty list (every sparse step a MoE layer)")
    return {
        **_qwen3(f),
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "moe_every": f.int("decoder_sparse_step", 1),
        "norm_topk_prob": f.bool("norm_topk_prob", False),
    }


def _deepseek(f: _Fields) -> dict[str, Any]:
    """DeepSeek-V2/V3: latent attention and a mixture of experts with shared experts after
    ``first_k_dense_replace`` dense layers (absent fields: the V2 or V3 class's defaults, ``CLASS_DEFAULTS``).
    ``n_routed_experts`` has the alias ``num_local_experts`` (V3) or ``num_experts`` (V2)."""
    f.only("moe_layer_freq", (1,), "every layer from first_k_dense_replace on a mixture of experts")
    return {
        **_latent_attention(f),
        **_experts(f, "n_routed_experts", "moe_intermediate_size"),
        "shared_experts": _count(f, "n_shared_experts"),
        "dense_layers_first": _count(f, "first_k_dense_replace"),
        # the router's and RoPE's layout: no count, but the training step's tensors (ModelConfig's docstrings)
        "norm_topk_prob": f.bool("norm_topk_prob", False),
        "expert_groups": f.int("n_group", 1),
        "expert_groups_per_token": f.int("topk_group", 1),
        "rope_interleave": f.model_type != "deepseek_v2" and f.bool("rope_interleave", False),  # V2 has no such field
        **({"topk_method": _v2_topk_method(f)} if f.model_type == "deepseek_v2" else {}),
    }


def _v2_topk_method(f: _Fields) -> str:
    """DeepSeek-V2's ``topk_method`` (``DeepseekV2TopkRouter.forward`` knows two; any other leaves its weights
    undefined: transformers' forward fails)."""
    method = f.str("topk_method", "greedy")
    if method not in ("greedy", "group_limited_greedy"):
        raise f.error(f"field 'topk_method' = {short_repr(method)} is not supported: greedy or group_limited_greedy")
    return method


def _latent_attention(f: _Fields) -> dict[str, Any]:
    """DeepSeek's block with latent attention (MLA) and a dense SwiGLU MLP.  Traps: ``head_dim`` here is the
    RoPE part of a head only and ``qk_head_dim`` the whole query/key head (transformers sets both, and
    ``save_pretrained`` writes them: they are checked); ``q_lora_rank: null`` is a plain query projection."""
    out = _common(f, tie_default=False)
    heads = out["num_heads"]
    if out["num_kv_heads"] not in (None, heads):
        raise f.error("field 'num_key_value_heads' must equal num_attention_heads for latent attention")
    rope = f.int("qk_rope_head_dim", null=False)
    if out["head_dim"] not in (None, rope):
        raise f.error(f"field 'head_dim' = {out['head_dim']} must be qk_rope_head_dim ({rope}) for DeepSeek")
    f.only("attention_bias", (False,), "DeepSeek's projections without biases")
    f.only("mlp_bias", (False,), "DeepSeek's MLPs without biases")
    nope = f.int("qk_nope_head_dim", null=False)
    qk_head = f.int("qk_head_dim", nope + rope, null=False)
    if qk_head != nope + rope:
        raise f.error(f"field 'qk_head_dim' = {qk_head} must be qk_nope_head_dim + qk_rope_head_dim ({nope + rope})")
    return {
        **out,
        "num_kv_heads": None,
        "head_dim": None,
        "mlp": _only_swiglu(f, "hidden_act"),
        "kv_lora_rank": f.int("kv_lora_rank", null=False),
        "q_lora_rank": None if f.raw("q_lora_rank") is None else f.int("q_lora_rank"),  # null: a plain q_proj
        "qk_nope_head_dim": nope,
        "qk_rope_head_dim": rope,
        "v_head_dim": f.int("v_head_dim", null=False),
    }


def _gpt_oss(f: _Fields) -> dict[str, Any]:
    """gpt-oss (transformers' models/gpt_oss): every layer a mixture of ``num_local_experts`` experts of width
    ``intermediate_size`` with biases (``gate_up_proj_bias``, ``down_proj_bias``) and gpt-oss's clamped SwiGLU
    (``swiglu_limit``), a router with a bias, Q/K/V/O biases (``attention_bias``), one sink logit per head, and
    sliding-window layers alternating with full ones (``layer_types``; absent: layer i windowed when (i+1) % 2)."""
    bias = f.bool("attention_bias", True)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "attention_sinks": True,
        **_experts(f, "num_local_experts", None),
        "expert_bias": True,
        "router_bias": True,
        "swiglu_limit": f.number("swiglu_limit", 7.0),
        **_window(f, default_every=2),
    }


def _qwen2_moe(f: _Fields) -> dict[str, Any]:
    """Qwen2-MoE (Qwen1.5-MoE): Qwen2 attention (``qkv_bias``), ``num_experts`` routed experts of
    ``moe_intermediate_size`` and one shared expert of ``shared_expert_intermediate_size`` scaled by
    σ(``shared_expert_gate``(x)) (``Qwen2MoeSparseMoeBlock``); layer i is sparse when (i + 1) %
    decoder_sparse_step == 0 and i is not in mlp_only_layers (only an empty list is modelled)."""
    only = f.raw("mlp_only_layers")
    if only not in (None, []):
        raise f.error("field 'mlp_only_layers' is not supported: only an empty list (every sparse step a MoE layer)")
    return {
        **_common(f, tie_default=False),
        "qkv_bias": f.bool("qkv_bias", True),
        "mlp": _only_swiglu(f, "hidden_act"),
        **_qwen_window(f),
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "moe_every": f.int("decoder_sparse_step", 1),
        "shared_experts": 1,
        "shared_expert_d_ff": f.int("shared_expert_intermediate_size", null=False),
        "shared_expert_gate": True,
        "norm_topk_prob": f.bool("norm_topk_prob", False),  # no count: the router's division (the step's tensors)
    }


def _olmo(f: _Fields) -> dict[str, Any]:
    """OLMo (transformers' models/olmo): Llama-style blocks whose norms are ``OlmoLayerNorm``, a LayerNorm with no
    weight and no bias at a fixed eps of 1e-5 (``norm_weights = false``); ``clip_qkv`` clamps Q, K and V (no count
    changes).  ``OlmoConfig`` defines neither ``rms_norm_eps`` nor ``head_dim``: one in a file is ignored."""
    out = _common(f, tie_default=False)
    f.used -= {"rms_norm_eps", "head_dim"}
    bias = f.bool("attention_bias", False)
    return {
        **out,
        "head_dim": None,
        "norm_eps": 1e-5,
        "norm": "layernorm",
        "norm_weights": False,
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
    }


BLOOM_SEQUENCE_LENGTH = 2048
"""BLOOM's training sequence length (Le Scao et al. 2022, "BLOOM", arXiv:2211.05100, table 3): the context of a
bloom config.json, which has no position field (ALiBi has no table)."""


def _bloom(f: _Fields) -> dict[str, Any]:
    """BLOOM (transformers' models/bloom): GPT-2's pre-LayerNorm block (fused ``query_key_value`` read as our
    q/k/v, ``dense``, a 4·d tanh-GELU MLP, every projection with a bias), ALiBi instead of positions, a LayerNorm
    on the embeddings (``word_embeddings_layernorm``), tied embeddings by default.  ``n_embed`` (legacy) overrides
    ``hidden_size`` as ``BloomConfig.__post_init__`` does; ``pretraining_tp``/``slow_but_exact`` slice the same
    matmuls and are ignored; the context is ``BLOOM_SEQUENCE_LENGTH``."""
    f.only("apply_residual_connection_post_layernorm", (False,), "the residual from the block input (BLOOM's)")
    d = f.int("n_embed") if f.has("n_embed") else f.int("hidden_size")
    f.used.add("hidden_size")
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": f.int("n_layer"),
        "num_heads": f.int("n_head"),
        "d_ff": 4 * d,
        "context_length": BLOOM_SEQUENCE_LENGTH,
        "norm": "layernorm",
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", True),
        "qkv_bias": True,
        "output_bias": True,
        "mlp_bias": True,
        "mlp": "gelu",
        "positions": "alibi",
        "embedding_norm": True,
    }


def _ernie4_5_moe(f: _Fields) -> dict[str, Any]:
    """Ernie 4.5-MoE (transformers' models/ernie4_5_moe): ``moe_num_experts`` routed experts of
    ``moe_intermediate_size`` (top ``moe_k``) and ``moe_num_shared_experts`` shared ones run as one MLP of that many
    times the width, on layers i >= ``moe_layer_start_index`` with (i + 1) % ``moe_layer_interval`` == 0 up to
    ``moe_layer_end_index`` (-1: the last; only the last is modelled); the router holds a frozen score bias of E
    (``moe_statics.e_score_correction_bias``); ``use_bias`` puts biases on q/k/v/o, the dense and shared MLPs and
    the LM head (not on the routed experts)."""
    out = _common(f, tie_default=True)
    end = f.raw("moe_layer_end_index", -1)
    if end not in (-1, out["num_layers"] - 1) or isinstance(end, bool):
        raise f.error(
            f"field 'moe_layer_end_index' = {short_repr(end)} is not supported: the mixture of experts runs to the "
            "last layer (-1)"
        )
    bias = f.bool("use_bias", False)
    return {
        **out,
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": bias,
        "lm_head_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "moe_num_experts", "moe_intermediate_size"),
        "shared_experts": _count(f, "moe_num_shared_experts"),
        "dense_layers_first": _count(f, "moe_layer_start_index"),
        "moe_every": f.int("moe_layer_interval", 1),
        "router_score_bias": True,
    }


def _count(f: _Fields, key: str) -> int:
    """A count that may be 0 (``first_k_dense_replace``); absent: the class's default."""
    value = f.raw(key)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_SIZE:
        raise f.error(f"field '{f.key(key)}' must be an integer >= 0, got {short_repr(value)}")
    return value


# -- the model zoo (issue 30): types whose modeling file is one of the above with other field names --------
def _llama_like(f: _Fields, *, bias: str | None = "attention_bias", qk_norm: bool = False) -> dict[str, Any]:
    """Llama's block under another name (pre-RMSNorm, SwiGLU, RoPE): Granite, Helium, InternLM3, EXAONE 3,
    Ministral 3, SmolLM3, HunYuan-Dense (per-head q/k norms), ERNIE 4.5 (``use_bias`` on every projection).
    ``bias`` names the field that puts a bias on Q, K, V and O (None: none)."""
    out = _common(f, tie_default=False)
    on = False if bias is None else f.bool(bias, False)
    mlp_bias = on if bias == "use_bias" else f.bool("mlp_bias", False) if "mlp_bias" in _defined(f) else False
    return {
        **out,
        "qkv_bias": on,
        "output_bias": on,
        "mlp_bias": mlp_bias,
        "qk_norm": qk_norm,
        "mlp": _only_swiglu(f, "hidden_act"),
    }


def _defined(f: _Fields) -> frozenset[str]:
    return DEFINED_FIELDS.get(f.model_type, frozenset())


SEED_OSS_DROPOUT = ("attention_dropout", "residual_dropout")
"""Seed-OSS's dropouts, 0.1 in its class (configuration_seed_oss.py:80-81): applied in training unless a
config.json sets them to 0."""


def _seed_oss(f: _Fields) -> dict[str, Any]:
    """Seed-OSS: ``attention_bias`` on Q, K and V, ``attention_out_bias`` on O (modeling_seed_oss.py)."""
    out = _llama_like(f)
    return {**out, "output_bias": f.bool("attention_out_bias", False)}


def _helium(f: _Fields) -> dict[str, Any]:
    """Helium: Llama's block, but ``o_proj`` is ``hidden_size`` square without a bias (modeling_helium.py:223;
    ``attention_bias`` is on q, k and v only), so a ``head_dim`` with ``num_attention_heads · head_dim`` other
    than ``hidden_size`` builds a model that cannot run: refused."""
    out = {**_llama_like(f), "output_bias": False}
    if out["head_dim"] is not None and out["num_heads"] * out["head_dim"] != out["d_model"]:
        raise f.error(
            f"num_attention_heads · head_dim = {out['num_heads'] * out['head_dim']} is not hidden_size "
            f"({out['d_model']}): Helium's o_proj is hidden_size wide"
        )
    return out


def _internlm3(f: _Fields) -> dict[str, Any]:
    """InternLM3: transformers builds ``LlamaForCausalLM`` (its own class refuses ``qkv_bias`` other than
    ``bias``, as we do)."""
    out = _llama_like(f)
    if out["qkv_bias"] != out["mlp_bias"]:
        raise f.error("fields 'qkv_bias' and 'bias' must agree (transformers builds Llama, one bias setting)")
    return out


def _head_dim_given(f: _Fields, out: dict[str, Any]) -> dict[str, Any]:
    """Ministral's and HunYuan-Dense's attention take ``getattr(config, "head_dim", ...)``, which is the class's
    None when the file leaves ``head_dim`` out or null: transformers cannot build that model, so it is refused."""
    if out["head_dim"] is None:
        raise f.error(
            f"field 'head_dim' is required for {f.model_type} (transformers' attention reads it as given; "
            "a null does not build)"
        )
    return out


def _smollm3(f: _Fields) -> dict[str, Any]:
    """SmolLM3: Llama's block; the layers whose ``no_rope_layers`` entry is 0 skip RoPE (no parameter, no matmul;
    ``nope_layers``, for the training step's ops).  Absent, ``no_rope_layers`` is configuration_smollm3.py's
    ``int((i + 1) % no_rope_layer_interval != 0)`` (interval 4).  A sliding window (``use_sliding_window``) is
    not modelled."""
    f.raw("sliding_window")  # unused without the flag
    f.only("use_sliding_window", (False,), "full attention on every layer")
    types = f.raw("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
        raise f.error("field 'layer_types' is not supported for SmolLM3: full attention on every layer only")
    out = _llama_like(f)
    layers = out["num_layers"]
    rope = f.raw("no_rope_layers")
    if rope is None:
        interval = f.int("no_rope_layer_interval", 4)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    else:
        f.raw("no_rope_layer_interval")  # unused beside the list
    if not isinstance(rope, list) or len(rope) < layers or any(r not in (0, 1) or isinstance(r, float) for r in rope):
        raise f.error(
            f"field 'no_rope_layers' must be a list of 0/1 flags, one per layer ({layers}), got {short_repr(rope)}"
        )
    return {**out, "nope_layers": tuple(i for i in range(layers) if not rope[i])}


def _granite(f: _Fields) -> dict[str, Any]:
    """Granite: Llama's block; its four multipliers (embedding, residual, attention, logits) scale
    activations by constants: no parameter, no matmul (read and ignored)."""
    for key in GRANITE_MULTIPLIERS:
        f.number(key, 1.0)
    return _llama_like(f)


GRANITE_MULTIPLIERS = ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")


def _granite_moe(f: _Fields) -> dict[str, Any]:
    """Granite-MoE: Granite's attention, every layer a mixture of ``num_local_experts`` SwiGLU experts of
    ``intermediate_size``; GraniteMoeShared adds one always-on SwiGLU MLP of ``shared_intermediate_size``
    (0: none), summed ungated (modeling_granitemoeshared.py)."""
    out = {**_granite(f), **_experts(f, "num_local_experts", None)}
    if f.model_type == "granitemoeshared":
        shared = _count(f, "shared_intermediate_size")
        if shared:
            out |= {"shared_experts": 1, "shared_expert_d_ff": shared}
    return out


def _scaled_geglu(f: _Fields, activation: str) -> dict[str, Any]:
    """Gemma's pre-norm block: GeGLU from the field ``activation``, embeddings × √d, a tied head by default,
    ``attention_bias`` on q/k/v and o."""
    out = _common(f, tie_default=True)
    bias = f.bool("attention_bias", False)
    return {
        **out,
        "mlp": _activation(f, activation, "gelu_pytorch_tanh"),
        "qkv_bias": bias,
        "output_bias": bias,
        "scale_embeddings": True,
    }


def _gemma1(f: _Fields) -> dict[str, Any]:
    """Gemma (v1): pre-norm (no sandwich), GeGLU from ``hidden_act``, embeddings × √d, tied head."""
    f.only("use_bidirectional_attention", (False, None), "a causal LM")
    return _scaled_geglu(f, "hidden_act")


def _olmo3(f: _Fields) -> dict[str, Any]:
    """OLMo-3: OLMo-2's block with sliding windows on three layers in four (``layer_types``)."""
    return {**_olmo2(f), **_window(f, default_every=4)}


def _exaone4(f: _Fields) -> dict[str, Any]:
    """EXAONE 4: norms after the sublayers (OLMo-2's placement) with per-head q/k norms, and a window on every
    layer but every ``sliding_window_pattern``-th (an int; the hub's "LLLG" comes with ``layer_types``); with a
    window given, the full-attention layers skip RoPE (``nope_layers``: no count, the training step's ops)."""
    pattern = f.data.get("sliding_window_pattern")
    if isinstance(pattern, str):  # "LLLG": transformers' own __post_init__ takes it only beside layer_types
        f.raw("sliding_window_pattern")
        if not re.fullmatch(r"L+G", pattern) or f.data.get("layer_types") is None:
            raise f.error(
                f"field 'sliding_window_pattern' = {short_repr(pattern)} is read only as 'L...LG' beside "
                "'layer_types' (transformers' Exaone4Config needs an integer otherwise)"
            )
    window = _window(f, default_every=4, pattern=not isinstance(pattern, str))
    out = _common(f, tie_default=False)
    every = window.get("full_attention_every")
    full = [i for i in range(out["num_layers"]) if not window or (every is not None and (i + 1) % every == 0)]
    given = f.int("sliding_window", None, allow_none=True)  # the class's 4,096 when absent
    return {
        **out,
        "qk_norm": True,
        "norm_placement": "post",
        "mlp": _only_swiglu(f, "hidden_act"),
        **window,
        # "global NoPE": with a window given, the full-attention layers skip RoPE (modeling_exaone4.py:233-235)
        "nope_layers": tuple(full) if given is not None else (),
    }


def _olmoe(f: _Fields) -> dict[str, Any]:
    """OLMoE: OLMo's pre-norm block with q/k norms over the whole projection, every layer a mixture of
    ``num_experts`` SwiGLU experts of ``intermediate_size``; ``clip_qkv`` (a clamp) only null."""
    f.only("clip_qkv", (None,), "no clamp on Q, K and V")
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "qk_norm": True,
        "qk_norm_scope": "projection",
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "num_experts", None),
        "norm_topk_prob": f.bool("norm_topk_prob", False),  # no count: the router's division (the step's tensors)
    }


def _phimoe(f: _Fields) -> dict[str, Any]:
    """Phi-3.5-MoE: LayerNorm (with bias, ``rms_norm_eps`` its epsilon), biased attention when
    ``attention_bias``, every layer a mixture of ``num_local_experts`` SwiGLU experts of ``intermediate_size``;
    ``lm_head_bias`` only false."""
    f.only("lm_head_bias", (False,), "an LM head without a bias")
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "norm": "layernorm",
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "num_local_experts", None),
        **_window(f, default_every=None),
    }


def _per_layer(f: _Fields, key: str) -> int:
    """A count given once or per layer (HunYuan's ``moe_topk`` / ``num_experts`` lists): one value for every
    layer only."""
    value = f.raw(key)
    if isinstance(value, list):
        if not value or any(v != value[0] for v in value):
            raise f.error(f"field '{f.key(key)}' differs between layers: one value for every layer only")
        f.data = {**f.data, f.key(key): value[0]}
    return f.int(key, null=False)


def _hunyuan_moe(f: _Fields) -> dict[str, Any]:
    """HunYuan-MoE (Hunyuan-A13B): HunYuan-Dense's attention; every layer ``num_experts`` SwiGLU experts of
    ``intermediate_size`` (top ``moe_topk``) beside one always-on shared MLP of ``intermediate_size``, summed
    ungated (modeling_hunyuan_v1_moe.py ``HunYuanMoEV1Moe``).  The hub file's ``moe_intermediate_size`` and
    ``num_shared_expert`` are not fields of the class, so transformers (and we) ignore them."""
    out = _head_dim_given(f, _llama_like(f, qk_norm=True))
    return {
        **out,
        "num_experts": _per_layer(f, "num_experts"),
        "experts_per_token": _per_layer(f, "moe_topk"),
        "shared_experts": 1,
    }


def _sarvam_mla(f: _Fields) -> dict[str, Any]:
    """Sarvam-M (``sarvam_mla``): DeepSeek-V3's model (transformers builds ``DeepseekV3ForCausalLM``); its class
    drops a saved ``head_dim`` (the remote code's ``kv_lora_rank + qk_rope_head_dim``) and ``q_head_dim``
    (configuration_sarvam_mla.py ``__post_init__``), so they are ignored here too."""
    dropped = [k for k in ("head_dim", "q_head_dim") if k in f.data]
    f.ignored_parts += dropped
    f.data = {k: v for k, v in f.data.items() if k not in dropped}
    return _deepseek(f)


def _youtu(f: _Fields) -> dict[str, Any]:
    """Youtu-LLM: DeepSeek's latent attention with a dense SwiGLU MLP in every layer (modeling_youtu.py), tied
    by default."""
    return {
        **_latent_attention(f),
        "tie_embeddings": f.bool("tie_word_embeddings", True),
        "rope_interleave": f.bool("rope_interleave", True),  # no count; the training step's RoPE tensors
    }


def _vaultgemma(f: _Fields) -> dict[str, Any]:
    """VaultGemma: Gemma 2 without the norms after the sublayers (``input_layernorm`` and
    ``pre_feedforward_layernorm`` only: pre-norm), GeGLU from ``hidden_activation``, embeddings × √d, a window
    on every other layer (``layer_types``)."""
    return {**_scaled_geglu(f, "hidden_activation"), **_window(f, default_every=2)}


def _hyperclovax(f: _Fields) -> dict[str, Any]:
    """HyperCLOVA X: Granite's block (its four multipliers read, no count) with a norm after each sublayer
    when ``use_post_norm`` (``post_norm1``, ``post_norm2``: Gemma's sandwich, "Peri-LN")."""
    out = _granite(f)
    return {**out, "norm_placement": "sandwich" if f.bool("use_post_norm", True) else "pre"}


def _dense_first(f: _Fields, dense_default: int) -> int:
    """``mlp_layer_types`` as the leading dense layers: "dense" × k then "sparse" (absent: ``dense_default``)."""
    types = f.raw("mlp_layer_types")
    if types is None:
        return dense_default
    k = next((i for i, t in enumerate(types) if t != "dense"), len(types)) if isinstance(types, list) else -1
    if k < 0 or any(t != "sparse" for t in types[k:]):
        raise f.error("field 'mlp_layer_types' is not supported: 'dense' layers first, then 'sparse' ones")
    return k


def _hy_v3(f: _Fields) -> dict[str, Any]:
    """Hunyuan v3: per-head q/k norms (on the transposed states, as EXAONE 4), dense first layers
    (``mlp_layer_types``, default one), then ``num_experts`` SwiGLU experts of ``moe_intermediate_size`` plus
    ``num_shared_experts`` of the same width run as one MLP (DeepSeek's shared experts), their outputs summed in
    fp32 with ``enable_moe_fp32_combine`` (read: no count, the training step's tensors)."""
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": f.bool("mlp_bias", False),
        "qk_norm": True,
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "shared_experts": _count(f, "num_shared_experts"),
        "dense_layers_first": _dense_first(f, 1),
        # no count: the sum of the routed and shared outputs in fp32 (the training step's tensors)
        "moe_fp32_combine": f.bool("enable_moe_fp32_combine", True),
    }


def _glm4_moe_lite(f: _Fields) -> dict[str, Any]:
    """GLM-4.7-Flash (``glm4_moe_lite``): DeepSeek-V3's latent attention and experts, the dense first
    layers given by ``mlp_layer_types`` (default one) instead of ``first_k_dense_replace``."""
    f.data = {**f.data, "first_k_dense_replace": _dense_first(f, 1)}
    return _deepseek(f)


def _deepseek_v32(f: _Fields) -> dict[str, Any]:
    """DeepSeek-V3.2 (``deepseek_v32``, models/deepseek_v32/modeling_deepseek_v32.py) and GLM-5 (``glm_moe_dsa``):
    DeepSeek-V3's latent attention and experts (the dense first layers from ``mlp_layer_types``, else
    ``first_k_dense_replace``, as ``DeepseekV32Config.__post_init__`` derives them), plus DeepSeek Sparse
    Attention's indexer in every layer (``DeepseekV32Indexer``: ``index_n_heads`` heads of ``index_head_dim``,
    top ``index_topk`` keys; ``config.DSA_FIELDS``).  ``DeepseekV32Attention`` always has the query bottleneck
    (``q_a_proj`` of ``q_lora_rank``: null does not build) and interleaved RoPE (the class has no
    ``rope_interleave``); ``layer_types`` can only be ``indexed_attention``."""
    if f.has("q_lora_rank") and f.raw("q_lora_rank") is None:
        raise f.error(
            "field 'q_lora_rank' = null is not supported: DeepseekV32Attention always builds the query "
            "bottleneck q_a_proj (and the indexer's wq_b reads it)"
        )
    types = f.raw("layer_types")
    if types is not None and (not isinstance(types, list) or any(t != "indexed_attention" for t in types)):
        raise f.error("field 'layer_types' is not supported: 'indexed_attention' in every layer")
    f.data = {**f.data, "first_k_dense_replace": _dense_first(f, _count(f, "first_k_dense_replace"))}
    if f.raw("num_experts") is not None:  # __post_init__'s BC: re-routed to n_routed_experts
        f.data = {**f.data, "n_routed_experts": f.raw("num_experts")}
    return {
        **_deepseek(f),
        "rope_interleave": True,
        "index_heads": f.int("index_n_heads", null=False),
        "index_head_dim": f.int("index_head_dim", null=False),
        "index_topk": f.int("index_topk", null=False),
    }


def _glm_moe_dsa(f: _Fields) -> dict[str, Any]:
    """GLM-5 (``glm_moe_dsa``, models/glm_moe_dsa/modeling_glm_moe_dsa.py): DeepSeek-V3.2's model with the
    indexer's RoPE interleaved (the same count) and ``indexer_types``: a ``"shared"`` layer has no indexer and
    reuses the previous full layer's top-k (``GlmMoeDsaAttention``).  ``indexer_types``, else
    ``index_topk_pattern`` (``F``/``S`` letters or a list), else ``index_topk_freq`` / ``index_skip_topk_offset``
    (layer i full when max(i − offset + 1, 0) % freq == 0), as ``GlmMoeDsaConfig.__post_init__`` derives them;
    read as ``indexer_pattern`` (None: every layer full).  The first layer must be full (transformers' forward
    fails on a shared layer with no earlier top-k)."""
    layers = f.int("num_hidden_layers")
    types = f.raw("indexer_types")
    pattern = f.raw("index_topk_pattern")
    freq, offset = f.raw("index_topk_freq"), f.raw("index_skip_topk_offset")
    if types is None and isinstance(pattern, str):
        types = [{"F": "full", "S": "shared"}.get(c, c) for c in pattern]
    elif types is None and pattern is not None:
        types = pattern
    elif types is None:
        freq = 1 if freq is None else freq
        offset = 2 if offset is None else offset
        if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SIZE for v in (freq, offset)):
            raise f.error("fields 'index_topk_freq' and 'index_skip_topk_offset' must be integers >= 0")
        types = ["full" if max(i - offset + 1, 0) % max(freq, 1) == 0 else "shared" for i in range(layers)]
    if (
        not isinstance(types, list)
        or len(types) != layers
        or any(t not in ("full", "shared") for t in types)
        or types[0] != "full"
    ):
        raise f.error(
            f"field 'indexer_types' (or index_topk_pattern / index_topk_freq) must give 'full' or 'shared' for each of "
            f"the {layers} layers, the first 'full', got {short_repr(types)}"
        )
    full = all(t == "full" for t in types)
    return {**_deepseek_v32(f), "indexer_pattern": None if full else "".join("FS"[t == "shared"] for t in types)}


def _starcoder2(f: _Fields) -> dict[str, Any]:
    """StarCoder2: LayerNorm (``norm_epsilon``), RoPE, the 2-matrix GELU MLP (``c_fc``, ``c_proj``), a bias on
    every projection when ``use_bias``, an optional window on every layer."""
    heads = f.int("num_attention_heads")
    act = f.str("hidden_act", "gelu_pytorch_tanh")
    if act not in GELU_ACTIVATIONS:
        raise f.error(f"field 'hidden_act' = {short_repr(act)} is not supported: a GELU MLP")
    bias = f.bool("use_bias", True)
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": f.int("num_key_value_heads", None),
        "d_ff": f.int("intermediate_size"),
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f),
        "norm_eps": f.number("norm_epsilon", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", True),
        "norm": "layernorm",
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": bias,
        "mlp": "gelu",
        "hf_activation": act,
        **_window(f, default_every=None),
    }


def _gpt_bigcode(f: _Fields) -> dict[str, Any]:
    """GPTBigCode (StarCoder 1, SantaCoder): GPT-2's block with one key/value head (``multi_query``, default
    true) in its fused ``c_attn``."""
    out = _gpt2(f)
    kv = 1 if f.bool("multi_query", True) else out["num_heads"]
    if f.int("num_key_value_heads", kv) != kv:  # set by __post_init__, so written by save_pretrained
        raise f.error(f"field 'num_key_value_heads' must be {kv} (multi_query = {kv == 1})")
    act = f.str("activation_function", "gelu_pytorch_tanh")  # GPTBigCodeConfig's default, not GPT-2's
    return {**out, "num_kv_heads": None if kv == out["num_heads"] else 1, "hf_activation": act}


# -- partial rotary (issue 30): RoPE on the first rotary_dim of each head (``_rotary``) --------------------
def _glm(f: _Fields, *, sandwich: bool = False) -> dict[str, Any]:
    """GLM-4 (``glm``) and GLM-4-0414 (``glm4``, with sandwich norms: ``post_self_attn_layernorm`` and
    ``post_mlp_layernorm``): Llama's block with a fused ``gate_up_proj`` (our w1 + w3, gate first), biases on Q,
    K and V (``attention_bias``, default true; ``o_proj`` has none) and RoPE on half of each head."""
    out = _common(f, tie_default=False, partial=True)
    return {
        **out,
        "qkv_bias": f.bool("attention_bias", True),
        "mlp": _only_swiglu(f, "hidden_act"),
        **({"norm_placement": "sandwich"} if sandwich else {}),
        **_rotary(f, out, 0.5),
    }


def _glm4_moe(f: _Fields) -> dict[str, Any]:
    """GLM-4.5/4.6 (``glm4_moe``): GLM's attention (Q/K/V biases when ``attention_bias``, per-head q/k RMSNorms
    when ``use_qk_norm``, RoPE on half of each head), ``first_k_dense_replace`` dense layers of
    ``intermediate_size``, then ``n_routed_experts`` SwiGLU experts of ``moe_intermediate_size`` with
    ``n_shared_experts`` of that width run as one MLP.  The router is DeepSeek-V3's (sigmoid, group-limited, a
    score-correction buffer): it changes which experts, not how many, and has no parameter but its weight.
    ``Glm4MoeConfig`` defines no ``head_dim``, but ``Glm4MoeAttention`` reads it (``getattr``, else
    ``hidden_size // num_attention_heads``, floored: the class's 4,096 / 96 gives 42): it is read."""
    out = _common(f, tie_default=False, partial=True)
    out["head_dim"] = out["head_dim"] or out["d_model"] // out["num_heads"]
    return {
        **out,
        "qkv_bias": f.bool("attention_bias", False),
        "qk_norm": f.bool("use_qk_norm", False),
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "n_routed_experts", "moe_intermediate_size"),
        "shared_experts": _count(f, "n_shared_experts"),
        "dense_layers_first": _count(f, "first_k_dense_replace"),
        **_rotary(f, out, 0.5),
        # DeepSeek-V3's router: no count, but the training step's tensors (``ModelConfig``'s docstrings)
        "norm_topk_prob": f.bool("norm_topk_prob", True),
        "expert_groups": f.int("n_group", 1),
        "expert_groups_per_token": f.int("topk_group", 1),
    }


def _minimax_m2(f: _Fields) -> dict[str, Any]:
    """MiniMax-M2: every layer a mixture of ``num_local_experts`` SwiGLU experts of ``intermediate_size`` (no
    dense MLP, no shared expert; sigmoid routing with a score-correction buffer, no parameter), q/k RMSNorms over
    the whole projection (``MiniMaxM2Attention.q_norm``: h·head_dim, OLMo-2's scope), no biases, and RoPE on the
    legacy ``rotary_dim`` (``convert_rope_params_to_dict``: factor rotary_dim / head_dim)."""
    out = _common(f, tie_default=False, partial=True)
    legacy = f.int("rotary_dim", None, allow_none=True)
    head_dim = out["head_dim"] or out["d_model"] // out["num_heads"]
    return {
        **out,
        "qk_norm": True,
        "qk_norm_scope": "projection",
        "mlp": _only_swiglu(f, "hidden_act"),
        **_experts(f, "num_local_experts", None),
        **_rotary(f, out, 1.0 if legacy is None else legacy / head_dim),
    }


def _stablelm(f: _Fields) -> dict[str, Any]:
    """StableLM (3B-4E1T, StableLM 2): LayerNorm (``layer_norm_eps``, gain and bias), SwiGLU, biases on Q, K and
    V when ``use_qkv_bias``, RoPE on a quarter of each head by default; ``use_parallel_residual``: attention and the
    MLP side by side from ``input_layernorm`` alone (``parallel_block = one_norm``).  Refused: ``qk_layernorm``
    (one LayerNorm per head, each with its own weights)."""
    f.only("qk_layernorm", (False,), "no q/k norm (StableLM's per-head LayerNorms with their own weights)")
    out = {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": None,  # StableLmAttention: hidden_size // num_heads
        "d_ff": f.int("intermediate_size"),
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f, partial=True),
        "norm_eps": f.number("layer_norm_eps", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "norm": "layernorm",
        "qkv_bias": f.bool("use_qkv_bias", False),
        "mlp": _only_swiglu(f, "hidden_act"),
        "parallel_block": "one_norm" if f.bool("use_parallel_residual", False) else "none",
    }
    return {**out, **_rotary(f, out, 0.25, sliced=True)}


# -- Gated DeltaNet hybrids (issue 30): Qwen3-Next and the Qwen3.5 text models ----------------------------------
LAYER_KINDS = ("linear_attention", "full_attention")


def _hybrid_layers(f: _Fields, layers: int) -> int | None:
    """Which layers are Gated DeltaNet: ``layer_types`` if given (its length must be ``num_hidden_layers``, and it
    must follow the one rule modelled: layer i full when (i + 1) % n == 0), else ``full_attention_interval`` (the
    class's ``__post_init__`` builds ``layer_types`` from it, default 4).  The interval n, or None when every
    layer is full attention."""
    types = f.raw("layer_types")
    if types is None:
        n = f.int("full_attention_interval", 4)
        return None if n == 1 else n
    f.used.add("full_attention_interval")  # the class ignores it when layer_types is given
    if not isinstance(types, list) or not all(t in LAYER_KINDS for t in types):
        raise f.error("field 'layer_types' must be a list of 'linear_attention' / 'full_attention'")
    if len(types) != layers:
        raise f.error(f"field 'layer_types' lists {len(types)} layers, num_hidden_layers is {layers}")
    if "linear_attention" not in types:
        return None
    first_full = next((i for i, t in enumerate(types) if t == "full_attention"), len(types))
    n = first_full + 1
    if any((t == "full_attention") != ((i + 1) % n == 0) for i, t in enumerate(types)):
        raise f.error(
            "field 'layer_types' is not understood: lm-accounting models a hybrid whose every n-th layer is full "
            "attention, the others Gated DeltaNet"
        )
    return n


def _gated_deltanet(f: _Fields, layers: int) -> dict[str, Any]:
    """The Gated DeltaNet layers' fields (``config.LINEAR_FIELDS``; absent: the class's defaults)."""
    n = _hybrid_layers(f, layers)
    fields = {
        "linear_key_heads": f.int("linear_num_key_heads", null=False),
        "linear_value_heads": f.int("linear_num_value_heads", null=False),
        "linear_key_head_dim": f.int("linear_key_head_dim", null=False),
        "linear_value_head_dim": f.int("linear_value_head_dim", null=False),
        "linear_conv_kernel": f.int("linear_conv_kernel_dim", null=False),
    }
    return {} if n is None else {"full_attention_interval": n, **fields}


def _qwen_hybrid(f: _Fields, d_ff: str) -> dict[str, Any]:
    """Qwen3-Next's and Qwen3.5's blocks: gated attention (``q_proj`` twice as wide, ``o_proj(attn · σ(gate))``),
    per-head q/k RMSNorms, no biases (``attention_bias`` true is refused: the gate would share the bias), RoPE on a
    quarter of each head by default (``partial_rotary_factor`` 0.25, the class's ``__post_init__``), the (1 + w)
    RMSNorms (Gemma's: the same count), a SwiGLU MLP of ``d_ff``, and Gated DeltaNet layers (``_gated_deltanet``).
    Qwen3.5's ``rope_parameters`` add ``mrope_section`` (multimodal RoPE: for text the three position rows are
    equal, the plain rotation): ignored."""
    f.only("attention_bias", (False,), "Qwen3-Next's attention without biases")
    layers = f.int("num_hidden_layers")
    out = {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": layers,
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": f.int("head_dim", None),
        "d_ff": f.int(d_ff, null=False),
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f, partial=True),
        "norm_eps": f.number("rms_norm_eps", 1e-6),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "qk_norm": True,
        "attention_output_gate": True,
        "mlp": _only_swiglu(f, "hidden_act"),
    }
    return {**out, **_rotary(f, out, 0.25), **_gated_deltanet(f, layers)}


def _qwen_hybrid_moe(f: _Fields) -> dict[str, Any]:
    """The mixture of experts of Qwen3-Next and Qwen3.5-MoE (``Qwen3NextSparseMoeBlock``): ``num_experts`` routed
    experts of ``moe_intermediate_size`` and one shared expert of ``shared_expert_intermediate_size`` scaled by
    σ(``shared_expert_gate``(x)), Qwen2-MoE's; a gate needs its expert's width (0 or null is refused)."""
    return {
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "shared_experts": 1,
        "shared_expert_d_ff": f.int("shared_expert_intermediate_size", null=False),
        "shared_expert_gate": True,
    }


def _qwen3_next(f: _Fields) -> dict[str, Any]:
    """Qwen3-Next (models/qwen3_next): ``_qwen_hybrid`` with ``_qwen_hybrid_moe``; layer i is sparse when (i + 1) %
    ``decoder_sparse_step`` == 0 and i is not in ``mlp_only_layers`` (only an empty list is modelled), a dense
    layer has ``intermediate_size``; ``num_experts`` 0 makes every layer dense (``Qwen3NextDecoderLayer``)."""
    only = f.raw("mlp_only_layers")
    if only not in (None, []):
        raise f.error("field 'mlp_only_layers' is not supported: only an empty list (every sparse step a MoE layer)")
    out = _qwen_hybrid(f, "intermediate_size")
    if f.raw("num_experts") == 0:  # the expert fields then build nothing
        f.used |= {"num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size"}
        f.used |= {"decoder_sparse_step", "norm_topk_prob"}
        return out
    return {
        **out,
        **_qwen_hybrid_moe(f),
        "moe_every": f.int("decoder_sparse_step", 1),
        "norm_topk_prob": f.bool("norm_topk_prob", True),
    }


def _qwen3_5_moe_text(f: _Fields) -> dict[str, Any]:
    """Qwen3.5-MoE's text model (models/qwen3_5_moe): every layer a ``_qwen_hybrid_moe`` (the class has no
    ``intermediate_size`` and no dense layer; its router always normalises the top-k weights)."""
    out = _qwen_hybrid(f, "moe_intermediate_size")
    return {**out, **_qwen_hybrid_moe(f), "norm_topk_prob": True}


# -- parallel attention + MLP blocks (``parallel_block``): x + attn(norm(x)) + mlp(norm(x)) ---------------------
def _gelu_mlp(f: _Fields, key: str, default: str) -> dict[str, Any]:
    """The 2-matrix MLP of any GELU (``gelu`` exact, ``gelu_new`` tanh: the same matmuls), its name kept
    (``hf_activation``: a transformers program replays its ops)."""
    act = f.str(key, default)
    if act not in GELU_ACTIVATIONS:
        raise f.error(f"field '{key}' = {short_repr(act)} is not supported: a GELU MLP")
    return {"mlp": "gelu", "hf_activation": act}


def _cohere(f: _Fields) -> dict[str, Any]:
    """Cohere (Command R; transformers' models/cohere, ``CohereDecoderLayer``): ``x + attn(ln(x)) + mlp(ln(x))``
    from one ``CohereLayerNorm`` (a gain, no bias; ``layer_norm_eps``), a SwiGLU MLP, RoPE on interleaved pairs
    (``rotate_half`` over ``x[..., ::2]``, ``x[..., 1::2]``), ``attention_bias`` on q/k/v/o, a tied head by default;
    ``logit_scale`` multiplies the logits by a constant (no parameter, no matmul: read and ignored).  Cohere2
    (Command R7B, Command A) windows every layer but every ``sliding_window_pattern``-th (``layer_types``) and
    rotates only the windowed layers' Q and K (RoPE's elementwise FLOPs are counted on every layer: an
    overestimate of the non-matmul figure only).  ``use_qk_norm`` (Command R+): Q and K normed per head by
    ``CohereLayerNorm``s holding a gain per head and dimension, (h, head_dim) and (kv, head_dim)
    (``qk_norm_scope = head_weights``)."""
    qk_norm = f.model_type == "cohere" and f.bool("use_qk_norm", False)
    f.number("logit_scale", 0.0625)
    bias = f.bool("attention_bias", False)
    out = {
        **_common(f, tie_default=True),
        "norm_eps": f.number("layer_norm_eps", 1e-5),
        "norm": "layernorm",
        "norm_bias": False,
        "parallel_block": "one_norm",
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
        "rope_interleave": True,
        **({"qk_norm": True, "qk_norm_scope": "head_weights"} if qk_norm else {}),
    }
    return {**out, **(_window(f, default_every=4, pattern=True) if f.model_type == "cohere2" else {})}


def _phi(f: _Fields) -> dict[str, Any]:
    """Phi-1/1.5/2 (transformers' models/phi, ``PhiDecoderLayer``): ``x + attn(ln(x)) + mlp(ln(x))`` from one
    LayerNorm (gain and bias), biases on q/k/v and ``dense``, a 2-matrix GELU MLP (``fc1``, ``fc2``, with biases),
    RoPE on the first ``int(head_dim · partial_rotary_factor)`` of each head (sliced; the class's 0.5), a final
    LayerNorm and an LM head with a bias; ``qk_layernorm``: one LayerNorm of ``head_dim`` (gain and bias) on every
    Q head and one on every K head."""
    out = {
        **_common(f, tie_default=False, partial=True),
        "norm_eps": f.number("layer_norm_eps", 1e-5),
        "norm": "layernorm",
        "parallel_block": "one_norm",
        "qkv_bias": True,
        "output_bias": True,
        "mlp_bias": True,
        **_gelu_mlp(f, "hidden_act", "gelu_new"),
        "lm_head_bias": True,
        "qk_norm": f.bool("qk_layernorm", False),
    }
    return {**out, **_rotary(f, out, 0.5, sliced=True)}


def _gpt_neox(f: _Fields) -> dict[str, Any]:
    """GPT-NeoX / Pythia (transformers' models/gpt_neox, ``GPTNeoXLayer``): LayerNorms with biases, one fused
    ``query_key_value`` (3·d x d, per head [q, k, v]: read as our q/k/v, the same matmul split), ``dense``, both
    with a bias when ``attention_bias``, a 2-matrix GELU MLP with biases; ``use_parallel_residual`` (default true)
    runs ``x + attn(ln1(x)) + mlp(ln2(x))``, else attention then the MLP.  RoPE on the first
    ``int(head_size · rotary_pct)`` of each head (0.25; ``rotary_emb_base`` is its θ); the head (``lm_head``) has
    no bias and is untied by default."""
    heads = f.int("num_attention_heads")
    bias = f.bool("attention_bias", True)
    theta = f.number("rotary_emb_base", 10_000.0)
    out = {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": heads,
        "d_ff": f.int("intermediate_size"),
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f, partial=True) if f.has("rope_parameters") or f.has("rope_theta") else theta,
        "norm_eps": f.number("layer_norm_eps", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "norm": "layernorm",
        "parallel_block": "two_norms" if f.bool("use_parallel_residual", True) else "none",
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": True,
        **_gelu_mlp(f, "hidden_act", "gelu"),
        "head_dim": None,
    }
    return {**out, **_rotary(f, out, f.number("rotary_pct", 0.25))}


def _gptj(f: _Fields) -> dict[str, Any]:
    """GPT-J (transformers' models/gptj, ``GPTJBlock``): ``x + attn(ln_1(x)) + mlp(ln_1(x))`` from one LayerNorm,
    q/k/v and ``out_proj`` without biases, a 2-matrix GELU MLP (``fc_in``, ``fc_out``, width ``n_inner`` or 4·d)
    with biases, RoPE on the first ``rotary_dim`` of each head in interleaved pairs (``rotate_every_two``), a
    final LayerNorm and an LM head with a bias.  ``rotary_dim`` null (sin/cos as wide as the whole model) or wider
    than a head (``q[..., :rotary_dim]`` is the head, its sin/cos wider) is refused: neither runs."""
    d = f.int("n_embd")
    inner = f.int("n_inner", None, allow_none=True)
    rotary = f.int("rotary_dim", None, allow_none=True)  # absent: the class's 64
    if rotary is None:
        raise f.error("field 'rotary_dim' = null is not supported: RoPE on the first rotary_dim of each head")
    out = {
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": f.int("n_layer"),
        "num_heads": f.int("n_head"),
        "d_ff": 4 * d if inner is None else inner,
        "context_length": f.int("n_positions"),
        "rope_theta": _rope_theta(f),
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "norm": "layernorm",
        "parallel_block": "one_norm",
        "mlp_bias": True,
        **_gelu_mlp(f, "activation_function", "gelu_new"),
        "lm_head_bias": True,
        "rope_interleave": True,
    }
    head_dim = d // out["num_heads"]
    if rotary > head_dim:
        raise f.error(f"field 'rotary_dim' = {rotary} exceeds the head size {head_dim}: GPT-J's RoPE cannot run")
    return {**out, "rotary_dim": rotary} if rotary < head_dim else out


def _falcon(f: _Fields) -> dict[str, Any]:
    """Falcon (transformers' models/falcon, ``FalconDecoderLayer``): LayerNorms with biases, one fused
    ``query_key_value`` (read as our q/k/v: the same matmul split), ``dense``, a 2-matrix GELU MLP of
    ``ffn_hidden_size`` (4·d), every projection with a bias when ``bias``, full RoPE, a tied head by default.
    The block: ``new_decoder_architecture`` (Falcon-40B/180B) runs attention and the MLP side by side from
    ``ln_attn`` and ``ln_mlp`` (``num_ln_in_parallel_attn`` 2, its default) or from ``input_layernorm`` (1), with
    ``num_kv_heads`` K/V heads; otherwise (Falcon-7B) one K/V head when ``multi_query`` (else one per head), and
    ``parallel_attn``: side by side from ``input_layernorm``, else attention then the MLP.  ``n_embed`` (legacy)
    overrides ``hidden_size`` as ``FalconConfig.__post_init__`` does.  Refused: ``alibi`` (Falcon's ALiBi) and
    the combinations ``FalconDecoderLayer`` cannot run (a new-architecture block that is not parallel, two norms
    without the new architecture, K/V heads that the fused projection does not hold)."""
    f.only("alibi", (False,), "RoPE (Falcon's ALiBi is not modelled)")
    d = f.int("n_embed") if f.has("n_embed") else f.int("hidden_size")
    f.used.add("hidden_size")
    heads = f.int("num_attention_heads")
    new, parallel = f.bool("new_decoder_architecture", False), f.bool("parallel_attn", True)
    norms = f.int("num_ln_in_parallel_attn", None, allow_none=True)
    multi_query = f.bool("multi_query", True)
    kv = f.int("num_kv_heads", None, allow_none=True)
    if new and not parallel:
        raise f.error("field 'parallel_attn' = false is not supported with new_decoder_architecture (it cannot run)")
    if new and norms not in (None, 1, 2) or not new and parallel and norms == 2:
        raise f.error(
            f"field 'num_ln_in_parallel_attn' = {short_repr(norms)} is not supported here: 2 (or null) with "
            "new_decoder_architecture, 1, or null"
        )
    if not new and (multi_query or kv not in (None, heads)):
        if not multi_query:
            raise f.error(f"field 'num_kv_heads' must be num_attention_heads ({heads}) without multi_query")
        kv = 1
    block = ("one_norm" if norms == 1 else "two_norms") if new else "one_norm" if parallel else "none"
    mlp = _gelu_mlp(f, "activation", "gelu")
    bias = f.bool("bias", False)
    ffn = f.int("ffn_hidden_size", None, allow_none=True)
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": heads,
        "num_kv_heads": None if kv in (None, heads) else kv,
        "d_ff": 4 * d if ffn is None else ffn,
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f),
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", True),
        "norm": "layernorm",
        "parallel_block": block,
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": bias,
        **mlp,
    }


# -- ReLU-family MLPs (``mlp = relu``, ``relu2``): OPT and Nemotron -----------------------------------------------
OPT_POSITION_OFFSET = 2
"""``OPTLearnedPositionalEmbedding`` (models/opt/modeling_opt.py): ``nn.Embedding(num_embeddings + 2, d)``, looked up
at ``position_ids + 2`` (fairseq's padding offset): the table has ``max_position_embeddings + 2`` rows."""


def _relu_mlp(f: _Fields, key: str, default: str) -> dict[str, Any]:
    """A 2-matrix MLP by its activation: ``relu`` (OPT), ``relu2`` (Nemotron, ``ReLUSquaredActivation``), or any
    GELU (the same matmuls, ``mlp = gelu``, its name kept in ``hf_activation``)."""
    act = f.str(key, default)
    if act in ("relu", "relu2"):
        return {"mlp": act}
    if act in GELU_ACTIVATIONS:
        return {"mlp": "gelu", "hf_activation": act}
    raise f.error(f"field '{key}' = {short_repr(act)} is not supported: a ReLU, squared-ReLU or GELU MLP")


def _opt(f: _Fields) -> dict[str, Any]:
    """OPT (transformers' models/opt, ``OPTDecoderLayer``): pre-LayerNorm blocks (``do_layer_norm_before``) with
    gains and biases (none when ``layer_norm_elementwise_affine`` is false), q/k/v/out_proj and ``fc1``/``fc2``
    with biases when ``enable_bias``, a 2-matrix MLP of ``ffn_dim`` (``activation_function``, ReLU by default),
    learned positions in a table of ``max_position_embeddings + 2`` rows (``OPT_POSITION_OFFSET``), a final
    LayerNorm and a head tied by default.  Refused: post-norm blocks (``do_layer_norm_before`` false, OPT-350m:
    each norm after its residual add, and no final norm), a ``word_embed_proj_dim`` other than ``hidden_size``
    (OPT-350m's ``project_in``/``project_out``) and ``_remove_final_layer_norm`` (no final norm): lm-accounting
    models neither."""
    f.only("do_layer_norm_before", (True,), "pre-norm blocks (OPT-350m's post-norm blocks are not modelled)")
    f.only("_remove_final_layer_norm", (False,), "a final LayerNorm (OPT's default)")
    d = f.int("hidden_size")
    proj = f.int("word_embed_proj_dim", None, allow_none=True)
    if proj is not None and proj != d:
        raise f.error(
            f"field 'word_embed_proj_dim' = {proj} is not supported: embeddings of hidden_size ({d}); "
            "OPT-350m's project_in/project_out are not modelled"
        )
    positions = f.int("max_position_embeddings")
    bias = f.bool("enable_bias", True)
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": f.int("num_hidden_layers"),
        "num_heads": f.int("num_attention_heads"),
        "d_ff": f.int("ffn_dim"),
        "context_length": positions,
        "max_position_embeddings": positions + OPT_POSITION_OFFSET,
        "position_offset": OPT_POSITION_OFFSET,
        "tie_embeddings": f.bool("tie_word_embeddings", True),
        "norm": "layernorm",
        "norm_weights": f.bool("layer_norm_elementwise_affine", True),
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": bias,
        **_relu_mlp(f, "activation_function", "relu"),
        "positions": "learned",
    }


def _nemotron(f: _Fields) -> dict[str, Any]:
    """Nemotron (transformers' models/nemotron, ``NemotronDecoderLayer``): Llama's pre-norm block with
    ``NemotronLayerNorm1P`` norms (a LayerNorm with gain and bias applied as ``(1 + w)``: the same parameters; the
    ``+ 1`` is d adds per call, not modelled), ``norm_eps``, a 2-matrix MLP (``up_proj``, ``down_proj``) with
    ``hidden_act`` (``relu2``: squared ReLU), ``attention_bias`` on q/k/v/o, ``mlp_bias``, RoPE on the first
    ``int(head_dim · partial_rotary_factor)`` of each head (the class's 0.5; ``rot_dim = cos.shape[-1]``, not
    sliced), an untied head by default.  ``num_key_value_heads`` is required: ``NemotronConfig`` leaves it None and
    ``NemotronAttention`` divides by it, so transformers cannot build a file without it."""
    out = {
        **_common(f, tie_default=False, partial=True),
        "norm_eps": f.number("norm_eps", 1e-5),
        "norm": "layernorm",
        "qkv_bias": f.bool("attention_bias", False),
        "output_bias": f.bool("attention_bias", False),
        "mlp_bias": f.bool("mlp_bias", False),
        **_relu_mlp(f, "hidden_act", "relu2"),
    }
    if out["num_kv_heads"] is None:
        raise f.error(
            "field 'num_key_value_heads' is required for nemotron (NemotronAttention divides by it; the class's "
            "None cannot build)"
        )
    return {**out, **_rotary(f, out, 0.5)}


def _llama4_text(f: _Fields) -> dict[str, Any]:
    """Llama 4's text model (transformers' models/llama4: ``Llama4TextConfig``, ``Llama4ForCausalLM``).

    * Attention: q/k/v/o (biased with ``attention_bias``); RoPE on the layers whose ``no_rope_layers`` entry is 1, the
      others NoPE (``nope_layers``; absent or empty, ``int((i + 1) % no_rope_layer_interval != 0)``, interval 4, as
      ``__post_init__``).  The RoPE layers attend within chunks of ``attention_chunk_size`` (``attention_chunk``;
      null: every layer full); a ``layer_types`` must be the one ``__post_init__`` derives.  ``use_qk_norm``:
      ``Llama4TextL2Norm`` on the RoPE layers' Q and K, an RMS norm without a weight (no parameter, no matmul); the
      NoPE layers' attention temperature tuning (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale``)
      scales Q elementwise: neither changes a count, and neither is in the elementwise estimate; both flags are kept
      (``l2_qk_norm``, ``attn_temperature_tuning``) for the training step's replay (``analytic.ops.transformers.llama4``).
    * Feed-forward: layer i is a mixture of experts when i is in ``moe_layers``, which must be (as its default)
      ``range(step - 1, L, step)`` for ``interleave_moe_layer_step`` (our ``moe_every``: (i + 1) % step == 0); the
      other layers a SwiGLU of ``intermediate_size_mlp``.  ``Llama4TextMoe``: a router d -> E (no bias), E =
      ``num_local_experts`` routed experts of ``intermediate_size`` (top ``num_experts_per_tok``, sigmoid scores),
      and one shared expert of ``intermediate_size``.  transformers runs every token through every routed expert
      (``all_experts_run``; see ``flops.expert_rows``)."""
    out = _common(f, tie_default=False)
    layers = out["num_layers"]
    out["d_ff"] = f.int("intermediate_size_mlp")  # the dense layers' width; intermediate_size is the experts'
    expert_width = f.int("intermediate_size")
    l2_qk_norm = f.bool("use_qk_norm", True)  # an L2 norm without weights: no parameter, no matmul
    bias = f.bool("attention_bias", False)
    step = f.int("interleave_moe_layer_step", 1)
    moe = f.raw("moe_layers")
    if moe is not None and moe != list(range(step - 1, layers, step)):
        raise f.error(
            f"field 'moe_layers' = {short_repr(moe)} is not supported: lm-accounting models every "
            f"interleave_moe_layer_step-th layer as a mixture of experts (layers {step - 1}, {2 * step - 1}, ...; "
            f"transformers' default for step {step})"
        )
    rope = f.raw("no_rope_layers")
    if not rope:  # None or []: __post_init__'s default
        rope = [int((i + 1) % f.int("no_rope_layer_interval", 4) != 0) for i in range(layers)]
    else:
        f.raw("no_rope_layer_interval")  # unused beside the list
    if not isinstance(rope, list) or len(rope) < layers or any(r not in (0, 1) or isinstance(r, float) for r in rope):
        raise f.error(
            f"field 'no_rope_layers' must be a list of 0/1 flags, one per layer ({layers}), got {short_repr(rope)}"
        )
    chunk = f.int("attention_chunk_size", None, allow_none=True)
    types = f.raw("layer_types")
    derived = ["chunked_attention" if rope[i] and chunk is not None else "full_attention" for i in range(layers)]
    if types is not None and types != derived:
        raise f.error(
            "field 'layer_types' is not supported for Llama 4: chunked attention on the RoPE layers "
            "(no_rope_layers 1) when attention_chunk_size is set, full attention on the others"
        )
    return {
        **out,
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
        "nope_layers": tuple(i for i in range(layers) if not rope[i]),
        "attention_chunk": chunk,
        "num_experts": f.int("num_local_experts", null=False),
        "experts_per_token": f.int("num_experts_per_tok", null=False),
        "expert_d_ff": expert_width,
        "shared_experts": 1,
        "moe_every": step,
        "all_experts_run": True,
        "l2_qk_norm": l2_qk_norm,
        "attn_temperature_tuning": f.bool("attn_temperature_tuning", True),
    }


# -- Mamba2 hybrids (issue 30): Nemotron-H -------------------------------------------------------------------------
NEMOTRON_H_LETTERS = {"linear_attention": "M", "full_attention": "*", "mlp": "-", "moe": "E"}
"""``NemotronHConfig._list_to_pattern``: each layer type of ``layers_block_type`` as its letter of
``hybrid_override_pattern`` (``config.PATTERN_LETTERS``; ``E``, a mixture of experts, is refused by
``ModelConfig``)."""


def _nemotron_h_pattern(f: _Fields) -> str:
    """The layer pattern: ``hybrid_override_pattern`` (the hub's spelling; the class converts it to
    ``layers_block_type``) or ``layers_block_type`` / ``layer_types`` (what ``save_pretrained`` writes), else the
    class's default list.  The class takes its layer count from the pattern and ignores ``num_hidden_layers``; a
    ``num_hidden_layers`` that disagrees with it is refused (the file describes two models)."""
    pattern = f.raw("hybrid_override_pattern")
    types = f.raw("layers_block_type")
    if types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) and t in NEMOTRON_H_LETTERS for t in types):
            raise f.error(
                f"field '{f.key('layers_block_type')}' must be a list of {', '.join(map(repr, NEMOTRON_H_LETTERS))}"
            )
        pattern = "".join(NEMOTRON_H_LETTERS[t] for t in types)  # the class prefers the list
    elif pattern is None:
        pattern = "ME*-"  # the class's default ["linear_attention", "moe", "full_attention", "mlp"]
    if not isinstance(pattern, str) or not pattern or set(pattern) - set(NEMOTRON_H_LETTERS.values()):
        raise f.error(
            f"field 'hybrid_override_pattern' must be a string of M, *, - and E, one per layer, got {short_repr(pattern)}"
        )
    layers = f.raw("num_hidden_layers")
    if layers is not None and layers != len(pattern):
        raise f.error(
            f"the layer pattern lists {len(pattern)} layers, num_hidden_layers is {short_repr(layers)} "
            "(transformers builds the pattern's and ignores num_hidden_layers)"
        )
    return pattern


def _legacy(f: _Fields, legacy: str, name: str) -> str:
    """``legacy`` when the file has it (``NemotronHConfig.__post_init__`` pops it from kwargs over ``name``, which is
    then unread), else ``name``."""
    if f.has(legacy):
        f.used.add(name)
        return legacy
    return name


def _nemotron_h(f: _Fields) -> dict[str, Any]:
    """Nemotron-H (transformers' models/nemotron_h, ``NemotronHBlock``): one pre-RMSNorm block per letter of the
    layer pattern (``_nemotron_h_pattern``), ``x + mixer(norm(x))``: ``M`` a ``NemotronHMamba2Mixer`` of
    ``mamba_num_heads`` × ``mamba_head_dim`` with ``n_groups`` groups of ``ssm_state_size``, a conv of
    ``conv_kernel`` taps and chunks of ``chunk_size`` (the legacy ``mamba_*`` spellings the class's
    ``__post_init__`` renames are read too); ``*`` a ``NemotronHAttention`` (q/k/v/o without bias, whatever
    ``attention_bias`` says, and no rotary embedding: ``positions = none``); ``-`` a ``NemotronHMLP`` (``up_proj``,
    ``down_proj``, ``mlp_hidden_act``, ``mlp_bias``); ``E`` a ``NemotronHMoE``: ``n_routed_experts`` experts of
    ``moe_intermediate_size`` without gate (top ``num_experts_per_tok`` by sigmoid scores, within ``topk_group`` of
    ``n_group`` groups), over ``moe_latent_size`` features when set (``fc1_latent_proj``, ``fc2_latent_proj``), and
    one shared ``NemotronHMLP`` of ``moe_shared_expert_intermediate_size`` (``n_shared_experts`` and
    ``moe_shared_expert_overlap`` are read by nothing).  The class builds ``in_proj``/``out_proj`` with ``use_bias``
    and the conv with ``use_conv_bias``: only False and True are modelled.  ``NemotronHForCausalLM._tied_weights_keys``
    is empty: the head is never tied to the embeddings, whatever ``tie_word_embeddings`` says (read, and
    ``tie_embeddings`` false).  Ignored (no count changes): ``expand`` and ``mamba_proj_bias`` (nothing reads them),
    the time-step limits and initialisation, ``residual_in_fp32``, ``rescale_prenorm_residual``,
    ``use_mamba_kernels``, ``mamba_ssm_cache_dtype`` (the modeling file never reads it: the SSM state is the scan's
    fp32 output), the Mamba2 fields of a pattern without ``M`` and the expert fields of one without ``E`` (they
    build nothing), and the multi-token-prediction fields (transformers builds no MTP layer)."""
    mamba = {
        "mamba_heads": f.int("mamba_num_heads"),
        "mamba_head_dim": f.int("mamba_head_dim"),
        "mamba_state_size": f.int("ssm_state_size"),
        "mamba_groups": f.int(_legacy(f, "mamba_n_groups", "n_groups")),
        "mamba_conv_kernel": f.int(_legacy(f, "mamba_d_conv", "conv_kernel")),
        "mamba_chunk_size": f.int(_legacy(f, "mamba_chunk_size", "chunk_size")),
    }
    f.only(
        _legacy(f, "mamba_conv_bias", "use_conv_bias"), (True,), "a Mamba2 conv1d with a bias (Nemotron-H's default)"
    )
    f.only("use_bias", (False,), "Mamba2 in_proj and out_proj without biases (Nemotron-H's default)")
    f.only("mamba_hidden_act", ("silu",), "a Mamba2 mixer with SiLU after its conv (Nemotron-H's default)")
    f.only("sliding_window", (None,), "full attention (Nemotron-H's default)")
    pattern = _nemotron_h_pattern(f)
    f.bool("tie_word_embeddings", False)  # read (a wrong type is refused), but the class never ties its head
    experts = {}
    if "E" not in pattern:  # the expert fields build nothing
        f.used |= {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts"}
        f.used |= {"moe_shared_expert_intermediate_size", "moe_latent_size", "moe_shared_expert_overlap"}
        f.used |= {"n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor"}
    else:  # NemotronHMoE (its router's e_score_correction_bias is a buffer, not a parameter)
        f.used |= {"n_shared_experts", "moe_shared_expert_overlap", "routed_scaling_factor"}  # nothing reads them
        experts = {
            **_experts(f, "n_routed_experts", "moe_intermediate_size"),
            "shared_experts": 1,
            "shared_expert_d_ff": f.int("moe_shared_expert_intermediate_size", null=False),
            "expert_latent": f.int("moe_latent_size", None, allow_none=True),
            "norm_topk_prob": f.bool("norm_topk_prob", True),
            "expert_groups": f.int("n_group", 1),
            "expert_groups_per_token": f.int("topk_group", 1),
        }
    return {
        **experts,
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": len(pattern),
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": f.int("head_dim", None),
        "d_ff": f.int("intermediate_size"),
        "context_length": f.int("max_position_embeddings"),
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_embeddings": False,
        "positions": "none",
        "mlp_bias": f.bool("mlp_bias", False),
        **_relu_mlp(f, "mlp_hidden_act", "relu2"),
        "layer_pattern": pattern,
        **(mamba if "M" in pattern else {}),
    }


def _bamba(f: _Fields) -> dict[str, Any]:
    """Bamba (transformers' models/bamba, ``BambaDecoderLayer``): Llama's pre-RMSNorm block (``input_layernorm``,
    ``pre_ff_layernorm``, a SwiGLU ``feed_forward`` with ``mlp_bias``) whose mixer is attention on the layers of
    ``attn_layer_indices`` (q/k/v/o with ``attention_bias``, RoPE on the first half of each head: the class's
    ``__post_init__`` sets ``partial_rotary_factor`` 0.5) and a ``BambaMixer`` on the others: Nemotron-H's Mamba2
    mixer (``mixer_ffn``; its sizes: ``_expanded_mamba``).  Refused: a ``layer_types`` that disagrees with
    ``attn_layer_indices`` (the class derives the one from the other)."""
    layers = f.int("num_hidden_layers")
    indices = f.raw("attn_layer_indices") or []
    if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
        raise f.error(f"field 'attn_layer_indices' must be a list of layer indices, got {short_repr(indices)}")
    if any(not 0 <= i < layers for i in indices):
        raise f.error(f"field 'attn_layer_indices' names a layer outside 0..{layers - 1}: {short_repr(indices)}")
    pattern = "".join("*" if i in indices else "M" for i in range(layers))
    types = f.raw("layers_block_type")
    if types is not None and types != ["full_attention" if c == "*" else "linear_attention" for c in pattern]:
        raise f.error(
            f"field '{f.key('layers_block_type')}' disagrees with attn_layer_indices (BambaConfig derives it from them)"
        )
    bias = f.bool("attention_bias", False)
    out = {
        **_common(f, tie_default=False, partial=True),
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": f.bool("mlp_bias", False),
        "mlp": _only_swiglu(f, "hidden_act"),
        "layer_pattern": pattern,
        "mixer_ffn": True,
        **_expanded_mamba(f),
    }
    return {**out, **_rotary(f, out, 0.5)}


def _expanded_mamba(f: _Fields, inner: int | None = None) -> dict[str, Any]:
    """The Mamba2 fields of Bamba and Granite-4.0-H (``BambaMixer``, ``GraniteMoeHybridMambaLayer``): ``mamba_n_heads``
    heads of ``mamba_d_head`` ("auto": ``mamba_expand · hidden_size / mamba_n_heads``; the classes require heads ·
    head size = ``mamba_expand · hidden_size``, the mixer's width), ``mamba_n_groups`` groups of ``mamba_d_state``, a
    conv of ``mamba_d_conv`` taps with a bias (``mamba_conv_bias`` false is refused) and chunks of
    ``mamba_chunk_size``; ``mamba_proj_bias`` true (biases on in_proj and out_proj) is refused.  ``inner``: the
    mixer's width when the class takes it from elsewhere (Falcon-H1's ``mamba_d_ssm``)."""
    f.only("mamba_conv_bias", (True,), "a Mamba2 conv1d with a bias (the class's default)")
    f.only("mamba_proj_bias", (False,), "Mamba2 in_proj and out_proj without biases (the class's default)")
    d, heads = f.int("hidden_size"), f.int("mamba_n_heads")
    width = f"mamba_expand · hidden_size = {f.int('mamba_expand') * d}" if inner is None else f"mamba_d_ssm = {inner}"
    inner = f.int("mamba_expand") * d if inner is None else inner
    head = f.raw("mamba_d_head")
    head = inner // heads if head in (None, "auto") else f.int("mamba_d_head")
    if heads * head != inner:
        raise f.error(
            f"mamba_n_heads · mamba_d_head = {heads} · {head} must be {width} ({CONFIG_CLASSES[f.model_type]} "
            "refuses it)"
        )
    return {
        "mamba_heads": heads,
        "mamba_head_dim": head,
        "mamba_state_size": f.int("mamba_d_state"),
        "mamba_groups": f.int("mamba_n_groups"),
        "mamba_conv_kernel": f.int("mamba_d_conv"),
        "mamba_chunk_size": f.int("mamba_chunk_size"),
    }


def _falcon_h1(f: _Fields) -> dict[str, Any]:
    """Falcon-H1 (transformers' models/falcon_h1, ``FalconH1DecoderLayer``): every layer ``H``, attention (q/k/v/o
    with ``attention_bias``, full RoPE) and a ``FalconH1Mixer`` (Bamba's Mamba2, ``_expanded_mamba``, of width
    ``mamba_d_ssm`` when given, else ``mamba_expand · hidden_size``; its gated RMSNorm only with ``mamba_rms_norm``,
    normed before or after the gate as ``mamba_norm_before_gate`` says: read, no count) side by side on ``input_layernorm``, their outputs summed, then ``pre_ff_layernorm`` and a SwiGLU of
    ``intermediate_size`` (``mlp_bias``).  Its multipliers (``embedding_multiplier``, ``lm_head_multiplier``,
    ``mlp_multipliers``, ``key_multiplier``, the attention and SSM in/out multipliers, ``ssm_multipliers``'
    ``mup_vector``) scale activations by constants: no parameter, no matmul (ignored).  Refused: ``projectors_bias``
    (a bias on the mixer's ``out_proj``), not modelled."""
    f.only("projectors_bias", (False,), "a Mamba2 out_proj without bias (Falcon-H1's default)")
    layers = f.int("num_hidden_layers")
    types = f.raw("layers_block_type")
    if types is not None and types != ["hybrid"] * layers:
        raise f.error(f"field '{f.key('layers_block_type')}' must be 'hybrid' on every layer (FalconH1Config's)")
    inner = f.int("mamba_d_ssm", None, allow_none=True)  # the class's 1,024; null: mamba_expand · hidden_size
    if inner is not None:
        f.used.add("mamba_expand")  # unread by the class when mamba_d_ssm is given
    bias = f.bool("attention_bias", False)
    return {
        **_common(f, tie_default=False),
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp_bias": f.bool("mlp_bias", False),
        "mlp": _only_swiglu(f, "hidden_act"),
        "layer_pattern": "H" * layers,
        "mixer_ffn": True,
        "mamba_norm": f.bool("mamba_rms_norm", False),
        # no count: which side of the gated norm the gate multiplies (the training step's tensors)
        "mamba_norm_before_gate": f.bool("mamba_norm_before_gate", True),
        **_expanded_mamba(f, inner),
    }


SSM_CONTEXT = 2048
"""The context of a pure state-space model read from its config.json (the default ``--context``): its class has no
``max_position_embeddings`` (no position limit), so the 2,048 tokens the Mamba and Mamba2 papers train at (Gu & Dao
2023, arXiv:2312.00752, §4.2; Dao & Gu 2024, arXiv:2405.21060, §9.2).  It sizes nothing: no parameter depends on it."""


def _mamba2(f: _Fields) -> dict[str, Any]:
    """Mamba2 (transformers' models/mamba2, ``Mamba2ForCausalLM``, config ``Mamba2Config``): ``num_hidden_layers``
    ``Mamba2Block`` blocks, each ``x + mixer(norm(x))`` with an RMSNorm and a ``Mamba2Mixer`` (Nemotron-H's Mamba2 mixer:
    ``num_heads`` × ``head_dim``, ``n_groups`` groups of ``state_size``, a conv of ``conv_kernel`` taps, chunks of
    ``chunk_size``, the gated RMSNorm), then ``norm_f`` and ``lm_head`` (tied to the embeddings by
    ``tie_word_embeddings``): our ``layer_pattern`` of ``M`` only, no attention and no MLP.  The class requires
    ``hidden_size · expand = num_heads · head_dim`` (``validate_architecture``; refused otherwise, as transformers
    refuses it).  The mixer builds ``in_proj``/``out_proj`` with ``use_bias`` and the conv with ``use_conv_bias``:
    only False and True are modelled.  Ignored (no count changes): ``time_step_rank`` (the mixer keeps it and builds
    nothing with it), the time-step limits and initialisation, ``rescale_prenorm_residual``; ``residual_in_fp32`` (default true)
    changes no count but the training step's residual dtype (``ModelConfig.residual_in_fp32``).  No attention heads and no MLP width: ``num_heads`` 1 and ``d_ff`` = d (they size
    nothing without ``*`` or ``-`` layers); the context is ``SSM_CONTEXT``."""
    f.only("use_bias", (False,), "Mamba2 in_proj and out_proj without biases (Mamba2Config's default)")
    f.only("use_conv_bias", (True,), "a Mamba2 conv1d with a bias (Mamba2Config's default)")
    f.only("hidden_act", ("silu",), "a Mamba2 mixer with SiLU after its conv (Mamba2Config's default)")
    d, heads, head = f.int("hidden_size"), f.int("num_heads"), f.int("head_dim")
    expand = f.int("expand")
    if d * expand != heads * head:
        raise f.error(
            f"hidden_size · expand = {d} · {expand} must equal num_heads · head_dim = {heads} · {head} "
            "(Mamba2Config refuses it)"
        )
    layers = f.int("num_hidden_layers")
    return {
        **_state_space_model(f, d, layers, "M", tied=False),
        "mamba_heads": heads,
        "mamba_head_dim": head,
        "mamba_state_size": f.int("state_size"),
        "mamba_groups": f.int("n_groups"),
        "mamba_conv_kernel": f.int("conv_kernel"),
        "mamba_chunk_size": f.int("chunk_size"),
        "residual_in_fp32": f.bool("residual_in_fp32", True),
    }


def _state_space_model(f: _Fields, d: int, layers: int, letter: str, tied: bool) -> dict[str, Any]:
    """The fields a pure state-space model (Mamba2's or Mamba's ``letter`` on every layer, no attention, no MLP)
    shares: ``num_heads`` 1 and ``d_ff`` = d size nothing, the context is ``SSM_CONTEXT`` (the class has no position
    limit), ``tie_word_embeddings`` defaults to the class's ``tied``."""
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": layers,
        "num_heads": 1,
        "d_ff": d,
        "context_length": SSM_CONTEXT,
        "norm_eps": f.number("layer_norm_epsilon", 1e-5),
        "tie_embeddings": f.bool("tie_word_embeddings", tied),
        "positions": "none",
        "layer_pattern": letter * layers,
    }


def _mamba(f: _Fields, norms: str = "none") -> dict[str, Any]:
    """Mamba (transformers' models/mamba, ``MambaForCausalLM``, config ``MambaConfig``): ``num_hidden_layers``
    ``MambaBlock`` blocks, each ``x + mixer(norm(x))`` with an RMSNorm and a ``MambaMixer`` (``config.SSM_FIELDS``:
    ``expand · hidden_size`` channels, ``state_size``, a dt rank of ``time_step_rank``, "auto" = ⌈hidden_size / 16⌉
    as ``__post_init__`` resolves it, a conv of ``conv_kernel`` taps), then ``norm_f`` and ``lm_head`` (tied by
    ``tie_word_embeddings``, default true): our ``layer_pattern`` of ``S`` only, no attention and no MLP.  The mixer
    builds ``in_proj``/``out_proj`` with ``use_bias`` and the conv with ``use_conv_bias``: only False and True are
    modelled; ``hidden_act`` SiLU only.  Ignored: ``_MAMBA_IGNORED``.  No attention heads and no MLP width:
    ``num_heads`` 1 and ``d_ff`` = d (they size nothing); the context is ``SSM_CONTEXT``.  ``norms``: Falcon-Mamba's
    weightless RMSNorms on dt, B and C (``_falcon_mamba``)."""
    what = CONFIG_CLASSES[f.model_type]
    f.only("use_bias", (False,), f"Mamba in_proj and out_proj without biases ({what}'s default)")
    f.only("use_conv_bias", (True,), f"a Mamba conv1d with a bias ({what}'s default)")
    f.only("hidden_act", ("silu",), f"a Mamba mixer with SiLU after its conv ({what}'s default)")
    d, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    rank = f.raw("time_step_rank", "auto")
    rank = -(-d // 16) if rank == "auto" else f.int("time_step_rank")
    return {
        **_state_space_model(f, d, layers, "S", tied=True),
        "ssm_inner": f.int("expand") * d,
        "ssm_state_size": f.int("state_size"),
        "ssm_dt_rank": rank,
        "ssm_conv_kernel": f.int("conv_kernel"),
        "ssm_norms": norms,
        "residual_in_fp32": f.bool("residual_in_fp32", True),  # no count: the training step's residual dtype
    }


def _falcon_mamba(f: _Fields) -> dict[str, Any]:
    """Falcon-Mamba (transformers' models/falcon_mamba, ``FalconMambaForCausalLM``): Mamba's model (``_mamba``) whose
    mixer normalises dt, B and C after ``x_proj`` with ``FalconMambaWeightlessRMSNorm`` (``mixer_rms_eps``; its
    ``weight`` is a non-persistent buffer: no parameter, elementwise FLOPs only).  ``use_falcon_mambapy`` picks
    mambapy's scan, not the count (ignored, as ``use_mambapy``)."""
    return _mamba(f, "weightless")


def _jamba(f: _Fields) -> dict[str, Any]:
    """Jamba (transformers' models/jamba, ``JambaForCausalLM``, config ``JambaConfig``): Llama's two-sublayer block
    (``mixer_ffn``: ``input_layernorm``, a mixer, ``pre_ff_layernorm``, an FFN) whose mixer is attention on the layers
    i with i % ``attn_layer_period`` = ``attn_layer_offset`` (``JambaAttention``: GQA q/k/v/o without bias and without
    any position encoding, heads of ``head_dim`` when the file sets it, else hidden_size / heads) and a
    ``JambaMambaMixer`` on the others (``S``: Mamba's mixer with ``mamba_expand · hidden_size`` channels, state
    ``mamba_d_state``, dt rank ``mamba_dt_rank``, "auto" = ⌈hidden_size / 16⌉, a conv of ``mamba_d_conv`` taps, and
    RMSNorms with gains on dt, B and C: ``ssm_norms`` "rmsnorm"); the FFN is a ``JambaSparseMoeBlock`` (a router
    without bias, softmax top ``num_experts_per_tok`` of ``num_experts`` SwiGLU experts of ``intermediate_size``, gate
    and up fused) on the layers i with i % ``expert_layer_period`` = ``expert_layer_offset`` when ``num_experts`` > 1,
    else a SwiGLU ``JambaMLP`` of ``intermediate_size``.  Experts are placed by our ``moe_every`` = the period, i.e.
    (i + 1) % period = 0: an offset other than period − 1 is refused (Jamba-v0.1's is 2, 1).  ``mamba_conv_bias``
    false, ``mamba_proj_bias`` true and an activation other than SiLU (the MLPs' and the mixer's) are refused."""
    f.only("mamba_conv_bias", (True,), "a Mamba conv1d with a bias (JambaConfig's default)")
    f.only("mamba_proj_bias", (False,), "Mamba in_proj and out_proj without biases (JambaConfig's default)")
    f.only("hidden_act", ("silu",), "SiLU in the SwiGLU MLPs and after the Mamba conv (JambaConfig's default)")
    d, layers = f.int("hidden_size"), f.int("num_hidden_layers")
    periods = {}
    for what in ("attn", "expert"):
        period, offset = f.int(f"{what}_layer_period"), f.raw(f"{what}_layer_offset")
        if not isinstance(offset, int) or isinstance(offset, bool) or not 0 <= offset < period:
            raise f.error(
                f"field '{what}_layer_offset' must be an integer in 0..{period - 1} ({what}_layer_period {period}; "
                f"JambaConfig refuses it), got {short_repr(offset)}"
            )
        periods[what] = (period, offset)
    period, offset = periods["attn"]
    pattern = "".join("*" if i % period == offset else "S" for i in range(layers))
    period, offset = periods["expert"]
    experts: dict[str, Any] = {}
    if f.int("num_experts") > 1 and any(i % period == offset for i in range(layers)):
        if offset != period - 1:
            raise f.error(
                f"expert_layer_offset = {offset} with expert_layer_period = {period}: lm-accounting places the "
                "experts on the layers i with (i + 1) % period = 0 (offset period − 1) only"
            )
        experts = {**_experts(f, "num_experts", None), "moe_every": period}
    else:  # every FFN a JambaMLP: the routing fields build nothing
        f.used.add("num_experts_per_tok")
    rank = f.raw("mamba_dt_rank", "auto")
    return {
        **experts,
        "vocab_size": f.int("vocab_size"),
        "d_model": d,
        "num_layers": layers,
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": f.int("head_dim", None),
        "d_ff": f.int("intermediate_size"),
        "context_length": f.int("max_position_embeddings"),
        "norm_eps": f.number("rms_norm_eps", 1e-6),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "positions": "none",
        "mlp": "swiglu",
        "layer_pattern": pattern,
        "mixer_ffn": True,
        "ssm_inner": f.int("mamba_expand") * d,
        "ssm_state_size": f.int("mamba_d_state"),
        "ssm_dt_rank": -(-d // 16) if rank == "auto" else f.int("mamba_dt_rank"),
        "ssm_conv_kernel": f.int("mamba_d_conv"),
        "ssm_norms": "rmsnorm",
    }


GRANITE_HYBRID_LETTERS = {"linear_attention": "M", "full_attention": "*", "mamba": "M", "attention": "*"}
"""Granite-4.0-H's ``layer_types``, the transformers 5 names and the legacy ones ``remap_legacy_layer_types``
(configuration_utils.py) renames, as ``layer_pattern`` letters."""


def _granitemoehybrid(f: _Fields) -> dict[str, Any]:
    """Granite-4.0-H (transformers' models/granitemoehybrid, ``GraniteMoeHybridDecoderLayer``): Bamba's block
    (``mixer_ffn``): ``input_layernorm``, a mixer (a ``GraniteMoeHybridMambaLayer``, Bamba's Mamba2, on the
    ``layer_types`` "mamba" layers, attention with ``attention_bias`` on the others; the class's default: every
    layer Mamba2), ``post_attention_layernorm`` and ``shared_mlp``, a SwiGLU of ``shared_intermediate_size`` with its
    gate and up fused (``input_linear``).  Attention has RoPE when ``position_embedding_type`` is "rope" and no
    position otherwise (the class's None: ``rotary_emb`` is None).  Granite's four multipliers scale by constants
    (read, no count).  With ``num_local_experts`` > 0 (the class's default 8: Granite-4.0-H-Tiny and -Small) every
    layer adds ``block_sparse_moe``, GraniteMoe's routed SwiGLU experts of ``intermediate_size`` (top
    ``num_experts_per_tok``, a router without bias), summed with ``shared_mlp`` (our one shared expert); with 0 it has
    ``shared_mlp`` alone (a dense SwiGLU)."""
    shared = f.int("shared_intermediate_size")
    if f.raw("num_local_experts", 8) == 0:  # dense: shared_mlp alone; the expert fields build nothing
        f.used |= {"num_experts_per_tok", "intermediate_size"}
        ffn = {"d_ff": shared}
    else:  # GraniteMoeShared's: routed SwiGLU experts of intermediate_size beside the always-on shared_mlp
        ffn = {"d_ff": f.int("intermediate_size"), **_experts(f, "num_local_experts", None)}
        ffn |= {"shared_experts": 1, "shared_expert_d_ff": shared}
    for key in GRANITE_MULTIPLIERS:
        f.number(key, 1.0)
    layers = f.int("num_hidden_layers")
    types = f.raw("layer_types")
    if types is None:
        types = ["mamba"] * layers
    if not isinstance(types, list) or not all(isinstance(t, str) and t in GRANITE_HYBRID_LETTERS for t in types):
        raise f.error(
            f"field '{f.key('layer_types')}' must be a list of {', '.join(map(repr, GRANITE_HYBRID_LETTERS))}"
        )
    if len(types) != layers:
        raise f.error(f"field '{f.key('layer_types')}' lists {len(types)} layers, num_hidden_layers is {layers}")
    position = f.raw("position_embedding_type")
    if position not in (None, "nope", "rope"):
        raise f.error(f"field 'position_embedding_type' = {short_repr(position)} is not supported: rope or none")
    bias = f.bool("attention_bias", False)
    theta = _rope_theta(f)
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": layers,
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": f.int("head_dim", None),
        **ffn,
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": theta,
        "norm_eps": f.number("rms_norm_eps", 1e-6),
        "tie_embeddings": f.bool("tie_word_embeddings", False),
        "positions": "rope" if position == "rope" else "none",
        "qkv_bias": bias,
        "output_bias": bias,
        "mlp": _only_swiglu(f, "hidden_act"),
        "layer_pattern": "".join(GRANITE_HYBRID_LETTERS[t] for t in types),
        "mixer_ffn": True,
        **_expanded_mamba(f),
    }


LFM2_LETTERS = {"conv": "C", "full_attention": "*"}
"""LFM2's ``layer_types`` as ``layer_pattern`` letters: a short convolution or attention (``Lfm2DecoderLayer``)."""


def _lfm2_pattern(f: _Fields, layers: int) -> str:
    """LFM2's ``layer_types`` as a pattern; absent (``lfm2`` only): ``full_attn_idxs`` as ``Lfm2Config.__post_init__``
    derives it, attention on those layers and a short convolution on the others, every layer attention when both are
    absent.  ``Lfm2MoeConfig`` derives nothing: its layers need ``layer_types``."""
    types = f.raw("layer_types")
    if types is None and f.model_type == "lfm2":
        indices = f.raw("full_attn_idxs")
        if indices is None:
            return "*" * layers
        if not isinstance(indices, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in indices):
            raise f.error(f"field 'full_attn_idxs' must be a list of layer indices, got {short_repr(indices)}")
        return "".join("*" if i in indices else "C" for i in range(layers))
    f.used.add("full_attn_idxs")  # the class ignores it when layer_types is given
    if types is None:
        raise f.error("missing required field 'layer_types' (Lfm2MoeConfig derives none: 'conv' / 'full_attention')")
    if not isinstance(types, list) or not all(isinstance(t, str) and t in LFM2_LETTERS for t in types):
        raise f.error(f"field 'layer_types' must be a list of {' / '.join(map(repr, LFM2_LETTERS))}")
    if len(types) != layers:
        raise f.error(f"field 'layer_types' lists {len(types)} layers, num_hidden_layers is {layers}")
    return "".join(LFM2_LETTERS[t] for t in types)


def _lfm2_ff_dim(f: _Fields) -> int:
    """``Lfm2MLP``'s width (models/lfm2/modeling_lfm2.py), transformers' arithmetic as written: with
    ``block_auto_adjust_ff_dim``, ``int(2 · intermediate_size / 3)``, then ``int(block_ffn_dim_multiplier · that)``
    rounded up to a multiple of ``block_multiple_of`` (the modeling file skips both on a null multiplier, which
    transformers 5.24's strict ``Lfm2Config`` refuses, as we do); ``block_ff_dim`` is the
    legacy name of ``intermediate_size`` (``Lfm2Config.__post_init__`` pops it over the field)."""
    width = f.int("block_ff_dim") if f.has("block_ff_dim") else f.int("intermediate_size")
    f.used.add("intermediate_size")
    if not f.bool("block_auto_adjust_ff_dim", True):
        f.used |= {"block_ffn_dim_multiplier", "block_multiple_of"}  # unread by the MLP without the adjustment
        return width
    width = int(2 * width / 3)
    multiplier = f.raw("block_ffn_dim_multiplier")  # null: refused, as Lfm2Config's strict float | int field does
    multiplier = positive_number(multiplier, f"{f.source}: field 'block_ffn_dim_multiplier'")
    multiple = f.int("block_multiple_of")
    width = int(multiplier * width)
    width = multiple * ((width + multiple - 1) // multiple)
    return width if width >= 1 else _no_width(f, width)


def _no_width(f: _Fields, width: int) -> int:
    raise f.error(f"the MLP's adjusted width is {width} (block_auto_adjust_ff_dim): transformers builds no MLP")


def _lfm2_common(f: _Fields) -> dict[str, Any]:
    """LFM2's and LFM2-MoE's shared fields (models/lfm2/modeling_lfm2.py): ``Lfm2DecoderLayer`` is a pre-RMSNorm block
    (``operator_norm``, the mixer, ``ffn_norm``, the MLP: ``mixer_ffn``) whose mixer is attention (q/k/v/``out_proj``
    without biases, per-head RMSNorms ``q_layernorm``, ``k_layernorm``, full RoPE) on the "full_attention" layers and
    an ``Lfm2ShortConv`` (``config.PATTERN_LETTERS``' ``C``: ``conv_L_cache`` taps, ``conv_bias`` on the conv,
    ``in_proj`` and ``out_proj``) on the "conv" layers (without one, no pattern: Llama's blocks with qk-norm, as
    ``Lfm2Config``'s defaults build); ``embedding_norm`` is the final norm (applied after the last layer).  ``tie_embedding`` is the legacy name of ``tie_word_embeddings`` (``__post_init__`` pops it over the
    field); ``head_dim``, which the classes do not define, is read as ``Lfm2Attention``'s ``getattr`` reads it."""
    layers = f.int("num_hidden_layers")
    pattern = _lfm2_pattern(f, layers)
    tied = f.bool("tie_embedding", True) if f.has("tie_embedding") else f.bool("tie_word_embeddings", True)
    f.used.add("tie_word_embeddings")
    conv = f.int("conv_L_cache")
    bias = f.bool("conv_bias", False)
    return {
        "vocab_size": f.int("vocab_size"),
        "d_model": f.int("hidden_size"),
        "num_layers": layers,
        "num_heads": f.int("num_attention_heads"),
        "num_kv_heads": f.int("num_key_value_heads", None),
        "head_dim": f.int("head_dim", None),
        "context_length": f.int("max_position_embeddings"),
        "rope_theta": _rope_theta(f),
        "norm_eps": f.number("norm_eps", 1e-5),
        "tie_embeddings": tied,
        "qk_norm": True,
        **({"layer_pattern": pattern, "mixer_ffn": True} if "C" in pattern else {}),  # all attention: Llama's blocks
        **({"short_conv_kernel": conv, "short_conv_bias": bias} if "C" in pattern else {}),
    }


def _lfm2(f: _Fields) -> dict[str, Any]:
    """LFM2 (transformers' models/lfm2, ``Lfm2ForCausalLM``): ``_lfm2_common`` with a SwiGLU ``Lfm2MLP`` (w1, w3, w2;
    no bias) of ``_lfm2_ff_dim`` in every layer."""
    return {**_lfm2_common(f), "d_ff": _lfm2_ff_dim(f)}


def _lfm2_moe(f: _Fields) -> dict[str, Any]:
    """LFM2-MoE (transformers' models/lfm2_moe, ``Lfm2MoeForCausalLM``): ``_lfm2_common``; the first
    ``num_dense_layers`` layers have a SwiGLU ``Lfm2MoeMLP`` of ``intermediate_size`` as it is (no adjustment), the
    others an ``Lfm2MoeSparseMoeBlock``: ``num_experts`` SwiGLU experts of ``moe_intermediate_size`` (``gate_up_proj``,
    ``down_proj``), top ``num_experts_per_tok`` of a d -> E router without bias (``gate.weight``).  The router's
    sigmoid scores, its ``expert_bias`` (a buffer added to pick the top k: no parameter, ``use_expert_bias``), the
    division by their sum (``norm_topk_prob``) and ``routed_scaling_factor`` change which experts and by what weight,
    not how many: no count."""
    f.number("routed_scaling_factor", 1.0)
    return {
        **_lfm2_common(f),
        "router_buffer_bias": f.bool("use_expert_bias", True),  # no count: the training step's router tensors
        "d_ff": f.int("intermediate_size"),
        **_experts(f, "num_experts", "moe_intermediate_size"),
        "dense_layers_first": _count(f, "num_dense_layers"),
        "norm_topk_prob": f.bool("norm_topk_prob", True),
    }


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
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "granite": _granite,
    "granitemoe": _granite_moe,
    "granitemoeshared": _granite_moe,
    "helium": _helium,
    "internlm3": _internlm3,
    "exaone": _llama_like,
    "ernie4_5": lambda f: _llama_like(f, bias="use_bias"),
    "seed_oss": _seed_oss,
    "ministral": lambda f: _head_dim_given(f, _mistral(f)),
    "ministral3": _mistral,
    "smollm3": _smollm3,
    "hunyuan_v1_dense": lambda f: _head_dim_given(f, _llama_like(f, qk_norm=True)),
    "gemma": _gemma1,
    "olmo3": _olmo3,
    "exaone4": _exaone4,
    "olmoe": _olmoe,
    "phimoe": _phimoe,
    "hy_v3": _hy_v3,
    "hunyuan_v1_moe": _hunyuan_moe,
    "iquestcoder": _llama_like,
    "sarvam_mla": _sarvam_mla,
    "youtu": _youtu,
    "vaultgemma": _vaultgemma,
    "hyperclovax": _hyperclovax,
    "glm4_moe_lite": _glm4_moe_lite,
    "starcoder2": _starcoder2,
    "gpt_bigcode": _gpt_bigcode,
    "gpt_oss": _gpt_oss,
    "qwen2_moe": _qwen2_moe,
    "olmo": _olmo,
    "bloom": _bloom,
    "ernie4_5_moe": _ernie4_5_moe,
    "glm4_moe": _glm4_moe,
    "minimax_m2": _minimax_m2,
    "glm4": lambda f: _glm(f, sandwich=True),
    "glm": _glm,
    "stablelm": _stablelm,
    "qwen3_next": _qwen3_next,
    "qwen3_5_text": lambda f: _qwen_hybrid(f, "intermediate_size"),
    "qwen3_5_moe_text": _qwen3_5_moe_text,
    "cohere": _cohere,
    "cohere2": _cohere,
    "phi": _phi,
    "gpt_neox": _gpt_neox,
    "gptj": _gptj,
    "falcon": _falcon,
    "opt": _opt,
    "nemotron": _nemotron,
    "deepseek_v32": _deepseek_v32,
    "glm_moe_dsa": _glm_moe_dsa,
    "llama4_text": _llama4_text,
    "nemotron_h": _nemotron_h,
    "bamba": _bamba,
    "granitemoehybrid": _granitemoehybrid,
    "falcon_h1": _falcon_h1,
    "lfm2": _lfm2,
    "lfm2_moe": _lfm2_moe,
    "mamba2": _mamba2,
    "mamba": _mamba,
    "falcon_mamba": _falcon_mamba,
    "jamba": _jamba,
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
    if model_type in SAME_CLASSES:  # GPT-SW3: GPT-2's configuration and model classes
        data = {**data, "model_type": SAME_CLASSES[model_type]}
        model_type = SAME_CLASSES[model_type]
    if model_type in REFUSED_WRAPPERS:
        text_type = REFUSED_WRAPPERS[model_type]
        raise ConfigError(
            f"{source}: model_type '{model_type}' is a multimodal wrapper whose text model '{text_type}' has "
            f"{REFUSED_MODEL_TYPES[text_type]}"
        )
    if model_type in REFUSED_MODEL_TYPES:
        raise ConfigError(f"{source}: model_type '{model_type}' has {REFUSED_MODEL_TYPES[model_type]}")
    if model_type in WRAPPERS:
        return _wrapped(data, source, name, model_type)
    if model_type not in MAPPINGS:
        text = data.get("text_config")
        inner = text.get("model_type") if isinstance(text, Mapping) else None
        hint = f"; its text_config is a '{inner}', but only a {' or '.join(WRAPPERS)} wrapper is read" if inner else ""
        raise ConfigError(
            f"{source}: unsupported model_type {short_repr(model_type)} "
            f"(supported: {', '.join(SUPPORTED_MODEL_TYPES + tuple(WRAPPERS))}){hint}"
        )
    f = _Fields(data, source, model_type)
    fields = _read(f)
    dropout = tuple(
        (k, float(data[k]))
        for k in DROPOUT_FIELDS + DROPOUT_FIELDS_OF.get(model_type, ())
        if isinstance(data.get(k), (int, float)) and not isinstance(data.get(k), bool)
    )
    return dataclasses.replace(_model(fields, source, name, f.ignored()), dropout=dropout)


DROPOUT_FIELDS = ("attention_dropout", "hidden_dropout", "embd_pdrop", "resid_pdrop", "attn_pdrop")
DROPOUT_FIELDS += ("residual_dropout", "embedding_dropout")  # StarCoder2's and Seed-OSS's
DROPOUT_FIELDS_OF = {"opt": ("dropout", "layerdrop")}
"""Dropout fields read for one class only: their names are common words another class's config.json may carry
without meaning (``OPTConfig``'s; no other class with a program defines them)."""
GPT_BIGCODE_DROPOUT = {"attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1}
"""``GPTBigCodeConfig``'s dropouts (configuration_gpt_bigcode.py:65-67): the class's values where a config.json
leaves one out."""
OPT_DROPOUT = {"dropout": 0.1, "attention_dropout": 0.0}
"""``OPTConfig``'s dropouts (configuration_opt.py:61-62); its ``layerdrop`` (0.0) skips whole layers at random."""
DROPOUT_MODELLED = {
    "gpt2": {"attn_pdrop": 0.1, "resid_pdrop": 0.1, "embd_pdrop": 0.1},
    "gpt_bigcode": dict.fromkeys(GPT_BIGCODE_DROPOUT),
    "opt": dict.fromkeys(OPT_DROPOUT),
}
"""The dropout probabilities the transformers programs model (``analytic.ops.transformers``): GPT-2's three at
``GPT2Config``'s 0.1; GPTBigCode's three and OPT's two at any probability (None); every other family (and OPT's
``layerdrop``) at 0."""


def unmodelled_dropout(cfg: ModelConfig) -> list[str]:
    """The config.json's dropout fields whose probability the transformers program does not model, as
    ``name p``."""
    modelled = DROPOUT_MODELLED.get(cfg.hf_model_type or "", {})
    any_p = [k for k, p in modelled.items() if p is None]
    return [f"{k} {p:g}" for k, p in cfg.dropout if k not in any_p and p != modelled.get(k, 0.0)]


def _read(f: _Fields) -> dict[str, Any]:
    """The ``ModelConfig`` fields of ``f``'s model type (``_refuse_unknown`` after reading)."""
    fields = {**MAPPINGS[f.model_type](f), "hf_model_type": f.model_type}
    _refuse_unknown(f)
    return fields


def _refuse_unknown(f: _Fields) -> None:
    """A field the configuration class defines that was neither read nor known to change no count is refused
    (the class may build something else with it); a field it does not define is ignored (``f.ignored``)."""
    unknown = f.not_understood()
    if unknown:
        raise f.error(
            f"{'field' if len(unknown) == 1 else 'fields'} {', '.join(short_repr(k) for k in unknown)} "
            f"{'is' if len(unknown) == 1 else 'are'} not understood for model_type '{f.model_type}' (transformers' "
            f"{CONFIG_CLASSES[f.model_type]} defines {'it' if len(unknown) == 1 else 'them'}; lm-accounting cannot "
            "tell whether they change the counts)"
        )


def _model(fields: dict[str, Any], source: str, name: str, ignored: tuple[str, ...]) -> ModelConfig:
    keep_none = ("num_kv_heads", "head_dim", "expert_d_ff", "q_lora_rank")
    fields = {k: v for k, v in fields.items() if v is not None or k in keep_none}
    try:
        return ModelConfig(**fields, name=name, ignored_fields=ignored)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


TIED_BY_TEXT = frozenset(["llama4"])
"""Wrappers whose LM head is tied by the ``text_config``'s own ``tie_word_embeddings``, not the wrapper's:
``Llama4ForConditionalGeneration`` builds ``Llama4ForCausalLM(config.text_config)``, which ties by its config
(tests/test_arch_llama4.py); the wrapper's flag is ignored.  The other wrappers tie by the wrapper's flag."""


def _wrapped(data: Mapping[str, Any], source: str, name: str, model_type: str) -> ModelConfig:
    """A multimodal wrapper (Gemma 3's ``gemma3``, Mistral 3's ``mistral3``, Kimi K2.5's ``kimi_k25``): its
    ``text_config`` read as the text model type (for ``WRAPPERS_OF_ANY_TEXT``, any supported one), the
    text class's defaults filling what the published ``text_config`` leaves out (``WRAPPED_TEXT_DEFAULTS``),
    and the wrapper's ``tie_word_embeddings`` (the flag transformers ties the wrapped LM head by).  The vision
    tower and the projector are not counted, and the model's name says so."""
    w = _Fields(data, source, model_type)
    text_type = WRAPPERS[model_type]
    text = w.raw("text_config")
    if not isinstance(text, Mapping):
        shown = "missing" if text is None else f"not an object ({short_repr(text)})"
        raise w.error(
            f"model_type '{model_type}' is a multimodal wrapper and its text model ('text_config') is {shown}; "
            "lm-accounting counts the text model of a wrapper"
        )
    inner = text.get("model_type", text_type)
    allowed = SUPPORTED_MODEL_TYPES if model_type in WRAPPERS_OF_ANY_TEXT else (text_type,)
    if inner in REFUSED_MODEL_TYPES:
        raise w.error(
            f"model_type '{model_type}' is a multimodal wrapper whose text model '{inner}' has "
            f"{REFUSED_MODEL_TYPES[inner]}"
        )
    if inner not in allowed:
        wanted = f"'{text_type}'" if len(allowed) == 1 else "a supported model_type"
        raise w.error(f"field 'text_config.model_type' must be {wanted}, got {short_repr(inner)}")
    text_type = inner
    tie = None if model_type in TIED_BY_TEXT else w.bool("tie_word_embeddings", True)
    _refuse_unknown(w)  # the wrapper's own fields: read, ignored or refused like any other
    f = _Fields(text, f"{source}: text_config", text_type, WRAPPED_TEXT_DEFAULTS.get(text_type, {}))
    fields = _read(f)
    if tie is not None:
        fields["tie_embeddings"] = tie
        f.used.discard("tie_word_embeddings")  # the text_config's own flag is not the one transformers reads
    note = f" (text model of a {model_type} wrapper; the vision tower is not counted)"
    return _model(fields, source, name[: MAX_NAME_CHARS - len(note)] + note, w.ignored() + f.ignored("text_config."))


def _reject_constant(name: str) -> Any:
    """``Infinity`` and ``-Infinity`` as floats: transformers writes an infinite float so (``json.dumps``; the Mamba2
    classes' ``time_step_limit`` default is (0.0, inf)), and a count field given one is refused as not an integer;
    ``NaN`` is refused."""
    if name in ("Infinity", "-Infinity"):
        return float(name)
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
    return config_from_hf(data, str(path), file_label(path, stem))


# -- the reverse map: a ModelConfig as the config.json transformers builds its model from ------------------
def _write_mamba(cfg: ModelConfig) -> dict[str, Any]:
    """Mamba's and Falcon-Mamba's config.json (``_mamba``): the mixer's widths, ``expand`` = E / d (an E that is no
    multiple of d cannot be written: ``to_hf_dict`` refuses it)."""
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "state_size": cfg.ssm_state_size,
        "expand": cfg.ssm_inner // cfg.d_model,
        "conv_kernel": cfg.ssm_conv_kernel,
        "time_step_rank": cfg.ssm_dt_rank,
        "residual_in_fp32": cfg.residual_in_fp32,
    }


def _write_jamba(cfg: ModelConfig) -> dict[str, Any]:
    """Jamba's config.json (``_jamba``): the attention layers as a period and an offset (the first ``*`` and the
    distance to the next; a pattern they do not give back is refused by ``to_hf_dict``), the experts on every
    ``moe_every``-th layer counted from 1."""
    stars = [i for i in range(cfg.num_layers) if cfg.layer_kind(i) == "*"]
    period = stars[1] - stars[0] if len(stars) > 1 else cfg.num_layers + 1
    every = cfg.moe_every if cfg.moe else 1
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.d_head,
        "max_position_embeddings": cfg.context_length,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "attn_layer_period": period,
        "attn_layer_offset": stars[0] if stars else cfg.num_layers,
        "num_experts": cfg.num_experts if cfg.moe else 1,
        "num_experts_per_tok": cfg.experts_per_token if cfg.moe else 1,
        "expert_layer_period": every,
        "expert_layer_offset": every - 1,
        "mamba_d_state": cfg.ssm_state_size,
        "mamba_d_conv": cfg.ssm_conv_kernel,
        "mamba_expand": cfg.ssm_inner // cfg.d_model,
        "mamba_dt_rank": cfg.ssm_dt_rank,
    }


def to_hf_dict(cfg: ModelConfig) -> dict[str, Any]:
    """The config.json of ``cfg`` for transformers' class of ``cfg.hf_model_type``:
    ``AutoConfig.for_model(**to_hf_dict(cfg))`` builds the model whose parameter count is ours
    (tests/test_measure_hf.py builds every preset with a type and every config.json of
    tests/test_transformers_truth.py on meta).  Every count-relevant field is written explicitly, so no class
    default (Mistral's ``sliding_window`` 4,096, Qwen3's ``head_dim`` 128) fills in for ours; no token ids
    (``NO_TOKEN_IDS``).  The context is the step's sequence, not a size: GPT-2's position table stays
    ``max_position_embeddings`` (a step at 256 tokens of a 1,024-position model), and a windowed model with fewer
    layers than its full-attention period (a 2-layer Gemma 3) is written with every layer sliding.  A config
    without a type, or with an option the type's class cannot express (a course preset, Llama with a q/k/v bias
    but no output bias), or of a type with no writer (``WRITERS``: the zoo's types are read, not written back,
    except EXAONE 3 and InternLM3, which the ``llama`` program measures), is a one-line ``ConfigError``."""
    model_type = cfg.hf_model_type
    if model_type is None:
        raise ConfigError(
            f"{cfg.name} is not a Hugging Face model (no hf_model_type): transformers has no class for it"
        )
    if model_type not in WRITERS:
        raise ConfigError(
            f"{cfg.name}: hf_model_type '{model_type}' is not one lm-accounting writes back as a config.json "
            f"(written: {', '.join(WRITERS)})"
        )
    values = {"model_type": model_type, **WRITERS[model_type](cfg), **NO_TOKEN_IDS}
    expected = config_from_hf(values, f"{cfg.name} ({model_type})")
    ours, theirs = _built(cfg), _built(expected)
    differ = [k for k in ours if ours[k] != theirs[k]]
    if differ:
        key = differ[0]
        raise ConfigError(
            f"{cfg.name}: {key} = {short_repr(ours[key])} cannot be written as a "
            f"{model_type} config.json (transformers' class builds {short_repr(theirs[key])})"
        )
    return values


NO_TOKEN_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
"""The token ids ``to_hf_dict`` writes: none.  They change no count and no byte (``padding_idx`` only zeroes
one row of the embedding's gradient, in place), and a class default can lie outside a vocabulary shrunk with
``--vocab-size``: Phi-3's ``pad_token_id`` 32,000 makes ``nn.Embedding`` refuse a 1,024-row table
("Padding_idx must be within num_embeddings"), GPT-2's, Phi-3's and OLMo-2's ``bos``/``eos`` ids draw
transformers' out-of-vocabulary warnings."""


def _built(cfg: ModelConfig) -> dict[str, Any]:
    """What fixes transformers' model of ``cfg``: every resolved field but the name, the ignored fields and the
    training context (``context_length``: the sequence a step runs, not a size; GPT-2's position table is
    ``max_position_embeddings``, written as ``n_positions``), and ``full_attention_every`` only where a layer has
    full attention (a Gemma 3 of fewer than 6 layers windows
    every layer, as its ``layer_types`` say)."""
    out = {k: v for k, v in cfg.resolved().items() if k not in ("name", "ignored_fields", "context_length")}
    if out["full_attention_every"] is not None and out["full_attention_every"] > cfg.num_layers:
        out["full_attention_every"] = None
    return out


def _write_common(cfg: ModelConfig, act: str = "hidden_act") -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.context_length,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        act: {"swiglu": "silu", "geglu": "gelu_pytorch_tanh", "gelu": "gelu_new"}[cfg.mlp],
    }


def _write_window(cfg: ModelConfig, *, layer_types: bool) -> dict[str, Any]:
    """``sliding_window`` (null: none), and for the classes that read it ``layer_types`` (the windowed layers)."""
    out: dict[str, Any] = {"sliding_window": cfg.sliding_window}
    if layer_types:
        out["layer_types"] = [
            "sliding_attention" if cfg.layer_windowed(i) else "full_attention" for i in range(cfg.num_layers)
        ]
    return out


def _write_glm(cfg: ModelConfig) -> dict[str, Any]:
    """GLM and GLM-4-0414: Llama's fields, ``attention_bias`` on q/k/v and the rotated share of each head."""
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta, "partial_rotary_factor": cfg.rope_dim / cfg.d_head}
    return {**_write_common(cfg), "attention_bias": cfg.qkv_bias, "rope_parameters": rope}


def _write_gpt2(cfg: ModelConfig) -> dict[str, Any]:
    return {
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_inner": cfg.d_ff,
        "n_positions": cfg.position_rows,
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "activation_function": "gelu_new",
    }


def _write_falcon(cfg: ModelConfig) -> dict[str, Any]:
    """Falcon's block from ``parallel_block`` and the K/V heads (``_falcon``): two norms, or K/V heads other than 1
    and h, is the new architecture; one norm the old one side by side (Falcon-7B's), none sequential."""
    h, kv = cfg.num_heads, cfg.kv_heads
    new = cfg.parallel_block == "two_norms" or kv not in (1, h)
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": h,
        "num_kv_heads": kv,
        "new_decoder_architecture": new,
        "num_ln_in_parallel_attn": (2 if cfg.parallel_block == "two_norms" else 1) if new else None,
        "parallel_attn": cfg.parallel_block != "none",
        "multi_query": not new and kv == 1,
        "ffn_hidden_size": cfg.d_ff,
        "max_position_embeddings": cfg.context_length,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bias": cfg.qkv_bias,
        "activation": cfg.hf_activation or "gelu",
        "alibi": False,
    }


def _write_llama(cfg: ModelConfig) -> dict[str, Any]:
    return {**_write_common(cfg), "attention_bias": cfg.qkv_bias, "mlp_bias": cfg.mlp_bias}


def _write_granite(cfg: ModelConfig) -> dict[str, Any]:
    """Granite-MoE's ``attention_bias`` (q/k/v and o); its multipliers left at the class's 1.0: they change no count
    and no byte."""
    return {"attention_bias": cfg.qkv_bias}


def _write_experts(cfg: ModelConfig, count: str) -> dict[str, Any]:
    return {count: cfg.num_experts, "num_experts_per_tok": cfg.experts_per_token}


def _write_qwen3(cfg: ModelConfig) -> dict[str, Any]:
    return {**_write_common(cfg), "attention_bias": cfg.qkv_bias, "use_sliding_window": False}


def _write_gemma(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **_write_common(cfg, "hidden_activation"),
        "attention_bias": cfg.qkv_bias,
        **_write_window(cfg, layer_types=True),
    }


def _write_deepseek(cfg: ModelConfig) -> dict[str, Any]:
    out = _write_common(cfg)
    del out["head_dim"]  # DeepSeek's head_dim is the RoPE part, derived from qk_rope_head_dim
    shared = cfg.shared_experts
    if shared and cfg.shared_width % shared == 0:
        shared_each = cfg.shared_width // shared
        if shared_each != cfg.expert_width:  # DeepSeek's shared MLP is n_shared_experts experts wide
            shared = 0  # not expressible: to_hf_dict's round trip names the field
    return {
        **out,
        **_write_experts(cfg, "n_routed_experts"),
        "moe_intermediate_size": cfg.expert_width,
        "n_shared_experts": shared,
        "first_k_dense_replace": cfg.dense_layers_first,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "attention_bias": False,
        "norm_topk_prob": cfg.norm_topk_prob,
        "n_group": cfg.expert_groups,
        "topk_group": cfg.expert_groups_per_token,
        **({"rope_interleave": cfg.rope_interleave} if cfg.hf_model_type != "deepseek_v2" else {}),
        **({"topk_method": cfg.topk_method or "greedy"} if cfg.hf_model_type == "deepseek_v2" else {}),
    }


def _write_glm4_moe_lite(cfg: ModelConfig) -> dict[str, Any]:
    """DeepSeek-V3's fields, the dense first layers as ``mlp_layer_types`` (the class has no
    ``first_k_dense_replace``)."""
    out = _write_deepseek(cfg)
    k = out.pop("first_k_dense_replace")
    return {**out, "mlp_layer_types": ["dense"] * k + ["sparse"] * (cfg.num_layers - k)}


def _write_deepseek_v32(cfg: ModelConfig) -> dict[str, Any]:
    """DeepSeek-V3's fields (but ``rope_interleave``, which the class lacks: always interleaved) and the
    indexer's; GLM-5's ``indexer_types`` from ``indexer_pattern`` (DeepSeek-V3.2's class has none: every layer
    full, so a pattern there does not round-trip and ``to_hf_dict`` names it)."""
    out = {k: v for k, v in _write_deepseek(cfg).items() if k != "rope_interleave"}
    pattern = cfg.indexer_pattern or "F" * cfg.num_layers
    types = {"indexer_types": ["full" if c == "F" else "shared" for c in pattern]}
    return {
        **out,
        "index_n_heads": cfg.index_heads,
        "index_head_dim": cfg.index_head_dim,
        "index_topk": cfg.index_topk,
        **(types if cfg.hf_model_type == "glm_moe_dsa" else {}),
    }


def _write_youtu(cfg: ModelConfig) -> dict[str, Any]:
    """Youtu: DeepSeek's latent attention fields, no experts (its class keeps V3's expert fields, unread)."""
    out = _write_common(cfg)
    del out["head_dim"]  # the RoPE part, derived from qk_rope_head_dim
    return {
        **out,
        "kv_lora_rank": cfg.kv_lora_rank,
        "q_lora_rank": cfg.q_lora_rank,
        "qk_nope_head_dim": cfg.qk_nope_head_dim,
        "qk_rope_head_dim": cfg.qk_rope_head_dim,
        "v_head_dim": cfg.v_head_dim,
        "attention_bias": False,
        "rope_interleave": cfg.rope_interleave,
    }


def _write_qwen_hybrid(cfg: ModelConfig) -> dict[str, Any]:
    """Qwen3-Next's and Qwen3.5's attention and Gated DeltaNet fields (``_qwen_hybrid``): the layer kinds as
    ``full_attention_interval`` (1: every layer full attention), RoPE on ``rotary_dim / head_dim`` of each head."""
    out = {
        **_write_common(cfg),
        "attention_bias": False,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
        "full_attention_interval": cfg.full_attention_interval or 1,
    }
    if cfg.hybrid:
        out |= {
            "linear_num_key_heads": cfg.linear_key_heads,
            "linear_num_value_heads": cfg.linear_value_heads,
            "linear_key_head_dim": cfg.linear_key_head_dim,
            "linear_value_head_dim": cfg.linear_value_head_dim,
            "linear_conv_kernel_dim": cfg.linear_conv_kernel,
        }
    return out


def _write_qwen_hybrid_moe(cfg: ModelConfig) -> dict[str, Any]:
    return {
        **_write_experts(cfg, "num_experts"),
        "moe_intermediate_size": cfg.expert_width,
        "shared_expert_intermediate_size": cfg.shared_width,
    }


def _write_qwen3_next(cfg: ModelConfig) -> dict[str, Any]:
    if not cfg.moe:
        return {**_write_qwen_hybrid(cfg), "num_experts": 0}
    return {
        **_write_qwen_hybrid(cfg),
        **_write_qwen_hybrid_moe(cfg),
        "decoder_sparse_step": cfg.moe_every,
        "mlp_only_layers": [],
        "norm_topk_prob": cfg.norm_topk_prob,
    }


def _write_lfm2(cfg: ModelConfig) -> dict[str, Any]:
    """LFM2's and LFM2-MoE's shared fields (``_lfm2_common``): ``layer_types`` always (``Lfm2MoeConfig`` needs them),
    ``head_dim`` only where it is not d / heads (the classes define none; ``Lfm2Attention`` reads it by ``getattr``)."""
    out = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "max_position_embeddings": cfg.context_length,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "layer_types": ["conv" if cfg.layer_kind(i) == "C" else "full_attention" for i in range(cfg.num_layers)],
        "conv_L_cache": cfg.short_conv_kernel or 3,
        "conv_bias": cfg.short_conv_bias,
    }
    return out if cfg.d_head * cfg.num_heads == cfg.d_model else {**out, "head_dim": cfg.d_head}


WRITERS: dict[str, Callable[[ModelConfig], dict[str, Any]]] = {
    "gpt2": _write_gpt2,
    "llama": _write_llama,
    "mistral": lambda cfg: {**_write_common(cfg), **_write_window(cfg, layer_types=False)},
    "mixtral": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_local_experts"),
        **_write_window(cfg, layer_types=False),
    },
    "qwen2": lambda cfg: {**_write_common(cfg), "use_sliding_window": False},
    "qwen3": _write_qwen3,
    "qwen3_moe": lambda cfg: {
        **_write_qwen3(cfg),
        **_write_experts(cfg, "num_experts"),
        "moe_intermediate_size": cfg.expert_width,
        "decoder_sparse_step": cfg.moe_every,
        "mlp_only_layers": [],
        "norm_topk_prob": cfg.norm_topk_prob,
    },
    "gemma2": _write_gemma,
    "gemma3_text": _write_gemma,
    "vaultgemma": _write_gemma,
    "phi3": lambda cfg: {**_write_common(cfg), **_write_window(cfg, layer_types=False)},
    "olmo2": lambda cfg: {**_write_common(cfg), "attention_bias": cfg.qkv_bias},
    "deepseek_v2": _write_deepseek,
    "deepseek_v3": _write_deepseek,
    "sarvam_mla": _write_deepseek,  # transformers builds DeepseekV3ForCausalLM for it
    "glm4_moe_lite": _write_glm4_moe_lite,
    "youtu": _write_youtu,
    "deepseek_v32": _write_deepseek_v32,
    "glm_moe_dsa": _write_deepseek_v32,
    "exaone": _write_llama,  # transformers builds LlamaForCausalLM for these two
    "internlm3": _write_llama,
    "helium": _write_llama,
    "smollm3": lambda cfg: {
        **_write_llama(cfg),
        "no_rope_layers": [int(i not in cfg.nope_layers) for i in range(cfg.num_layers)],
        "use_sliding_window": False,
    },
    "granite": _write_llama,
    "hyperclovax": lambda cfg: {**_write_llama(cfg), "use_post_norm": cfg.norm_placement == "sandwich"},
    "gemma": lambda cfg: {**_write_common(cfg), "attention_bias": cfg.qkv_bias},
    "olmo3": lambda cfg: {
        **_write_common(cfg),
        "attention_bias": cfg.qkv_bias,
        **_write_window(cfg, layer_types=True),
    },  # its multipliers left at the class's 1.0: they change no count and no byte
    "iquestcoder": _write_llama,
    "glm": _write_glm,
    "stablelm": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k not in ("head_dim", "rms_norm_eps")},
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
        "layer_norm_eps": cfg.norm_eps,
        "use_qkv_bias": cfg.qkv_bias,
        "use_parallel_residual": cfg.parallel_block == "one_norm",
        "qk_layernorm": False,
    },
    "glm4": _write_glm,
    "exaone4": lambda cfg: {
        **_write_common(cfg),
        # null only without NoPE layers (with a window given, transformers skips RoPE on every full layer); the
        # class's 4,096 where every layer is full yet NoPE; layer_types always (a null window's pattern is 0)
        "sliding_window": cfg.sliding_window or (4096 if cfg.nope_layers else None),
        "layer_types": _write_window(cfg, layer_types=True)["layer_types"],
    },
    "starcoder2": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k not in ("rms_norm_eps", "head_dim")},
        "norm_epsilon": cfg.norm_eps,
        "hidden_act": cfg.hf_activation or "gelu_pytorch_tanh",
        "use_bias": cfg.qkv_bias,
        **_write_window(cfg, layer_types=False),
    },
    "ernie4_5": lambda cfg: {**_write_common(cfg), "use_bias": cfg.qkv_bias},
    "seed_oss": lambda cfg: {
        **_write_common(cfg),
        "attention_bias": cfg.qkv_bias,
        "attention_out_bias": cfg.output_bias,
        "mlp_bias": cfg.mlp_bias,
        # the config.json's dropouts, else the class's 0.1 (configuration_seed_oss.py:80-81): they shape training
        **{k: dict(cfg.dropout).get(k, 0.1) for k in SEED_OSS_DROPOUT},
    },
    "ministral": lambda cfg: {**_write_common(cfg), **_write_window(cfg, layer_types=True)},
    "ministral3": lambda cfg: {
        **_write_common(cfg),
        **_write_window(cfg, layer_types=False),
        # Llama 4's attention scale reads both (modeling_ministral3.py:147-151); their values change no count or byte
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "llama_4_scaling_beta": 0.1,
            "original_max_position_embeddings": cfg.context_length,
        },
    },
    "hunyuan_v1_dense": lambda cfg: {**_write_common(cfg), "attention_bias": cfg.qkv_bias},
    "gpt_oss": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_local_experts"),
        "attention_bias": cfg.qkv_bias,
        "swiglu_limit": cfg.swiglu_limit,
        **_write_window(cfg, layer_types=True),
    },
    "qwen3_next": _write_qwen3_next,
    "qwen3_5_text": _write_qwen_hybrid,
    "qwen3_5_moe_text": lambda cfg: {
        **{k: v for k, v in _write_qwen_hybrid(cfg).items() if k != "intermediate_size"},
        **_write_qwen_hybrid_moe(cfg),
    },
    "qwen2_moe": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_experts"),
        "qkv_bias": cfg.qkv_bias,
        "moe_intermediate_size": cfg.expert_width,
        "shared_expert_intermediate_size": cfg.shared_width,
        "decoder_sparse_step": cfg.moe_every,
        "mlp_only_layers": [],
        "use_sliding_window": False,
        "norm_topk_prob": cfg.norm_topk_prob,
    },
    "olmo": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k not in ("head_dim", "rms_norm_eps")},
        "attention_bias": cfg.qkv_bias,
    },
    "bloom": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
    },
    "cohere": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k != "rms_norm_eps"},
        "layer_norm_eps": cfg.norm_eps,
        "attention_bias": cfg.qkv_bias,
        "use_qk_norm": cfg.qk_norm,
    },
    "cohere2": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k != "rms_norm_eps"},
        "layer_norm_eps": cfg.norm_eps,
        "attention_bias": cfg.qkv_bias,
        **_write_window(cfg, layer_types=True),
    },
    "gptj": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "n_embd": cfg.d_model,
        "n_layer": cfg.num_layers,
        "n_head": cfg.num_heads,
        "n_positions": cfg.context_length,
        "n_inner": cfg.d_ff,
        "rotary_dim": cfg.rope_dim,
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "activation_function": cfg.hf_activation or "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
    "phi": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k not in ("rms_norm_eps", "hidden_act")},
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
        "layer_norm_eps": cfg.norm_eps,
        "hidden_act": cfg.hf_activation or "gelu_new",
        "qk_layernorm": cfg.qk_norm,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
    },
    "gpt_neox": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.context_length,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
        "layer_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": cfg.hf_activation or "gelu",
        "attention_bias": cfg.qkv_bias,
        "use_parallel_residual": cfg.parallel_block == "two_norms",
    },
    "ernie4_5_moe": lambda cfg: {
        **_write_common(cfg),
        "use_bias": cfg.qkv_bias,
        "moe_num_experts": cfg.num_experts,
        "moe_k": cfg.experts_per_token,
        "moe_intermediate_size": cfg.expert_width,
        "moe_num_shared_experts": cfg.shared_width // cfg.expert_width if cfg.shared_experts else 0,
        "moe_layer_start_index": cfg.dense_layers_first,
        "moe_layer_interval": cfg.moe_every,
        "moe_layer_end_index": -1,
    },
    "gpt_bigcode": lambda cfg: {
        **_write_gpt2(cfg),
        "activation_function": cfg.hf_activation or "gelu_pytorch_tanh",
        "multi_query": cfg.num_kv_heads == 1,
        # the config.json's dropouts, else the class's 0.1: they shape training
        **{k: dict(cfg.dropout).get(k, p) for k, p in GPT_BIGCODE_DROPOUT.items()},
    },
    "opt": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "ffn_dim": cfg.d_ff,
        "max_position_embeddings": cfg.max_positions,
        "enable_bias": cfg.qkv_bias,
        "layer_norm_elementwise_affine": cfg.norm_weights,
        "tie_word_embeddings": cfg.tie_embeddings,
        "activation_function": cfg.mlp if cfg.mlp != "gelu" else cfg.hf_activation or "gelu",
        # the config.json's dropouts, else the class's: they shape training
        **{k: dict(cfg.dropout).get(k, p) for k, p in OPT_DROPOUT.items()},
    },
    "falcon": _write_falcon,
    "nemotron": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.context_length,
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
        "norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "hidden_act": cfg.mlp if cfg.mlp != "gelu" else cfg.hf_activation or "gelu",
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
    },
    "granitemoe": lambda cfg: {**_write_common(cfg), **_write_experts(cfg, "num_local_experts"), **_write_granite(cfg)},
    "granitemoeshared": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_local_experts"),
        **_write_granite(cfg),
        "shared_intermediate_size": cfg.shared_width if cfg.shared_experts else 0,
    },
    "glm4_moe": lambda cfg: {
        **_write_glm(cfg),
        "use_qk_norm": cfg.qk_norm,
        **_write_experts(cfg, "n_routed_experts"),
        "moe_intermediate_size": cfg.expert_width,
        "n_shared_experts": cfg.shared_experts,
        "first_k_dense_replace": cfg.dense_layers_first,
        "norm_topk_prob": cfg.norm_topk_prob,
        "n_group": cfg.expert_groups,
        "topk_group": cfg.expert_groups_per_token,
    },
    "hunyuan_v1_moe": lambda cfg: {
        **_write_common(cfg),
        "attention_bias": cfg.qkv_bias,
        "num_experts": cfg.num_experts,
        "moe_topk": cfg.experts_per_token,
    },
    "minimax_m2": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_local_experts"),
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": cfg.rope_theta,
            "partial_rotary_factor": cfg.rope_dim / cfg.d_head,
        },
    },
    "llama4_text": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_local_experts"),
        "attention_bias": cfg.qkv_bias,
        "intermediate_size": cfg.expert_width,
        "intermediate_size_mlp": cfg.d_ff,
        "interleave_moe_layer_step": cfg.moe_every,
        "no_rope_layers": [int(i not in cfg.nope_layers) for i in range(cfg.num_layers)],
        "attention_chunk_size": cfg.attention_chunk,
        "use_qk_norm": cfg.l2_qk_norm,
        "attn_temperature_tuning": cfg.attn_temperature_tuning,
    },
    "hy_v3": lambda cfg: {
        **_write_common(cfg),
        **_write_experts(cfg, "num_experts"),
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
        "moe_intermediate_size": cfg.expert_width,
        "num_shared_experts": cfg.shared_experts,
        "mlp_layer_types": ["dense"] * cfg.dense_layers_first + ["sparse"] * (cfg.num_layers - cfg.dense_layers_first),
        "enable_moe_fp32_combine": cfg.moe_fp32_combine,
    },
    "phimoe": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k != "head_dim"},
        **_write_experts(cfg, "num_local_experts"),
        "attention_bias": cfg.qkv_bias,
        **_write_window(cfg, layer_types=False),
    },
    "nemotron_h": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "hybrid_override_pattern": cfg.layer_pattern,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.d_head,
        "intermediate_size": cfg.d_ff,
        "max_position_embeddings": cfg.context_length,
        "layer_norm_epsilon": cfg.norm_eps,
        "mlp_hidden_act": cfg.mlp if cfg.mlp != "gelu" else cfg.hf_activation or "gelu",
        "mlp_bias": cfg.mlp_bias,
        # the Mamba2 mixer's (the class's defaults where the pattern has no M: they build nothing)
        **(
            {
                "mamba_num_heads": cfg.mamba_heads,
                "mamba_head_dim": cfg.mamba_head_dim,
                "ssm_state_size": cfg.mamba_state_size,
                "n_groups": cfg.mamba_groups,
                "conv_kernel": cfg.mamba_conv_kernel,
                "chunk_size": cfg.mamba_chunk_size,
            }
            if cfg.mamba_layers
            else {}
        ),
        # the E layers' (NemotronHMoE)
        **(
            {
                "n_routed_experts": cfg.num_experts,
                "num_experts_per_tok": cfg.experts_per_token,
                "moe_intermediate_size": cfg.expert_width,
                "moe_shared_expert_intermediate_size": cfg.shared_width,
                "moe_latent_size": cfg.expert_latent,
                "norm_topk_prob": cfg.norm_topk_prob,
                "n_group": cfg.expert_groups,
                "topk_group": cfg.expert_groups_per_token,
            }
            if cfg.moe
            else {}
        ),
    },
    "bamba": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k != "rope_parameters"},
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},  # partial 0.5: the class's
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
        "attn_layer_indices": [i for i in range(cfg.num_layers) if cfg.layer_kind(i) == "*"],
        "mamba_n_heads": cfg.mamba_heads,
        "mamba_d_head": cfg.mamba_head_dim,
        "mamba_n_groups": cfg.mamba_groups,
        "mamba_d_state": cfg.mamba_state_size,
        "mamba_d_conv": cfg.mamba_conv_kernel,
        "mamba_chunk_size": cfg.mamba_chunk_size,
        "mamba_expand": cfg.mamba_inner // cfg.d_model,
    },
    "granitemoehybrid": lambda cfg: {
        **{k: v for k, v in _write_common(cfg).items() if k != "intermediate_size"},
        "intermediate_size": cfg.d_ff,
        "shared_intermediate_size": cfg.shared_width if cfg.moe else cfg.d_ff,
        **(_write_experts(cfg, "num_local_experts") if cfg.moe else {"num_local_experts": 0}),
        "attention_bias": cfg.qkv_bias,
        "position_embedding_type": "rope" if cfg.positions == "rope" else None,
        "layer_types": ["attention" if cfg.layer_kind(i) == "*" else "mamba" for i in range(cfg.num_layers)],
        "mamba_n_heads": cfg.mamba_heads,
        "mamba_d_head": cfg.mamba_head_dim,
        "mamba_n_groups": cfg.mamba_groups,
        "mamba_d_state": cfg.mamba_state_size,
        "mamba_d_conv": cfg.mamba_conv_kernel,
        "mamba_chunk_size": cfg.mamba_chunk_size,
        "mamba_expand": cfg.mamba_inner // cfg.d_model,
    },
    "falcon_h1": lambda cfg: {
        **_write_common(cfg),
        "attention_bias": cfg.qkv_bias,
        "mlp_bias": cfg.mlp_bias,
        "mamba_rms_norm": cfg.mamba_norm,
        "mamba_norm_before_gate": cfg.mamba_norm_before_gate,
        "mamba_d_ssm": cfg.mamba_inner,
        "mamba_n_heads": cfg.mamba_heads,
        "mamba_d_head": cfg.mamba_head_dim,
        "mamba_n_groups": cfg.mamba_groups,
        "mamba_d_state": cfg.mamba_state_size,
        "mamba_d_conv": cfg.mamba_conv_kernel,
        "mamba_chunk_size": cfg.mamba_chunk_size,
    },
    "mamba": _write_mamba,
    "falcon_mamba": _write_mamba,
    "jamba": _write_jamba,
    "olmoe": lambda cfg: {  # no head_dim: OlmoeConfig has none (d / heads)
        **{k: v for k, v in _write_common(cfg).items() if k != "head_dim"},
        **_write_experts(cfg, "num_experts"),
        "attention_bias": cfg.qkv_bias,
        "norm_topk_prob": cfg.norm_topk_prob,
    },
    "mamba2": lambda cfg: {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers,
        "num_heads": cfg.mamba_heads,
        "head_dim": cfg.mamba_head_dim,
        "expand": cfg.mamba_heads * cfg.mamba_head_dim // cfg.d_model,
        "state_size": cfg.mamba_state_size,
        "n_groups": cfg.mamba_groups,
        "conv_kernel": cfg.mamba_conv_kernel,
        "chunk_size": cfg.mamba_chunk_size,
        "layer_norm_epsilon": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "residual_in_fp32": cfg.residual_in_fp32,
    },
    "lfm2": lambda cfg: {**_write_lfm2(cfg), "intermediate_size": cfg.d_ff, "block_auto_adjust_ff_dim": False},
    "lfm2_moe": lambda cfg: {
        **_write_lfm2(cfg),
        "intermediate_size": cfg.d_ff,
        **_write_experts(cfg, "num_experts"),
        "moe_intermediate_size": cfg.expert_width,
        "num_dense_layers": cfg.dense_layers_first,
        "norm_topk_prob": cfg.norm_topk_prob,
        "use_expert_bias": cfg.router_buffer_bias,
    },
}
"""Per model type, the config.json fields that fix every count (``to_hf_dict``)."""
assert set(WRITERS) <= set(SUPPORTED_MODEL_TYPES)
