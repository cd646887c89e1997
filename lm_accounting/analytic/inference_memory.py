"""Activation temporaries of one inference step of *our* live model (no autograd), exact.

``step_temporaries`` replays the allocations and frees of ``model.kv_cache.prefill`` / ``decode``
under ``torch.no_grad`` op by op, as ``replay.py`` does for training (it reuses that file's RMSNorm
and RoPE sequences for a block whose tensors autograd does not keep), and returns the peak bytes
above what lives before the step: the weights, the RoPE tables, the cache and the input ids.  The
step's output, the logits (B·S·V·e), is part of the peak.  Exact (the storage tracker on meta and
CPU tensors agrees byte for byte, ``tests/test_infer_live.py``; with ``last_logits``, the head on the
last positions and the sampler's fp32 copy, too) for the course architecture: pre-
RMSNorm, SwiGLU, RoPE, no biases, with GQA, head_dim, per-head qk-norm, tied embeddings and sliding
windows; another architecture gets its course twin's figure, labelled an estimate.

With ``attention="sdpa"`` the block's attention is the fused kernel (``_fused``): no mask and no
S × keys scores, its output and logsumexp only, as ``model.kv_cache`` runs it (filled semantics).

Notation: s = tokens per sequence in the step (P, or 1), n = keys a layer attends over, T = B·s,
e = bytes per element of the model dtype; masks are bool (1 byte), positions int64 (8 bytes).
"""

from __future__ import annotations

from ..config import ModelConfig
from ..setup import TrainingSetup
from .ops.engine import Affine, Replay, repeat
from .replay import _norm_forward_unsaved, _qkv_forward, _rope_forward_unsaved
from .sizes import Sizes


def exact_for(cfg: ModelConfig) -> bool:
    """Whether the replay follows this architecture op for op (else: its course twin's, an estimate)."""
    return not [u for u in cfg.unsupported_for_replay() if u != "sliding-window attention"]


def _slot_mask(r: Replay, s: int, slots: int, window: int | None) -> None:
    """``StaticKVCache.slot_mask``: kept until the step ends (cached for the layers of its size)."""
    M = s * slots
    r(+8 * s, +8 * slots)  # arange of the query positions, arange of the slots
    r(+M, +s, +M, -M, -s)  # j <= q; q >= slots; "|"; both operands die
    if window is not None:
        r(+s, +8 * s, +M, -8 * s, +M, -s, -M, +M, -M, -M)  # q >= slots; q − w; j > ·; "|"; "&"; temps die
    r(-8 * s, -8 * slots)  # the two aranges die when the function returns


def _fused(r: Replay, z: Sizes) -> None:
    """The fused kernel (``layers.FusedAttention``) on q and the keys: its output (B, h, s, d_head) and the
    fp32 logsumexp (``Sizes.lse``), which dies on return; no S × keys tensor.  Merging the heads copies
    the output (``Sizes.merge_copy``) unless s = 1: a decode step's (B, h, 1, d_head) output transposed
    to (B, 1, h, d_head) is still contiguous, so the reshape is a view.  Neither moment can set a step's
    peak: beside the same x, ln1 output, q, k and v, RoPE on q held two q-sized tensors and the cos/sin rows
    (output + merge copy: two, no rows; output + logsumexp: less while h·P·4 < P·q_dim·e), so a mutant
    logsumexp or merge copy leaves every peak unchanged (checked: tests/test_infer_live.py still passes)."""
    Tq = z.act(z.cfg.q_dim)
    r(+Tq, +z.lse, -z.lse)  # output; the logsumexp dies when FusedAttention.forward returns
    if z.merge_copy and z.seq > 1:
        r(+Tq, -Tq)  # merge heads (a copy); the kernel's output dies


def _layer(r: Replay, z: Sizes, n: int, *, fresh_keys: bool, masked: bool) -> None:
    """One pre-norm block at s = z.seq queries over n keys.  ``fresh_keys``: attention reads this step's
    own K and V (prefill under 'filled'); else it reads the cache (views), and the fresh K and V die once
    written.  ``masked``: a boolean mask is applied (``torch.where``)."""
    c, T = z.cfg, z.T
    Td, Tq, Tkv, Tf = z.act(c.d_model), z.act(c.q_dim), z.act(c.kv_dim), z.act(c.d_ff)
    Sc, Sr = z.batch * c.num_heads * z.seq * n * z.e, z.score_rows
    w8, w4 = z.wrap(z.e)
    _norm_forward_unsaved(r, z, T, c.d_model)  # ln1
    _qkv_forward(r, z)  # q, k, v projections (and their biases)
    if c.qk_norm:
        _norm_forward_unsaved(r, z, T * c.num_heads, c.d_head)
        _norm_forward_unsaved(r, z, T * c.kv_heads, c.d_head)
        r(-Tq, -Tkv)  # the projections die (q, k rebound to the normed heads)
    _rope_forward_unsaved(r, z, c.q_dim)
    _rope_forward_unsaved(r, z, c.kv_dim)
    r(-Tkv, -Tq)  # un-rotated q, k die
    if not fresh_keys:
        r(-Tkv, -Tkv)  # cache.update wrote K and V in place; the fresh ones die (attention reads the cache)
    if z.sdpa:
        _fused(r, z)  # reads the strided V as it is: no copy
    else:
        r(+Sc, +w8, +w4, +Sc, -w4, -w8, -Sc)  # QKᵀ; · 1/√d_head (CPU: a wrapped scalar); raw scores die
        if masked:
            r(+z.e, +Sc, -z.e, -Sc)  # where(mask, scores, -inf): the -inf scalar tensor; scaled scores die
        r(+Sr, +Sc, -Sr, +Sc, +Sr, +Sc, -Sr, -Sc, -Sc)  # softmax: max, subtract, exp, sum, divide; temps die
        v_copy = Tkv if fresh_keys else 0  # this step's V is a transposed view: matmul copies it; the cache's is not
        r(+v_copy, +Tq, -v_copy, -Sc, -Sc)  # AV; the V copy, the scores and the probabilities die
        r(+Tq, -Tq)  # merge heads (a copy); AV output dies
    kv_fresh = Tkv if fresh_keys else 0
    r(+Td, -Tq, -kv_fresh, -kv_fresh, -Tq, -Td)  # output projection; q, k, v, merged heads, ln1 output die
    r(+Td, -Td)  # residual add; attention output dies
    _norm_forward_unsaved(r, z, T, c.d_model)  # ln2
    r(+Tf, +Tf, +Tf, -Tf, -Tf)  # w1; sigmoid; silu; sigmoid and w1 output die
    r(+Tf, +Tf, -Tf, -Tf)  # w3; gate; silu and w3 output die
    r(+Td, -Tf, -Td)  # w2; gate and ln2 output die
    r(+Td, -Td, -Td)  # residual add; FFN output and the middle stream die
    r(-Td)  # the block's input dies when the loop rebinds x


def step_temporaries(
    cfg: ModelConfig,
    batch: int,
    seq: int,
    keys: list[int],
    e: int,
    *,
    prefill: bool,
    semantics: str = "filled",
    slots: list[int] | None = None,
    cpu: bool = False,
    attention: str = "naive",
    cuda: bool = False,
    last_logits: bool = False,
) -> int:
    """Peak bytes above the pre-step baseline during one prefill (``seq`` = P) or decode (``seq`` = 1)
    step, ``keys[i]`` = keys layer i attends over, ``slots[i]`` = its cache slots (static semantics).
    ``attention`` ``sdpa``: the fused kernel (filled semantics; no mask is built, a windowed layer's
    window is the kernel's); ``cuda``: the CUDA kernels' logsumexp and output layout (``Sizes.lse``,
    ``Sizes.merge_copy``), else the CPU flash kernel's (meta and cpu).  ``last_logits``: the head runs on
    each sequence's last position only (``logits_to_keep = 1``: the final norm's output sliced, a view),
    and the sampler copies those B·V logits to fp32 (transformers' ``generate``: ``outputs.logits[:, -1]
    .to(copy=True, dtype=torch.float32)``; vLLM's ``Sampler``: ``logits.to(torch.float32)``)."""
    if not exact_for(cfg):
        cfg = cfg.course_twin()
    z = Sizes(cfg, batch, seq, e, setup=TrainingSetup(attention=attention), cpu=cpu, cuda=cuda)
    s, Td = seq, z.act(cfg.d_model)
    r = Replay(Affine(0))
    r(+8 * s)  # token positions (int64)
    if prefill and not z.sdpa:
        r(+s * s, +s * s, -s * s)  # causal mask: ones, tril; ones dies
        if cfg.sliding_window is not None:  # window mask: ones_like, tril(−w), "~", "&"; temps die
            r(+s * s, +s * s, -s * s, +s * s, -s * s, +s * s, -s * s)
    r(+Td)  # token embeddings
    made: set[int] = set()
    runs: list[list] = []  # [signature, count]: consecutive identical layers replay once (``_repeat``)
    for i in range(cfg.num_layers):
        static = semantics == "static" and not (prefill and s > slots[i])
        build = None
        if static and slots[i] not in made:  # the first layer of this cache size builds the slot mask
            made.add(slots[i])
            build = (slots[i], cfg.sliding_window if cfg.layer_windowed(i) else None)
        sig = (keys[i], not static and prefill, static or prefill, build)
        if runs and runs[-1][0] == sig and build is None:
            runs[-1][1] += 1
        else:
            runs.append([sig, 1])
    for (n, fresh, masked, build), count in runs:
        if build is not None:
            _slot_mask(r, s, *build)
        repeat(r, count, lambda q, n=n, fresh=fresh, masked=masked: _layer(q, z, n, fresh_keys=fresh, masked=masked))
    _norm_forward_unsaved(r, z, z.T, cfg.d_model)  # ln_final
    if last_logits:
        r(+z.batch * cfg.vocab_size * e, -Td)  # logits (B, 1, V) of the last positions; ln_final output dies
        masks = sum(s * n for n in made)  # static semantics: the slot masks, cleared when the step returns
        r(-Td, -8 * s, -masks)  # the forward returns: the residual stream, the positions and the masks die
        r(+z.batch * cfg.vocab_size * 4)  # the sampler's fp32 copy, beside the step's output
    else:
        r(+z.T * cfg.vocab_size * e, -Td)  # logits (the step's output); ln_final output dies
    return r.peak().at(1)
