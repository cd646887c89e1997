"""What transformers' configuration class for each supported ``model_type`` defines (transformers 5.x), as data.

``hf_config`` reads a config.json without importing transformers, so the facts it needs about transformers'
own ``*Config`` classes are written out here, and tests/test_hf_roundtrip.py derives each table from the
installed transformers and checks that it is equal (so the two cannot drift apart):

* ``DEFINED_FIELDS``: the names a config class defines, and so the only fields of a config.json that can change
  what transformers builds.  A name is defined when it is a parameter of the class's ``__init__`` (its dataclass
  fields), a key or target of its ``attribute_map``, a settable property, a legacy key its ``__post_init__`` or
  RoPE conversion reads from ``kwargs`` (``rope_theta``, ``sliding_window_pattern``), or a public attribute its
  ``__post_init__`` sets (DeepSeek's ``qk_head_dim``: a saved value is set back over it on loading).  Any other
  field is stored on the config object and read by nothing (``n_special``, ``unsloth_version``).
* ``ALIASES``: the class's ``attribute_map`` (alias -> the name it is stored under, which ``save_pretrained``
  writes): Qwen3-MoE's ``num_experts`` is saved as ``num_local_experts``.
* ``CLASS_DEFAULTS``: the class's default for each optional field the reader takes (a ``None`` is derived, e.g.
  ``num_key_value_heads`` -> ``num_attention_heads``), and ``rope_theta`` from the class's ``default_theta``.
* ``WRAPPERS``: a multimodal configuration class -> the text model type of its ``text_config``, with the text
  class's defaults for the shape fields a published ``text_config`` leaves out (``WRAPPED_TEXT_DEFAULTS``);
  ``WRAPPERS_OF_ANY_TEXT``: the wrappers whose ``text_config`` is an ``AutoConfig`` (any supported text type).
* ``SAME_CLASSES``: a ``model_type`` whose configuration and causal-LM classes are another type's (GPT-SW3).
"""

from __future__ import annotations

from typing import Any


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


COMMON_FIELDS = _names(
    """
        _attn_implementation _commit_hash _experts_implementation allow_global_per_layer_attribute_access architectures
        attn_implementation chunk_size_feed_forward dtype experts_implementation id2label ignore_keys_at_rope_validation
        initializer_range is_encoder_decoder label2id name_or_path num_labels output_attentions output_hidden_states
        partial_rotary_factor per_layer_config problem_type return_dict rope_parameters rope_scaling rope_theta
        serialize_explicit_per_layer_config tie_word_embeddings torch_dtype transformers_version
    """
)
"""Defined by ``PreTrainedConfig`` itself (and its RoPE mixin), so by every class below."""

WRAPPER_COMMON_FIELDS = COMMON_FIELDS - {"initializer_range"}
"""What Mistral 3's and Kimi K2.5's wrapper classes inherit (they define no ``initializer_range``)."""

DEFINED_FIELDS: dict[str, frozenset[str]] = {
    "gpt2": COMMON_FIELDS
    | _names(
        """
            activation_function add_cross_attention attn_pdrop bos_token_id embd_pdrop eos_token_id hidden_size
            layer_norm_epsilon max_position_embeddings n_embd n_head n_inner n_layer n_positions num_attention_heads
            num_hidden_layers pad_token_id reorder_and_upcast_attn resid_pdrop scale_attn_by_inverse_layer_idx
            scale_attn_weights summary_activation summary_first_dropout summary_proj_to_labels summary_type
            summary_use_proj use_cache vocab_size
        """
    ),
    "llama": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            max_position_embeddings mlp_bias num_attention_heads num_hidden_layers num_key_value_heads pad_token_id
            pretraining_tp rms_norm_eps use_cache vocab_size
        """
    ),
    "mistral": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads pad_token_id rms_norm_eps
            sliding_window use_cache vocab_size
        """
    ),
    "mixtral": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_experts num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts output_router_logits pad_token_id rms_norm_eps router_aux_loss_coef
            router_jitter_noise sliding_window use_cache vocab_size
        """
    ),
    "qwen2": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id hidden_act hidden_size intermediate_size layer_types
            max_position_embeddings max_window_layers num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id rms_norm_eps sliding_window use_cache use_sliding_window vocab_size
        """
    ),
    "qwen3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            layer_types max_position_embeddings max_window_layers num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id rms_norm_eps sliding_window use_cache use_sliding_window vocab_size
        """
    ),
    "qwen3_moe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id decoder_sparse_step eos_token_id hidden_act hidden_size
            intermediate_size max_position_embeddings mlp_only_layers moe_intermediate_size norm_topk_prob
            num_attention_heads num_experts num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts
            output_router_logits pad_token_id rms_norm_eps router_aux_loss_coef sliding_window use_cache
            use_sliding_window vocab_size
        """
    ),
    "gpt_oss": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size layer_types max_position_embeddings num_attention_heads num_experts num_experts_per_tok
            num_hidden_layers num_key_value_heads num_local_experts output_router_logits pad_token_id rms_norm_eps
            router_aux_loss_coef sliding_window swiglu_alpha swiglu_limit use_cache vocab_size
        """
    ),
    "qwen2_moe": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id decoder_sparse_step eos_token_id hidden_act hidden_size intermediate_size
            layer_types max_position_embeddings max_window_layers mlp_only_layers moe_intermediate_size
            norm_topk_prob num_attention_heads num_experts num_experts_per_tok num_hidden_layers num_key_value_heads
            output_router_logits pad_token_id qkv_bias rms_norm_eps router_aux_loss_coef
            shared_expert_intermediate_size sliding_window use_cache use_sliding_window vocab_size
        """
    ),
    "ernie4_5_moe": COMMON_FIELDS
    | _names(
        """
            bos_token_id eos_token_id hidden_act hidden_size intermediate_size max_position_embeddings
            moe_intermediate_size moe_k moe_layer_end_index moe_layer_interval moe_layer_start_index moe_norm_min
            moe_num_experts moe_num_shared_experts num_attention_heads num_experts num_experts_per_tok
            num_hidden_layers num_key_value_heads output_router_logits pad_token_id rms_norm_eps router_aux_loss_coef
            use_bias use_cache vocab_size
        """
    ),
    "glm4_moe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id first_k_dense_replace hidden_act hidden_size
            intermediate_size max_position_embeddings moe_intermediate_size n_group n_routed_experts n_shared_experts
            norm_topk_prob num_attention_heads num_experts_per_tok num_hidden_layers num_key_value_heads
            num_local_experts num_mtp_layers num_nextn_predict_layers output_router_logits pad_token_id rms_norm_eps
            routed_scaling_factor topk_group use_cache use_qk_norm vocab_size
        """
    ),
    "minimax_m2": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_experts num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts output_router_logits pad_token_id rms_norm_eps rotary_dim
            router_aux_loss_coef router_jitter_noise use_cache vocab_size
        """
    ),
    "glm4": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id rms_norm_eps use_cache vocab_size
        """
    ),
    "stablelm": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id hidden_act hidden_dropout hidden_size intermediate_size
            layer_norm_eps max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id qk_layernorm use_cache use_parallel_residual use_qkv_bias vocab_size
        """
    ),
    "opt": WRAPPER_COMMON_FIELDS
    | _names(
        """
            _remove_final_layer_norm activation_function attention_dropout bos_token_id do_layer_norm_before
            dropout enable_bias eos_token_id ffn_dim hidden_size init_std layer_norm_elementwise_affine layerdrop
            max_position_embeddings num_attention_heads num_hidden_layers pad_token_id use_cache vocab_size
            word_embed_proj_dim
        """
    ),
    "nemotron": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings mlp_bias norm_eps num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id use_cache vocab_size
        """
    ),
    "bloom": COMMON_FIELDS
    | _names(
        """
            apply_residual_connection_post_layernorm attention_dropout bos_token_id eos_token_id hidden_dropout
            hidden_size layer_norm_epsilon n_embed n_head n_layer num_attention_heads num_hidden_layers pad_token_id
            pretraining_tp slow_but_exact use_cache vocab_size
        """
    ),
    "olmo": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id clip_qkv eos_token_id hidden_act hidden_size
            intermediate_size max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id use_cache vocab_size
        """
    ),
    "gemma2": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attn_logit_softcapping bos_token_id eos_token_id final_logit_softcapping
            head_dim hidden_activation hidden_size intermediate_size layer_types max_position_embeddings
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id query_pre_attn_scalar rms_norm_eps
            sliding_window use_bidirectional_attention use_cache vocab_size
        """
    ),
    "gemma3_text": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attn_logit_softcapping bos_token_id eos_token_id final_logit_softcapping
            head_dim hidden_activation hidden_size intermediate_size layer_types max_position_embeddings
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id query_pre_attn_scalar rms_norm_eps
            rope_local_base_freq sliding_window sliding_window_pattern use_bidirectional_attention use_cache vocab_size
        """
    ),
    "phi3": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id embd_pdrop eos_token_id hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            original_max_position_embeddings pad_token_id resid_pdrop rms_norm_eps sliding_window use_cache vocab_size
        """
    ),
    "olmo2": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads pad_token_id rms_norm_eps
            use_cache vocab_size
        """
    ),
    "deepseek_v2": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id first_k_dense_replace head_dim hidden_act
            hidden_size intermediate_size kv_lora_rank max_position_embeddings mlp_bias moe_intermediate_size n_group
            n_routed_experts n_shared_experts norm_topk_prob num_attention_heads num_experts num_experts_per_tok
            num_hidden_layers num_key_value_heads output_router_logits pad_token_id pretraining_tp q_lora_rank
            qk_head_dim qk_nope_head_dim qk_rope_head_dim rms_norm_eps routed_scaling_factor topk_group topk_method
            use_cache v_head_dim vocab_size
        """
    ),
    "deepseek_v3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id first_k_dense_replace head_dim hidden_act
            hidden_size intermediate_size kv_lora_rank max_position_embeddings moe_intermediate_size n_group
            n_routed_experts n_shared_experts norm_topk_prob num_attention_heads num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts num_mtp_layers num_nextn_predict_layers output_router_logits
            pad_token_id pretraining_tp q_lora_rank qk_head_dim qk_nope_head_dim qk_rope_head_dim rms_norm_eps
            rope_interleave routed_scaling_factor topk_group use_cache v_head_dim vocab_size
        """
    ),
    "gemma3": COMMON_FIELDS
    | _names(
        """
            boi_token_id boi_token_index eoi_token_id eoi_token_index image_token_id image_token_index
            mm_tokens_per_image text_config vision_config
        """
    ),
    "granite": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_multiplier bos_token_id embedding_multiplier eos_token_id
            hidden_act hidden_size intermediate_size logits_scaling max_position_embeddings mlp_bias
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id residual_multiplier
            rms_norm_eps use_cache vocab_size
        """
    ),
    "granitemoe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_multiplier bos_token_id embedding_multiplier eos_token_id
            hidden_act hidden_size intermediate_size logits_scaling max_position_embeddings num_attention_heads
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts output_router_logits
            pad_token_id residual_multiplier rms_norm_eps router_aux_loss_coef use_cache vocab_size
        """
    ),
    "granitemoeshared": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_multiplier bos_token_id embedding_multiplier eos_token_id
            hidden_act hidden_size intermediate_size logits_scaling max_position_embeddings num_attention_heads
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts output_router_logits
            pad_token_id residual_multiplier rms_norm_eps router_aux_loss_coef shared_intermediate_size
            use_cache vocab_size
        """
    ),
    "helium": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings mlp_bias num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id rms_norm_eps use_cache vocab_size
        """
    ),
    "internlm3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bias bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings mlp_bias num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id qkv_bias rms_norm_eps use_cache vocab_size
        """
    ),
    "exaone": COMMON_FIELDS
    | _names(
        """
            activation_function attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act
            hidden_size intermediate_size layer_norm_epsilon max_position_embeddings mlp_bias
            num_attention_heads num_hidden_layers num_key_value_heads num_layers pad_token_id rms_norm_eps
            use_cache vocab_size
        """
    ),
    "ernie4_5": COMMON_FIELDS
    | _names(
        """
            bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size max_position_embeddings
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id rms_norm_eps use_bias
            use_cache vocab_size
        """
    ),
    "seed_oss": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_out_bias bos_token_id eos_token_id head_dim hidden_act
            hidden_size intermediate_size max_position_embeddings mlp_bias num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id pretraining_tp residual_dropout rms_norm_eps use_cache vocab_size
        """
    ),
    "ministral": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            layer_types max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id rms_norm_eps sliding_window use_cache vocab_size
        """
    ),
    "ministral3": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size intermediate_size
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads pad_token_id
            rms_norm_eps sliding_window use_cache vocab_size
        """
    ),
    "smollm3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id hidden_act hidden_size intermediate_size
            layer_types max_position_embeddings mlp_bias no_rope_layer_interval no_rope_layers
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id rms_norm_eps sliding_window
            use_cache use_sliding_window vocab_size
        """
    ),
    "hunyuan_v1_dense": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eod_token_id eos_token_id head_dim hidden_act
            hidden_size intermediate_size max_position_embeddings num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id pretraining_tp rms_norm_eps use_cache vocab_size
        """
    ),
    "gemma": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id rms_norm_eps use_bidirectional_attention use_cache vocab_size
        """
    ),
    "olmo3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id hidden_act hidden_size intermediate_size
            layer_types max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id rms_norm_eps sliding_window use_cache vocab_size
        """
    ),
    "exaone4": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id eos_token_id hidden_act hidden_size intermediate_size layer_types
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads pad_token_id
            rms_norm_eps sliding_window sliding_window_pattern use_cache vocab_size
        """
    ),
    "olmoe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id clip_qkv eos_token_id hidden_act hidden_size
            intermediate_size max_position_embeddings norm_topk_prob num_attention_heads num_experts
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts output_router_logits
            pad_token_id rms_norm_eps router_aux_loss_coef use_cache vocab_size
        """
    ),
    "phimoe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id hidden_act hidden_size input_jitter_noise
            intermediate_size lm_head_bias max_position_embeddings num_attention_heads num_experts_per_tok
            num_hidden_layers num_key_value_heads num_local_experts output_router_logits pad_token_id
            rms_norm_eps router_aux_loss_coef router_jitter_noise sliding_window use_cache vocab_size
        """
    ),
    "hy_v3": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id enable_moe_fp32_combine eos_token_id head_dim
            hidden_act hidden_size intermediate_size max_position_embeddings mlp_bias mlp_layer_types
            moe_intermediate_size num_attention_heads num_experts num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts num_shared_experts output_router_logits pad_token_id
            rms_norm_eps router_scaling_factor use_cache vocab_size
        """
    ),
    "glm4_moe_lite": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size kv_lora_rank max_position_embeddings mlp_layer_types moe_intermediate_size n_group
            n_routed_experts n_shared_experts norm_topk_prob num_attention_heads num_experts_per_tok
            num_hidden_layers num_key_value_heads num_local_experts output_router_logits pad_token_id
            pretraining_tp q_lora_rank qk_head_dim qk_nope_head_dim qk_rope_head_dim rms_norm_eps
            rope_interleave routed_scaling_factor topk_group use_cache v_head_dim vocab_size
        """
    ),
    "deepseek_v32": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id first_k_dense_replace head_dim hidden_act
            hidden_size index_head_dim index_n_heads index_topk intermediate_size kv_lora_rank layer_types
            max_position_embeddings mlp_bias mlp_layer_types moe_intermediate_size n_group n_routed_experts
            n_shared_experts norm_topk_prob num_attention_heads num_experts num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts output_router_logits pad_token_id q_lora_rank qk_head_dim
            qk_nope_head_dim qk_rope_head_dim rms_norm_eps routed_scaling_factor topk_group use_cache v_head_dim
            vocab_size
        """
    ),
    "starcoder2": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id embedding_dropout eos_token_id hidden_act hidden_size
            intermediate_size max_position_embeddings norm_epsilon num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id residual_dropout sliding_window use_bias use_cache vocab_size
        """
    ),
    "gpt_bigcode": COMMON_FIELDS
    | _names(
        """
            activation_function add_cross_attention attention_softmax_in_fp32 attn_pdrop bos_token_id embd_pdrop
            eos_token_id hidden_size layer_norm_epsilon max_position_embeddings multi_query n_embd n_head
            n_inner n_layer n_positions num_attention_heads num_hidden_layers num_key_value_heads pad_token_id
            resid_pdrop scale_attention_softmax_in_fp32 scale_attn_weights use_cache vocab_size
        """
    ),
    "mistral3": WRAPPER_COMMON_FIELDS
    | _names(
        """
            image_token_id image_token_index multimodal_projector_bias projector_hidden_act spatial_merge_size
            text_config vision_config vision_feature_layer
        """
    ),
    "granitemoehybrid": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_multiplier bos_token_id embedding_multiplier eos_token_id
            hidden_act hidden_size intermediate_size layer_types layers_block_type logits_scaling mamba_chunk_size
            mamba_conv_bias mamba_d_conv mamba_d_head mamba_d_state mamba_expand mamba_n_groups mamba_n_heads
            mamba_proj_bias max_position_embeddings num_attention_heads num_experts_per_tok num_hidden_layers
            num_key_value_heads num_local_experts output_router_logits pad_token_id position_embedding_type
            residual_multiplier rms_norm_eps router_aux_loss_coef shared_intermediate_size time_step_limit use_cache
            vocab_size
        """
    ),
    "falcon_h1": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_in_multiplier attention_out_multiplier bos_token_id
            embedding_multiplier eos_token_id hidden_act hidden_size intermediate_size key_multiplier layer_types
            layers_block_type lm_head_multiplier mamba_chunk_size mamba_conv_bias mamba_d_conv mamba_d_head mamba_d_ssm
            mamba_d_state mamba_expand mamba_n_groups mamba_n_heads mamba_norm_before_gate mamba_proj_bias
            mamba_rms_norm max_position_embeddings mlp_bias mlp_multipliers num_attention_heads num_hidden_layers
            num_key_value_heads num_logits_to_keep pad_token_id projectors_bias rms_norm_eps ssm_in_multiplier
            ssm_multipliers ssm_out_multiplier time_step_limit use_cache vocab_size
        """
    ),
    "lfm2": COMMON_FIELDS
    | _names(
        """
            block_auto_adjust_ff_dim block_ff_dim block_ffn_dim_multiplier block_multiple_of bos_token_id conv_L_cache
            conv_bias eos_token_id full_attn_idxs hidden_size intermediate_size layer_types max_position_embeddings
            norm_eps num_attention_heads num_hidden_layers num_key_value_heads pad_token_id tie_embedding use_cache
            vocab_size
        """
    ),
    "lfm2_moe": COMMON_FIELDS
    | _names(
        """
            bos_token_id conv_L_cache conv_bias eos_token_id hidden_size intermediate_size layer_types
            max_position_embeddings moe_intermediate_size norm_eps norm_topk_prob num_attention_heads num_dense_layers
            num_experts num_experts_per_tok num_hidden_layers num_key_value_heads output_router_logits pad_token_id
            routed_scaling_factor tie_embedding use_cache use_expert_bias vocab_size
        """
    ),
    "bamba": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attn_layer_indices bos_token_id eos_token_id hidden_act hidden_size
            intermediate_size layer_types layers_block_type mamba_chunk_size mamba_conv_bias mamba_d_conv mamba_d_head
            mamba_d_state mamba_expand mamba_n_groups mamba_n_heads mamba_proj_bias max_position_embeddings mlp_bias
            num_attention_heads num_hidden_layers num_key_value_heads num_logits_to_keep pad_token_id rms_norm_eps
            time_step_limit use_cache vocab_size z_loss_coefficient
        """
    ),
    "mamba": COMMON_FIELDS
    | _names(
        """
            bos_token_id conv_kernel eos_token_id expand hidden_act hidden_size intermediate_size layer_norm_epsilon
            num_hidden_layers pad_token_id rescale_prenorm_residual residual_in_fp32 state_size time_step_floor
            time_step_init_scheme time_step_max time_step_min time_step_rank time_step_scale use_associative_scan
            use_bias use_cache use_conv_bias use_mambapy vocab_size
        """
    ),
    "falcon_mamba": COMMON_FIELDS
    | _names(
        """
            bos_token_id conv_kernel eos_token_id expand hidden_act hidden_size intermediate_size layer_norm_epsilon
            mixer_rms_eps num_hidden_layers pad_token_id rescale_prenorm_residual residual_in_fp32 state_size
            time_step_floor time_step_init_scheme time_step_max time_step_min time_step_rank time_step_scale
            use_associative_scan use_bias use_cache use_conv_bias use_falcon_mambapy use_mambapy vocab_size
        """
    ),
    "jamba": COMMON_FIELDS
    | _names(
        """
            attention_dropout attn_layer_offset attn_layer_period bos_token_id eos_token_id expert_layer_offset
            expert_layer_period hidden_act hidden_size intermediate_size mamba_conv_bias mamba_d_conv mamba_d_state
            mamba_dt_rank mamba_expand mamba_proj_bias max_position_embeddings num_attention_heads num_experts
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts output_router_logits
            pad_token_id rms_norm_eps router_aux_loss_coef use_associative_scan use_cache use_mamba_kernels
            use_mambapy vocab_size
        """
    ),
    "mamba2": COMMON_FIELDS
    | _names(
        """
            bos_token_id chunk_size conv_kernel eos_token_id expand head_dim hidden_act hidden_size layer_norm_epsilon
            n_groups num_heads num_hidden_layers pad_token_id rescale_prenorm_residual residual_in_fp32 state_size
            time_step_floor time_step_limit time_step_max time_step_min time_step_rank use_bias use_cache
            use_conv_bias vocab_size
        """
    ),
    "nemotron_h": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id chunk_size conv_kernel eos_token_id expand head_dim
            hidden_dropout hidden_size hybrid_override_pattern intermediate_size layer_norm_epsilon layer_types
            layers_block_type mamba_chunk_size mamba_conv_bias mamba_d_conv mamba_dt_init_floor mamba_dt_limit
            mamba_dt_max mamba_dt_min mamba_expand mamba_head_dim mamba_hidden_act mamba_n_groups mamba_num_heads
            mamba_proj_bias mamba_ssm_cache_dtype max_position_embeddings mlp_bias mlp_hidden_act moe_intermediate_size
            moe_latent_size moe_shared_expert_intermediate_size moe_shared_expert_overlap mtp_hybrid_override_pattern
            mtp_layers_block_type n_group n_groups n_routed_experts n_shared_experts norm_topk_prob num_attention_heads
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts num_logits_to_keep
            num_nextn_predict_layers output_router_logits pad_token_id rescale_prenorm_residual residual_in_fp32
            routed_scaling_factor sliding_window ssm_state_size time_step_floor time_step_limit time_step_max
            time_step_min topk_group use_bias use_cache use_conv_bias use_mamba_kernels vocab_size
        """
    ),
    "qwen3_next": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id decoder_sparse_step eos_token_id full_attention_interval
            head_dim hidden_act hidden_size intermediate_size layer_types linear_conv_kernel_dim linear_key_head_dim
            linear_num_key_heads linear_num_value_heads linear_value_head_dim max_position_embeddings mlp_only_layers
            moe_intermediate_size norm_topk_prob num_attention_heads num_experts num_experts_per_tok
            num_hidden_layers num_key_value_heads output_router_logits pad_token_id rms_norm_eps
            router_aux_loss_coef shared_expert_intermediate_size use_cache vocab_size
        """
    ),
    "qwen3_5_text": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id full_attention_interval head_dim hidden_act
            hidden_size intermediate_size layer_types linear_conv_kernel_dim linear_key_head_dim linear_num_key_heads
            linear_num_value_heads linear_value_head_dim max_position_embeddings num_attention_heads
            num_hidden_layers num_key_value_heads pad_token_id rms_norm_eps use_cache vocab_size
        """
    ),
    "qwen3_5_moe_text": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id full_attention_interval head_dim hidden_act
            hidden_size layer_types linear_conv_kernel_dim linear_key_head_dim linear_num_key_heads
            linear_num_value_heads linear_value_head_dim max_position_embeddings moe_intermediate_size
            num_attention_heads num_experts num_experts_per_tok num_hidden_layers num_key_value_heads
            output_router_logits pad_token_id rms_norm_eps router_aux_loss_coef shared_expert_intermediate_size
            use_cache vocab_size
        """
    ),
    "qwen3_5": WRAPPER_COMMON_FIELDS
    | _names("image_token_id text_config video_token_id vision_config vision_end_token_id vision_start_token_id"),
    "qwen3_5_moe": WRAPPER_COMMON_FIELDS
    | _names("image_token_id text_config video_token_id vision_config vision_end_token_id vision_start_token_id"),
    "kimi_k25": WRAPPER_COMMON_FIELDS
    | _names(
        """
            image_token_id projection_hidden_size projection_layer_norm_eps text_config video_token_id
            vision_config vision_end_token_id vision_start_token_id
        """
    ),
    "hunyuan_v1_moe": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eod_token_id eos_token_id head_dim hidden_act
            hidden_size intermediate_size max_position_embeddings moe_topk num_attention_heads num_experts
            num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts output_router_logits
            pad_token_id pretraining_tp rms_norm_eps sep_token_id use_cache vocab_size
        """
    ),
    "iquestcoder": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size max_position_embeddings mlp_bias num_attention_heads num_hidden_layers
            num_key_value_heads pad_token_id rms_norm_eps use_cache vocab_size
        """
    ),
    "sarvam_mla": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id first_k_dense_replace head_dim hidden_act
            hidden_size intermediate_size kv_lora_rank max_position_embeddings moe_intermediate_size n_group
            n_routed_experts n_shared_experts norm_topk_prob num_attention_heads num_experts num_experts_per_tok
            num_hidden_layers num_key_value_heads num_local_experts num_mtp_layers num_nextn_predict_layers
            num_shared_experts output_router_logits pad_token_id pretraining_tp q_head_dim q_lora_rank
            qk_head_dim qk_nope_head_dim qk_rope_head_dim rms_norm_eps rope_interleave routed_scaling_factor
            topk_group use_cache v_head_dim vocab_size
        """
    ),
    "vaultgemma": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attn_logit_softcapping bos_token_id eos_token_id
            final_logit_softcapping head_dim hidden_activation hidden_size intermediate_size layer_types
            max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads pad_token_id
            query_pre_attn_scalar rms_norm_eps sliding_window use_cache vocab_size
        """
    ),
    "hyperclovax": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout attention_multiplier bos_token_id embedding_multiplier eos_token_id
            head_dim hidden_act hidden_size intermediate_size logits_scaling max_position_embeddings mlp_bias
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id residual_multiplier
            rms_norm_eps use_cache use_post_norm vocab_size
        """
    ),
    "youtu": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id embedding_initializer_range eos_token_id head_dim
            hidden_act hidden_size intermediate_size kv_lora_rank max_position_embeddings num_attention_heads
            num_hidden_layers num_key_value_heads pad_token_id q_lora_rank qk_head_dim qk_nope_head_dim
            qk_rope_head_dim rms_norm_eps rope_interleave use_cache v_head_dim vocab_size
        """
    ),
    "cohere": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id hidden_act hidden_size
            intermediate_size layer_norm_eps logit_scale max_position_embeddings num_attention_heads
            num_hidden_layers num_key_value_heads pad_token_id use_cache use_qk_norm vocab_size
        """
    ),
    "cohere2": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id eos_token_id head_dim hidden_act hidden_size
            intermediate_size layer_norm_eps layer_types logit_scale max_position_embeddings
            num_attention_heads num_hidden_layers num_key_value_heads pad_token_id sliding_window
            sliding_window_pattern use_cache vocab_size
        """
    ),
    "phi": COMMON_FIELDS
    | _names(
        """
            attention_dropout bos_token_id embd_pdrop eos_token_id hidden_act hidden_size intermediate_size
            layer_norm_eps max_position_embeddings num_attention_heads num_hidden_layers num_key_value_heads
            pad_token_id qk_layernorm resid_pdrop use_cache vocab_size
        """
    ),
    "gpt_neox": COMMON_FIELDS
    | _names(
        """
            attention_bias attention_dropout bos_token_id classifier_dropout eos_token_id hidden_act
            hidden_dropout hidden_size intermediate_size is_decoder layer_norm_eps max_position_embeddings
            num_attention_heads num_hidden_layers pad_token_id rotary_emb_base rotary_pct use_cache
            use_parallel_residual vocab_size
        """
    ),
    "gptj": COMMON_FIELDS
    | _names(
        """
            activation_function attn_pdrop bos_token_id embd_pdrop eos_token_id hidden_size
            layer_norm_epsilon max_position_embeddings n_embd n_head n_inner n_layer n_positions
            num_attention_heads num_hidden_layers pad_token_id resid_pdrop rotary_dim use_cache vocab_size
        """
    ),
    "falcon": COMMON_FIELDS
    | _names(
        """
            activation alibi attention_dropout bias bos_token_id eos_token_id ffn_hidden_size hidden_dropout
            hidden_size layer_norm_epsilon max_position_embeddings multi_query n_embed
            new_decoder_architecture num_attention_heads num_hidden_layers num_kv_heads
            num_ln_in_parallel_attn pad_token_id parallel_attn use_cache vocab_size
        """
    ),
}
DEFINED_FIELDS["llama4_text"] = COMMON_FIELDS | _names(
    """
        attention_bias attention_chunk_size attention_dropout attn_scale attn_temperature_tuning bos_token_id
        eos_token_id floor_scale head_dim hidden_act hidden_size interleave_moe_layer_step intermediate_size
        intermediate_size_mlp layer_types max_position_embeddings moe_layers no_rope_layer_interval no_rope_layers
        num_attention_heads num_experts_per_tok num_hidden_layers num_key_value_heads num_local_experts
        output_router_logits pad_token_id rms_norm_eps router_aux_loss_coef router_jitter_noise use_cache use_qk_norm
        vocab_size
    """
)  # Llama4TextConfig (models/llama4/configuration_llama4.py)
DEFINED_FIELDS["llama4"] = WRAPPER_COMMON_FIELDS | _names(
    """
        boi_token_id boi_token_index eoi_token_id eoi_token_index image_token_id image_token_index text_config
        vision_config
    """
)  # Llama4Config: the multimodal wrapper (no initializer_range of its own)
DEFINED_FIELDS["glm"] = DEFINED_FIELDS["glm4"]
DEFINED_FIELDS["glm_moe_dsa"] = (
    DEFINED_FIELDS["deepseek_v32"] | _names("index_skip_topk_offset index_topk_freq index_topk_pattern indexer_types")
)  # GlmMoeDsaConfig: DeepseekV32Config's fields and the per-layer indexer schedule  # GlmConfig defines Glm4Config's fields (and defaults)

CONFIG_CLASSES = {
    "gpt2": "GPT2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "mixtral": "MixtralConfig",
    "qwen2": "Qwen2Config",
    "qwen3": "Qwen3Config",
    "qwen3_moe": "Qwen3MoeConfig",
    "gemma2": "Gemma2Config",
    "gemma3_text": "Gemma3TextConfig",
    "phi3": "Phi3Config",
    "olmo2": "Olmo2Config",
    "deepseek_v2": "DeepseekV2Config",
    "deepseek_v3": "DeepseekV3Config",
    "gpt_oss": "GptOssConfig",
    "qwen2_moe": "Qwen2MoeConfig",
    "olmo": "OlmoConfig",
    "bloom": "BloomConfig",
    "opt": "OPTConfig",
    "nemotron": "NemotronConfig",
    "ernie4_5_moe": "Ernie4_5_MoeConfig",
    "glm4_moe": "Glm4MoeConfig",
    "minimax_m2": "MiniMaxM2Config",
    "glm4": "Glm4Config",
    "glm": "GlmConfig",
    "stablelm": "StableLmConfig",
    "cohere": "CohereConfig",
    "cohere2": "Cohere2Config",
    "phi": "PhiConfig",
    "gpt_neox": "GPTNeoXConfig",
    "gptj": "GPTJConfig",
    "falcon": "FalconConfig",
    "gemma3": "Gemma3Config",
    "mistral3": "Mistral3Config",
    "kimi_k25": "Kimi_K25Config",
    "qwen3_next": "Qwen3NextConfig",
    "nemotron_h": "NemotronHConfig",
    "mamba2": "Mamba2Config",
    "mamba": "MambaConfig",
    "falcon_mamba": "FalconMambaConfig",
    "jamba": "JambaConfig",
    "bamba": "BambaConfig",
    "lfm2": "Lfm2Config",
    "lfm2_moe": "Lfm2MoeConfig",
    "falcon_h1": "FalconH1Config",
    "granitemoehybrid": "GraniteMoeHybridConfig",
    "qwen3_5_text": "Qwen3_5TextConfig",
    "qwen3_5_moe_text": "Qwen3_5MoeTextConfig",
    "qwen3_5": "Qwen3_5Config",
    "qwen3_5_moe": "Qwen3_5MoeConfig",
    "granite": "GraniteConfig",
    "granitemoe": "GraniteMoeConfig",
    "granitemoeshared": "GraniteMoeSharedConfig",
    "helium": "HeliumConfig",
    "internlm3": "InternLM3Config",
    "exaone": "ExaoneConfig",
    "ernie4_5": "Ernie4_5Config",
    "seed_oss": "SeedOssConfig",
    "ministral": "MinistralConfig",
    "ministral3": "Ministral3Config",
    "smollm3": "SmolLM3Config",
    "hunyuan_v1_dense": "HunYuanDenseV1Config",
    "gemma": "GemmaConfig",
    "olmo3": "Olmo3Config",
    "exaone4": "Exaone4Config",
    "olmoe": "OlmoeConfig",
    "phimoe": "PhimoeConfig",
    "hy_v3": "HYV3Config",
    "hunyuan_v1_moe": "HunYuanMoEV1Config",
    "iquestcoder": "IQuestCoderConfig",
    "sarvam_mla": "SarvamMLAConfig",
    "vaultgemma": "VaultGemmaConfig",
    "hyperclovax": "HyperCLOVAXConfig",
    "youtu": "YoutuConfig",
    "glm4_moe_lite": "Glm4MoeLiteConfig",
    "deepseek_v32": "DeepseekV32Config",
    "glm_moe_dsa": "GlmMoeDsaConfig",
    "starcoder2": "Starcoder2Config",
    "gpt_bigcode": "GPTBigCodeConfig",
    "llama4_text": "Llama4TextConfig",
    "llama4": "Llama4Config",
}
ALIASES: dict[str, dict[str, str]] = {
    "gptj": {
        "max_position_embeddings": "n_positions",
        "hidden_size": "n_embd",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
    "gpt2": {
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
    "mixtral": {"num_experts": "num_local_experts"},
    "qwen3_moe": {"num_experts": "num_local_experts"},
    "gpt_oss": {"num_experts": "num_local_experts"},
    "bloom": {"num_hidden_layers": "n_layer", "num_attention_heads": "n_head"},
    "ernie4_5_moe": {"num_experts": "moe_num_experts", "num_experts_per_tok": "moe_k"},
    "glm4_moe": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "minimax_m2": {"num_experts": "num_local_experts"},
    "deepseek_v2": {"num_experts": "n_routed_experts"},
    "deepseek_v3": {"num_local_experts": "n_routed_experts", "num_mtp_layers": "num_nextn_predict_layers"},
    "llama4": {
        "image_token_id": "image_token_index",
        "boi_token_id": "boi_token_index",
        "eoi_token_id": "eoi_token_index",
    },
    "gemma3": {
        "image_token_id": "image_token_index",
        "boi_token_id": "boi_token_index",
        "eoi_token_id": "eoi_token_index",
    },
    "mistral3": {"image_token_id": "image_token_index"},
    "hunyuan_v1_moe": {"num_experts_per_tok": "moe_topk", "num_local_experts": "num_experts"},
    "sarvam_mla": {
        "num_local_experts": "n_routed_experts",
        "num_mtp_layers": "num_nextn_predict_layers",
        "num_experts": "n_routed_experts",
        "num_shared_experts": "n_shared_experts",
    },
    "internlm3": {"qkv_bias": "attention_bias", "bias": "mlp_bias"},
    "exaone": {
        "num_layers": "num_hidden_layers",
        "layer_norm_epsilon": "rms_norm_eps",
        "activation_function": "hidden_act",
    },
    "olmoe": {"num_local_experts": "num_experts"},
    "hy_v3": {"num_local_experts": "num_experts"},
    "glm4_moe_lite": {"num_local_experts": "n_routed_experts", "head_dim": "qk_rope_head_dim"},
    "deepseek_v32": {"num_local_experts": "n_routed_experts"},
    "glm_moe_dsa": {"num_local_experts": "n_routed_experts"},
    "nemotron_h": {"layer_types": "layers_block_type", "num_local_experts": "n_routed_experts"},
    "bamba": {"layer_types": "layers_block_type"},
    "jamba": {"num_local_experts": "num_experts"},
    "falcon_h1": {"layer_types": "layers_block_type"},
    "granitemoehybrid": {"layers_block_type": "layer_types"},
    "gpt_bigcode": {
        "hidden_size": "n_embd",
        "max_position_embeddings": "n_positions",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    },
}
CLASS_DEFAULTS: dict[str, dict[str, Any]] = {
    "glm4_moe": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "use_qk_norm": False,
        "hidden_act": "silu",
        "moe_intermediate_size": 1408,
        "n_routed_experts": 128,
        "num_experts_per_tok": 8,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "rope_theta": 10000.0,
    },
    "minimax_m2": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "num_local_experts": 256,
        "num_experts_per_tok": 8,
        "rope_theta": 5000000.0,
    },
    "glm4": {
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1.5625e-07,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "stablelm": {
        "num_key_value_heads": 32,
        "layer_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "use_qkv_bias": False,
        "qk_layernorm": False,
        "use_parallel_residual": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "ernie4_5_moe": {
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "use_bias": False,
        "hidden_act": "silu",
        "moe_num_shared_experts": 2,
        "moe_layer_start_index": 1,
        "moe_layer_end_index": -1,
        "moe_layer_interval": 1,
        "rope_theta": 500000.0,
    },
    "opt": {
        "do_layer_norm_before": True,
        "_remove_final_layer_norm": False,
        "activation_function": "relu",
        "enable_bias": True,
        "layer_norm_elementwise_affine": True,
        "tie_word_embeddings": True,
    },
    "nemotron": {
        "num_key_value_heads": None,
        "head_dim": None,
        "hidden_act": "relu2",
        "norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "rope_theta": 10000.0,
    },
    "bloom": {
        "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": True,
        "apply_residual_connection_post_layernorm": False,
    },
    "olmo": {
        "num_key_value_heads": None,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "gpt_oss": {
        "num_key_value_heads": 8,
        "head_dim": 64,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "sliding_window": 128,
        "swiglu_limit": 7.0,
        "rope_theta": 150000.0,
    },
    "qwen2_moe": {
        "num_key_value_heads": 16,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "decoder_sparse_step": 1,
        "qkv_bias": True,
        "rope_theta": 10000.0,
    },
    "gemma3": {"tie_word_embeddings": True},
    "mistral3": {"tie_word_embeddings": True},
    "kimi_k25": {"tie_word_embeddings": True},
    "granitemoehybrid": {
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "shared_intermediate_size": 1024,
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "rope_theta": 10000.0,
    },
    "falcon_h1": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "mamba_d_ssm": 1024,
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "mamba_rms_norm": False,
        "rope_theta": 10000.0,
    },
    "lfm2": {
        "num_key_value_heads": 8,
        "norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "conv_bias": False,
        "conv_L_cache": 3,
        "block_multiple_of": 256,
        "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": True,
        "rope_theta": 1000000.0,
    },
    "lfm2_moe": {
        "num_key_value_heads": 8,
        "norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "conv_bias": False,
        "conv_L_cache": 3,
        "num_dense_layers": 2,
        "norm_topk_prob": True,
        "rope_theta": 1000000.0,
    },
    "bamba": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "mamba_n_heads": 128,
        "mamba_n_groups": 1,
        "mamba_d_state": 256,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_chunk_size": 256,
        "rope_theta": 10000.0,
    },
    "mamba": {
        "state_size": 16,
        "layer_norm_epsilon": 1e-05,
        "expand": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "hidden_act": "silu",
        "time_step_rank": "auto",
        "tie_word_embeddings": True,
    },
    "falcon_mamba": {
        "state_size": 16,
        "layer_norm_epsilon": 1e-05,
        "expand": 2,
        "conv_kernel": 4,
        "use_bias": False,
        "use_conv_bias": True,
        "hidden_act": "silu",
        "time_step_rank": "auto",
        "tie_word_embeddings": True,
    },
    "jamba": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "num_experts_per_tok": 2,
        "num_experts": 16,
        "expert_layer_period": 2,
        "expert_layer_offset": 1,
        "attn_layer_period": 8,
        "attn_layer_offset": 4,
        "mamba_d_state": 16,
        "mamba_d_conv": 4,
        "mamba_expand": 2,
        "mamba_dt_rank": "auto",
        "mamba_conv_bias": True,
        "mamba_proj_bias": False,
    },
    "mamba2": {
        "num_heads": 128,
        "head_dim": 64,
        "state_size": 128,
        "layer_norm_epsilon": 1e-05,
        "expand": 2,
        "conv_kernel": 4,
        "n_groups": 8,
        "use_bias": False,
        "use_conv_bias": True,
        "hidden_act": "silu",
        "chunk_size": 256,
        "tie_word_embeddings": False,
    },
    "nemotron_h": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": False,
        "mlp_hidden_act": "relu2",
        "mlp_bias": False,
        "ssm_state_size": 128,
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "mamba_hidden_act": "silu",
        "n_groups": 8,
        "conv_kernel": 4,
        "chunk_size": 128,
        "use_conv_bias": True,
        "use_bias": False,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 7688,
        "moe_shared_expert_intermediate_size": 7688,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
    },
    "qwen3_next": {
        "num_key_value_heads": 2,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "norm_topk_prob": True,
        "rope_theta": 10000.0,
    },
    "qwen3_5_text": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "rope_theta": 10000.0,
    },
    "qwen3_5_moe_text": {
        "num_key_value_heads": 2,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 8,
        "num_experts": 256,
        "rope_theta": 10000.0,
    },
    "qwen3_5": {"tie_word_embeddings": False},
    "qwen3_5_moe": {"tie_word_embeddings": False},
    "gpt2": {
        "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": True,
        "activation_function": "gelu_new",
        "n_inner": None,
        "add_cross_attention": False,
    },
    "llama": {
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "mistral": {
        "num_key_value_heads": 8,
        "head_dim": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "rope_theta": 10000.0,
    },
    "mixtral": {
        "num_key_value_heads": 8,
        "head_dim": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": None,
        "rope_theta": 1000000.0,
    },
    "qwen2": {
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "rope_theta": 10000.0,
    },
    "qwen3": {
        "num_key_value_heads": 32,
        "head_dim": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "use_sliding_window": False,
        "max_window_layers": 28,
        "rope_theta": 10000.0,
    },
    "qwen3_moe": {
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "use_sliding_window": False,
        "decoder_sparse_step": 1,
        "norm_topk_prob": False,
        "rope_theta": 10000.0,
    },
    "gemma2": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4096,
        "use_bidirectional_attention": None,
        "rope_theta": 10000.0,
    },
    "gemma3_text": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_activation": "gelu_pytorch_tanh",
        "sliding_window": 4096,
        "use_bidirectional_attention": False,
        "rope_theta": 1000000.0,
    },
    "phi3": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": None,
        "rope_theta": 10000.0,
    },
    "olmo2": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "deepseek_v2": {
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "n_shared_experts": 2,
        "first_k_dense_replace": 0,
        "n_routed_experts": 64,
        "moe_intermediate_size": 1407,
        "norm_topk_prob": False,
        "n_group": None,
        "topk_group": None,
        "topk_method": "greedy",
        "rope_theta": 10000.0,
    },
    "deepseek_v3": {
        "num_key_value_heads": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "n_shared_experts": 1,
        "first_k_dense_replace": 3,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "moe_intermediate_size": 2048,
        "norm_topk_prob": True,
        "n_group": 8,
        "topk_group": 4,
        "rope_interleave": True,
        "rope_theta": 10000.0,
    },
    "granite": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "granitemoe": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "num_experts_per_tok": 2,
        "rope_theta": 10000.0,
    },
    "granitemoeshared": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "shared_intermediate_size": 0,
        "num_experts_per_tok": 2,
        "rope_theta": 10000.0,
    },
    "helium": {
        "num_key_value_heads": 20,
        "head_dim": 128,
        "rms_norm_eps": 1e-08,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 100000.0,
    },
    "internlm3": {
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "exaone": {
        "num_key_value_heads": 8,
        "head_dim": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 500000.0,
    },
    "ernie4_5": {
        "num_key_value_heads": 2,
        "head_dim": 128,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "use_bias": False,
        "hidden_act": "silu",
        "rope_theta": 500000.0,
    },
    "seed_oss": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": True,
        "attention_out_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "ministral": {
        "num_key_value_heads": 8,
        "head_dim": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "rope_theta": 10000.0,
    },
    "ministral3": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": None,
        "rope_theta": 10000.0,
    },
    "smollm3": {
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "sliding_window": None,
        "use_sliding_window": False,
        "rope_theta": 2000000.0,
    },
    "hunyuan_v1_dense": {
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "gemma": {
        "num_key_value_heads": 16,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "gelu_pytorch_tanh",
        "use_bidirectional_attention": None,
        "rope_theta": 10000.0,
    },
    "olmo3": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "rope_theta": 500000.0,
    },
    "exaone4": {
        "num_key_value_heads": 32,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "sliding_window": 4096,
        "sliding_window_pattern": 4,
        "rope_theta": 10000.0,
    },
    "olmoe": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "clip_qkv": None,
        "num_experts_per_tok": 8,
        "rope_theta": 10000.0,
    },
    "phimoe": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "sliding_window": None,
        "lm_head_bias": False,
        "num_experts_per_tok": 2,
        "rope_theta": 1000000.0,
    },
    "hy_v3": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "num_shared_experts": 1,
        "moe_intermediate_size": 1536,
        "num_experts_per_tok": 8,
        "rope_theta": 11158840.0,
    },
    "glm4_moe_lite": {
        "num_key_value_heads": 20,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "moe_intermediate_size": 1536,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 192,
        "v_head_dim": 256,
        "kv_lora_rank": 512,
        "q_lora_rank": 768,
        "n_shared_experts": 1,
        "n_routed_experts": 64,
        "num_experts_per_tok": 4,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "rope_interleave": True,
        "rope_theta": 10000.0,
    },
    "deepseek_v32": {
        "num_key_value_heads": 128,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "moe_intermediate_size": 2048,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "n_group": 8,
        "topk_group": 4,
        "rope_theta": 10000.0,
        "first_k_dense_replace": 3,
        "index_n_heads": 64,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
    "glm_moe_dsa": {
        "num_key_value_heads": 64,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "moe_intermediate_size": 2048,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 192,
        "v_head_dim": 256,
        "kv_lora_rank": 512,
        "q_lora_rank": 2048,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "rope_theta": 10000.0,
        "first_k_dense_replace": 3,
        "index_n_heads": 32,
        "index_head_dim": 128,
        "index_topk": 2048,
    },
    "starcoder2": {
        "num_key_value_heads": 2,
        "norm_epsilon": 1e-05,
        "tie_word_embeddings": True,
        "use_bias": True,
        "hidden_act": "gelu_pytorch_tanh",
        "sliding_window": None,
        "rope_theta": 10000.0,
    },
    "gpt_bigcode": {
        "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": True,
        "activation_function": "gelu_pytorch_tanh",
        "n_inner": None,
        "multi_query": True,
        "add_cross_attention": False,
    },
    "hunyuan_v1_moe": {
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "moe_topk": 1,
        "rope_theta": 10000.0,
    },
    "iquestcoder": {
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "rope_theta": 10000.0,
    },
    "sarvam_mla": {
        "num_key_value_heads": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "hidden_act": "silu",
        "moe_intermediate_size": 2048,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": None,
        "n_shared_experts": 1,
        "n_routed_experts": 128,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "n_group": 1,
        "topk_group": 1,
        "rope_interleave": True,
        "rope_theta": 10000.0,
    },
    "vaultgemma": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "sliding_window": 4096,
        "hidden_activation": "gelu_pytorch_tanh",
        "rope_theta": 10000.0,
    },
    "hyperclovax": {
        "num_key_value_heads": None,
        "head_dim": None,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "use_post_norm": True,
        "rope_theta": 10000.0,
    },
    "youtu": {
        "num_key_value_heads": 16,
        "rms_norm_eps": 1e-06,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "rope_interleave": True,
        "rope_theta": 10000.0,
    },
    "cohere": {
        "num_key_value_heads": None,
        "layer_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "use_qk_norm": False,
        "hidden_act": "silu",
        "logit_scale": 0.0625,
        "rope_theta": 500000.0,
    },
    "cohere2": {
        "num_key_value_heads": None,
        "layer_norm_eps": 1e-05,
        "tie_word_embeddings": True,
        "attention_bias": False,
        "hidden_act": "silu",
        "logit_scale": 0.0625,
        "sliding_window": 4096,
        "layer_types": None,
        "rope_theta": 10000.0,
    },
    "phi": {
        "num_key_value_heads": None,
        "layer_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "qk_layernorm": False,
        "hidden_act": "gelu_new",
        "rope_theta": 10000.0,
    },
    "gpt_neox": {
        "layer_norm_eps": 1e-05,
        "tie_word_embeddings": False,
        "use_parallel_residual": True,
        "attention_bias": True,
        "hidden_act": "gelu",
        "rope_theta": 10000.0,
    },
    "gptj": {
        "n_inner": None,
        "rotary_dim": 64,
        "activation_function": "gelu_new",
        "layer_norm_epsilon": 1e-05,
        "tie_word_embeddings": False,
        "rope_theta": 10000.0,
    },
    "falcon": {
        "num_ln_in_parallel_attn": None,
        "layer_norm_epsilon": 1e-05,
        "num_kv_heads": None,
        "alibi": False,
        "new_decoder_architecture": False,
        "multi_query": True,
        "parallel_attn": True,
        "bias": False,
        "max_position_embeddings": 2048,
        "ffn_hidden_size": None,
        "activation": "gelu",
        "tie_word_embeddings": True,
        "rope_theta": 10000.0,
    },
}
CLASS_DEFAULTS["glm"] = CLASS_DEFAULTS["glm4"]
CLASS_DEFAULTS["llama4_text"] = {
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size_mlp": 16384,
    "rms_norm_eps": 1e-05,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "num_experts_per_tok": 1,
    "num_local_experts": 16,
    "interleave_moe_layer_step": 1,
    "use_qk_norm": True,
    "no_rope_layer_interval": 4,
    "attention_chunk_size": 8192,
    "rope_theta": 500000.0,
}
CLASS_DEFAULTS["llama4"] = {"tie_word_embeddings": False}

SAME_CLASSES = {"gpt-sw3": "gpt2"}
"""A ``model_type`` whose configuration class and causal-LM class are another type's (transformers'
``CONFIG_MAPPING_NAMES`` and ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``): GPT-SW3 is ``GPT2Config`` and
``GPT2LMHeadModel``, so its config.json is read as GPT-2's."""

WRAPPERS = {
    "gemma3": "gemma3_text",
    "mistral3": "mistral",
    "kimi_k25": "deepseek_v3",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "llama4": "llama4_text",
}
"""Multimodal wrapper ``model_type`` -> the ``model_type`` of its ``text_config`` (``sub_configs_defaults``)."""

WRAPPERS_OF_ANY_TEXT = frozenset(["mistral3", "kimi_k25"])
"""Wrappers whose ``text_config`` is an ``AutoConfig`` (``sub_configs``): any text ``model_type`` the reader
supports (Mistral 3's is ``mistral`` or ``ministral3``), ``WRAPPERS``' when the text_config names none."""

WRAPPED_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "max_position_embeddings": 131072,
    },
}
"""The text class's defaults for the shape fields: google/gemma-3-4b-it's ``text_config`` gives only
``hidden_size``, ``intermediate_size``, ``num_hidden_layers`` and ``sliding_window``."""
