"""transformers 5.24's modeling code as programs of the op library, one module per model family.

``PROGRAMS`` maps a config's ``hf_model_type`` to the module of this package that transliterates its
modeling file.  Each such module provides ``causal_lm(cfg, seq, setup, batch)`` (the ``*ForCausalLM``
program: ``parameters()`` and ``loss()``, see ``ops.step``) and ``unsupported(cfg, setup)`` (reasons, empty
when covered); ``predict_step`` runs its training step (``ops.step.training_step``) the way
``measure.hf.build_hf_step`` measures the real model.
"""

from __future__ import annotations

import importlib
import inspect

from ....config import ModelConfig
from ....hf_config import unmodelled_dropout
from ....setup import TrainingSetup
from ..cuda import transformers_unsupported
from ..engine import Affine, StepInBatch
from ..step import training_step

PROGRAMS = {
    "mixtral": "moe",
    "qwen3_moe": "moe",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek",
    "glm4_moe_lite": "deepseek",  # Glm4MoeLiteForCausalLM: DeepSeek-V3's attention, router and block
    "sarvam_mla": "deepseek",
    "deepseek_v32": "deepseek_v32",  # DeepSeek-V3's with DSA: the indexer's S² scores, its top-k mask in attention
    "glm_moe_dsa": "deepseek_v32",  # GLM-5: DeepSeek-V3.2's with the indexer's RoPE interleaved
    "youtu": "deepseek",  # YoutuForCausalLM: Llama's model and layer, DeepseekV3Attention, dense MLPs  # DeepseekV3ForCausalLM (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    "llama": "llama",
    "mistral": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "exaone": "llama",  # transformers' EXAONE 3 and InternLM3 are LlamaForCausalLM (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    "internlm3": "llama",
    # Llama's op sequence under another class (checked against each class, tests/test_ops_transformers_zoo.py):
    # IQuest-Coder's file is Llama's; HunYuan-Dense runs its per-head q/k norms after RoPE (``Attention.norm_at``)
    "iquestcoder": "llama",
    "ministral": "llama",  # Mistral's, with both masks built every forward
    "granite": "granite",
    "hunyuan_v1_dense": "llama",
    "smollm3": "llama",  # Llama's, without RoPE on its NoPE layers (``nope_layers``)
    "gpt2": "gpt2",
    "olmo2": "olmo2",
    "olmo3": "olmo2",  # OLMo-2's with a mask and a rotary table per layer type
    "phi3": "phi3",
    "gemma2": "gemma",
    "gemma3_text": "gemma",
    "gemma": "gemma",  # v1: Llama's layer with Gemma's norm, MLP and scaled embedding
    "cohere": "cohere",
    "cohere2": "cohere",  # Cohere2ForCausalLM: Cohere's model, windowed layers (cohere.py)
    "gpt_neox": "gpt_neox",
    "phi": "phi",
    "gptj": "gptj",
    "starcoder2": "starcoder2",
    "exaone4": "exaone4",
    "helium": "interleaved",  # Llama's with RoPE over interleaved pairs (Cohere's rotate_half)
    "ernie4_5": "interleaved",
    "glm": "glm",
    "glm4": "glm",  # GLM-4-0414: GLM's with sandwich norms
    "ministral3": "ministral3",  # Mistral's with Llama 4's attention scale on q
    "vaultgemma": "gemma",  # Gemma 2's without the post-norms
    "hyperclovax": "granite",  # Granite's with a norm after each sub-block (use_post_norm)
    "olmo": "olmo",  # Llama's with weightless LayerNorms and OLMo-2's RoPE
    "seed_oss": "llama",  # Llama's with attention_out_bias; its dropouts (class default 0.1) only at 0
    "stablelm": "stablelm",
    "gpt_bigcode": "gpt_bigcode",  # GPT-2's model with nn.Linear, multi-query attention and Llama's interfaces
    "opt": "opt",
    "bloom": "bloom",
    "falcon": "falcon",  # RoPE only; one norm with 1 or h K/V heads replayed as Falcon-7B's old architecture
    "nemotron": "nemotron",  # Llama's with LayerNorm1P, squared ReLU and partial RoPE; amp-bf16 refused
    "olmoe": "olmoe",  # Qwen3-MoE's sparse block (router first) under OLMo-2's whole-projection q/k norms
    "qwen2_moe": "qwen2_moe",  # Qwen3-MoE's router and experts, a shared expert scaled by a sigmoid gate
    "granitemoe": "granitemoe",  # Granite's multipliers, a top-k-then-softmax router, grouped_mm experts
    "granitemoeshared": "granitemoe",  # Granite-MoE's with an ungated shared MLP (shared_mlp)
    "glm4_moe": "glm4_moe",  # GLM's partial RoPE, Qwen3's q/k norms, DeepSeek-V3's router and sparse block
    "hunyuan_v1_moe": "hunyuan_moe",  # HunYuan-Dense's attention, an fp32 router, an ungated shared MLP
    "ernie4_5_moe": "ernie4_5_moe",  # ERNIE 4.5's attention, an fp32 router with a frozen score bias
    "minimax_m2": "minimax_m2",  # OLMoE's attention with partial RoPE, a sigmoid router with a score bias
    "hy_v3": "hy_v3",  # EXAONE 4's q/k-norm place, an fp32 sigmoid router, shared experts summed in fp32
    "gpt_oss": "gpt_oss",  # sinks, biased experts with a clamped SwiGLU, windows on every other layer
    "phimoe": "phimoe",  # LayerNorms, the sparsemixer router (Gumbel top-2, a custom autograd Function)
    "bamba": "bamba",  # Llama's block around Nemotron-H's Mamba2 mixer or partial-RoPE attention, a SwiGLU
    "falcon_h1": "falcon_h1",  # attention and the Mamba2 mixer side by side in every layer, µP multipliers
    "granitemoehybrid": "granitemoehybrid",  # Granite's multipliers, Nemotron-H's Mamba2 mixer, a fused SwiGLU
    "nemotron_h": "nemotron_h",  # Mamba2 mixers (the PyTorch chunked scan), attention without RoPE, relu² MLPs
    "qwen3_next": "qwen3_next",  # Gated DeltaNet layers (the torch chunked rule) and gated attention, Qwen2-MoE's block
    "qwen3_5_text": "qwen3_5",  # Qwen3-Next's layers with unfused projections, a dense MLP, three-row rotary positions
    "qwen3_5_moe_text": "qwen3_5",  # Qwen3.5's layers with Qwen3-Next's sparse block in every layer
    "lfm2": "lfm2",  # Llama's model around short convolutions (Lfm2ShortConv) or q/k-normed attention, a SwiGLU
    "lfm2_moe": "lfm2_moe",  # LFM2's layers, a sigmoid router with a bias buffer, grouped_mm SwiGLU experts
    "mamba2": "mamba2_lm",  # Nemotron-H's Mamba2 mixer in every block, the residual kept in fp32 (residual_in_fp32)
    "mamba": "mamba",  # the sequential selective scan (a python loop of S steps), fp32 residuals
    "falcon_mamba": "mamba",  # Mamba's with weightless RMSNorms on dt, B and C
    "jamba": "jamba",  # Mamba's mixer (dt/B/C norms with gains) or attention without RoPE, SwiGLU or experts
    "llama4_text": "llama4",  # complex RoPE, NoPE layers with temperature tuning, chunked masks, every expert run (bmm)
}
"""hf_model_type -> the module of this package that transliterates its modeling file."""
B = Affine(1)  # the micro-batch as a symbol


def _module(cfg: ModelConfig):
    return importlib.import_module(f"{__name__}.{PROGRAMS[cfg.hf_model_type]}")


def fp32_kept_parameters(cfg: ModelConfig) -> int:
    """Trained parameters transformers' model of ``cfg`` keeps in fp32 in a 16-bit build
    (``_keep_in_fp32_modules_strict``): a program module's ``fp32_kept_parameters`` (DeepSeek's router weights),
    else 0."""
    if cfg.hf_model_type not in PROGRAMS:
        return 0
    count = getattr(_module(cfg), "fp32_kept_parameters", None)
    return count(cfg) if count else 0


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """Why transformers' model of ``cfg`` under ``setup`` is not replayed (empty: it is)."""
    if cfg.hf_model_type not in PROGRAMS:
        return [f"transformers' {cfg.hf_model_type or cfg.name} is not transliterated (have: {', '.join(PROGRAMS)})"]
    dropout = unmodelled_dropout(cfg)
    why = (
        [f"dropout of {', '.join(dropout)} (the config.json's: transformers applies it in training)"] if dropout else []
    )
    return why + _module(cfg).unsupported(cfg, setup)


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    batch: int = 1,
    mode: str = "traced",
    device: str = "meta",
    cpu_threads: int = 1,
    sharding=None,
    optimizer_step: bool = True,
) -> StepInBatch:
    """The training step of transformers' model of ``cfg`` (see ``ops.predict_step``); ``sharding``: on one
    rank of that wrapper's job (``step.Sharding``).

    ``batch`` 1 replays the step at B = 1 exactly (its size-1 batch dim lets torch view tensors that it
    copies at B >= 2, e.g. matmul's reshape of a transposed query); any other ``batch`` gives the lines in
    B, exact for every B >= 2."""
    module = _module(cfg)
    b = 1 if batch == 1 else B
    if (
        device == "cuda"
    ):  # a GPU's plain run (``ops.cuda``): its kernel facts, the scratch that is no line in B at batch
        reasons = transformers_unsupported(cfg, setup, seq)
        if reasons:
            raise ValueError("; ".join(reasons))
    # the target reaches a program that takes it (a cpu run: GPT-2's LayerNorm keeps mean and rstd in the
    # input's dtype, ``ops.aten_layer_norm``)
    target = {"device": device} if "device" in inspect.signature(module.causal_lm).parameters else {}
    return training_step(
        lambda: module.causal_lm(cfg, seq, setup, b, **target),
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
        cpu_threads=cpu_threads,
        sharding=sharding,
        cuda_batch=batch if device == "cuda" else None,
        optimizer_step=optimizer_step,
    )
