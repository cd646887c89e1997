"""transformers' parameter tensors: the numel of each, in ``model.parameters()`` order, per model type.

AdamW keeps one ``step`` counter per parameter tensor and its for-loop implementation works tensor by tensor
(``analytic.memory``), so those figures need the tensors of the model that trains, not only the parameter
count N (which is the same for every implementation).  transformers 5.24's modules differ from ours where they
fuse: GPT-2's ``c_attn`` (Q, K and V in one ``Conv1D``, weight and bias), Phi-3's ``qkv_proj`` and
``gate_up_proj``, and the mixture-of-experts classes' experts (``gate_up_proj`` [E, 2·F, d] and ``down_proj``
[E, d, F] as two tensors for all experts).  Module order (each module's weight, then its bias):

* GPT-2 (``GPT2LMHeadModel``, and GPTBigCode's): wte, wpe; per block ln_1, c_attn, attn.c_proj, ln_2, c_fc,
  mlp.c_proj (each a weight and a bias); ln_f (weight, bias); lm_head unless tied.
* the others (``*ForCausalLM``): embed_tokens; per layer the attention (q, k, v, o and their biases; Phi-3's
  o_proj then qkv_proj; MiniMax-M2's whole-projection qk-norms, GLM's and StableLM's blocks as Llama's but for
  GLM's fused gate_up_proj; qk-norms after o_proj: per head, or over the whole projection for OLMo-2; DeepSeek's
  latent projections, then DeepSeek-V3.2's and GLM-5's indexer: wq_b, wk, k_norm, weights_proj (no gradient: not
  ``trained``); gpt-oss's sinks first, the attention module's own parameter), the MLP (gate, up, down;
  Phi-3's gate_up then down; StarCoder2's c_fc then c_proj; a mixture of experts: the router then the experts
  (``FUSED_MOE_ROUTER_FIRST``) or the experts then the router (Qwen3-MoE, DeepSeek; Llama 4's
  ``feed_forward.experts.gate_up_proj`` [E, d, 2·F], ``down_proj`` [E, F, d], ``router``), then DeepSeek's shared
  experts, Llama 4's ``shared_expert`` or Qwen2-MoE's shared expert and its gate; gpt-oss's router and expert biases after their weights),
  then the layer's norms (two; one in a parallel block from one norm; four with sandwich norms: Gemma 2/3, GLM-4-0414, HyperCLOVA X; each a weight, and
  a bias for a LayerNorm: StableLM, Phi-3.5-MoE, StarCoder2); Granite-MoE's norms come before its MLP
  (``NORMS_BEFORE_MLP``), GPT-NeoX's and GPT-J's before the attention (``NORMS_FIRST``; GPT-NeoX's fused
  ``query_key_value``, GPT-J's k_proj, v_proj, q_proj, out_proj); the final norm; lm_head unless tied, then
  its bias (Phi, GPT-J).
* OPT (``OPTForCausalLM``, models/opt/modeling_opt.py): embed_tokens, embed_positions (max_position_embeddings + 2
  rows), the final LayerNorm (``OPTDecoder`` registers it before its layers); per layer k_proj, v_proj, q_proj,
  out_proj (each with its bias), self_attn_layer_norm, fc1, fc2 (with biases), final_layer_norm; lm_head tied.
* Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5): an attention layer's ``q_proj`` holds the query and its output
  gate (2·h·d_head x d); a linear layer registers ``dt_bias`` and ``A_log`` (its own parameters) first, then
  Qwen3-Next's conv1d, ``in_proj_qkvz``, ``in_proj_ba``, norm, ``out_proj``, or Qwen3.5's conv1d, norm,
  ``out_proj``, ``in_proj_qkv``, ``in_proj_z``, ``in_proj_b``, ``in_proj_a``; the mixture of experts is
  Qwen2-MoE's (router first).

tests/test_hf_tensors.py compares every supported model type with transformers' real model on meta, tensor by
tensor; tests/test_hostile_impl.py every typed preset and committed config.json.
"""

from __future__ import annotations

from ..config import ModelConfig

FUSED_QKV_WITH_BIAS = ("gpt2", "bloom", "gpt_bigcode")
"""GPT-2-shaped blocks: LayerNorm (weight, bias), one fused Q/K/V (``c_attn``, BLOOM's ``query_key_value``;
GPTBigCode's multi-query ``c_attn`` is q + 2·kv wide) and every projection with a bias; BLOOM adds
``word_embeddings_layernorm`` after the embedding."""

FUSED_MOE_ROUTER_FIRST = (
    "jamba",
    "mixtral",
    "gpt_oss",
    "qwen2_moe",
    "ernie4_5_moe",
    "minimax_m2",
    "olmoe",
    "phimoe",
    "hy_v3",
    "hunyuan_v1_moe",
    "granitemoe",
    "granitemoeshared",
    "granitemoehybrid",
    "qwen3_next",
    "qwen3_5_moe_text",
)
"""Mixture-of-experts classes that register the router (``gate``, ``router``, HunYuan's ``gate.wg``) before
the experts."""

FUSED_QKV = FUSED_QKV_WITH_BIAS + ("gpt_neox", "falcon")
"""One fused Q/K/V tensor (and its bias, where ``qkv_bias``): GPT-NeoX's and Falcon's ``query_key_value`` too
(rows per head [q, k, v], or per K/V group [q..., k, v]: the same numel)."""

NORMS_FIRST = ("gpt_neox", "gptj")
"""Blocks that register their norms before the attention (``GPTNeoXLayer``: input_layernorm,
post_attention_layernorm; ``GPTJBlock``: ln_1)."""

NORMS_BEFORE_MLP = ("granitemoe", "granitemoeshared")
"""Blocks that register their two norms before the MLP (``GraniteMoeDecoderLayer``: ``block_sparse_moe`` last,
then GraniteMoeShared's ``shared_mlp``, fused ``input_linear`` (2·F x d) then ``output_linear``)."""

FUSED_GATE_UP = ("phi3", "glm", "glm4", "granitemoeshared", "granitemoehybrid")
"""Dense MLPs with one ``gate_up_proj`` (2·F x d) then ``down_proj`` (GraniteMoeShared's and Granite-4.0-H's shared
MLP, ``input_linear`` then ``output_linear``)."""


LFM2_TYPES = ("lfm2", "lfm2_moe")
"""LFM2's blocks (``Lfm2DecoderLayer``, models/lfm2/modeling_lfm2.py) register the mixer (attention or the short
conv: ``conv``, ``in_proj``, ``out_proj``), ``feed_forward`` (w1, w3, w2; LFM2-MoE's experts, then its router), then
``operator_norm`` and ``ffn_norm``."""


def _norm_tensors(cfg: ModelConfig) -> int:
    """One norm's tensors: LayerNorm's weight and bias, RMSNorm's weight, none without weights (OLMo)."""
    return 0 if not cfg.norm_weights else 2 if cfg.norm == "layernorm" and cfg.norm_bias else 1


def _linear_attention(cfg: ModelConfig) -> list[int]:
    """A Gated DeltaNet layer's tensors (module docstring)."""
    d, hv, conv, vd = cfg.d_model, cfg.linear_value_heads, cfg.linear_conv_dim, cfg.linear_value_dim
    first = [hv, hv, conv * cfg.linear_conv_kernel]  # dt_bias, A_log, conv1d
    if cfg.hf_model_type == "qwen3_next":
        return first + [d * (conv + vd), d * 2 * hv, cfg.linear_value_head_dim, vd * d]
    return first + [cfg.linear_value_head_dim, vd * d, d * conv, d * vd, d * hv, d * hv]


def _ssm_mixer(cfg: ModelConfig) -> list[int]:
    """A Mamba (v1) mixer's tensors (``MambaMixer``): its own ``A_log`` and ``D``, then conv1d (weight, bias),
    ``in_proj``, ``x_proj``, ``dt_proj`` (weight, bias), ``out_proj``, and Jamba's dt/B/C norms (Falcon-Mamba's are
    buffers)."""
    d, e, n, r = cfg.d_model, cfg.ssm_inner, cfg.ssm_state_size, cfg.ssm_dt_rank
    norms = [r, n, n] if cfg.ssm_norms == "rmsnorm" else []
    return [e * n, e, e * cfg.ssm_conv_kernel, e, d * 2 * e, e * cfg.ssm_x_width, r * e, e, e * d, *norms]


def _pattern_layer(cfg: ModelConfig, layer: int) -> list[int]:
    """A ``layer_pattern`` block (``NemotronHBlock``): its norm, then its mixer's tensors: a Mamba2 mixer's own
    ``dt_bias``, ``A_log``, ``D``, then conv1d (weight, bias), ``in_proj``, the gated norm (none without
    ``mamba_norm``) and ``out_proj``; an attention's q/k/v/o; an MLP's ``up_proj`` and ``down_proj`` (with biases under
    ``mlp_bias``); a ``NemotronHMoE``'s experts, router, shared expert and latent projections.  With ``mixer_ffn``:
    Bamba's SwiGLU and two norms, then the mixer; Granite-4.0-H's two norms, MoE and ``shared_mlp``, then the mixer;
    Falcon-H1's SwiGLU, Mamba2 mixer, attention, then its two norms; LFM2's mixer, MLP, then its two norms
    (``LFM2_TYPES``)."""
    d, kind = cfg.d_model, cfg.layer_kind(layer)
    if cfg.mamba_layers:
        h, conv, inner = cfg.mamba_heads, cfg.mamba_conv_dim, cfg.mamba_inner
        norm = [inner] if cfg.mamba_norm else []  # Falcon-H1 without mamba_rms_norm: no gated norm
        mamba = [h, h, h, conv * cfg.mamba_conv_kernel, conv, d * cfg.mamba_in_width, *norm, inner * d]
    if kind == "H":  # FalconH1DecoderLayer: feed_forward, mamba, self_attn, input_layernorm, pre_ff_layernorm
        return _mlp(cfg, layer) + mamba + _attention(cfg) + [d, d]
    if kind == "M":
        mixer = mamba
    elif kind == "C":  # Lfm2ShortConv: conv, in_proj, out_proj (each with its bias under conv_bias)
        b, k = cfg.short_conv_bias, cfg.short_conv_kernel
        mixer = [d * k] + [d] * b + [3 * d * d] + [3 * d] * b + [d * d] + [d] * b
    elif kind == "S":
        mixer = _ssm_mixer(cfg)
    elif kind == "*":
        mixer = _attention(cfg)
    elif kind == "E":  # NemotronHMoE: experts (up, down), the router, the shared expert, the latent projections
        e, f, n, s = cfg.num_experts, cfg.expert_width, cfg.expert_in, cfg.shared_width
        mixer = [e * f * n, e * n * f, e * d] + _dense(cfg, s)
        if cfg.expert_latent is not None:
            lat = cfg.expert_latent
            mixer += [lat * d, lat, d * lat, d] if cfg.mlp_bias else [lat * d, d * lat]
    else:  # NemotronHMLP: up_proj, down_proj
        mixer = _dense(cfg, cfg.d_ff)
    if cfg.hf_model_type in LFM2_TYPES:  # Lfm2DecoderLayer: the mixer, feed_forward, operator_norm, ffn_norm
        return mixer + _mlp(cfg, layer) + [d, d]
    if cfg.hf_model_type == "granitemoehybrid":  # the two norms, block_sparse_moe (router first), shared_mlp, the mixer
        return [d, d] + _mlp(cfg, layer) + mixer
    if cfg.hf_model_type == "jamba":  # Jamba*DecoderLayer: the mixer, feed_forward, input_layernorm, pre_ff_layernorm
        return mixer + _mlp(cfg, layer) + [d, d]
    if cfg.mixer_ffn:  # BambaDecoderLayer registers feed_forward, input_layernorm, pre_ff_layernorm, then the mixer
        return _mlp(cfg, layer) + [d, d] + mixer
    return [d] + mixer


def _attention(cfg: ModelConfig, trained: bool = False, layer: int = 0) -> list[int]:
    d, kind = cfg.d_model, cfg.hf_model_type
    if cfg.kv_lora_rank is not None:  # DeepSeek's latent attention
        h, rope, r = cfg.num_heads, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        qk = cfg.qk_nope_head_dim + rope
        q = (
            [d * h * qk]
            if cfg.q_lora_rank is None
            else [d * cfg.q_lora_rank, cfg.q_lora_rank, cfg.q_lora_rank * h * qk]
        )
        out = q + [d * (r + rope), r, r * h * (cfg.qk_nope_head_dim + cfg.v_head_dim), h * cfg.v_head_dim * d]
        if (
            cfg.layer_indexer(layer) and not trained
        ):  # DeepSeek-V3.2's indexer after o_proj: wq_b, wk, k_norm, weights_proj
            # (no gradient: it runs under torch.no_grad())
            hi, di = cfg.index_heads, cfg.index_head_dim
            out += [cfg.q_lora_rank * hi * di, d * di, di, di, d * hi]
        return out
    q, kv = cfg.num_heads * cfg.d_head, cfg.kv_heads * cfg.d_head
    if kind in FUSED_QKV:
        return [d * (q + 2 * kv)] + ([q + 2 * kv] if cfg.qkv_bias else []) + [d * q] + ([d] if cfg.output_bias else [])
    if kind == "gptj":  # GPTJAttention registers k_proj, v_proj, q_proj, out_proj (no biases)
        return [kv * d, kv * d, q * d, d * q]
    if kind == "phi3":
        return [d * q, (q + 2 * kv) * d]
    if kind == "opt":  # OPTAttention registers k_proj, v_proj, q_proj, out_proj (each with enable_bias' bias)
        b = cfg.qkv_bias
        return [kv * d] + [kv] * b + [kv * d] + [kv] * b + [q * d] + [q] * b + [d * q] + [d] * cfg.output_bias
    out: list[int] = [cfg.num_heads] if cfg.attention_sinks else []  # gpt-oss's ``sinks``: the module's own
    if cfg.attention_output_gate:  # Qwen3-Next's q_proj (the query and its gate), k, v, o, per-head q/k norms
        return [2 * q * d, kv * d, kv * d, d * q] + ([cfg.d_head, cfg.d_head] if cfg.qk_norm else [])
    for n in (q, kv, kv):
        out += [n * d] + ([n] if cfg.qkv_bias else [])
    out += [d * q] + ([d] if cfg.output_bias else [])
    if cfg.qk_norm:  # a LayerNorm's weight then bias (Phi's qk_layernorm)
        per = 2 if cfg.norm == "layernorm" and cfg.norm_bias else 1
        out += [q] * per + [kv] * per if cfg.qk_norm_scope != "head" else [cfg.d_head] * 2 * per
    return out


def _dense(cfg: ModelConfig, width: int) -> list[int]:
    d = cfg.d_model
    if cfg.hf_model_type in FUSED_GATE_UP:
        return [2 * width * d, d * width]
    if not cfg.gated_mlp:  # StarCoder2's c_fc then c_proj, OPT's fc1 then fc2, Nemotron's up then down
        return [width * d, width, d * width, d] if cfg.mlp_bias else [width * d, d * width]
    if not cfg.mlp_bias:
        return [width * d, width * d, d * width]
    return [width * d, width, width * d, width, d * width, d]  # gate, up (bias: width), down (bias: d)


def _mlp(cfg: ModelConfig, layer: int, trained: bool = False) -> list[int]:
    d = cfg.d_model
    if cfg.hf_model_type in FUSED_QKV_WITH_BIAS:
        return [d * cfg.d_ff, cfg.d_ff, cfg.d_ff * d, d]
    if not cfg.layer_moe(layer):
        return _dense(cfg, cfg.d_ff)
    e, f = cfg.num_experts, cfg.expert_width
    router = [e * d] + ([e] if cfg.router_bias else [])  # gpt-oss's router bias
    if cfg.router_score_bias and not trained:  # Ernie 4.5's gate.moe_statics.e_score_correction_bias (frozen)
        router.append(e)
    bias = cfg.expert_bias  # gpt-oss: gate_up_proj_bias after gate_up_proj, down_proj_bias after down_proj
    experts = [e * 2 * f * d] + ([e * 2 * f] if bias else []) + [e * d * f] + ([e * d] if bias else [])
    shared = (_dense(cfg, cfg.shared_width) if cfg.shared_experts else []) + ([d] if cfg.shared_expert_gate else [])
    if cfg.hf_model_type in FUSED_MOE_ROUTER_FIRST:
        return router + experts + shared
    return experts + router + shared


def _layer(cfg: ModelConfig, layer: int, trained: bool = False) -> list[int]:
    d = cfg.d_model
    if cfg.layer_pattern is not None:
        return _pattern_layer(cfg, layer)
    if cfg.hf_model_type in FUSED_QKV_WITH_BIAS:
        attention, mlp = _attention(cfg), _mlp(cfg, layer)
        return [d, d] + attention + [d, d] + mlp
    count = 4 if cfg.norm_placement == "sandwich" else 1 if cfg.parallel_block == "one_norm" else 2
    norms = [d] * count * _norm_tensors(cfg)  # Gemma 2/3, GLM-4-0414: 4; a parallel block from one norm: 1
    mixer = (
        _attention(cfg, trained, layer) if cfg.layer_attention(layer) else _linear_attention(cfg)
    )  # a hybrid's Gated DeltaNet
    if cfg.hf_model_type in NORMS_FIRST:
        return norms + mixer + _mlp(cfg, layer, trained)
    if cfg.hf_model_type == "opt":  # self_attn, self_attn_layer_norm, fc1, fc2, final_layer_norm
        half = len(norms) // 2
        return mixer + norms[:half] + _mlp(cfg, layer, trained) + norms[half:]
    if cfg.hf_model_type in NORMS_BEFORE_MLP:
        return mixer + norms + _mlp(cfg, layer, trained)
    return mixer + _mlp(cfg, layer, trained) + norms


def _ends(cfg: ModelConfig) -> tuple[list[int], list[int]]:
    """The tensors before the first layer and after the last."""
    d, v = cfg.d_model, cfg.vocab_size
    head = [v * d, cfg.position_rows * d] if cfg.positions == "learned" else [v * d]  # GPT-2's wpe
    if cfg.hf_model_type == "bloom":  # word_embeddings_layernorm
        head += [d, d]
    tail = [d] * _norm_tensors(cfg)
    if cfg.hf_model_type == "opt":  # OPTDecoder registers final_layer_norm before its layers
        head, tail = head + tail, []
    return head, tail + ([] if cfg.tie_embeddings else [v * d]) + ([v] if cfg.lm_head_bias else [])


def hf_parameter_tensor_sizes(cfg: ModelConfig, layers=None, trained: bool = False) -> list[int]:
    """numel of each parameter tensor of transformers' model of ``cfg``, in ``model.parameters()`` order;
    ``layers``: only those layers (default all); ``trained``: only those with a gradient (not Ernie's frozen
    score bias)."""
    head, tail = _ends(cfg)
    body = [n for i in (range(cfg.num_layers) if layers is None else layers) for n in _layer(cfg, i, trained)]
    return head + body + tail


def hf_parameter_tensor_count(cfg: ModelConfig, trained: bool = False) -> int:
    """``len(hf_parameter_tensor_sizes(cfg))`` without listing the layers (dense and MoE layers counted)."""
    head, tail = _ends(cfg)
    count = len(head) + len(tail)
    # layers of two or more kinds (a hybrid's, GLM-5's with and without an indexer, a layer pattern's): each as it is
    if cfg.hybrid or cfg.indexer_pattern or cfg.layer_pattern:
        return count + sum(len(_layer(cfg, i, trained)) for i in range(cfg.num_layers))
    if cfg.dense_layers:
        dense = next(i for i in range(cfg.num_layers) if not cfg.layer_moe(i))
        count += cfg.dense_layers * len(_layer(cfg, dense, trained))
    if cfg.moe_layers:
        first, every = cfg.dense_layers_first, cfg.moe_every
        sparse = first + (every - (first + 1) % every) % every  # the first i >= first with (i + 1) % every == 0
        count += cfg.moe_layers * len(_layer(cfg, sparse, trained))
    return count
