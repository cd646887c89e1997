"""Inference FLOPs and memory: prefill, decode at position p, the generation's total, KV cache, weights.

Exact ints, no torch.  Conventions (stated in every output):

* **Steps.**  Prefill runs the prompt of P tokens and yields the first generated token; then G − 1
  decode steps at positions p = P, ..., P + G − 2 each feed one token and yield the next.  The cache
  holds C positions: P + G − 1 under ``generate`` and ``engine`` (the last token is never fed back),
  P + G under ``forward`` (``cache_positions``; the programs below).
* **Prefill FLOPs** are the forward at S = P (``components.breakdown`` via ``forward_flops``): the
  full P × P attention square, as the live model and every counter compute it, under ``forward`` and
  ``generate``; ``engine`` counts the pairs a causal kernel computes (``prefill_pairs``).
* **Decode FLOPs** at position p are the registry's forward at T = B tokens with each attention
  matmul against the cached keys: a new token at position p attends over n = p + 1 keys (min(p + 1, w)
  on a windowed layer).  QKᵀ and AV are c·S² at S queries × S keys (``flops.attention_scores_flops``:
  2·B·h·S·d_head·S), so one query against n keys is c·n, c = the formula at S = 1.  For the course
  architecture this is 2·B·N_matmul + 4·L·B·(p + 1)·h·d_head.
* **Cache semantics** (``SEMANTICS``): ``filled`` attends over the filled positions (above);
  ``static`` attends over every slot of the capacity-C cache, masked, as transformers' ``StaticCache``
  does with eager attention: n = C (min(C, w) windowed) at every decode step, and prefill attends
  over C keys too (P × C; a windowed ring shorter than the prompt attends over the prompt itself).
* **KV cache**: ``memory.kv_cache_bytes`` at C tokens (windowed layers keep min(C, w)).
* **Programs** (``PROGRAMS``): which serving program the figures describe.  ``forward`` is the model's
  own forward at every prompt position (B·P·V logits; C = P + G), what our live model's prefill runs.
  ``generate`` is transformers' ``generate()``: ``logits_to_keep = 1`` (generation/utils.py: "If the
  model supports `logits_to_keep` in forward(), set it to 1"), so the prefill's head runs on B rows, and
  a cache of C = P + G − 1 positions (``max_cache_length = generation_config.max_length - 1``; the last
  token generated is never fed back).  ``engine`` is what vLLM and SGLang run: last-token logits, a
  paged cache of P + G − 1 positions in blocks of ``BLOCK_SIZE``, a fused causal kernel that computes
  only the attended pairs (the causal triangle, a windowed layer's band: ``flops.attended_pairs``),
  and MLA absorbed at decode (below).
* **Absorbed MLA** (engine decode; DeepSeek-V2 §2.1.2 "we can absorb W^UK into W^Q, and W^UV into
  W^O"; vLLM ``MLACommonImpl``, FlashMLA): the query's no-RoPE part is mapped into the latent space
  (q_nope · W^UK, 2·h·d_nope·r per token), each head scores the cached latent and RoPE key (QKᵀ:
  2·h·(r + d_rope) per key), takes the probabilities over the latent (AV: 2·h·r per key), and maps
  the result out (· W^UV, 2·h·r·d_v per token).  The two per-token products are exactly
  ``kv_b_proj``'s FLOPs on one token, 2·r·h·(d_nope + d_v), so the ``kv_b_proj`` row is its S = 1
  figure; nothing grows with the keys but the two attention rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..breakdown import Breakdown, Item
from ..config import AccountingError, ModelConfig
from ..names import DTYPE_BYTES
from .flops import (
    attended_pairs,
    causal_attention_flops,
    causal_conv_flops,
    conv_update_flops,
    forward_flops,
    mamba_conv_flops,
    mamba_conv_update_flops,
    short_conv_flops,
    short_conv_update_flops,
    ssd_step_flops,
    ssm_conv_flops,
    ssm_conv_update_flops,
    windowed_attention_flops,
)
from .memory import kv_cache_bytes
from .params import parameter_breakdown
from .sizes import Sizes

SEMANTICS = ("filled", "static")
WEIGHT_BYTES = {"fp32": (4, 1), "bf16": (2, 1), "fp8": (1, 1), "int8": (1, 1), "int4": (1, 2)}
"""Weight storage: bytes per parameter as a fraction (num, den); int4 = 1/2 byte (two weights a byte),
plus its group scales and zero-points (``WeightFormat``)."""
QUANTIZED = ("fp8", "int8", "int4")
COMPUTE = {"fp32": ("fp32",), "bf16": ("bf16",), "fp8": ("fp8", "bf16"), "int8": ("int8", "bf16"), "int4": ("bf16",)}
"""The matmul dtypes each storage runs at: fp8 and int8 checkpoints as w8a8 (the GPU's FP8 or INT8 peak: vLLM's
``Fp8LinearMethod`` and compressed-tensors W8A8 quantise the activations on the fly) or weight-only (bf16
compute, e.g. Marlin on a GPU without FP8); int4 (GPTQ/AWQ) is weight-only.  The first is the default."""


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its weights.  ``dtype`` (``WEIGHT_BYTES``): the block matrices' storage.
    Quantised (``QUANTIZED``), the embedding table, the LM head, the norms, the biases and MoE routers stay
    bf16 unless ``embeddings`` (AWQ/GPTQ/FP8 checkpoints keep them 16-bit: AutoAWQ's ``modules_to_not_convert``
    and llm-compressor's ``ignore=["lm_head"]``); fp32 and bf16 keep every tensor in their dtype.  int4 adds,
    per ``group`` weights of a matrix, an fp16 scale and a packed int4 zero-point (GPTQ/AWQ's ``scales`` and
    ``qzeros``): 2.5 bytes a group.  fp8 and int8 per-tensor or per-channel scales are not counted."""

    dtype: str = "bf16"
    group: int = 128
    embeddings: bool = False

    def tensor_bytes(self, n: int, key: str, group: str) -> int:
        """Bytes of one tensor of ``n`` elements (``key``, ``group``: the registry's)."""
        matrix = group in ("attention projections", "ffn") and not key.endswith(".bias") and "router" not in key
        quantized = self.dtype in QUANTIZED and (matrix or (self.embeddings and group in ("embedding", "lm head")))
        if not quantized:
            num, den = WEIGHT_BYTES["bf16" if self.dtype in QUANTIZED else self.dtype]
            return -(-n * num // den)
        if self.dtype != "int4":
            return n
        groups = -(-n // self.group)
        return -(-n // 2) + 2 * groups + -(-groups // 2)  # packed weights, fp16 scales, packed int4 zeros


def weight_format(weights: str | WeightFormat) -> WeightFormat:
    return weights if isinstance(weights, WeightFormat) else WeightFormat(weights)


KV_DTYPES = {"fp32": "fp32", "bf16": "bf16", "fp8": "int8"}
"""KV-cache dtypes -> the storage type ``kv_cache_bytes`` prices them as (fp8 e4m3/e5m2: 1 byte, as int8)."""
ATTENTION = "attention matmuls"
HEAD = "lm head"
PROGRAMS = ("engine", "generate", "forward")
"""``engine``: a serving engine's program (vLLM, SGLang); ``generate``: transformers' ``generate()``;
``forward``: the full forward at every prompt position (module docstring)."""
BLOCK_SIZE = 16
"""Tokens per KV-cache block of the engine program: vLLM's default ``--block-size`` (``CacheConfig``)."""


def check_program(program: str) -> None:
    if program not in PROGRAMS:
        raise AccountingError(f"unknown program '{program}' (valid: {', '.join(PROGRAMS)})")


def cache_positions(program: str, prompt: int, generate: int) -> int:
    """Positions a sequence's cache holds at the end: P + G under ``forward`` (our static cache), else
    P + G − 1 (the last generated token is sampled, never fed back)."""
    return prompt + generate - (program != "forward")


def engine_blocks(tokens: int, block: int = BLOCK_SIZE) -> int:
    """Blocks of a paged cache holding ``tokens`` positions of one sequence: ⌈tokens / block⌉."""
    return -(-tokens // block)


MLA_BLOCKS = {"h100": 64, "h200": 64, "gh200": 64, "b200": 128, "b100": 128, "gb200": 128}
"""MLA's block size by GPU generation (vLLM ``platforms/cuda.py``): FlashMLA on Hopper forces 64 ("Forcing kv
cache block size to 64 for FlashMLA backend"), CUTLASS MLA on Blackwell 128; other GPUs keep 16."""


def engine_block(cfg: ModelConfig, gpu: str = "h100-80gb") -> int:
    """Tokens per block of the engine's cache: ``BLOCK_SIZE``; under MLA, ``MLA_BLOCKS`` by the GPU's family."""
    if not cfg.mla:
        return BLOCK_SIZE
    return next((size for family, size in MLA_BLOCKS.items() if gpu.startswith(family)), BLOCK_SIZE)


def cache_slots(program: str, prompt: int, generate: int, block: int = BLOCK_SIZE) -> int:
    """Positions allocated per sequence: ``cache_positions``, the engine's rounded up to whole blocks."""
    held = cache_positions(program, prompt, generate)
    return engine_blocks(held, block) * block if program == "engine" else held


def check_semantics(semantics: str) -> None:
    if semantics not in SEMANTICS:
        raise AccountingError(f"unknown cache semantics '{semantics}' (valid: {', '.join(SEMANTICS)})")


def check_lengths(cfg: ModelConfig, prompt: int, generate: int) -> None:
    """P + G must fit the model's context (every program's request is P + G tokens).  The message says what
    does run: a RoPE model is analysed at any context (``--context P+G``); a model with learned positions
    runs at most ``max_positions`` positions, so ``--context`` helps only up to its table."""
    need = prompt + generate
    if need <= cfg.context_length:
        return
    head = f"prompt {prompt:,} + generate {generate:,} = {need:,} tokens exceeds {cfg.name}'s context of {cfg.context_length:,} tokens"
    if cfg.positions != "learned":
        raise AccountingError(f"{head}; to analyse the longer context, add --context {need}")
    rows = cfg.max_positions
    if need <= rows:  # the context was set below the position table
        raise AccountingError(
            f"{head}; its {rows:,} learned positions allow a context up to {rows:,}: add --context {need}"
        )
    fits = [
        f"--prompt {p} --generate {g}" for p, g in ((rows - generate, generate), (prompt, rows - prompt)) if p > 0 < g
    ]
    fits = fits or [f"--prompt {rows - rows // 2} --generate {rows // 2}"]
    extra = (need - rows) * cfg.d_model
    raise AccountingError(
        f"{head}: it has {rows:,} learned positions (max_position_embeddings), and no --context can go past "
        f"that table, so prompt + generate must be at most {rows:,} (e.g. {' or '.join(dict.fromkeys(fits))}); "
        f"a variant with a longer table is a different model ({extra:,} more parameters): "
        f"--set max_position_embeddings={need} --context {need}"
    )


ATTENTIONS = ("naive", "sdpa")
"""``naive``: the course's attention, the (B, h, S, keys) scores and probabilities materialised; ``sdpa``:
a fused kernel (flash / memory-efficient), which keeps only its output and the fp32 logsumexp
(``setup.ATTENTIONS``).  The matmul FLOPs are the same (the full square; ``attention_flops``)."""


def default_attention(semantics: str) -> str:
    """``sdpa`` (what a serving engine runs), except under 'static' semantics, which model transformers'
    ``StaticCache`` with eager attention (a mask over every slot): ``naive``."""
    return "naive" if semantics == "static" else "sdpa"


def default_program(semantics: str, attention: str) -> str:
    """``engine`` (what serves a model), except when the static cache or naive attention is asked for:
    those name transformers' code, so its ``generate``."""
    return "generate" if semantics == "static" or attention == "naive" else "engine"


def check_attention(attention: str, semantics: str) -> None:
    if attention not in ATTENTIONS:
        raise AccountingError(f"unknown attention '{attention}' (valid: {', '.join(ATTENTIONS)})")
    if attention == "sdpa" and semantics == "static":
        raise AccountingError(
            "--cache static models transformers' StaticCache with eager attention (every slot, masked): "
            "use --attention naive with it, or --cache filled with --attention sdpa"
        )


LATENT_EXPANSION = "layers.*.attn.kv_b_proj"
"""Latent attention (MLA) caches the normed latent and the rotated RoPE key (transformers v5); each step
expands keys and values from every cached position with ``kv_b_proj``, so its FLOPs grow with the keys."""


def check_supported(cfg: ModelConfig) -> None:
    """Every architecture the registry describes is supported (MLA in transformers v5's cache form), except Llama 4's
    chunked attention (``attention_chunk``): what transformers' cache keeps on a chunked layer and which keys a
    decode step sees there are not modelled, so ``infer`` refuses it in one line."""
    if cfg.attention_chunk is not None:
        raise AccountingError(
            f"{cfg.name}: infer does not model Llama 4's chunked attention yet (the chunked layers' cache and decode "
            "keys); account gives its parameters and FLOPs, memory its model states"
        )


def kv_split(cfg: ModelConfig, tp: int) -> int:
    """Ranks the KV cache is split over: tp (KV heads split), or 1 for MLA (the latent is replicated)."""
    return 1 if cfg.mla else tp


def layer_slots(cfg: ModelConfig, capacity: int) -> list[int]:
    """Cache slots per layer: C on a full-attention layer, min(C, w) on a windowed one, none on a hybrid's Gated
    DeltaNet layer (its state does not grow: ``kv_cache.linear_state_bytes``)."""
    w = cfg.sliding_window
    return [
        0 if not cfg.layer_attention(i) else min(capacity, w) if cfg.layer_windowed(i) else capacity
        for i in range(cfg.num_layers)
    ]


def kv_layer_token_bytes(cfg: ModelConfig, batch: int, dtype: str) -> int:
    """K and V of one cached position on one attention layer, B sequences: ``kv_cache_width · B · bytes`` (what
    grows with the keys; a hybrid's fixed linear-layer states are not part of it)."""
    if dtype not in KV_DTYPES:
        raise AccountingError(f"unknown KV-cache dtype '{dtype}' (valid: {', '.join(KV_DTYPES)})")
    return cfg.cached_width * batch * DTYPE_BYTES[KV_DTYPES[dtype]]  # DSA: the indexer's key too


def absorbed(cfg: ModelConfig, program: str) -> bool:
    """Whether decode runs MLA in the absorbed form (the engine program; module docstring)."""
    return cfg.mla and program == "engine"


def attention_per_key(cfg: ModelConfig, batch: int, program: str = "forward") -> list[tuple[str, str, int, bool]]:
    """(key, label, c, per_query) per component whose FLOPs grow with the keys attended: the attention
    matmuls, c = FLOPs of one query against one key per layer (the formulas are c·S²: checked at S = 2),
    and under MLA ``kv_b_proj``, c = FLOPs of expanding one cached position (linear in S), read from the
    registry at S = 1.  Absorbed MLA (``absorbed``): QKᵀ c = 2·B·h·(r + d_rope), AV c = 2·B·h·r, over
    the latent; ``kv_b_proj`` does not grow (module docstring)."""
    from ..components import breakdown

    one, two = breakdown("flops", Sizes.of(cfg, 1, batch)), breakdown("flops", Sizes.of(cfg, 2, batch))
    latent = {
        "layers.*.attn.qk": 2 * batch * cfg.num_heads * (cfg.kv_lora_rank + cfg.qk_rope_head_dim),
        "layers.*.attn.av": 2 * batch * cfg.num_heads * cfg.kv_lora_rank,
    } if absorbed(cfg, program) else {}  # fmt: skip
    out = []
    for it in one:
        if it.group == ATTENTION or (cfg.mla and it.key == LATENT_EXPANSION and not latent):
            power = 4 if it.group == ATTENTION else 2
            if two[it.key].per_layer != power * it.per_layer:
                raise AccountingError(f"{it.key}: not c·S^{power // 2}; decode FLOPs cannot be derived from it")
            out.append((it.key, it.label, latent.get(it.key, it.per_layer), it.group == ATTENTION))
    return out


def _with_attention(
    base: Breakdown, cfg: ModelConfig, batch: int, keys: list[int], queries: int, text: str, program: str = "forward"
) -> Breakdown:
    """``base`` with each attention matmul replaced by Σ_layers c·queries·keys[layer] (MLA's kv_b_proj:
    Σ_layers c·keys[layer], the cached positions it expands)."""
    per = {key: (c, q) for key, _, c, q in attention_per_key(cfg, batch, program)}
    uniform = len(set(keys)) == 1
    items = []
    for it in base:
        if it.key in per:
            c, per_query = per[it.key]
            c = c * queries if per_query else c
            total = c * sum(keys)
            per_layer = c * keys[0] if uniform else None
            items.append(Item(it.key, it.label, it.group, total, per_layer, text))
        else:
            items.append(it)
    return Breakdown(base.quantity, base.unit, tuple(items))


def _last_token_head(base: Breakdown, cfg: ModelConfig, batch: int) -> Breakdown:
    """``base`` with the LM head on B rows, the last position of each sequence (``logits_to_keep = 1``)."""
    head = {it.key: it for it in forward_flops(cfg, 1, batch) if it.group == HEAD}
    text = "last position only: 2·B·d·V"
    items = [Item(it.key, it.label, it.group, head[it.key].total, None, text) if it.key in head else it for it in base]
    return Breakdown(base.quantity, base.unit, tuple(items))


def prefill_pairs(cfg: ModelConfig, prompt: int) -> list[int]:
    """Query-key pairs a causal fused kernel computes per layer in the prefill: the causal triangle
    P(P + 1)/2, a windowed layer's band (``flops.attended_pairs``)."""
    w = cfg.sliding_window
    return [
        attended_pairs(prompt, w if cfg.layer_windowed(i) else None) if cfg.layer_attention(i) else 0
        for i in range(cfg.num_layers)
    ]


def prefill_flops(
    cfg: ModelConfig, prompt: int, batch: int, capacity: int, semantics: str = "filled", program: str = "forward"
) -> Breakdown:
    """Matmul FLOPs of the prefill, per component (forward, filled: the forward at S = P).  ``generate``
    and ``engine`` run the head on the last position only; ``engine``'s attention rows count the pairs
    a causal kernel computes (``prefill_pairs``), not the square."""
    check_semantics(semantics)
    check_program(program)
    base = _short_prompt_conv(forward_flops(cfg, prompt, batch), cfg, prompt, batch)
    if program != "forward":
        base = _last_token_head(base, cfg, batch)
    if program == "engine":  # the attention rows only (MLA's kv_b_proj expands the P new tokens, as in forward)
        per = {key: c for key, _, c, per_query in attention_per_key(cfg, batch) if per_query}
        pairs = prefill_pairs(cfg, prompt)
        text = "causal kernel: c·Σ pairs attended (P(P+1)/2; a window's band)"
        uniform = len(set(pairs)) == 1
        items = [
            Item(
                it.key, it.label, it.group, per[it.key] * sum(pairs), per[it.key] * pairs[0] if uniform else None, text
            )
            if it.key in per
            else it
            for it in base
        ]
        return Breakdown(base.quantity, base.unit, tuple(items))
    if semantics == "filled":
        return base
    keys = [max(n, prompt) if cfg.layer_attention(i) else 0 for i, n in enumerate(layer_slots(cfg, capacity))]
    return _with_attention(base, cfg, batch, keys, prompt, "static: 2·B·h·P·C·d_head per layer")


def prefill_extras(cfg: ModelConfig, prompt: int, batch: int) -> dict[str, int | None]:
    """The labelled alternatives to the full square: causal half, sliding-window band (None: no window)."""
    return {
        "attention_full_square": sum(it.total for it in forward_flops(cfg, prompt, batch) if it.group == ATTENTION),
        "attention_causal_half": causal_attention_flops(cfg, prompt, batch),
        "attention_windowed_band": None if cfg.sliding_window is None else windowed_attention_flops(cfg, prompt, batch),
    }


def decode_keys(cfg: ModelConfig, position: int, capacity: int, semantics: str = "filled") -> list[int]:
    """Keys each layer's attention reads at a decode step at ``position``."""
    slots = layer_slots(cfg, capacity)
    if semantics == "static":
        return slots
    return [min(position + 1, n) for n in slots]


def decode_flops(
    cfg: ModelConfig, position: int, batch: int, capacity: int, semantics: str = "filled", program: str = "forward"
) -> Breakdown:
    """Matmul FLOPs of one decode step (B tokens) at ``position``, per component (``engine`` with MLA:
    absorbed, module docstring)."""
    check_semantics(semantics)
    check_program(program)
    from ..components import breakdown

    base = breakdown("flops", Sizes.of(cfg, 1, batch))
    text = "2·B·h·n·d_head per layer, n = " + ("C slots" if semantics == "static" else "p + 1 keys")
    if absorbed(cfg, program):
        text = "absorbed MLA: 2·B·h·(2r + d_rope)·n per layer, n = p + 1 latent keys"
    keys = decode_keys(cfg, position, capacity, semantics)
    return _recurrent_decode(_with_attention(base, cfg, batch, keys, 1, text, program), cfg, batch)


def _short_prompt_conv(base: Breakdown, cfg: ModelConfig, prompt: int, batch: int) -> Breakdown:
    """A hybrid's prefill of fewer than K tokens: transformers' cache pads the conv's input on the left to K
    (``LinearAttentionLayer.update_conv_state``) before ``causal_conv1d_fn``, so the conv runs on max(P, K) inputs,
    ``flops.causal_conv_flops`` at S = K."""
    rows = {}
    if cfg.hybrid and prompt < cfg.linear_conv_kernel:
        per = causal_conv_flops(cfg, batch, cfg.linear_conv_kernel)
        text = "cache-padded to K inputs: 2·B·(2·H_k·d_k + H_v·d_v)·(2K−1)·K"
        rows["layers.*.linear_attn.conv1d"] = (cfg.linear_layers, per, text)
    if cfg.mamba_layers and prompt < cfg.mamba_conv_kernel:  # Mamba2's conv: the same padding by the cache
        per = mamba_conv_flops(cfg, batch, cfg.mamba_conv_kernel)
        rows["layers.*.mamba.conv1d"] = (cfg.mamba_layers, per, "cache-padded to K inputs: 2·B·(H·P + 2·G·N)·(2K−1)·K")
    if cfg.short_conv_layers and prompt < cfg.short_conv_kernel:  # LFM2's conv: the same padding by the cache
        per = short_conv_flops(cfg, batch, cfg.short_conv_kernel)
        rows["layers.*.conv.conv1d"] = (cfg.short_conv_layers, per, "cache-padded to K inputs: 2·B·d·(2K−1)·K")
    if cfg.ssm_layers and prompt < cfg.ssm_conv_kernel:  # Mamba's conv: the same padding by the cache
        per = ssm_conv_flops(cfg, batch, cfg.ssm_conv_kernel)
        rows["layers.*.ssm.conv1d"] = (cfg.ssm_layers, per, "cache-padded to K inputs: 2·B·E·(2K−1)·K")
    if not rows:
        return base
    items = [
        Item(it.key, it.label, it.group, rows[it.key][0] * rows[it.key][1], rows[it.key][1], rows[it.key][2])
        if it.key in rows
        else it
        for it in base
    ]
    return Breakdown(base.quantity, base.unit, tuple(items))


def _recurrent_decode(base: Breakdown, cfg: ModelConfig, batch: int) -> Breakdown:
    """A hybrid's decode step as transformers runs it with a cache: the gated delta rule in its recurrent form
    (``torch_recurrent_gated_delta_rule``: elementwise products and sums over each value head's d_k x d_v state,
    7 per state element — decay, read k, update, read q — and no matmul; FlopCounterMode counts 0) and the conv
    updated from its cached inputs (``flops.conv_update_flops``), not the chunked prefill path."""
    rows = {}
    if cfg.hybrid:
        rows["layers.*.linear_attn.core"] = (
            cfg.linear_layers,
            0,
            "recurrent form: no matmul (7·B·H_v·d_k·d_v elementwise)",
        )
        text = "conv update: 2·B·(2·H_k·d_k + H_v·d_v)·2·K"
        rows["layers.*.linear_attn.conv1d"] = (cfg.linear_layers, conv_update_flops(cfg, batch), text)
    if cfg.mamba_layers:  # Mamba2: mamba2_selective_state_update reads the state out by C with one bmm
        rows["layers.*.mamba.core"] = (cfg.mamba_layers, ssd_step_flops(cfg, batch), "state update: 2·B·H·P·N")
        text = "conv update: 2·B·(H·P + 2·G·N)·2·K"
        rows["layers.*.mamba.conv1d"] = (cfg.mamba_layers, mamba_conv_update_flops(cfg, batch), text)
    if cfg.short_conv_layers:  # LFM2: causal_conv1d_update over the K cached inputs and the new one
        rows["layers.*.conv.conv1d"] = (
            cfg.short_conv_layers,
            short_conv_update_flops(cfg, batch),
            "conv update: 2·B·d·2·K",
        )
    if cfg.ssm_layers:  # Mamba: mamba_selective_state_update's read-out is the scan's at S = 1; the conv is updated
        rows["layers.*.ssm.conv1d"] = (cfg.ssm_layers, ssm_conv_update_flops(cfg, batch), "conv update: 2·B·E·2·K")
    if not rows:
        return base
    items = [
        Item(it.key, it.label, it.group, rows[it.key][0] * rows[it.key][1], rows[it.key][1], rows[it.key][2])
        if it.key in rows
        else it
        for it in base
    ]
    return Breakdown(base.quantity, base.unit, tuple(items))


def sum_min(lo: int, hi: int, cap: int | None) -> int:
    """Σ_{k=lo}^{hi} min(k, cap) in closed form (cap None: no cap); 0 for an empty range."""
    if hi < lo:
        return 0

    def tri(a: int, b: int) -> int:  # Σ_{k=a}^{b} k
        return (a + b) * (b - a + 1) // 2 if b >= a else 0

    if cap is None or hi <= cap:
        return tri(lo, hi)
    if lo > cap:
        return cap * (hi - lo + 1)
    return tri(lo, cap) + cap * (hi - cap)


def generation_flops(
    cfg: ModelConfig, prompt: int, generate: int, batch: int, semantics: str = "filled", program: str = "forward"
) -> int:
    """Matmul FLOPs of the G − 1 decode steps, in closed form: (G − 1)·(non-attention per step) +
    Σ_layers c·Σ_{p=P}^{P+G−2} n_layer(p) (filled: n = min(p + 1, w); static: n = slots)."""
    steps, capacity = generate - 1, cache_positions(program, prompt, generate)
    if steps <= 0:
        return 0
    step = decode_flops(cfg, prompt, batch, capacity, semantics, program)
    grows = attention_per_key(cfg, batch, program)
    other = sum(it.total for it in step if it.key not in {key for key, *_ in grows})
    c = sum(c for _, _, c, _ in grows)
    if semantics == "static":
        keys = sum(layer_slots(cfg, capacity)) * steps
    else:
        keys = sum(sum_min(prompt + 1, prompt + generate - 1, n) for n in layer_slots(cfg, capacity))
    return other * steps + c * keys


# -- memory ------------------------------------------------------------------------


def _replicated(key: str, group: str) -> bool:
    """Tensor parallelism keeps a full copy of norm gains, row-parallel biases, the router and MLA's down
    projections (``q_a_proj``, ``kv_a_proj``: replicated linears, as vLLM shards DeepSeek) on every rank."""
    return (
        group == "norms"
        or key.endswith(("output_proj.bias", "w2.bias", "proj.bias", "attn.q_a_proj", "attn.kv_a_proj"))
        or "router" in key
    )


def weights_bytes(cfg: ModelConfig, dtype: str | WeightFormat, tp: int = 1, only: str | None = None) -> int:
    """Bytes of the weights on one rank: every parameter as ``dtype`` stores it (``WeightFormat``), matrices
    and embeddings split over ``tp`` ranks (rounded up per tensor: the worst rank), norms and row-parallel
    biases replicated.  ``only``: the tensors of that registry group alone (e.g. "embedding")."""
    fmt = weight_format(dtype)
    if fmt.dtype not in WEIGHT_BYTES:
        raise AccountingError(f"unknown weight dtype '{fmt.dtype}' (valid: {', '.join(WEIGHT_BYTES)})")
    total = 0
    for it in parameter_breakdown(cfg):
        if only is not None and it.group != only:
            continue
        per = it.total if not it.per_layer else it.per_layer
        count = it.total // per if per else 0  # layers holding it (a subset for MoE components)
        shard = per if _replicated(it.key, it.group) else -(-per // tp)
        total += count * fmt.tensor_bytes(shard, it.key, it.group)
    return total


def kv_bytes(cfg: ModelConfig, tokens: int, batch: int, dtype: str, tp: int = 1) -> int:
    """KV cache on one rank: ``kv_cache_bytes`` at ``tokens`` positions in ``dtype`` / tp (KV heads split;
    an MLA latent cache is replicated on every rank)."""
    if dtype not in KV_DTYPES:
        raise AccountingError(f"unknown KV-cache dtype '{dtype}' (valid: {', '.join(KV_DTYPES)})")
    return kv_cache_bytes(cfg, tokens, batch, KV_DTYPES[dtype]) // kv_split(cfg, tp)


TP_LISTED = 64
"""A refusal lists the valid ``--tp`` degrees up to this many (a bound on the work: never one trial per head)."""


def _valid_tp(heads: int) -> str:
    """The degrees that divide ``heads``, up to ``TP_LISTED`` (at most 64 trials, whatever the head count)."""
    valid = [str(t) for t in range(1, min(heads, TP_LISTED) + 1) if heads % t == 0]
    return ", ".join(valid) + (f"; none above {TP_LISTED} listed" if heads > TP_LISTED else "")


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Tensor parallelism splits heads: the KV heads (and query heads) must divide evenly."""
    if cfg.mla and cfg.num_heads % tp:  # latent attention: the heads split, the latent is replicated
        raise AccountingError(
            f"--tp {tp} does not divide the {cfg.num_heads} attention heads of {cfg.name} "
            f"(valid: {_valid_tp(cfg.num_heads)})"
        )
    if not cfg.mla and (cfg.kv_heads % tp or cfg.num_heads % tp):
        raise AccountingError(
            f"--tp {tp} does not divide the {cfg.kv_heads} KV heads"
            + ("" if cfg.num_heads % tp == 0 else f" and {cfg.num_heads} query heads")
            + f" of {cfg.name} (valid: {_valid_tp(math.gcd(cfg.kv_heads, cfg.num_heads))})"
        )
