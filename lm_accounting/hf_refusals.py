"""Why a Hugging Face ``model_type`` is refused: one reason per missing piece, each naming what is not modelled.

``hf_config`` reads the types of ``hf_config.SUPPORTED_MODEL_TYPES`` (and the multimodal wrappers of
``hf_fields.WRAPPERS``); every other causal-LM type transformers 5.24 registers
(``transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) is listed here under the piece of
its modeling file that lm-accounting's architecture options (``config.ModelConfig``) cannot express, and
tests/test_hf_zoo.py checks that every registered type is either read or listed. The pieces were read off the
modeling files (``transformers/models/<type>/modeling_<type>.py``); the last group is the types whose modeling
file has not been compared with our options yet, refused as such rather than guessed.
"""

from __future__ import annotations


def _types(text: str) -> tuple[str, ...]:
    return tuple(text.split())


REASONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "zamba": (
        "Zamba's shared attention blocks (one attention block reused across layers), which lm-accounting does not model yet",
        _types("zamba zamba2"),
    ),
    "deltanet": (
        (
            "linear-attention layers not compared with Qwen3-Next's Gated DeltaNet yet (lm-accounting models "
            "Qwen3-Next's and Qwen3.5's only)"
        ),
        _types("lara_mini qwen4_exp qwen4_exp_text kimi_linear olmo_hybrid minimax"),
    ),
    "short_conv": (
        (
            "short-convolution layers beside sliding-window attention layers, an attention output gate and "
            "optional sandwich norms (LFM3's Lfm3DecoderLayer), which lm-accounting does not combine yet (it "
            "models LFM2's short convolutions beside full attention: lfm2, lfm2_moe)"
        ),
        _types("lfm3"),
    ),
    "recurrent": (
        "recurrent layers (RWKV, xLSTM, RG-LRU), which lm-accounting does not model yet",
        _types("rwkv xlstm recurrent_gemma"),
    ),
    "sinks": (
        "attention sinks applied as a post-attention logsumexp scaling (Granite SWA), not compared with gpt-oss's yet",
        _types("granite_swa granitemoe_swa"),
    ),
    "parallel": (
        (
            "attention and MLP in parallel (a parallel block) with a fused projection lm-accounting does not map "
            "yet (CodeGen's qkv_proj in mp_num groups)"
        ),
        _types("codegen"),
    ),
    "mlp_activation": (
        (
            "a non-gated MLP with a ReLU-family activation (squared ReLU, ReLU, xIELU) in a modeling file not "
            "compared with lm-accounting's yet (its ReLU MLPs: OPT's and Nemotron's)"
        ),
        _types("arcee apertus nanochat jais2 persimmon"),
    ),
    "positions": (
        (
            "sinusoidal or offset learned positions, or ALiBi without BLOOM's block, which lm-accounting does "
            "not model yet (RoPE, GPT-2's learned table, BLOOM's ALiBi)"
        ),
        _types("mpt xglm biogpt ctrl"),
    ),
    "norms": (
        ("norms lm-accounting does not model yet (GPT-1's post-norm, BitNet's sub-norms)"),
        _types("openai-gpt bitnet"),
    ),
    "encoder": (
        "an encoder or encoder-decoder model (bidirectional or cross-attention), not a decoder-only LM",
        _types(
            "bart bert bert-generation big_bird bigbird_pegasus blenderbot blenderbot-small camembert "
            "data2vec-text electra ernie marian mbart megatron-bert mvp pegasus plbart prophetnet rembert "
            "roberta roberta-prelayernorm roc_bert roformer trocr whisper xlm xlm-roberta xlm-roberta-xl xmod "
            "xlnet musicgen musicgen_melody git"
        ),
    ),
    "multimodal": (
        (
            "a multimodal or audio model that is not a text decoder in a wrapper (vision cross-attention, "
            "AltUp, byte patches, audio streams, a vision tower inside the causal LM)"
        ),
        _types(
            "mllama fuyu got_ocr2 phi4_multimodal gemma3n gemma3n_text blt moshi moss_transcribe_diarize dots3_note"
        ),
    ),
    "mrope": (
        (
            "multimodal rotary positions (M-RoPE over time, height and width) in a text class lm-accounting "
            "does not map yet"
        ),
        _types("qwen2_5_vl_text qwen3_vl_text qwen3_vl_moe_text"),
    ),
    "attention_variants": (
        (
            "an attention variant lm-accounting does not model yet (GPT-Neo's local attention, differential, "
            "dynamic-mask, gated with learned scalings, mixture-of-attention experts, LSH, DeepSeek-V4's sparse "
            "attention, Laguna's softplus output gate)"
        ),
        _types("gpt_neo dory diffllama doge jetmoe reformer deepseek_v4 dots3_note_text laguna"),
    ),
    "window_pattern": (
        (
            "sliding-window layers in a pattern lm-accounting does not model (full attention on layers 0, n, "
            "2n, ...; its windows: every layer, or all but layers n-1, 2n-1, ...)"
        ),
        _types("cwm"),
    ),
    "moe_variants": (
        (
            "a mixture of experts lm-accounting does not model yet (LongCat's zero-computation experts, "
            "DBRX's fused experts with clipped Q/K/V)"
        ),
        _types("longcat_flash dbrx"),
    ),
    "unchecked": (
        "a modeling file not yet compared with lm-accounting's architecture options (refused rather than guessed)",
        _types(
            "afmoe apertus1p5_text solar_open aria_text axk1 axk2 bailing_hybrid beam cohere2_moe "
            "cohere_compass_text cpmant dots1 emu3 exaone_moe flex_olmo flint gemma4 "
            "gemma4_assistant gemma4_text gemma4_unified gemma4_unified_assistant gemma4_unified_text "
            "gpt_neox_japanese hrm_text hy_v4 inkling2_loop_text inkling2_text inkling_text kolibri1 "
            "mellum minicpm3 mimo_v2_flash minimax_m3_vl_text modernbert-decoder sarvam_moe zaya"
        ),
    ),
}
"""Group -> (what its types have that lm-accounting does not model, the types)."""

REFUSED_MODEL_TYPES: dict[str, str] = {t: reason for reason, types in REASONS.values() for t in types}
"""model_type -> the reason it is refused (``REASONS`` flattened)."""

REFUSED_WRAPPERS: dict[str, str] = {
    "qwen2_5_vl": "qwen2_5_vl_text",
    "qwen3_vl": "qwen3_vl_text",
    "qwen3_vl_moe": "qwen3_vl_moe_text",
}
"""Multimodal wrappers whose text model (``text_config``'s class) is refused: the refusal names it and its reason."""
