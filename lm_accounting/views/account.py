"""The view of an ``Account``: the headline command's tables."""

from __future__ import annotations

from ..account import CONVENTIONS, Account
from ..analytic.flops import chunked_attention_flops, routed_top_k_forward_flops, sparse_attention_flops
from ..breakdown import Breakdown
from ..config import ModelConfig
from ..units import fmt_bytes, fmt_sci, fmt_share
from .tables import Column, Table, View
from .words import plural

BREAKDOWN_COLUMNS = (
    Column("key"),
    Column("component"),
    Column("per layer", "int"),
    Column("total", "int"),
    Column("share", "share"),
)


def breakdown_table(title: str, bd: Breakdown, layers: int) -> Table:
    total = bd.total
    rows = [(it.key, it.label, it.per_layer, it.total, it.total / total if total else 0.0) for it in bd]
    # one block's total only when every block is the same (not a dense/MoE mix: no such block exists)
    uniform = all(it.total == it.per_layer * layers for it in bd if it.per_layer)
    per_layer = bd.per_layer_total if uniform else None
    rows.append(("total", f"all {plural(layers, 'layer')} + the rest", per_layer, total, 1.0 if total else 0.0))
    notes = [] if uniform else ["per layer: the value in each block that has the component (blocks differ)"]
    return Table(title, BREAKDOWN_COLUMNS, rows, notes)


def describe_config(cfg: ModelConfig) -> str:
    heads = plural(cfg.num_heads, "head")
    if cfg.kv_heads != cfg.num_heads:
        heads += f" ({plural(cfg.kv_heads, 'KV head')}, GQA)"
    if cfg.mla:
        head = f"head_dim {cfg.d_head} (Q/K: {cfg.qk_nope_head_dim} + {cfg.qk_rope_head_dim} RoPE; V: {cfg.v_head})"
    else:
        head = f"head_dim {cfg.d_head}" + (f" (RoPE on the first {cfg.rotary_dim})" if cfg.partial_rotary else "")
    extras = [head, *_ffn_widths(cfg), "tied" if cfg.tie_embeddings else "untied"]
    if cfg.qk_norm:
        extras.append("qk-norm")
    if cfg.hybrid:
        extras.append(
            f"{cfg.linear_layers} Gated DeltaNet + {cfg.attention_layers} attention layers "
            f"(H_k {cfg.linear_key_heads} × d_k {cfg.linear_key_head_dim}, H_v {cfg.linear_value_heads} × "
            f"d_v {cfg.linear_value_head_dim}, conv {cfg.linear_conv_kernel})"
        )
    if cfg.attention_output_gate:
        extras.append("gated attention output")
    if cfg.layer_pattern is not None and not cfg.ssm_layers:
        mamba = (
            f" (H {cfg.mamba_heads} × P {cfg.mamba_head_dim}, G {cfg.mamba_groups} × N {cfg.mamba_state_size}, "
            f"conv {cfg.mamba_conv_kernel}, chunk {cfg.mamba_chunk_size})"
            if cfg.mamba_layers
            else ""
        )
        conv = (
            f"a short convolution (K {cfg.short_conv_kernel}) on {plural(cfg.short_conv_layers, 'layer')}, "
            if cfg.short_conv_layers
            else f"Mamba2 on {plural(cfg.mamba_layers, 'layer')}, "
        )
        extras.append(f"{conv}attention on {cfg.attention_layers}, an MLP on {cfg.dense_layers}{mamba}")
    if cfg.ssm_layers:  # Mamba (v1), Falcon-Mamba, Jamba
        norms = "" if cfg.ssm_norms == "none" else f", {cfg.ssm_norms} dt/B/C norms"
        extras.append(
            f"Mamba on {plural(cfg.ssm_layers, 'layer')}, attention on {cfg.attention_layers} (E {cfg.ssm_inner:,} × "
            f"N {cfg.ssm_state_size}, dt rank {cfg.ssm_dt_rank}, conv {cfg.ssm_conv_kernel}{norms})"
        )
    if cfg.layer_pattern is not None and set(cfg.layer_pattern) <= {"M", "S"}:  # pure Mamba: no heads, no d_ff
        extras = extras[len(_ffn_widths(cfg)) + 1 :]
        return (
            f"{cfg.name}: vocab {cfg.vocab_size:,} · {plural(cfg.num_layers, 'layer')} · d_model {cfg.d_model:,} · "
            + (" · ".join(extras))
        )
    return (
        f"{cfg.name}: vocab {cfg.vocab_size:,} · {plural(cfg.num_layers, 'layer')} · d_model {cfg.d_model:,} · "
        f"{heads} · " + " · ".join(extras)
    )


def _ffn_widths(cfg: ModelConfig) -> list[str]:
    """The FFN widths a block really has: d_ff for dense blocks, the routed and shared experts' widths
    for mixture-of-experts blocks, and which blocks are which."""
    if not cfg.moe:
        return [f"d_ff {cfg.d_ff:,}"]
    out = [f"{plural(cfg.num_experts, 'expert')} × d_e {cfg.expert_width:,}, top-{cfg.experts_per_token}"]
    if cfg.shared_experts:
        out.append(f"{cfg.shared_experts} shared × {cfg.shared_width // cfg.shared_experts:,}")
    if cfg.pattern_experts:  # Nemotron-H: its E layers (the pattern places the MLP and the MoE layers)
        latent = f" over a {cfg.expert_latent:,}-wide latent" if cfg.expert_latent is not None else ""
        out.append(
            f"MoE on the {cfg.moe_layers} E layers{latent}, d_ff {cfg.d_ff:,} on the {cfg.dense_layers} - layers"
        )
    elif cfg.dense_layers:
        n = cfg.dense_layers_first if cfg.moe_every == 1 else cfg.dense_layers
        where = f"first {plural(n, 'layer')}" if cfg.moe_every == 1 else f"{n} of {plural(cfg.num_layers, 'layer')}"
        out.append(f"dense d_ff {cfg.d_ff:,} in {where}")
    else:
        out.append("every layer MoE (d_ff unused)" if cfg.expert_d_ff is not None else "every layer MoE")
    return out


COURSE_GPT2_SHAPES = {
    "gpt2-small": "openai-gpt2",
    "gpt2-medium": "openai-gpt2-medium",
    "gpt2-large": "openai-gpt2-large",
    "gpt2-xl": "openai-gpt2-xl",
}
"""The course presets at GPT-2 shapes -> the preset of the original GPT-2 at the same size."""


def describe_architecture(cfg: ModelConfig) -> str:
    """One line: the architecture family and options, naming the original-GPT-2 preset for the course ones."""
    if cfg.course_architecture and cfg.name in COURSE_GPT2_SHAPES:
        return (
            f"architecture: course (CS336 A1: {cfg.architecture}, no biases) at GPT-2 shapes; the original "
            f"GPT-2 (LayerNorm, biases, GELU MLP, learned positions) is preset {COURSE_GPT2_SHAPES[cfg.name]}"
        )
    return f"architecture: {cfg.family}: {cfg.architecture}"


def kv_cache_formula(cfg) -> str:
    """The KV-cache closed form that applies to ``cfg`` (latent attention, sliding windows)."""
    entry = "(r_kv + d_rope) (MLA: the latent and the shared RoPE key)" if cfg.mla else "2 · kv_heads · d_head"
    tokens = "S" if cfg.sliding_window is None else "Σ_layers min(S, w) on windowed layers, S on the others"
    if cfg.hybrid:  # Gated DeltaNet: K and V on the attention layers, a fixed state on the others (kv_cache.py)
        return (
            f"KV cache = {entry} · L_attn · S · B · bytes + L_lin · B · (conv_dim · K · bytes + H_v · d_k · d_v · 4) "
            "(inference; the linear layers' conv and fp32 recurrent states)"
        )
    if cfg.ssm_layers:  # Mamba: K and V on the attention layers, a fixed state on the Mamba layers (kv_cache.py)
        return (
            f"KV cache = {entry} · L_attn · S · B · bytes + L_s6 · B · (E · K · bytes + E · N · 4) "
            "(inference; the Mamba layers' conv and fp32 SSM states)"
        )
    if cfg.mamba_layers:  # Mamba2: K and V on the attention layers, a fixed state on the Mamba2 layers (kv_cache.py)
        return (
            f"KV cache = {entry} · L_attn · S · B · bytes + L_ssm · B · ((H·P + 2·G·N) · K · bytes + H · P · N · 4) "
            "(inference; the Mamba2 layers' conv and fp32 SSM states)"
        )
    if cfg.short_conv_layers:  # LFM2: K and V on the attention layers, the conv's last K inputs on the others
        return (
            f"KV cache = {entry} · L_attn · S · B · bytes + L_conv · B · d · K · bytes "
            "(inference; the short-convolution layers' conv states)"
        )
    return f"KV cache = {entry} · L · {tokens} · B · bytes (inference)".replace(" · L · Σ_layers", " · Σ_layers")


def account_view(acc: Account) -> View:
    cfg, L = acc.config, acc.config.num_layers
    ctx = f"context {plural(acc.seq, 'token')}"
    if acc.preset_context != acc.seq:
        ctx += f" (config context_length {acc.preset_context:,})"
    header = [
        describe_config(cfg),
        describe_architecture(cfg),
        f"{ctx} · batch {acc.batch:,}",
        (
            f"parameters {acc.params.total:,} ({acc.params.total / 1e9:.3f} billion)"
            + (f", {acc.active_params:,} active per token" if acc.active_params != acc.params.total else "")
            + f" · forward FLOPs {acc.forward.total:,} ({fmt_sci(acc.forward.total)}) · attention QKᵀ+AV "
            f"{fmt_share(acc.attention_matmuls / acc.forward.total)}"
        ),
    ]

    params = breakdown_table("Parameters (exact count per component)", acc.params, L)
    params.notes += [
        "weights: "
        + " · ".join(f"{dt} {fmt_bytes(b)}" for dt, b in acc.weight_bytes().items())
        + " (bf16 and fp16 are the same size)"
    ]

    fwd = breakdown_table(f"Forward FLOPs, matmuls only (B={acc.batch:,}, S={acc.seq:,})", acc.forward, L)
    fwd.notes += [
        "by group: " + " · ".join(f"{g} {fmt_share(v / acc.forward.total)}" for g, v in acc.forward.groups().items()),
        f"attention QKᵀ+AV, causal half only (labelled extra, not in the total): {acc.causal_attention:,}",
    ]
    if cfg.sliding_window is not None:
        fwd.notes.append(
            f"attention QKᵀ+AV with only the sliding-window band on the {cfg.windowed_layers} windowed layers "
            f"(window {cfg.sliding_window:,}; labelled extra, not in the total): "
            f"{acc.windowed_attention:,}"
        )

    if cfg.attention_chunk is not None:
        fwd.notes.append(
            f"attention QKᵀ+AV with only each query's own chunk on the {cfg.chunked_layers} chunked layers (Llama 4, "
            f"chunk {cfg.attention_chunk:,}; labelled extra, not in the total): "
            f"{chunked_attention_flops(cfg, acc.seq, acc.batch):,}"
        )
    if cfg.all_experts_run:
        fwd.notes.append(
            f"routed experts: the total runs every token through all {cfg.num_experts} experts (T·E rows), as "
            f"transformers' Llama4TextExperts does and FlopCounterMode counts; with each token's top-"
            f"{cfg.experts_per_token} only, what the router selects (labelled extra, not in the total): "
            f"{routed_top_k_forward_flops(cfg, acc.seq, acc.batch):,}"
        )
    if cfg.indexer:
        fwd.notes.append(
            f"DSA: the indexer's scores count every key (in the total, as transformers computes them); attention "
            f"QKᵀ+AV over each query's top {cfg.index_topk:,} keys only (labelled extra, not in the total): "
            f"{sparse_attention_flops(cfg, acc.seq, acc.batch):,}"
        )

    nonmm = breakdown_table("Non-matmul FLOPs (estimate, NOT in the totals above)", acc.nonmatmul, L)
    nonmm.notes += [
        (
            "convention: 1 FLOP per elementwise op; RMSNorm 4/elem, RoPE 3/elem, softmax 5/score, "
            "scaling 1/score, SiLU 4/elem, gate 1/elem, residual 1/elem. fvcore counts these as 0."
        ),
        f"= {fmt_share(acc.nonmatmul.total / acc.forward.total)} of the matmul total",
    ]

    step = acc.training.step
    train = Table(
        "Training step FLOPs (one optimizer step on B·S tokens)",
        (Column("estimate"), Column("FLOPs", "int"), Column("vs 3×forward", "share")),
        [(label, value, value / step) for _, label, value in acc.training_rows()],
    )
    kv = Table(
        "Memory basics",
        (Column("item"), Column("bytes", "int"), Column("size", "str")),
        [(f"weights, {dt}", b, fmt_bytes(b)) for dt, b in acc.weight_bytes().items()]
        + [
            (f"KV cache at S={acc.seq:,}, B={acc.batch:,}, {dt}", b, fmt_bytes(b))
            for dt, b in acc.kv_cache_bytes().items()
        ],
        [kv_cache_formula(cfg)],
    )
    footer = ["Conventions:", *[f"  - {c}" for c in CONVENTIONS]]
    return View(header, [params, fwd, nonmm, train, kv], footer)
