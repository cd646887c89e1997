"""The implementations whose training step ``memory`` predicts (``--impl``): the one registry.

An implementation is the model code a user trains with.  The same config trains differently under our
own model and under transformers' modeling code (its eager attention keeps one S×S tensor per layer
where ours keeps two, its RMSNorm upcasts to fp32, its loss upcasts the logits), so every memory figure
names the code it is for.  FLOPs stay one convention (``docs/conventions.md``).

* ``course``: our own ``TransformerLM`` (``lm_accounting.model``), what the CS336 answers use;
* ``transformers``: Hugging Face transformers' ``<Model>ForCausalLM`` in training mode, the class of the
  config's ``hf_model_type``;
* ``torchtitan``: torchtitan's models with its own parallelisms (llama3, qwen3, deepseek_v3).

The default (``default_impl``) is what a user bringing that input most likely runs: a config.json implies
transformers, a preset or a TOML file the course's model.  Nothing here imports a library: whether one is
installed is read with ``importlib.util.find_spec``.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from .config import AccountingError, ModelConfig, is_config_path
from .setup import TrainingSetup

TRANSFORMERS_VERSION = "5.24"
"""The transformers release whose modeling code the ``transformers`` programs follow
(``analytic/ops/transformers``)."""


@dataclass(frozen=True)
class Implementation:
    name: str
    what: str  # one phrase, for the help and the header
    library: str | None  # the module a measurement builds from (None: ours, always installed)
    extra: str | None  # the pip extra that installs it


IMPLEMENTATIONS = {
    "course": Implementation("course", "our own TransformerLM (lm_accounting.model), the CS336 course's", None, None),
    "transformers": Implementation(
        "transformers", f"transformers {TRANSFORMERS_VERSION}'s modeling code in training mode", "transformers", "hf"
    ),
    "torchtitan": Implementation(
        "torchtitan", "torchtitan's models (llama3, qwen3, deepseek_v3)", "torchtitan", "torchtitan"
    ),
}
IMPLS = tuple(IMPLEMENTATIONS)

HF_CAUSAL_LM = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "granitemoeshared": "GraniteMoeSharedForCausalLM",
    "helium": "HeliumForCausalLM",
    "internlm3": "LlamaForCausalLM",
    "exaone": "LlamaForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "ministral": "MinistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "phimoe": "PhimoeForCausalLM",
    "hy_v3": "HYV3ForCausalLM",
    "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
    "iquestcoder": "LlamaForCausalLM",
    "sarvam_mla": "DeepseekV3ForCausalLM",
    "youtu": "YoutuForCausalLM",
    "vaultgemma": "VaultGemmaForCausalLM",
    "hyperclovax": "HyperCLOVAXForCausalLM",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmo": "OlmoForCausalLM",
    "bloom": "BloomForCausalLM",
    "opt": "OPTForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "glm": "GlmForCausalLM",
    "cohere": "CohereForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "phi": "PhiForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "gptj": "GPTJForCausalLM",
    "falcon": "FalconForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "bamba": "BambaForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "mamba": "MambaForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
    "jamba": "JambaForCausalLM",
}
"""transformers 5.24's causal-LM class per ``model_type`` (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` in
``transformers/models/auto/modeling_auto.py``; a Gemma 3 wrapper's text model is ``gemma3_text``): every type
``hf_config`` reads (tests/test_hf_zoo.py checks both).  InternLM3 and EXAONE 3 are built as Llama's class."""

TORCHTITAN_MODELS = {"llama": "llama3", "qwen3": "qwen3", "deepseek_v3": "deepseek_v3"}
"""The ``model_type`` -> torchtitan model it ships (``torchtitan/models/``); no other model_type has one."""

TORCHTITAN_STATUS = (
    "not offered: torchtitan 0.3.0 installs against torch 2.13 on CPU (with ~60 packages and triton, which it "
    "does not declare), but cannot run a training step there "
    "(FlexAttention has no CPU backward, varlen attention no CPU kernel) nor on meta without hand-made varlen "
    "metadata, so its figures cannot be proven against its own code (issue 26); use --impl transformers or "
    "--impl course"
)


def default_impl(source: str | os.PathLike, layout: bool = False) -> str:
    """The implementation a user bringing ``source`` (the PRESET_OR_FILE argument) most likely runs: a
    Hugging Face config.json (a path ending in .json, ``config.load_config``'s rule) implies transformers;
    a preset or a TOML file, the course's model.  Under a parallel ``layout``, course: transformers' layers
    are modelled under data parallel only (``--impl transformers --dp N --zero 0|1|2|3``), ours under every
    layout (the header says so)."""
    hf = is_config_path(source) and os.fspath(source).lower().endswith(".json")
    return "transformers" if hf and not layout else "course"


def check_impl_name(impl: str) -> Implementation:
    if impl not in IMPLEMENTATIONS:
        raise AccountingError(f"unknown --impl '{impl}' (valid: {', '.join(IMPLS)})")
    return IMPLEMENTATIONS[impl]


def check_impl(cfg: ModelConfig, impl: str) -> None:
    """Refuse an implementation ``cfg`` cannot have (an ``AccountingError``, before anything is built):
    transformers for a config with no transformers class (a course preset), torchtitan for a model it does
    not ship, and (for now) torchtitan at all."""
    check_impl_name(impl)
    kind = cfg.hf_model_type
    if impl == "transformers" and kind not in HF_CAUSAL_LM:
        why = (
            f"{cfg.name} is the course's model; transformers has no class for it"
            if kind is None
            else f"no transformers class is known for model_type {kind}"
        )
        raise AccountingError(f"--impl transformers: {why} (use --impl course, or give a config.json)")
    if impl == "torchtitan":
        if kind not in TORCHTITAN_MODELS:
            ships = ", ".join(sorted(set(TORCHTITAN_MODELS.values())))
            raise AccountingError(f"--impl torchtitan: torchtitan ships {ships} only; {cfg.name} is none of them")
        raise AccountingError(f"--impl torchtitan: {TORCHTITAN_STATUS}")


def library_installed(impl: str) -> bool:
    """Whether the library ``impl``'s measurement builds from can be imported (not imported here)."""
    library = check_impl_name(impl).library
    return library is None or importlib.util.find_spec(library) is not None


def check_measurable(impl: str, measure: str) -> None:
    """Refuse ``--measure`` with an implementation whose library is not installed, naming the extra."""
    spec = check_impl_name(impl)
    if measure != "none" and not library_installed(impl):
        raise AccountingError(
            f"--measure {measure} --impl {impl} builds {spec.library}'s own model, and {spec.library} is not "
            f'installed: pip install "lm-accounting[{spec.extra}]"'
        )


def model_class(cfg: ModelConfig, impl: str) -> str:
    """The model class the step is for: ``TransformerLM`` (ours), transformers' class of the config's
    model_type, or torchtitan's model name."""
    if impl == "transformers":
        return HF_CAUSAL_LM[cfg.hf_model_type]
    if impl == "torchtitan":
        return f"torchtitan {TORCHTITAN_MODELS[cfg.hf_model_type]}"
    return "TransformerLM"


ATTENTION_WORDS = {
    "course": {"naive": "naive attention", "sdpa": "sdpa attention"},
    "transformers": {"naive": "eager attention", "sdpa": "sdpa attention"},
    "torchtitan": {"naive": "eager attention", "sdpa": "sdpa attention"},
}


def program_label(cfg: ModelConfig, impl: str, setup: TrainingSetup) -> str:
    """The header's one phrase naming the code predicted: 'transformers 5.24 LlamaForCausalLM, training
    mode, eager attention' or 'our TransformerLM (lm_accounting.model), naive attention'."""
    attention = ATTENTION_WORDS[impl][setup.attention]
    if impl == "transformers":
        return f"transformers {TRANSFORMERS_VERSION} {model_class(cfg, impl)}, training mode, {attention}"
    if impl == "torchtitan":
        return f"{model_class(cfg, impl)}, {attention}"
    return f"our TransformerLM (lm_accounting.model), {attention}"


def implementation_dict(cfg: ModelConfig, impl: str, setup: TrainingSetup) -> dict[str, str | None]:
    """The JSON ``implementation`` object: name, model class, library, the pip extra, the program."""
    spec = IMPLEMENTATIONS[impl]
    return {
        "name": impl,
        "model_class": model_class(cfg, impl),
        "library": spec.library,
        "extra": spec.extra,
        "program": program_label(cfg, impl, setup),
    }
