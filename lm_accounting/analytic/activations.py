"""What autograd keeps alive after the forward pass of *our* live model, per component and setup.

Derived from the ops in ``lm_accounting.model`` and the tensors torch 2.13's autograd formulas
save (``tools/autograd/derivatives.yaml``), for every ``TrainingSetup`` (``z.setup``).  The total
equals the live bytes after the forward pass minus the step's baseline, byte for byte, for every
setup (checked against the storage tracker in ``tests/test_memory_exact.py`` and
``tests/test_memory_setups.py``).  The components and their order are ``components.REGISTRY``; the
formulas are below, one per component.

Notation: T = B·S tokens; e = bytes per element of the parameters (4 for fp32 and amp-bf16, 2 for
bf16); h = bytes of a matmul's output (2 under amp-bf16, else e); RMSNorm computes in fp32 (4
bytes); n_W = the elements of weight W.  Per setup:

1. checkpoint ``none``: each op's saved tensors (below, per component);
2. ``full`` (``torch.utils.checkpoint``, non-reentrant): only each block's input, T·d·e, is kept
   (plus the int64 positions, 8·S, and, naive, the mask, S², that the recompute closures hold);
3. ``selective``: the block input plus the SAC cache (``_CachingTorchDispatchMode``): the outputs
   of every mm (q, k, v, output projection, w1, w3, w2: T·width·h each), of the QKᵀ and AV bmms
   (naive: B·h·S²·h and T·h·d_head·h) or of the fused kernel (output T·h·d_head·h and logsumexp
   B·h·S·4);
4. ``amp-bf16``: each matmul keeps autocast's bf16 copies of its operands (the weight, n_W·2, and an
   fp32 input, T·width·2) instead of the fp32 input; the residual stream and ln1/ln2 stay fp32.
"""

from __future__ import annotations

import dataclasses

from ..breakdown import Breakdown
from ..config import ModelConfig
from ..setup import TrainingSetup
from .params import parameter_breakdown
from .sizes import Sizes

FP32 = 4  # RMSNorm computes in float32 whatever the model dtype (model/layers.py RMSNorm)


def _ck(z: Sizes) -> str:
    return z.setup.checkpoint


def _h(z: Sizes) -> int:
    """Bytes per element of a matmul output: bf16 under amp-bf16, else the model dtype."""
    return 2 if z.amp else z.e


def _hact(z: Sizes, width: int) -> int:
    return z.T * width * _h(z)


def _weight_copy(z: Sizes, key: str) -> int:
    """amp-bf16 only: autocast's bf16 copy of a matmul's weight, saved by mm (n_W·2)."""
    if not z.amp:
        return 0
    return (
        parameter_breakdown(z.cfg)[key].per_layer * 2
        if key.startswith("layers.")
        else (parameter_breakdown(z.cfg)["token_embeddings"].total * 2)
    )


def norm_saved_bytes(z: Sizes, rows: int, width: int, xe: int | None = None) -> int:
    """RMSNorm keeps rsqrt (rows·4) and y = x·rsqrt (rows·width·4); a 16-bit input (``xe`` = 2)
    also keeps its fp32 copy (rows·width·4), and 16-bit parameters the fp32 copy of the gain (width·4)."""
    xe = z.e if xe is None else xe
    kept = rows * FP32 + rows * width * FP32
    if xe != FP32:
        kept += rows * width * FP32
    if z.e != FP32:
        kept += width * FP32
    return kept


def positions_saved_bytes(z: Sizes) -> int:
    """The int64 token positions (8·S): kept only by a checkpoint's recompute closures."""
    return 8 * z.seq if _ck(z) != "none" else 0


def mask_saved_bytes(z: Sizes) -> int:
    """The shared boolean causal mask, S² (naive attention only; the fused kernel is causal by itself)."""
    return 0 if z.sdpa else z.seq * z.seq


def residual_saved_bytes(z: Sizes) -> int:
    """none: the block's input and middle residual stream, kept by ln1 and ln2 in fp32 (2·T·d·4;
    fp32 and amp-bf16; a parallel block has no middle stream: T·d·4, the input kept by ln1 (and ln2: the same
    tensor under RMSNorm; LayerNorm keeps its centred input, one per norm, so two norms keep 2·T·d·4)); 16-bit: 0 (the norms keep fp32 copies instead, counted under them).
    full and selective: the block's input, kept by the checkpoint (T·d·e)."""
    if _ck(z) != "none":
        return z.act(z.cfg.d_model)
    streams = (
        1
        if z.cfg.parallel_block == "one_norm" or (z.cfg.parallel_block == "two_norms" and z.cfg.norm == "rmsnorm")
        else 2
    )
    return streams * z.act(z.cfg.d_model) if z.e == FP32 else 0


def block_norm_saved_bytes(z: Sizes) -> int:
    """ln1 or ln2 (none): the norm's own tensors plus its output, kept by the projections it feeds
    (T·4 + T·d·4 + T·d·e [+ T·d·4 + d·4 at 16-bit]); amp-bf16: no output (the projections keep bf16
    copies); checkpointed: 0."""
    if _ck(z) != "none":
        return 0
    own = norm_saved_bytes(z, z.T, z.cfg.d_model)
    return own if z.amp else own + z.act(z.cfg.d_model)


def final_norm_saved_bytes(z: Sizes) -> int:
    """ln_final (never checkpointed): as a block norm under ``none``, plus its fp32 input, the last
    residual stream (fp32 and amp-bf16)."""
    own = norm_saved_bytes(z, z.T, z.cfg.d_model)
    if not z.amp:
        own += z.act(z.cfg.d_model)
    return own + (z.act(z.cfg.d_model) if z.e == FP32 else 0)


def projection_saved_bytes(z: Sizes, key: str, width: int, input_copy: bool = True) -> int:
    """A block matmul: amp-bf16 (none) keeps the bf16 weight copy and the bf16 input copy
    (n_W·2 + T·d_in·2); selective keeps its output in the SAC cache (T·width·h); else 0."""
    if _ck(z) == "selective":
        return _hact(z, width)
    if _ck(z) == "full" or not z.amp:
        return 0
    return _weight_copy(z, key) + (z.T * z.cfg.d_model * 2 if input_copy else 0)


def output_proj_saved_bytes(z: Sizes) -> int:
    """none: the merged heads (T·h·d_head·h; none of its own where they are a view of the fused
    kernel's output: CUDA's memory-efficient kernel, ``Sizes.merge_copy``) [+ amp: the weight copy];
    selective: the output, T·d·h."""
    if _ck(z) == "selective":
        return _hact(z, z.cfg.d_model)
    if _ck(z) == "full":
        return 0
    return _hact(z, z.cfg.q_dim) * z.merge_copy + _weight_copy(z, "layers.*.attn.output_proj")


def qk_norm_saved_bytes(z: Sizes, heads: int) -> int:
    """Per-head RMSNorm on Q or K (none): as RMSNorm over T·heads rows of d_head (its input is a
    matmul output: 16-bit at bf16 and amp-bf16), plus (fp32) its input; checkpointed: 0.  A gain per head
    (``qk_norm_scope = head_weights``) is heads·d_head wide: its fp32 copy at 16-bit is too (the rest is the
    same; the LayerNorm kind keeps as much, tests/test_arch_parallel_block.py)."""
    if _ck(z) != "none":
        return 0
    width = z.act(heads * z.cfg.d_head)
    xe = 2 if z.amp else z.e
    gains = (heads - 1) * z.cfg.d_head * FP32 if z.cfg.qk_norm_scope == "head_weights" and z.e != FP32 else 0
    return norm_saved_bytes(z, z.T * heads, z.cfg.d_head, xe) + (width if z.e == FP32 and not z.amp else 0) + gains


def rope_saved_bytes(z: Sizes) -> int:
    """none: rotated Q and K (kept by QKᵀ or the fused kernel; under amp-bf16 with q/k/v biases their bf16
    copies), T·(h+kv)·d_head·h, and the gathered cos and sin rows of both rotations, 4·S·(d_head/2)·r in
    RoPE's dtype r (``_rope_bytes``); checkpointed: 0."""
    if _ck(z) != "none":
        return 0
    rotary = z.cfg.rope_dim if z.cfg.partial_rotary else z.cfg.d_head  # partial rotary: rows of rotary_dim/2
    return _hact(z, z.cfg.q_dim) + _hact(z, z.cfg.kv_dim) + 4 * z.seq * (rotary // 2) * _rope_bytes(z)


def _rope_bytes(z: Sizes) -> int:
    """Bytes per element RoPE runs in: the matmul outputs' (``_h``), but 4 under amp-bf16 with q/k/v biases,
    where the fp32 bias promotes q and k to fp32 (``analytic.replay._amp_attention_sizes``)."""
    return 4 if z.amp and z.cfg.qkv_bias else _h(z)


def qk_saved_bytes(z: Sizes) -> int:
    """selective, naive: the raw scores QKᵀ in the SAC cache, B·h·S²·h; else 0."""
    return z.score_count * _h(z) if (_ck(z) == "selective" and not z.sdpa) else 0


def softmax_saved_bytes(z: Sizes) -> int:
    """none, naive: exp(z) and its row sums (kept by the division), B·h·S²·x + B·h·S·x with x = e
    (4 under amp-bf16: exp is on CUDA's fp32 list); else 0."""
    if _ck(z) != "none" or z.sdpa:
        return 0
    return z.score_count * z.e + z.batch * z.cfg.num_heads * z.seq * z.e


def av_saved_bytes(z: Sizes) -> int:
    """none, naive: the probabilities (bf16 copy under amp-bf16) and a contiguous V, B·h·S²·h +
    T·kv·d_head·h; selective, naive: the AV output in the SAC cache, T·h·d_head·h; else 0."""
    if z.sdpa or _ck(z) == "full":
        return 0
    if _ck(z) == "selective":
        return _hact(z, z.cfg.q_dim)
    return z.score_count * _h(z) + _hact(z, z.cfg.kv_dim)


def sdpa_saved_bytes(z: Sizes) -> int:
    """The fused kernel (sdpa): none: its output, logsumexp and V (v_proj's output),
    T·h·d_head·h + B·h·S·4 + T·kv·d_head·h (Q and K are counted under RoPE); selective: output and
    logsumexp in the SAC cache; else 0."""
    if not z.sdpa or _ck(z) == "full":
        return 0
    kept = _hact(z, z.cfg.q_dim) + z.lse
    return kept + (_hact(z, z.cfg.kv_dim) if _ck(z) == "none" else 0)


def ffn_saved_bytes(z: Sizes, part: str) -> int:
    """SwiGLU (none): w1's and w3's outputs (T·d_ff·h each; amp: + their weight and input copies),
    the sigmoid and SiLU outputs (2·T·d_ff·h), the gated product (T·d_ff·h; amp: + w2's weight copy
    under ``w2``); selective: the w1, w3 and w2 outputs (T·d_ff·h, T·d_ff·h, T·d·h); full: 0."""
    ck = _ck(z)
    if ck == "full":
        return 0
    if ck == "selective":
        return {"w1": _hact(z, z.cfg.d_ff), "w3": _hact(z, z.cfg.d_ff), "w2": _hact(z, z.cfg.d_model)}.get(part, 0)
    out = {
        "w1": _hact(z, z.cfg.d_ff),
        "w3": _hact(z, z.cfg.d_ff),
        "silu": 2 * _hact(z, z.cfg.d_ff),
        "gate": _hact(z, z.cfg.d_ff),
        "w2": 0,
    }[part]
    if part in ("w1", "w3"):
        out += projection_saved_bytes(z, f"layers.*.ffn.{part}", z.cfg.d_ff)
    if part == "w2":
        out += _weight_copy(z, "layers.*.ffn.w2")
    return out


def _moe_rows(z: Sizes) -> int:
    """T·k: the routed slot rows of a mixture-of-experts layer (every token's k experts)."""
    return z.T * z.cfg.experts_per_token


def moe_router_saved_bytes(z: Sizes) -> int:
    """The router (a mixture of experts; its fp32 input, ln2's output, is counted under ln2): amp-bf16
    (none): autocast's bf16 weight and input copies, E·d·2 + T·d·2; selective: its logits in the SAC
    cache, T·E·h; else 0."""
    return projection_saved_bytes(z, "layers.*.moe.router", z.cfg.num_experts)


def _moe_weight_copies(z: Sizes) -> int:
    """amp-bf16: autocast's bf16 copy of one expert matrix for each bmm that ran: the full part's E experts
    (when T·k >= E) and the remainder's T·k mod E, (E·[q > 0] + rem)·d·d_e·2 (``MixtureOfExperts``)."""
    c = z.cfg
    q, rem = divmod(_moe_rows(z), c.num_experts)
    return ((c.num_experts if q else 0) + rem) * c.d_model * c.expert_width * 2


def moe_scores_saved_bytes(z: Sizes) -> int:
    """Router softmax and top-k (none): exp and its row sums, kept by the division (T·E·e + T·e), and
    top-k's int64 indices (T·k·8); checkpointed: 0."""
    if _ck(z) != "none":
        return 0
    return z.act(z.cfg.num_experts) + z.act(1) + _moe_rows(z) * 8


def moe_experts_saved_bytes(z: Sizes, part: str) -> int:
    """The routed experts' SwiGLU over the T·k slot rows (none): as ``ffn_saved_bytes`` with T·k rows of
    d_e (T·k·d_e·h each), and under ``w1`` the repeated token rows (T·k·d·e, kept as views by every
    expert bmm); amp-bf16 instead: each of w1 and w3 keeps its bf16 input copy (T·k·d·2) and each of w1,
    w3, w2 its bf16 weight copies (``_moe_weight_copies``); selective: the w1, w3 and w2 bmm outputs in the
    SAC cache (T·k·d_e·h, T·k·d_e·h, T·k·d·h); full: 0."""
    ck, rows, de, d = _ck(z), _moe_rows(z), z.cfg.expert_width, z.cfg.d_model
    if ck == "full":
        return 0
    if ck == "selective":
        return {"w1": rows * de * _h(z), "w3": rows * de * _h(z), "w2": rows * d * _h(z)}.get(part, 0)
    per = {"w1": 1, "w3": 1, "silu": 2, "gate": 1, "w2": 0}[part] * rows * de * _h(z)
    if z.amp:
        return (
            per
            + (_moe_weight_copies(z) if part in ("w1", "w2", "w3") else 0)
            + (rows * d * 2 if part in ("w1", "w3") else 0)
        )
    return per + (rows * d * z.e if part == "w1" else 0)


def moe_shared_saved_bytes(z: Sizes, part: str) -> int:
    """The shared experts' SwiGLU on every token, width n_s·d_s: as ``ffn_saved_bytes`` (its fp32 input
    is ln2's output, counted there; amp-bf16: w1 and w3 keep bf16 weight and input copies, w2 its weight
    copy)."""
    ck, width = _ck(z), z.cfg.shared_width
    if ck == "full":
        return 0
    if ck == "selective":
        return {"w1": _hact(z, width), "w3": _hact(z, width), "w2": _hact(z, z.cfg.d_model)}.get(part, 0)
    out = {"w1": 1, "w3": 1, "silu": 2, "gate": 1, "w2": 0}[part] * _hact(z, width)
    if part in ("w1", "w3"):
        out += projection_saved_bytes(z, f"layers.*.moe.shared.{part}", width)
    if part == "w2":
        out += _weight_copy(z, "layers.*.moe.shared.w2")
    return out


def moe_combine_saved_bytes(z: Sizes) -> int:
    """The weighting of the expert outputs (none): the routed outputs in slot order (T·k·d·h) and the
    top-k weights (T·k·e; fp32 under amp-bf16), both kept by the product; checkpointed: 0."""
    if _ck(z) != "none":
        return 0
    return _moe_rows(z) * (z.cfg.d_model * _h(z) + z.e)


def lm_head_saved_bytes(z: Sizes) -> int:
    """amp-bf16: autocast's bf16 copies of the LM head's weight (V·d·2) and input (T·d·2); else 0
    (the fp32/bf16 LM head keeps ln_final's output, counted there)."""
    if not z.amp:
        return 0
    return z.cfg.vocab_size * z.cfg.d_model * 2 + z.T * z.cfg.d_model * 2


def cross_entropy_saved_bytes(z: Sizes) -> int:
    """z = logits − max (kept by gather), exp(z), its row sums, and the 0-d loss: 2·T·V·e + T·e + e
    (e = 4 under amp-bf16: the logits are upcast first)."""
    return 2 * z.act(z.cfg.vocab_size) + z.act(1) + z.e


def saved_activation_breakdown(
    cfg: ModelConfig,
    seq: int,
    batch: int = 1,
    dtype: str = "fp32",
    setup: TrainingSetup | None = None,
    device: str = "meta",
) -> Breakdown:
    """Bytes saved for backward after ``loss = cross_entropy(model(tokens), targets)``, per component,
    for ``setup`` (or, as before, pure ``dtype`` with the default setup).  Components that keep
    nothing under the setup are left out.  ``device="cuda"``: the fused attention is CUDA's kernel
    (``Sizes.lse``, ``Sizes.merge_copy``); meta and cpu run the CPU flash kernel's layout."""
    from ..components import breakdown

    z = Sizes.of(cfg, seq, batch, dtype, setup)
    return breakdown("saved", dataclasses.replace(z, cuda=True) if device == "cuda" else z)
