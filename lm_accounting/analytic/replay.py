"""Implementation-exact peak memory of one training step of *our* live model.

``predict_training_step`` gives the peak and end-of-phase bytes of one steady-state
training step (forward + cross-entropy, backward, AdamW step), by replaying the
allocation and free sequence of our model's ops in order (pure Python integers).  Each
``r(...)`` line below follows one op of ``lm_accounting.model`` (forward) or one autograd
formula of torch 2.13 (backward: ``tools/autograd/derivatives.yaml``); the engine frees a
node's saved tensors right after it runs.  The sequence was derived op by op and is checked
byte for byte against the storage tracker on meta and CPU tensors in
``tests/test_memory_exact.py`` and ``tests/test_memory_result.py``.

The replay runs once with the batch B kept as a symbol: every tensor it allocates has a
size a·B + b (``Affine``; a is 0 for the weights, the gradients, the RoPE tables and the
mask, and b is 0 for every activation), so the live bytes at each point are a line in B,
and a phase's peak is the highest of those lines, ``PeakEnvelope``.  ``replay_training_step``
returns that exact function of B; ``predict_training_step`` evaluates it at one batch.

Two runs are replayed (``MODES``): ``mode="plain"``, the default of every public function, is a run
with no Python dispatch mode (what a GPU user gets; on CPU, what the allocator's own events show);
``mode="traced"`` is what the storage tracker (any dispatch mode, every meta run) sees.  Callers that
compare with the tracker pass ``mode="traced"``.

Mixture-of-experts blocks (``model/moe.py``) replace the FFN part of a block (``_moe_forward``,
``_moe_backward`` and their unsaved and amp-bf16 forms), for every setup; the blocks are replayed in
runs of equal kind (``_layer_runs``: dense_layers_first, moe_every).  How the T·k routed slots split
over the E experts (q = ⌊T·k/E⌋ per expert in one batched part, T·k mod E in a remainder) decides which
ops run, and it depends on B; so ``replay_training_step`` takes a ``batch`` hint and its lines in B
hold for the batches that split alike (every B when E divides S·k and S·k >= 2·E: ``moe_lines_in_batch``).
Under expert parallel (``replay_training_step(ep=...)``, fp32 and bf16) one rank's dispatch, experts and
combine replace the routed part (``_ep_routed_forward``, ``_ep_routed_backward``), with the row counts of
``analytic.expert_parallel`` and FSDP2's expert-unit events (``analytic.fsdp`` rule 7).

Under context parallel (a ``Ring`` installed, ``ops.aten_ring.installed``: ``analytic.context_parallel`` beside
sequence or vocab parallel) each fused attention is that cp rank's ring attention (``_ring``, ``_flash_forward``,
``_flash_backward``, ``_dv_grad``).

Notation: T = B·S tokens; e = bytes per element of the model dtype; RMSNorm computes in
fp32 (4 bytes) and, for a 16-bit model, keeps fp32 copies instead of its input.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..config import AccountingError, ModelConfig
from ..names import DEVICES, DTYPE_BYTES
from ..phases import StepMemory
from ..setup import TrainingSetup
from .expert_parallel import expert_parallel_split
from .fsdp import FsdpEvents, FsdpUnits
from .ops.engine import Affine, PeakEnvelope, PhaseInBatch, StepInBatch, apply_segment
from .ops.engine import Copy as _Copy
from .ops.engine import Grad as _Grad
from .ops.engine import Join as _Join
from .ops.engine import Replay as _Replay
from .ops.engine import repeat as _repeat
from .params import parameter_breakdown
from .sizes import Sizes, check_batch_seq

if TYPE_CHECKING:
    from .ops.aten_ring import RingDeltas

__all__ = ["Affine", "PeakEnvelope", "PhaseInBatch", "StepInBatch", "apply_segment"]  # re-exported (ops.engine)


def _norm_forward(r: _Replay, z: Sizes, rows: int, width: int, xe: int | None = None) -> None:
    """RMSNorm forward (model/layers.py RMSNorm.forward) over ``rows`` vectors of ``width``.

    ``xe``: bytes per element of the input (default: the model dtype's; 2 for a qk-norm under
    amp-bf16, whose parameters stay fp32).  A 16-bit input is copied to fp32 (saved) and the result
    cast back; a 16-bit gain is copied to fp32 (saved) too."""
    xe = z.e if xe is None else xe
    X, R = rows * width * 4, rows * 4
    gain = width * 4 if z.e != 4 else 0  # g.to(fp32): a copy only for 16-bit parameters
    w8, w4 = z.wrap()  # CPU only: mean's "/ width" and "+ eps" wrap a Python number
    if xe != 4:
        r(+X)  # x.to(fp32) (saved)
    r(+X, +R, +w8, +w4, -w4, -w8, -X)  # pow(x, 2); mean; the square dies
    r(+w8, +w4, +R, -w4, -w8, -R, +R, -R)  # + eps; rsqrt (saved)
    if xe == 4:
        r(+X, +X)  # y = x·rsqrt (saved); out = y·g
    else:
        r(+X, +gain, +X)  # y (saved); g.to(fp32) (saved); y·g
        r(+rows * width * xe, -X)  # cast back to the input dtype


def _norm_backward(
    r: _Replay,
    z: Sizes,
    rows: int,
    width: int,
    residual: bool,
    frame: tuple[int, ...] = (),
    rerun: bool = False,
    xe: int | None = None,
    sp: bool = False,
) -> None:
    """RMSNorm backward; with ``residual`` the input's gradient joins the residual stream's.
    ``frame``: bytes a checkpoint frame releases when this norm's saved input (the block input) goes.
    ``rerun``: the norm ran again inside a checkpoint; its saved tensors are only unpacked (held by
    no ``SavedVariable``), so they die as soon as the node's formula returns.  ``xe``: as forward.
    ``sp``: a sequence-parallel norm (``SequenceParallel``), which runs on a DTensor made from the local
    input: its two paths to x meet in that DTensor's gradient, a tensor subclass, so they are summed out
    of place in both runs, and only that sum joins the residual stream's gradient (an fp32 input's first
    part does not join it early)."""
    xe = z.e if xe is None else xe
    X, R, Xe = rows * width * 4, rows * 4, rows * width * xe
    G = z.norm_grad_scratch(rows, width)  # CUDA: Σ's staging over the rows, beside dg while it runs
    if xe != 4:
        r(+X, -Xe)  # grad to fp32
    if z.e != 4 and rerun:
        # grad·g; grad·y; the rerun's y and g copy die with the node (only unpacked, never kept); Σ -> dg
        r(+X, +X, -X, -width * 4, +width * 4, +G, -G, -X, -X)
        r(+_Grad(width * z.e), -width * 4)  # dg to the parameter dtype
    elif z.e != 4:
        r(+X, +X, +width * 4, +G, -G, -X, -X, -width * 4, -X)  # grad·g; grad·y; Σ -> dg (fp32)
        r(+_Grad(width * z.e), -width * 4)  # dg to the parameter dtype
    elif rerun:
        r(+X, +X, -X, +_Grad(width * 4), +G, -G, -X, -X)  # grad·g; grad·y; the rerun's y dies first; Σ -> dg (kept)
    else:
        r(+X, +X, +_Grad(width * 4), +G, -G, -X, -X, -X)  # grad·g; grad·y; Σ -> dg (kept); y released
    r(+X, +X, +R, -X, -X)  # d(x·r)/dx = grad_y·r; grad_y·x; Σ -> d rsqrt
    if residual and xe == 4 and not sp:
        r(_Join(X), -X)  # first part joins the residual stream's gradient
    w8, w4 = z.wrap()  # CPU only: "· -½", "/ width" and "· 2" wrap Python numbers
    r(+R, +w8, +w4, +R, -w4, -w8, +R, -R, -R, -R, -R)  # rsqrt backward: -½·r³·grad; rsqrt released
    r(+w8, +w4, +X, -w4, -w8, -R)  # mean backward: expand / width
    # pow backward: 2·x·grad; x released (and a checkpoint frame)
    r(+X, +w8, +w4, +X, -w4, -w8, +X, -X, -X, -X, *(-b for b in frame), -X)
    r(+X, -X, -X) if sp else r(_Copy(X), -X)  # sum of the two paths
    if residual and xe == 4 and sp:
        r(_Join(X), -X)  # the sum joins the residual stream's gradient
    if xe != 4:
        r(+Xe, -X)  # back to the input dtype
        if residual:
            r(_Join(Xe), -Xe)  # join the residual stream's gradient


def _join(size: Affine | int, dtensor: bool) -> tuple:
    """Two gradients of one tensor summed (``InputBuffer::accumulate``): in place in a plain run, an
    out-of-place copy when traced (``_Copy``), then the incoming one dies; the input of the projections
    under sequence parallel is the all-gathered DTensor (``PrepareModuleInput``), a tensor subclass, so its
    gradients are summed out of place in both runs."""
    return (+size, -size, -size) if dtensor else (_Copy(size), -size)


def _summed(z: Sizes, size: Affine | int) -> tuple:
    """Two input gradients of a norm's output summed where each is a view (a 3-D linear's dx): out of place
    in both runs; a TP rank's are its all-reduces' fresh outputs: ``_join`` (in place when plain)."""
    return _join(size, False) if z.all_reduce else (+size, -size, -size)


def _qkv_forward(r: _Replay, z: Sizes, n: int = 1, kept: int = 1) -> None:
    """The q, k and v projections (model/layers.py ``Linear``): each matmul's output (``n`` = 0: handed
    back by the SAC cache); with ``qkv_bias`` (Qwen2) the ``Bias`` add ``y + b`` makes a fresh tensor of
    the same size (saved by nothing: its backward needs no input), and the matmul's output dies
    (``kept`` = 0: the SAC cache keeps it)."""
    for width in (z.cfg.q_dim, z.cfg.kv_dim, z.cfg.kv_dim):
        X = z.act(width)
        r(+X * n)
        if z.cfg.qkv_bias:
            r(+X, -X * kept)


def _proj_grad(r: _Replay, z: Sizes, p: dict[str, int], proj: str, width: int, contiguous: bool) -> None:
    """The gradient of a q/k/v head view made ready for its projection's matmul, left live: ``contiguous``
    copies it out of the heads' layout.  With ``qkv_bias`` the ``Bias`` add's backward hands it on to the
    matmul and sums it over the tokens for the bias (``sum_to`` in the engine's ``validate_outputs``: a
    fresh gradient of the bias's size, kept by its AccumulateGrad); under amp-bf16, where it is fp32
    (``_amp_attention_sizes``), it is first cast to the bf16 matmul output's dtype, then the fp32 one dies."""
    X = (_amp_attention_sizes(z)[0] if z.amp else z).act(width)
    if contiguous:
        r(+X, -X)
    if z.cfg.qkv_bias:
        cast = z.bf16.act(width) if z.amp else 0
        r(+cast, +p[f"attn.{proj}.bias"], -X if cast else 0)


def _ring(z: Sizes) -> RingDeltas | None:
    """Context parallel (``analytic.context_parallel``: a ``Ring`` installed, ``ops.aten_ring.installed``): the
    fused attention of these blocks runs as cp rank c's ring attention, what it allocates and frees in order
    (``ops.aten_ring.ring_deltas``, the op library's transliteration of torch's, on q, k, v of the rank's heads
    and s positions in the attention's dtype).  None: the kernel alone.  Imported here: a ring needs sdpa."""
    if not z.sdpa:
        return None
    from .ops.aten_ring import active, ring_deltas

    ring = active()
    if ring is None:
        return None
    a = _amp_attention_sizes(z)[0] if z.amp else z
    c = z.cfg
    return ring_deltas(ring, z.batch, c.num_heads, c.kv_heads, z.seq, c.d_head, "fp32" if a.e == 4 else "bf16")


def _merge_copy(z: Sizes) -> int:
    """Whether merging the attention output's heads copies it (``Sizes.merge_copy``; the ring's output)."""
    rd = _ring(z)
    return z.merge_copy if rd is None else rd.merge_copy


def _flash_forward(r: _Replay, z: Sizes, n: int, q: Affine | int, e: int) -> None:
    """The fused kernel (``n`` 0: its outputs from the SAC cache): output (``q`` bytes) and logsumexp, with the
    CPU kernel's scratch for ``e``-byte inputs; under context parallel the ring's allocations (``_ring``)."""
    rd = _ring(z)
    if rd is not None:
        r(*rd.forward)
        return
    f1, f2 = z.flash_scratch_forward(e)  # CPU only
    r(+q * n, +z.lse * n, +f1 * n, +f2 * n, -f2 * n, -f1 * n)


def _flash_backward(r: _Replay, z: Sizes, q: Affine | int, kv: Affine | int, e: int) -> None:
    """The fused kernel's backward: dQ, dK, dV (``q``, ``kv`` bytes) with its scratch; under context parallel the
    ring's (dK and dV one buffer: ``_dv_grad``)."""
    rd = _ring(z)
    if rd is not None:
        r(*rd.backward)
        return
    g1, g2, g3 = z.flash_scratch_backward(e)  # the kernel's scratch (CPU, CUDA flash or memory-efficient)
    r(+q, +kv, +kv, +g1, +g2, +g3, -g3, -g2, -g1)


def _dv_grad(r: _Replay, z: Sizes, p: dict[str, int], width: int) -> int:
    """v_proj's incoming gradient made ready (``_proj_grad``): the fused kernel's dV has v's strides, the (B, S,
    kv, d_head) layout of v_proj's output, no copy.  The ring's dK, dV are views of one (B, kv, s, d)-ordered
    buffer (``ring_backward``): RoPE's backward released dK's view (``_rope_backward(freed=False)``), dV is copied
    (``RingDeltas.dv_copy``) and the buffer dies with its last view.  Returns the multiple of dV's bytes that
    v_proj's backward then releases."""
    rd = _ring(z)
    if rd is None:
        _proj_grad(r, z, p, "v_proj", width, contiguous=not z.sdpa)
        return 1
    X = (_amp_attention_sizes(z)[0] if z.amp else z).act(width)
    r(+X * rd.dv_copy, -2 * X * rd.dv_copy)
    _proj_grad(r, z, p, "v_proj", width, contiguous=False)
    return 1 if rd.dv_copy else 2


def _sp_all_gather(r: _Replay, z: Sizes) -> None:
    """Sequence parallel (``PrepareModuleInput``'s Shard(1) -> Replicate, and the backward of a
    reduce-scatter): a T/M-row tensor all-gathered to the whole (T x d) one in the model dtype: a
    norm's output before the column-parallel projections (then saved by them), the gradient of a
    row-parallel output before its backward, the embedding output's gradient.  The collective gathers
    along dim 0, (M·B, S/M, d); at B > 1 (``Sizes.gather_cat``) the M chunks are then cat along the
    sequence into a fresh (B, S, d) and the gathered buffer dies.  Nothing without sequence parallel."""
    if z.sp > 1:
        whole = z.act(z.cfg.d_model)
        r(+whole)
        if z.gather_cat:
            r(+whole, -whole)


def _sp_reduce_scatter(r: _Replay, z: Sizes, partial: Affine | int) -> None:
    """Sequence parallel: a whole (T x d) partial sum (a row-parallel projection's output, or the gradient
    of an all-gathered input) summed over the M ranks and split along the sequence: ``cat`` of its M
    sequence chunks (T·d: the collective scatters dim 0), the T/M-row output (``Sizes.residual``), then
    the cat and the ``partial`` (its bytes; 0 where the SAC cache still holds it) die."""
    whole = z.act(z.cfg.d_model)
    r(+whole, +z.residual, -whole, -partial)


def _tp_all_reduce(r: _Replay, z: Sizes, whole: Affine | int, partial: Affine | int | None = None) -> None:
    """Tensor parallel without sequence parallel (``z.all_reduce``): a (T x d) partial sum of ``whole``
    bytes, a row-parallel projection's output (``RowwiseParallel``'s Partial -> Replicate) or a
    column-parallel input's gradient (the backward of ``ColwiseParallel``'s ``DTensor.from_local`` of a
    Replicate input), all-reduced by DTensor's functional ``all_reduce``, which clones it first
    (``_c10d_functional.all_reduce``: out of place), then the partial dies (``partial``: its bytes, default
    ``whole``; 0 where the SAC cache still holds it).  Nothing otherwise."""
    if z.all_reduce:
        r(+whole, -(whole if partial is None else partial))


def _rotated(z: Sizes, width: int) -> int:
    """Of a (heads · d_head) projection, the part RoPE rotates: heads · rotary_dim (partial rotary), else all."""
    return width // z.cfg.d_head * z.cfg.rope_dim


def _rope_forward(r: _Replay, z: Sizes, width: int) -> None:
    """RoPE on (B, heads, S, d_head): gathers cos/sin rows, rotates adjacent pairs, interleaves.  Partial
    rotary (``CausalSelfAttention.rotate_part``): on the split-off first rotary_dim of each head, then
    concatenated with the rest (the whole head, saved by QKᵀ); the rotated part dies."""
    rot = _rotated(z, width)
    H, cs = z.act(rot) // 2, z.rope_table
    for _ in ("cos", "sin"):
        if z.e == 4:
            r(+cs)  # table rows (saved)
        else:
            r(+cs * 4 // z.e, +cs, -cs * 4 // z.e)  # fp32 rows, cast (saved)
    r(+H, +H, +H, -H, -H)  # x_even·cos − x_odd·sin
    r(+H, +H, +H, -H, -H)  # x_even·sin + x_odd·cos
    r(+2 * H, -H, -H)  # stack + flatten (saved by the QKᵀ matmul)
    if rot != width:
        r(+z.act(width), -2 * H)  # cat with the passed-through part; the rotated part dies


def _rope_backward(r: _Replay, z: Sizes, width: int, freed: bool = True) -> None:
    """Partial rotary: the incoming gradient's rotated part is a view (freed with the whole, after the split's
    backward concatenates the rotated part's gradient with the passed-through one).  ``freed`` False: the
    incoming gradient's storage outlives it (context parallel's dK, a view of the dK, dV buffer: ``_dv_grad``)."""
    rot = _rotated(z, width)
    H, cs, whole = z.act(rot) // 2, z.rope_table, rot == width
    whole = whole and freed
    r(+H, +H, +H, +H, -H, -cs, _Copy(H), -H)  # grads of out_odd and out_even through the products
    r(+H, *([-2 * H] if whole else []), -cs, _Copy(H), -H)  # the rotated tensor and the tables released; summed
    r(+2 * H, -H, +2 * H, -H, _Copy(2 * H), -2 * H)  # scatter back into the strided halves; summed
    if rot != width:
        r(+z.act(width), -2 * H, -z.act(width) * freed)  # split backward: the head's gradient; both parts released


class _MoeSplit:
    """How ``MixtureOfExperts.forward`` splits the T·k routed slots at one batch: q = ⌊T·k/E⌋ slots per
    expert in one (E, q, d) batch ("full") and the last ``rem`` = T·k mod E slots one each to experts
    0..rem−1 ("remainder").  Which parts exist (and whether the full part's reshape copies: q > 1)
    depends on B through T·k mod E, so the replay takes the batch as a hint: its sizes are exact lines
    in B for every batch with the same ``rem`` and the same parts (B ≡ batch modulo E / gcd(S·k, E)).

    Expert parallel (``ranks`` > 1; ``_ep_routed_forward``): none of those parts runs (q = rem = 0);
    ep rank ``rank``'s experts (``analytic.expert_parallel``) run a batched part of ``ranks``·⌊T·k/E⌋
    rows per expert and a part of ``ranks`` rows for each of its first ``extra`` experts (``ep_parts``);
    ``events``: FSDP2's expert-unit events and the block's index (``FsdpEvents.experts_*``), bound per
    block by ``_block``."""

    __slots__ = ("ep_q", "ep_rem", "events", "extra", "q", "ranks", "rem")

    def __init__(self, cfg: ModelConfig, seq: int, batch: int, ep: tuple[int, int] = (1, 0)):
        slots = batch * seq * cfg.experts_per_token
        self.ranks = ep[0]
        split = divmod(slots, cfg.num_experts)
        self.q, self.rem = split if self.ranks == 1 else (0, 0)
        self.ep_q, self.ep_rem = split if self.ranks > 1 else (0, 0)
        self.extra = expert_parallel_split(slots, cfg.num_experts, *ep).extra_experts if self.ranks > 1 else 0
        self.events: tuple[FsdpEvents, int] | None = None

    def full_rows(self, z: Sizes) -> Affine | int:
        """q·E = T·k − rem slots, a line in B (0 without a full part)."""
        return z.T * z.cfg.experts_per_token - self.rem if self.q else 0

    def ep_parts(self, z: Sizes) -> tuple[tuple[Affine | int, int], ...]:
        """Expert parallel: (rows, experts) of each part this rank's experts run, in call order: the
        batched one, G·ranks·q = E·q rows over the G = E/ep local experts; the extra one, ranks rows
        for each of ``extra`` experts (``analytic.expert_parallel`` item 3)."""
        batched = z.T * z.cfg.experts_per_token - self.ep_rem  # E·⌊T·k/E⌋ = T·k − T·k mod E, a line in B
        full = ((batched, z.cfg.num_experts // self.ranks),) if self.ep_q else ()
        return full + (((self.ranks * self.extra, self.extra),) if self.extra else ())

    def received(self, z: Sizes) -> Affine | int:
        """Rows this rank's experts receive: E·q + ranks·extra (the parts' sum), a line in B."""
        return sum((rows for rows, _ in self.ep_parts(z)), 0)

    def in_block(self, units: FsdpEvents | None, i: int) -> _MoeSplit:
        """This split with block i's expert-unit events bound (expert parallel under FSDP2), else itself."""
        if self.ranks == 1 or units is None or units.experts(i) is None:
            return self
        out = copy.copy(self)
        out.events = (units, i)
        return out

    def unit(self, r: _Replay, event: str, *args) -> None:
        """FSDP2's expert-unit ``event`` (``FsdpEvents.experts_<event>``), if bound."""
        if self.events is not None:
            units, i = self.events
            getattr(units, f"experts_{event}")(r, i, *args)


def _moe_forward(r: _Replay, z: Sizes, m: _MoeSplit, recompute: bool = False, cached: bool = False) -> None:
    """``MixtureOfExperts.forward`` (model/moe.py) on ln2's output ``flat`` (T, d), autograd saving; ends
    with its output (T, d) live.  E experts, top-k, expert width d_e; F = q·E and R = rem slot rows.
    ``recompute``: a checkpoint's rerun, which stops once the block's last saved tensors are packed (the
    weighting mul's inputs; with shared experts, their w2's) and drops the unsaved locals as it unwinds.
    ``cached`` (selective): the rerun takes the mm and bmm outputs from the SAC cache (``n = 0``).
    FSDP2's bf16 parameters under autocast (``z.softmax32``, ``_moe_mixed``): the routing in fp32 from
    exp on, the weighted sum fp32, cast to the bf16 of ``flat``."""
    c, e = z.cfg, z.e
    n = 0 if cached else 1
    d, E, k, de = c.d_model, c.num_experts, c.experts_per_token, c.expert_width
    Td, TE, Tr, Tkd = z.act(d), z.act(E), z.act(1), z.act(d) * k
    F = m.full_rows(z)
    Fde, Fd, Rde, Rd = F * de * e, F * d * e, m.rem * de * e, m.rem * d * e
    f = _moe_mixed(z)
    r(+TE * n)  # router: flat (T, d) @ (d, E) -> logits T·E·e (mm saves flat and the weight)
    r(+Tr, +TE, -Tr)  # softmax: max over E (detached, T·e); z = logits − max (T·E·e); the max dies
    if f > 1:  # exp: fp32 copy of z, exp (saved), the copy dies; Σ (saved), divide, all fp32; z and the logits die
        r(+TE * f, +TE * f, -TE * f, +Tr * f, +TE * f, -TE, -TE)
    else:
        r(+TE, +Tr, +TE, -TE, -TE)  # exp (saved), Σ (saved, T·e), divide (T·E·e); z and the logits die on return
    # topk: values T·k·e (fp32: f·e; saved by the weighting), int64 indices (saved); the probabilities die
    r(+z.T * k * e * f, +z.T * k * 8, -TE * f)
    r(+Tkd)  # repeat_interleave: (T, d) -> (T·k, d), a copy T·k·d·e (saved, as views, by every expert bmm)
    if m.ranks > 1:
        _ep_routed_forward(r, z, m, n, recompute)
    if m.q:  # (q·E, d) -> (E, q, d): bmm w1, sigmoid, silu, bmm w3, gate (all saved, F·d_e·e each); bmm w2 (F·d·e)
        r(+Fde * n, +Fde, +Fde, +Fde * n, +Fde, +Fd * n)
        if m.q > 1:
            r(+Fd)  # (E, q, d) -> (q, E, d) -> (q·E, d) in slot order: transpose + reshape, a copy F·d·e
    if m.rem:  # (R, 1, d): the same five saved R·d_e·e tensors and the bmm w2 output R·d·e
        r(+Rde * n, +Rde, +Rde, +Rde * n, +Rde, +Rd * n)
    if m.q and m.rem:
        r(+Tkd)  # cat of the two parts -> routed (T·k, d) (saved by the weighting mul)
    if recompute and not c.shared_experts:
        r(*_moe_unsaved_parts(z, m))  # early stop at the weighting mul: its output is never made
        return
    _moe_weighted_sum(r, z)
    if c.shared_experts:
        Sf = z.act(c.shared_width)  # the shared SwiGLU on flat: w1, sigmoid, silu, w3, gate (saved), w2
        r(+Sf * n, +Sf, +Sf, +Sf * n, +Sf)
        if recompute:  # early stop at the shared w2; the routed sum and the unsaved parts die
            r(-Td, *_moe_unsaved_parts(z, m))
            return
        r(+Td)
        r(+Td, -Td, -Td)  # routed + shared; both summands die
    r(*_moe_unsaved_parts(z, m))  # on return


def _moe_mixed(z: Sizes) -> int:
    """2 under FSDP2's MixedPrecisionPolicy(bf16) with autocast (``z.softmax32``: the bf16 model, e = 2,
    with CUDA autocast's lists), else 1: the factor from the model dtype's bytes to fp32's of the
    router's exp, Σ, probabilities and top-k weights (exp is on autocast's fp32 list), and of the
    weighted sum ((bf16 routed) · (fp32 weights) promotes; ``sum`` is on its fp32 list too)."""
    return 2 if z.softmax32 else 1


def _moe_weighted_sum(r: _Replay, z: Sizes) -> None:
    """``_finish``'s routed · weights (T·k, d), summed over each token's k -> (T, d); the product dies.
    Under FSDP2's bf16 policy with autocast (``_moe_mixed``: f = 2) both are fp32 (f·e bytes), and the
    sum is then cast to ``flat``'s bf16 (``.to(flat.dtype)``, model/moe.py; a no-op otherwise), the fp32
    sum dying at once.  The bf16 · fp32 product on the CPU goes through an fp32 copy of routed (``mix``,
    as ``_amp_moe_forward``'s)."""
    f, Td, Tkd = _moe_mixed(z), z.act(z.cfg.d_model), z.act(z.cfg.d_model) * z.cfg.experts_per_token
    mix = z.mixed_add_temp(z.cfg.d_model) * z.cfg.experts_per_token if f > 1 else 0
    r(+mix, +Tkd * f, -mix, +Td * f, -Tkd * f)
    if f > 1:
        r(+Td, -Td * f)


def _moe_sum_backward(r: _Replay, z: Sizes) -> None:
    """Backward of the weighted sum: d(out) expanded to (T, k, d) and viewed as (T·k, d), a copy.  Under
    FSDP2's bf16 policy with autocast (f = 2) the cast's backward first makes an fp32 d(out) (T·d·4), which
    dies once the copy (fp32) is made."""
    f, Td, Tkd = _moe_mixed(z), z.act(z.cfg.d_model), z.act(z.cfg.d_model) * z.cfg.experts_per_token
    if f > 1:
        r(+Td * f, +Tkd * f, -Td * f)
    else:
        r(+Tkd)


def _moe_unsaved_parts(z: Sizes, m: _MoeSplit) -> tuple:
    """The expert outputs that are not ``routed`` (so saved by nothing), freed when the forward returns:
    with a cat both parts' w2 outputs (and the full part's reshape copy); without, the full part's w2
    output when the reshape copied it.  Expert parallel (``_ep_routed_forward`` frees its own locals): the
    repeated slots, which the dispatch's index_select does not save (it keeps only the index)."""
    c, e = z.cfg, z.e
    if m.ranks > 1:
        return (-z.act(c.d_model) * c.experts_per_token,)
    Fd, Rd = m.full_rows(z) * c.d_model * e, m.rem * c.d_model * e
    if m.q and m.rem:
        return (-Rd, -Fd, -(Fd if m.q > 1 else 0))
    return (-Fd,) if m.q > 1 else ()


def _moe_forward_unsaved(r: _Replay, z: Sizes, m: _MoeSplit, cached: bool = False) -> None:
    """``MixtureOfExperts.forward`` inside a checkpoint: autograd saves nothing, every tensor lives as long
    as Python holds it (locals die when the forward returns); ends with its output (T, d) live.
    ``cached`` (selective): the SAC cache keeps every mm and bmm output (``k = 0``: a free it prevents)."""
    k0 = 0 if cached else 1
    c, e = z.cfg, z.e
    d, E, k, de = c.d_model, c.num_experts, c.experts_per_token, c.expert_width
    Td, TE, Tr, Tkd, Tk, Ti = z.act(d), z.act(E), z.act(1), z.act(d) * k, z.T * k * e, z.T * k * 8
    F = m.full_rows(z)
    Fde, Fd, Rde, Rd = F * de * e, F * d * e, m.rem * de * e, m.rem * d * e
    f = _moe_mixed(z)  # 2: exp, Σ, the probabilities and the top-k values in fp32 (see ``_moe_forward``)
    r(+TE)  # router logits
    if f > 1:  # softmax: max (dies at once), z; exp's fp32 copy of z (dies), exp; Σ; divide
        r(+Tr, +TE, -Tr, +TE * f, +TE * f, -TE * f, +Tr * f, +TE * f)
        r(-TE, -TE * f, -Tr * f, -TE * k0)  # on return z, exp, Σ and the logits die
    else:
        r(+Tr, +TE, -Tr, +TE, +Tr, +TE)  # softmax: max (dies at once), z, exp, Σ, divide
        r(-TE, -TE, -Tr, -TE * k0)  # on return z, exp, Σ and the logits die
    Tk = Tk * f
    r(+Tk, +Ti, -TE * f, -Ti)  # topk: values, indices; the probabilities and the indices die
    r(+Tkd)  # repeat_interleave (a copy)
    if m.ranks > 1:
        _ep_routed_forward_unsaved(r, z, m, k0)
    for rows_de, rows_d, present in ((Fde, Fd, m.q), (Rde, Rd, m.rem)):
        if present:  # bmm w1; sigmoid; silu (sigmoid, w1 output die); bmm w3; gate (silu, w3 output die); bmm w2
            r(+rows_de, +rows_de, +rows_de, -rows_de, -rows_de * k0, +rows_de, +rows_de, -rows_de, -rows_de * k0)
            r(+rows_d, -rows_de)  # bmm w2; the gate dies
            if rows_d is Fd and m.q > 1:
                r(+Fd)  # transpose + reshape to slot order, a copy
    if m.q and m.rem:
        r(+Tkd)  # cat
    _moe_weighted_sum(r, z)
    if c.shared_experts:
        Sf = z.act(c.shared_width)
        r(+Sf, +Sf, +Sf, -Sf, -Sf * k0)  # shared w1; sigmoid; silu; sigmoid and w1 output die
        r(+Sf, +Sf, -Sf, -Sf * k0)  # w3; gate; silu and w3 output die
        r(+Td, -Sf, +Td, -Td * k0, -Td)  # w2; gate dies; routed + shared; both summands die
    # on return: the weights, the slots, both parts' w2 outputs (kept by the SAC cache), the reshape copy
    # and the cat
    if m.ranks > 1:
        r(-Tkd)  # expert parallel: ``routed`` (``_ep_routed_forward_unsaved``'s last index_select)
    full_copy = Fd if m.q > 1 else 0
    r(-Tk, -Tkd, -Fd * k0, -Rd * k0, -full_copy, -(Tkd if m.q and m.rem else 0))


def _ep_routed_forward(r: _Replay, z: Sizes, m: _MoeSplit, n: int, recompute: bool = False) -> None:
    """``MixtureOfExperts._routed_expert_parallel`` (model/moe.py), autograd saving, on the repeated slots
    (T·k, d): ends with ``routed`` (T·k, d, slot order) live, and the dispatched rows (R, d, local order:
    R = ``m.received``) saved, as views, by the experts' bmms.  ``n``, ``recompute``: as ``_moe_forward``
    (a rerun's expert-unit events are FSDP2's in backward: ``FsdpEvents.experts_pre_rerun``)."""
    c, e = z.cfg, z.e
    d, de = c.d_model, c.expert_width
    Tkd, Rd = z.act(d) * c.experts_per_token, m.received(z) * d * e
    Ti, Ri = _ep_index_bytes(z, m)  # each index_select saves its index
    r(+Ti, +Tkd)  # index_select of the slots by expert: what is sent (T·k, d)
    r(+Rd)  # dispatch all_to_all: (R, d) received, by source
    r(+Ri, +Rd)  # index_select to local expert order (saved by the bmms)
    m.unit(r, "pre_rerun" if recompute else "pre_forward")
    outs = 0  # the parts' w2 outputs, saved by nothing (a rerun's taken from the SAC cache die too)
    for rows, _ in m.ep_parts(z):  # bmm w1, sigmoid, silu, bmm w3, gate (saved, rows·d_e·e each); bmm w2
        Pde = rows * de * e
        r(+Pde * n, +Pde, +Pde, +Pde * n, +Pde, +rows * d * e * n)
        outs = outs + rows * d * e
    m.unit(r, "post_rerun" if recompute else "post_forward")
    cat = Rd if len(m.ep_parts(z)) > 1 else 0  # two parts: their (rows, d) views cat; one: a view
    r(+cat, +Ri, +Rd, +Tkd, +Ti, +Tkd)  # index_select back to source order; combine all_to_all; to slot order
    r(-Tkd, -Rd, -outs, -cat, -Rd, -Tkd)  # on return: the sent slots, the received, the w2 outputs, cat, back, combined


def _ep_index_bytes(z: Sizes, m: _MoeSplit) -> tuple[Affine | int, Affine | int]:
    """The int64 indices of the dispatch's index_selects, T·k·8 (slots) and R·8 (received rows) bytes:
    ``torch.tensor`` of a Python list, made outside any dispatch mode, so a plain run allocates them
    and the storage tracker (traced) does not see them (0, 0)."""
    if not z.plain:
        return 0, 0
    return z.T * z.cfg.experts_per_token * 8, m.received(z) * 8


def _ep_routed_forward_unsaved(r: _Replay, z: Sizes, m: _MoeSplit, k0: int) -> None:
    """``_ep_routed_forward`` inside a checkpoint: nothing saved; the locals die as Python drops them
    (the dispatched rows on return); ends with ``routed`` live.  ``k0``: as ``_moe_forward_unsaved``."""
    c, e = z.cfg, z.e
    d, de = c.d_model, c.expert_width
    Tkd, Rd = z.act(d) * c.experts_per_token, m.received(z) * d * e
    Ti, Ri = _ep_index_bytes(z, m)  # each dies with its index_select
    r(+Ti, +Tkd, -Ti, +Rd, +Ri, +Rd, -Ri)  # index_select by expert; dispatch all_to_all; index_select to local order
    m.unit(r, "pre_forward")
    outs = 0
    for rows, _ in m.ep_parts(z):  # bmm w1; sigmoid; silu (sigmoid, w1 output die); bmm w3; gate (silu, w3 die)
        Pde = rows * de * e
        r(+Pde, +Pde, +Pde, -Pde, -Pde * k0, +Pde, +Pde, -Pde, -Pde * k0)
        r(+rows * d * e, -Pde)  # bmm w2; the gate dies
        outs = outs + rows * d * e * k0
    m.unit(r, "post_forward")
    cat = Rd if len(m.ep_parts(z)) > 1 else 0
    r(+cat, +Ri, +Rd, -Ri, +Tkd, +Ti, +Tkd, -Ti)  # cat; index_select back; combine all_to_all; to slot order
    r(-Tkd, -Rd, -Rd, -outs, -cat, -Rd, -Tkd)  # on return: sent, received, local rows, w2 outputs, cat, back, combined


def _expert_branch_backward(
    r: _Replay,
    z: Sizes,
    p: dict[str, int],
    rows: Affine | int,
    experts: int,
    last: bool,
    join: bool,
    held: Affine | int | None = None,
) -> None:
    """Backward of one ``Experts`` call on (experts, rows/experts, d) inputs: each bmm gives dW for its
    ``experts`` weight rows, which ``weight[:G]``'s slice backward copies into zeros (E, out, in); ``join``:
    the other part's gradient of each weight waits in its AccumulateGrad buffer and this one joins it;
    ``last``: the last part run, whose bmms release d(routed) and the repeated slots (``held`` bytes each:
    T·k·d·e; expert parallel: the received rows' gradient and the rows themselves, R·d·e)."""
    c, e = z.cfg, z.e
    d, de, k = c.d_model, c.expert_width, c.experts_per_token
    held = z.act(d) * k if held is None else held
    Rde, Rd, W = rows * de * e, rows * d * e, experts * de * d * e
    last_of = (-held,) if last else ()

    def weight(name: str) -> None:
        full = p[f"moe.experts.{name}"]
        r(+full, -W)  # slice backward: zeros (E, out, in), G rows copied in; the bmm's dW dies
        if join:
            r(_Copy(full), -full)  # summed with the other part's (a fresh tensor: in place when plain)

    r(+W, +Rde, *last_of, -Rde)  # w2 bmm: dW, d(gate); [d(routed) dies]; the gate released
    weight("w2")
    r(+Rde, +Rde, -Rde, -Rde, -Rde)  # gate: d silu, d(w3 out)
    r(+W, +Rd, -Rde)  # w3 bmm: dW, dx
    weight("w3")
    r(+Rde, +Rde, -Rde, -Rde)  # silu = a·σ(a)
    r(+Rde, -Rde, -Rde, _Copy(Rde), -Rde)  # sigmoid backward; sum of the two paths
    r(+W, +Rd, -Rde, *last_of, _Copy(Rd), -Rd)  # w1 bmm: dW, dx; [the slots die]; dx joins w3's (fresh: in place)
    weight("w1")


def _ep_routed_backward(r: _Replay, z: Sizes, p: dict[str, int], m: _MoeSplit, rerun: bool = False) -> None:
    """Backward of ``_ep_routed_forward``: from d(routed) (T·k, d) to d(slots) (T·k, d), both live
    (the caller's repeat_interleave backward sums the latter).  Each index_select backward is zeros and
    an ``index_add_`` into them (out of place when traced: ``_Copy``); each all-to-all's backward is the
    reverse all-to-all of the gradient; the parts run last-created first, the batched part last.
    ``rerun``: a checkpoint's rerun has unsharded the experts (``FsdpEvents.experts_pre_backward``)."""
    c, e = z.cfg, z.e
    d = c.d_model
    Tkd, Rd = z.act(d) * c.experts_per_token, m.received(z) * d * e
    Ti, Ri = _ep_index_bytes(z, m)  # each released by its index_select's backward
    r(+Tkd, _Copy(Tkd), -Tkd, -Ti)  # index_select (slot order) backward; d(routed) dies
    r(+Rd, -Tkd)  # combine all_to_all backward: (R, d) back from every rank; its input dies
    r(+Rd, _Copy(Rd), -Rd, -Ri)  # index_select (source order) backward: d(cat), viewed by every part
    m.unit(r, "pre_backward", rerun)
    parts = m.ep_parts(z)
    for j, (rows, experts) in reversed(list(enumerate(parts))):
        _expert_branch_backward(r, z, p, rows, experts, last=j == 0, join=j == 0 and len(parts) > 1, held=Rd)
    m.unit(r, "post_backward")
    for rows, _ in reversed(parts):
        r(+Rd, -rows * d * e)  # the part's slice of the local rows, backward: zeros (R, d); its grad dies
    if len(parts) > 1:
        r(_Copy(Rd), -Rd)  # the two slice backwards summed (fresh: in place when plain)
    r(+Rd, _Copy(Rd), -Rd, -Ri)  # index_select (local order) backward
    r(+Tkd, -Rd)  # dispatch all_to_all backward: (T·k, d) back to the slots' ranks; its input dies
    r(+Tkd, _Copy(Tkd), -Tkd, -Ti)  # index_select (by expert) backward: d(slots)


def _moe_grad_copy(z: Sizes, m: _MoeSplit | None) -> Affine | int:
    """T·k·d·e (fp32 under FSDP2's bf16 policy with autocast, ``_moe_mixed``) when the MoE backward's
    first node to unpack saved tensors comes after the sum's backward copy (no shared experts), else 0."""
    if m is None or z.cfg.shared_experts:
        return 0
    return z.act(z.cfg.d_model) * z.cfg.experts_per_token * _moe_mixed(z)


def _moe_backward(
    r: _Replay, z: Sizes, p: dict[str, int], m: _MoeSplit, copied: bool = False, rerun: bool = False
) -> None:
    """``MixtureOfExperts`` backward (autograd runs the later-created nodes first: the shared experts,
    then the remainder part, the full part, repeat_interleave, topk, softmax, the router); ends with
    d(flat) (T, d) live and flat (ln2's output) released."""
    c, e = z.cfg, z.e
    d, E, k = c.d_model, c.num_experts, c.experts_per_token
    Td, TE, Tr, Tkd, Tk = z.act(d), z.act(E), z.act(1), z.act(d) * k, z.T * k * e
    f = _moe_mixed(z)  # 2: the weighting and the routing from exp on in fp32 (``_moe_forward``)
    if c.shared_experts:
        Sf = z.act(c.shared_width)
        r(+p["moe.shared.w2"], +Sf, -Sf)  # shared w2: dW, d(gate); gate product released
        r(+Sf, +Sf, -Sf, -Sf, -Sf)  # gate: d silu, d(w3 out)
        r(+p["moe.shared.w3"], +Td, -Sf)  # w3: dW, dx
        r(+Sf, +Sf, -Sf, -Sf)  # silu = a·σ(a)
        r(+Sf, -Sf, -Sf, _Copy(Sf), -Sf)  # sigmoid backward; sum of the two paths
        r(+p["moe.shared.w1"], +Td, -Sf, _Copy(Td), -Td)  # w1: dW, dx; dx joins w3's (fresh mm outputs: in place)
    if not copied:  # (``copied``: done before a checkpoint's rerun)
        _moe_sum_backward(r, z)
    Tk = Tk * f
    if f > 1:  # g and the weights fp32, routed bf16: as amp-bf16's
        _mixed_weighting_backward(r, Tkd * f, Tkd, Tk, z.mixed_add_temp(d) * k, rerun)
    elif rerun:  # weighting mul: d(routed), g·routed; the rerun's routed and weights die with the node (only
        # unpacked), before the engine sums g·routed to d(weights) (T·k·e); the product and g die
        r(+Tkd, +Tkd, -Tkd, -Tk, +Tk, -Tkd, -Tkd)
    else:  # weighting mul: d(routed) = g·weights; g·routed summed to d(weights) (T·k·e); the product, g, the
        # saved weights and routed die
        r(+Tkd, +Tkd, +Tk, -Tkd, -Tkd, -Tk, -Tkd)
    F = m.full_rows(z)
    if m.ranks > 1:
        _ep_routed_backward(r, z, p, m, rerun)
    if m.rem:  # created last, run first: the remainder's (R, 1, d) bmms over experts 0..R-1
        _expert_branch_backward(r, z, p, m.rem, m.rem, last=not m.q, join=False)
        r(+Tkd, -m.rem * d * e)  # slots[q·E:] slice backward: zeros (T·k, d); the (R, 1, d) grad dies
    if m.q:
        _expert_branch_backward(r, z, p, F, E, last=True, join=bool(m.rem))
        if m.q > 1:
            r(+F * d * e, -F * d * e)  # (E, q, d) -> (q, E, d) -> (q·E, d) through the transpose: a copy
        r(+Tkd, -F * d * e)  # slots[:q·E] slice backward: zeros (T·k, d); the part's grad dies
        if m.rem:
            r(_Copy(Tkd), -Tkd)  # the two slice backwards summed (fresh: in place when plain)
    r(+Td, -Tkd)  # repeat_interleave backward: sum over the k copies -> (T, d)
    if c.shared_experts:
        r(_Copy(Td), -Td)  # joins the shared experts' d(flat)
    # topk backward: zeros (T, E), scatter into them (in place when plain); d(weights) and the indices die
    TE, Tr, TEe = TE * f, Tr * f, TE  # f = 2: the routing's fp32 (T·E·4, T·4); TEe: the logits' bf16
    r(+TE, _Copy(TE), -Tk, -z.T * k * 8)
    r(+TE, +TE, +TE, +TE, -TE, -TE, -TE, +TE)  # softmax's divide backward: d e, d Σ
    if rerun:  # the rerun's Σ, only unpacked, dies with the divide node, before its grad is summed
        r(-Tr, +Tr, -TE, -TE, _Copy(TE), -Tr)  # Σ backward; paths summed
    else:
        r(+Tr, -TE, -TE, -Tr, _Copy(TE), -Tr)  # Σ backward; paths summed
    r(+TE, -TE, -TE)  # exp backward; exp released
    if f > 1:
        r(+TEe, -TE)  # back through exp's fp32 cast
        TE = TEe
    # router mm: dW (E·d·e), dx; d(logits) and flat (ln2's output) released; dx joins d(flat) (in place when plain)
    r(+p["moe.router"], +Td, -TE, -Td, _Copy(Td), -Td)


def _layer_runs(
    r: _Replay,
    c: ModelConfig,
    split: _MoeSplit | None,
    backward: bool,
    body: Callable[[_Replay, _MoeSplit | None], None],
    units: FsdpEvents | None = None,
) -> None:
    """Replay the blocks in runs of equal kind (dense or mixture of experts), each run with ``_repeat``:
    forward layers 0 .. L−1, backward L−1 .. 1 (layer 0, the ``last``, is replayed apart).  ``units``:
    FSDP2's events around each block (``analytic.fsdp``); a run then also needs equal neighbours."""
    order = range(c.num_layers - 1, 0, -1) if backward else range(c.num_layers)
    if units is None and not c.moe:  # one run of alike dense blocks
        if order:
            _repeat(r, len(order), lambda q: _block(q, None, order[0], body, None, backward))
        return
    keys = [(c.layer_moe(i), units.key(i, backward) if units else None) for i in order]
    start = 0
    while start < len(keys):
        end = start
        while end < len(keys) and keys[end] == keys[start]:
            end += 1
        moe, i = split if keys[start][0] else None, order[start]
        _repeat(r, end - start, lambda q, m=moe, i=i: _block(q, m, i, body, units, backward))
        start = end


def _block(q: _Replay, m, i: int, body, units: FsdpEvents | None, backward: bool) -> None:
    """One block, between FSDP2's pre- and post- hooks of its unit (if sharded)."""
    m = m.in_block(units, i) if m is not None else None
    if units is None:
        body(q, m)
    elif backward:
        units.block_pre_backward(q, i)
        body(q, m)
        units.block_post_backward(q, i)
    else:
        units.block_pre_forward(q, i)
        body(q, m)
        units.block_post_forward(q, i)


def _layer_forward(
    r: _Replay, z: Sizes, recompute: bool = False, cached: bool = False, moe: _MoeSplit | None = None
) -> None:
    """One block, autograd saving what its formulas need (``moe``: a mixture-of-experts block).  ``recompute``: the backward-time rerun of
    a checkpointed block, which stops once its last saved tensor is packed again (w2's inputs).
    ``cached`` (selective): the rerun takes mm, bmm and fused-attention outputs from the SAC cache
    instead of computing them, so ``n = 0`` drops those allocations."""
    c, T, Td, Tq, Tkv, Tf = z.cfg, z.T, z.act(z.cfg.d_model), z.act(z.cfg.q_dim), z.act(z.cfg.kv_dim), z.act(z.cfg.d_ff)
    Sc, Sr = z.scores, z.score_rows
    n = 0 if cached else 1  # 0: a matmul output handed back by the SAC cache
    sp, Tr = z.sp > 1, z.residual  # Tr: the residual stream (T/M rows under sequence parallel)
    # CPU, naive: the wrapped 1/√d_head a rerun's scale node holds until the rerun's graph dies, at its early stop
    unwound = z.wrap(z.e)[0] if recompute and not z.sdpa else 0
    _norm_forward(r, z, z.rows, c.d_model)  # ln1
    _sp_all_gather(r, z)  # its output gathered (saved by q, k, v)
    _qkv_forward(r, z, n)
    if c.qk_norm:
        _norm_forward(r, z, T * c.num_heads, c.d_head)
        _norm_forward(r, z, T * c.kv_heads, c.d_head)
        if z.e != 4:
            r(-Tq, -Tkv)  # 16-bit: the projections die (the norms kept fp32 copies)
    _rope_forward(r, z, c.q_dim)
    _rope_forward(r, z, c.kv_dim)
    r(-Tkv, -Tq)  # un-rotated q, k die (RoPE saves only its tables)
    if z.sdpa:
        # flash kernel: output (B, h, S, d_head) and logsumexp (B, h, S) fp32, both saved (CPU: its scratch)
        _flash_forward(r, z, n, Tq, z.e)
        r(+Tq * _merge_copy(z))  # merge heads: the transposed output copied (saved by output_proj)
        if sp:  # output projection (a partial sum), reduce-scattered; ln1's own output dies; residual add
            r(+Td * n)
            _sp_reduce_scatter(r, z, Td)
            r(-Tr, +Tr, -Tr)
        else:  # output projection (TP: all-reduced); residual add; the projection's output dies
            r(+Td * n)
            _tp_all_reduce(r, z, Td)
            r(+Td, -Td)
    else:
        w8, we = z.wrap(z.e)  # CPU: the wrapped 1/√d_head, saved until the scale's backward (a rerun's: ``unwound``)
        r(+Sc * n, +w8, +we, +Sc, -we, -Sc)  # QKᵀ; · 1/√d_head; raw scores die
        r(+z.e, +Sc, -z.e, -Sc)  # where(mask, scores, -inf)
        r(+Sr, +Sc, -Sr)  # softmax: z = x − max(x)
        if z.softmax32:  # z.float(), exp (saved), the copy dies, Σ (saved), divide, z dies, to bf16 (saved by AV)
            r(+2 * Sc, +2 * Sc, -2 * Sc, +2 * Sr, +2 * Sc, -Sc, +Sc)
            r(+Tkv, +Tq * n, -Sc, -2 * Sc)  # V made contiguous (saved); AV; masked scores die; fp32 probs die
        else:
            r(+Sc, +Sr, +Sc, -Sc)  # exp (saved); Σ (saved); divide (saved by AV)
            r(+Tkv, +Tq * n, -Sc)  # V made contiguous (saved); AV; masked scores die
        r(+Tq, -Tq)  # merge heads (saved by output_proj)
        if sp:  # output projection (a partial sum), reduce-scattered (in its hook); then v and ln1's own output die
            r(+Td * n)  # (attention's locals die with its return); residual add
            _sp_reduce_scatter(r, z, Td)
            r(-Tkv, -Tr, +Tr, -Tr)
        else:  # output projection (TP: all-reduced); v dies; residual add
            r(+Td * n)
            _tp_all_reduce(r, z, Td)
            r(-Tkv, +Td, -Td)
    _norm_forward(r, z, z.rows, c.d_model)  # ln2
    if moe is None:
        _sp_all_gather(r, z)  # its output gathered (saved by w1, w3)
    if moe is not None:
        _moe_forward(r, z, moe, recompute, cached)
        if recompute:  # early stop (see ``_moe_forward``)
            r(-unwound)
            if z.e != 4:
                r(-Td)  # 16-bit: the middle stream (unsaved: ln2 kept an fp32 copy) dies as the rerun unwinds
            return
        r(+Td, -Td)  # residual add; the MoE output dies
        if z.e != 4:
            r(-Td, -Td)  # 16-bit: the block's input and middle stream die (norms kept fp32 copies)
        return
    r(+Tf * n, +Tf, +Tf, +Tf * n, +Tf)  # w1, sigmoid, silu, w3, gate (all saved)
    if recompute:  # checkpoint's early stop: w2's inputs were the block's last saved tensors
        r(-unwound)
        if sp:
            r(-Tr)  # ln2's own output (w1, w3 saved the gathered one) dies as the rerun unwinds
        if z.e != 4:
            r(-Tr)  # 16-bit: the middle stream (unsaved: ln2 kept an fp32 copy) dies as the rerun unwinds
        return
    r(+Td)  # w2
    _tp_all_reduce(r, z, Td)
    if sp:  # reduce-scattered; ln2's own output dies
        _sp_reduce_scatter(r, z, Td)
        r(-Tr)
    r(+Tr, -Tr)  # residual add
    if z.e != 4:
        r(-Tr, -Tr)  # 16-bit: the block's input and middle stream die (norms kept fp32 copies)


def _norm_forward_unsaved(r: _Replay, z: Sizes, rows: int, width: int, xe: int | None = None) -> None:
    """RMSNorm forward where autograd keeps nothing (inside a checkpoint): every tensor lives
    as long as Python holds it (the locals die when ``RMSNorm.forward`` returns)."""
    xe = z.e if xe is None else xe
    X, R = rows * width * 4, rows * 4
    gain = width * 4 if z.e != 4 else 0  # g.to(fp32): a copy only for 16-bit parameters
    w8, w4 = z.wrap()  # CPU only: mean's "/ width" and "+ eps" wrap a Python number
    if xe != 4:
        r(+X)  # x.to(fp32)
    r(+X, +R, +w8, +w4, -w4, -w8, -X)  # pow; mean; square dies
    r(+w8, +w4, +R, -w4, -w8, -R, +R, -R)  # + eps; mean dies; rsqrt; sum dies
    if xe == 4:
        r(+X, -R, +X, -X)  # y = x·rsqrt; rsqrt dies; y·g; y dies on return
    else:
        r(+X, -R, +gain, +X, -gain)  # y; rsqrt dies; g.to(fp32); y·g; g copy dies
        r(+rows * width * xe, -X, -X, -X)  # cast back; y·g, y and the fp32 input die on return


def _rope_forward_unsaved(r: _Replay, z: Sizes, width: int) -> None:
    """RoPE where autograd keeps nothing: the cos/sin rows and both halves die on return."""
    rot = _rotated(z, width)
    H, cs = z.act(rot) // 2, z.rope_table
    for _ in ("cos", "sin"):
        if z.e == 4:
            r(+cs)  # table rows
        else:
            r(+cs * 4 // z.e, +cs, -cs * 4 // z.e)  # fp32 rows, cast
    r(+H, +H, +H, -H, -H)  # x_even·cos − x_odd·sin
    r(+H, +H, +H, -H, -H)  # x_even·sin + x_odd·cos
    r(+2 * H, -cs, -cs, -H, -H)  # stack + flatten; cos, sin and the two halves die on return
    if rot != width:
        r(+z.act(width), -2 * H)  # partial rotary: cat with the passed-through part; the rotated part dies


def _layer_forward_unsaved(r: _Replay, z: Sizes, cached: bool = False, moe: _MoeSplit | None = None) -> None:
    """One block inside ``torch.utils.checkpoint``: autograd saves nothing, only the block's input is
    kept (by the checkpoint); every other tensor dies when Python drops it.  ``cached`` (selective
    checkpointing): the outputs of mm, bmm and the fused kernel are also kept, in the SAC cache
    (``torch.utils.checkpoint`` ``_CachingTorchDispatchMode``), until the backward's rerun takes them.
    ``k = 0`` marks a free that the cache prevents."""
    c, T, Td, Tq, Tkv, Tf = z.cfg, z.T, z.act(z.cfg.d_model), z.act(z.cfg.q_dim), z.act(z.cfg.kv_dim), z.act(z.cfg.d_ff)
    Sc, Sr = z.scores, z.score_rows
    k = 0 if cached else 1  # 0: a matmul output the SAC cache keeps alive
    out = 1 if z.all_reduce else k  # a projection's output handed on: TP's all-reduced one is in no cache
    sp, Tr = z.sp > 1, z.residual  # Tr: the residual stream (T/M rows under sequence parallel)
    _norm_forward_unsaved(r, z, z.rows, c.d_model)  # ln1
    _sp_all_gather(r, z)  # its output gathered
    _qkv_forward(r, z, kept=k)
    proj = 1 if c.qkv_bias else k  # q, k, v: a bias add's output is in no cache
    if c.qk_norm:
        _norm_forward_unsaved(r, z, T * c.num_heads, c.d_head)
        _norm_forward_unsaved(r, z, T * c.kv_heads, c.d_head)
        r(-Tq * proj, -Tkv * proj)  # the projections die (q, k rebound to the normed heads)
    _rope_forward_unsaved(r, z, c.q_dim)
    _rope_forward_unsaved(r, z, c.kv_dim)
    unrotated = 1 if c.qk_norm else proj  # the normed heads always die; bare projections only uncached
    r(-Tkv * unrotated, -Tq * unrotated)  # un-rotated q, k die
    if z.sdpa:
        _flash_forward(r, z, 1, Tq, z.e)  # flash kernel: output, logsumexp
        r(-z.lse * k)  # the logsumexp dies on return
        r(+Tq * _merge_copy(z), -Tq * k * _merge_copy(z))  # merge heads (a copy); the kernel's output dies
    else:
        # QKᵀ; · 1/√d_head (CPU: its wrapped 8 bytes stay: autograd keeps a wrapped number itself, not via
        # the checkpoint's pack hook, until the scale's backward); raw scores die
        r(+Sc, +z.wrap(z.e)[0], +z.wrap(z.e)[1], +Sc, -z.wrap(z.e)[1], -Sc * k)
        r(+z.e, +Sc, -z.e, -Sc)  # where(mask, scores, -inf); scaled scores die
        if z.softmax32:  # z.float(), exp, the copy dies, Σ, divide; Σ, z, exp die; probs to bf16
            r(+Sr, +Sc, -Sr, +2 * Sc, +2 * Sc, -2 * Sc, +2 * Sr, +2 * Sc, -2 * Sr, -Sc, -2 * Sc, +Sc)
        else:
            r(+Sr, +Sc, -Sr, +Sc, +Sr, +Sc, -Sr, -Sc, -Sc)  # softmax; z and exp die on return
        r(+Tkv, +Tq, -Tkv, -Sc, -Sc)  # V contiguous; AV; V copy, masked scores and probs die
        if z.softmax32:
            r(-2 * Sc)  # the fp32 probs die
        r(+Tq, -Tq * k)  # merge heads (a copy); AV output dies
    heads = _merge_copy(z) or k  # merged heads: a copy dies; a view of the kernel's output dies with it
    if sp:  # output projection (a partial sum), reduce-scattered; q, k, v, merged heads, ln1's outputs die
        r(+Td)
        _sp_reduce_scatter(r, z, Td * k)
        r(-Tq, -Tkv, -Tkv * proj, -Tq * heads, -Td, -Tr)
        r(+Tr, -Tr)  # residual add; attention output dies
    else:  # output projection (TP: all-reduced; the SAC cache keeps the partial); q, k, v, merged heads, ln1 output die
        r(+Td)
        _tp_all_reduce(r, z, Td, Td * k)
        r(-Tq, -Tkv, -Tkv * proj, -Tq * heads, -Td)
        r(+Td, -Td * out)  # residual add; attention output dies
    _norm_forward_unsaved(r, z, z.rows, c.d_model)  # ln2
    if moe is None:
        _sp_all_gather(r, z)  # its output gathered
    if moe is not None:
        _moe_forward_unsaved(r, z, moe, cached)
        r(-Td, +Td, -Td, -Td)  # ln2 output dies; residual add; the MoE output and the middle stream die
        return
    r(+Tf, +Tf, +Tf, -Tf, -Tf * k)  # w1; sigmoid; silu; sigmoid and w1 output die
    r(+Tf, +Tf, -Tf, -Tf * k)  # w3; gate; silu and w3 output die
    if sp:  # w2 (a partial sum), reduce-scattered; the gate and ln2's two outputs die
        r(+Td)
        _sp_reduce_scatter(r, z, Td * k)
        r(-Tf, -Td, -Tr)
        r(+Tr, -Tr, -Tr)  # residual add; FFN output and middle stream die
    else:  # w2 (TP: all-reduced); gate and ln2 output die
        r(+Td)
        _tp_all_reduce(r, z, Td, Td * k)
        r(-Tf, -Td)
        r(+Td, -Td * out, -Td)  # residual add; FFN output and middle stream die


def _layer_backward(r: _Replay, z: Sizes, p: dict[str, int], last: bool, moe: _MoeSplit | None = None) -> None:
    """One block's backward (layer 0 is ``last``).  Under full checkpointing the block is first
    rerun (``_layer_forward(recompute=True)``), and the last frame to die, layer 0's, releases the
    positions and the causal mask that every block's recompute closure held."""
    c, T, Td, Tq, Tkv, Tf = z.cfg, z.T, z.act(z.cfg.d_model), z.act(z.cfg.q_dim), z.act(z.cfg.kv_dim), z.act(z.cfg.d_ff)
    Sc, Sr = z.scores, z.score_rows
    checkpointed = z.setup.checkpoint != "none"
    rerun = checkpointed
    early = _moe_grad_copy(z, moe) if rerun else 0
    if moe is None:
        _sp_all_gather(r, z)  # sequence parallel: w2's reduce-scatter backward gathers d(out), before any rerun
    if rerun:
        # (MoE without shared experts: the sum's backward copies d(out) before the first node that needs
        # saved tensors, the weighting mul, starts the rerun)
        if early:
            _moe_sum_backward(r, z)
        _layer_forward(r, z, recompute=True, cached=z.setup.checkpoint == "selective", moe=moe)
    frame: tuple = ()  # what a checkpoint frame holds, released with the block input's last saved holder
    if checkpointed and last:
        frame = (8 * z.seq,) if z.sdpa else (8 * z.seq, z.seq * z.seq)  # positions (and mask), shared by all
    if z.setup.checkpoint == "selective" and (moe is None or c.shared_experts):
        frame += (Td,)  # w2's output (MoE: the shared experts'), left in the SAC cache by the early-stopping rerun
    if checkpointed and z.e != 4:
        frame += (z.residual,)  # 16-bit: the block input itself (fp32: it is ln1's saved input, released there)
    sp = z.sp > 1
    if moe is not None:
        _moe_backward(r, z, p, moe, copied=bool(early), rerun=rerun)
    else:
        r(+p["ffn.w2"], +Tf, -Tf, -Td * sp)  # w2: dW, d(gate); gate product released; (SP) the gathered d(out) too
        r(+Tf, +Tf, -Tf, -Tf, -Tf)  # gate: d silu, d(w3 out)
        r(+p["ffn.w3"], +Td, -Tf)  # w3: dW, dx
        _tp_all_reduce(r, z, Td)
        r(+Tf, +Tf, -Tf, -Tf)  # silu = a·σ(a)
        r(+Tf, -Tf, -Tf, _Copy(Tf), -Tf)  # sigmoid backward; sum of the two paths
        r(+p["ffn.w1"], +Td, -Tf, -Td)  # w1: dW, dx; ln2 output released
        _tp_all_reduce(r, z, Td)
        r(*_summed(z, Td))  # dx summed into w3's
        if sp:
            _sp_reduce_scatter(r, z, Td)  # d(gathered ln2 output) to ln2's T/M rows
    _norm_backward(r, z, z.rows, c.d_model, residual=True, rerun=rerun, sp=sp)  # ln2
    _sp_all_gather(r, z)  # the output projection's reduce-scatter backward gathers d(attention output)
    if z.sdpa:
        # output_proj: dW, d(heads); merged heads released; (SP) the gathered d(output) too
        r(+p["attn.output_proj"], +Tq, -Tq * _merge_copy(z), -Td * sp)
        # flash backward: dQ, dK, dV; then d(out), q, k, out, v, logsumexp and the output released
        _flash_backward(r, z, Tq, Tkv, z.e)
        r(-Tq, -Tkv, -Tq, -Tkv, -z.lse, -Tq)
    else:
        # output_proj: dW, d(heads); (SP) the gathered d(output) released; contiguous copy
        r(+p["attn.output_proj"], +Tq, -Tq, -Td * sp, +Tq, -Tq)
        r(+Tkv, +Sc, -Tq, -Tkv, -Sc)  # AV: dV, d(probs); V and probs released
        s, f = Sc, 2 if z.softmax32 else 1  # s: the bf16 scores; f: 2 when the softmax runs in fp32
        Sc, Sr = f * Sc, f * Sr
        if z.softmax32:
            r(+Sc, -s)  # d(probs) to fp32
        r(+Sc, +Sc, +Sc, +Sc, -Sc, -Sc, -Sc, +Sc)  # divide backward: d e, d Σ
        if rerun:  # the rerun's Σ, only unpacked, dies with the divide node, before its grad is summed
            r(-Sr, +Sr, -Sc, -Sc, _Copy(Sc), -Sr)  # Σ backward; paths summed
        else:
            r(+Sr, -Sc, -Sc, -Sr, _Copy(Sc), -Sr)  # Σ backward; paths summed
        r(+Sc, -Sc, -Sc)  # exp backward; exp released
        if z.softmax32:
            r(+s, -Sc)  # z.float() backward: to bf16
        Sc = s
        r(+z.e, +Sc, -z.e, -Sc)  # where backward
        if last and not checkpointed:
            r(-z.seq * z.seq)  # the shared causal mask dies with the last where node
        r(
            +z.wrap(z.e)[1], +Sc, -z.wrap(z.e)[1], -Sc, -z.wrap(z.e)[0]
        )  # scale backward (CPU: the saved scalar, cast, then released)
        r(+Tkv, +Tq, -Sc, -Tkv, -Tq)  # QKᵀ: dK, dQ; rotated k, q released
    _rope_backward(r, z, c.kv_dim, freed=_ring(z) is None)
    _rope_backward(r, z, c.q_dim)
    if c.qk_norm:
        _norm_backward(r, z, T * c.kv_heads, c.d_head, residual=False, rerun=rerun)
        _norm_backward(r, z, T * c.num_heads, c.d_head, residual=False, rerun=rerun)
    dv = _dv_grad(r, z, p, c.kv_dim)
    r(+p["attn.v_proj"], +Td, -Tkv * dv)  # v_proj: dW, dx; dV released
    _tp_all_reduce(r, z, Td)
    _proj_grad(r, z, p, "k_proj", c.kv_dim, contiguous=True)
    r(+p["attn.k_proj"], +Td, -Tkv)  # k_proj
    _tp_all_reduce(r, z, Td)
    r(*_summed(z, Td))  # summed into v's
    _proj_grad(r, z, p, "q_proj", c.q_dim, contiguous=True)
    # q_proj; ln1 output released; summed into the k + v sum (a fresh tensor: in place when plain; under
    # sequence parallel the gathered input is a DTensor, a tensor subclass: out of place in both runs)
    r(+p["attn.q_proj"], +Td, -Tq, -Td)
    _tp_all_reduce(r, z, Td)
    r(*_join(Td, sp))
    if sp:
        _sp_reduce_scatter(r, z, Td)  # d(gathered ln1 output) to ln1's T/M rows
    _norm_backward(r, z, z.rows, c.d_model, residual=True, frame=frame, rerun=rerun, sp=sp)  # ln1


def _amp_sizes(z: Sizes, p: dict[str, int]):
    """amp-bf16 sizes: (fp32 d-wide activation, bf16 views of q, kv, d, d_ff activations, bf16 scores
    and row statistics, fp32 scores and rows, bf16 weight copies per matmul = half the fp32 gradient)."""
    b, c = z.bf16, z.cfg
    w = {k: v // 2 for k, v in p.items()}  # autocast's bf16 copy of each (transposed) weight
    return z.act(c.d_model), b.act(c.d_model), b.act(c.q_dim), b.act(c.kv_dim), b.act(c.d_ff), w


def _amp_attention_sizes(z: Sizes) -> tuple[Sizes, int, int, int]:
    """amp-bf16: the ``Sizes`` of q, k and v from their projections on (bf16; with ``qkv_bias`` fp32: the
    ``Bias`` add of a bf16 matmul output and an fp32 bias promotes to fp32), their q and kv bytes, and
    ``casts``: 1 when the attention matmuls (and the fused kernel) take bf16 copies of fp32 q, k, v."""
    a = z if z.cfg.qkv_bias else z.bf16
    return a, a.act(z.cfg.q_dim), a.act(z.cfg.kv_dim), int(z.cfg.qkv_bias)


def _amp_qkv_forward(r: _Replay, z: Sizes, w: dict[str, int], n: int = 1, kept: int = 1, saved: bool = True) -> None:
    """The q, k and v projections under amp-bf16: each matmul casts its weight, then the fp32 input, to
    bf16 copies (both saved; ``saved`` False, inside a checkpoint: they die with the matmul) and returns
    bf16 (``n`` = 0: handed back by the SAC cache).  With ``qkv_bias`` the add of the fp32 bias (on no
    autocast list) promotes to an fp32 output (CPU: the bf16 operand first copied to fp32, as
    ``Sizes.mixed_add_temp``) and the bf16 matmul output dies (``kept`` = 0: the SAC cache keeps it)."""
    c, b = z.cfg, z.bf16
    Td2 = b.act(c.d_model)
    for name, width in (("q_proj", c.q_dim), ("k_proj", c.kv_dim), ("v_proj", c.kv_dim)):
        W, X2, X4 = w[f"attn.{name}"], b.act(width), z.act(width)
        r(+W, +Td2, +X2 * n)
        if not saved:
            r(-Td2, -W)
        if c.qkv_bias:
            mix = X4 if z.cpu else 0
            r(+mix, +X4, -mix, -X2 * kept)


def _amp_moe_sizes(z: Sizes, m: _MoeSplit):
    """amp-bf16 sizes of one MoE layer: the bf16 ``Sizes`` and, for the full and the remainder part (None
    when absent), (rows·d_e·2, rows·d·2, G·d·d_e·2): bf16 slot rows of d_e and of d, and the G experts'
    bf16 weight copy of one matrix."""
    c, b = z.cfg, z.bf16
    d, E, de = c.d_model, c.num_experts, c.expert_width
    F = m.full_rows(z)
    full = (F * de * 2, F * d * 2, E * d * de * 2) if m.q else None
    rem = (m.rem * de * 2, m.rem * d * 2, m.rem * d * de * 2) if m.rem else None
    return b, full, rem


def _amp_moe_forward(
    r: _Replay, z: Sizes, p: dict[str, int], m: _MoeSplit, recompute: bool = False, cached: bool = False
) -> None:
    """``MixtureOfExperts.forward`` under bf16 autocast (CUDA's lists, ``model/autocast.py``), autograd
    saving; ends with its fp32 output (T, d) live.  Each matmul (router mm, expert bmm, shared mm) casts
    its weight, then an fp32 input, to saved bf16 copies (the w2s take the bf16 gate as it is); softmax
    runs in bf16 up to ``exp`` (CUDA's fp32 list: exp, Σ and the probabilities are fp32); top-k returns
    fp32 weights; routed (bf16) · weights (fp32) promotes to fp32.  The fp32 repeated slots are saved by
    nothing here (the bmms keep their own bf16 copies) and die with the forward's locals, as does
    ln2's output (the block's caller drops it).  ``recompute``/``cached``: as ``_moe_forward``."""
    c = z.cfg
    d, E, k = c.d_model, c.num_experts, c.experts_per_token
    b, full, rem = _amp_moe_sizes(z, m)
    n = 0 if cached else 1
    Td, Td2, TE2, TE4, Tr2, Tr4 = z.act(d), b.act(d), b.act(E), z.act(E), b.act(1), z.act(1)
    Tkd4, Tkd2 = z.act(d) * k, b.act(d) * k
    r(+p["moe.router"] // 2, +Td2, +TE2 * n)  # router: bf16 weight copy d·E·2 and input copy T·d·2 (saved); logits
    r(+Tr2, +TE2, -Tr2)  # softmax (bf16): max (dies at once); z = logits − max
    # exp: fp32 copy of z, exp (saved), the copy dies; Σ (fp32, saved); divide (fp32); z and the logits die
    r(+TE4, +TE4, -TE4, +Tr4, +TE4, -TE2, -TE2)
    r(+z.T * k * 4, +z.T * k * 8, -TE4)  # topk: fp32 values (saved by the weighting), int64 indices; probs die
    r(+Tkd4)  # repeat_interleave: fp32 slots (T·k·d·4)
    for part in (full, rem):
        if part is None:
            continue
        Rde, Rd, W = part
        r(+W, +Rd, +Rde * n, +Rde, +Rde)  # w1: weight and input copies (saved), output; sigmoid; silu
        r(+W, +Rd, +Rde * n, +Rde)  # w3: weight and input copies (saved), output; gate
        r(+W, +Rd * n)  # w2: weight copy (saved; the gate is bf16 already); output (bf16)
        if part is full and m.q > 1:
            r(+Rd)  # transpose + reshape to slot order, a copy
    parts = _moe_unsaved_parts(b, m)  # the bf16 expert outputs saved by nothing
    if m.q and m.rem:
        r(+Tkd2)  # cat -> routed (bf16, saved by the weighting mul)
    if recompute and not c.shared_experts:
        r(-Tkd4, *parts)  # early stop at the weighting mul; the fp32 slots and unsaved outputs die
        return
    # routed · weights (fp32 by type promotion; on the CPU through an fp32 copy of routed, ``mix``, freed
    # with the op); sum over k (fp32); the product dies
    mixk = z.mixed_add_temp(d) * k
    r(+mixk, +Tkd4, -mixk, +Td, -Tkd4)
    if c.shared_experts:
        Sf, ws = b.act(c.shared_width), {x: p[f"moe.shared.{x}"] // 2 for x in ("w1", "w2", "w3")}
        r(+ws["w1"], +Td2, +Sf * n, +Sf, +Sf)  # shared w1 (copies saved); sigmoid; silu
        r(+ws["w3"], +Td2, +Sf * n, +Sf)  # w3 (copies saved); gate
        r(+ws["w2"])  # w2's weight copy
        if recompute:  # early stop at the shared w2: the routed sum, the slots and the unsaved outputs die
            r(-Td, -Tkd4, *parts)
            return
        mix = z.mixed_add_temp(d)  # CPU only: the bf16 operand of fp32 + bf16, copied to fp32
        r(+Td2 * n, +mix, +Td, -mix, -Td2, -Td)  # w2 (bf16); routed + shared (fp32); both summands die
    r(-Tkd4, *parts)  # on return: the fp32 slots and the unsaved expert outputs


def _amp_expert_branch_backward(r: _Replay, z: Sizes, p: dict[str, int], part: tuple, last: bool, join: bool) -> None:
    """``_expert_branch_backward`` under amp-bf16: each bmm gives bf16 dW and dx, releases its saved bf16
    weight and input copies, and autocast's ``_to_copy`` backward casts dx (the input copy's, run first: it
    was made last) and dW to fp32 before the slice backward; ``last`` releases the bf16 d(routed)."""
    Rde, Rd, W = part
    Tkd2 = z.bf16.act(z.cfg.d_model) * z.cfg.experts_per_token
    W4, Rd4 = 2 * W, 2 * Rd  # fp32 dW of G experts, fp32 dx
    last_of = (-Tkd2,) if last else ()

    def weight(name: str) -> None:
        full = p[f"moe.experts.{name}"]
        r(+W4, -W, +full, -W4)  # dW to fp32; slice backward: zeros (E, out, in), G rows copied in
        if join:
            r(_Copy(full), -full)  # summed with the other part's (in place when plain)

    r(+W, +Rde, *last_of, -W, -Rde)  # w2 bmm: dW, d(gate) (bf16); [d(routed) dies]; weight copy, gate released
    weight("w2")
    r(+Rde, +Rde, -Rde, -Rde, -Rde)  # gate: d silu, d(w3 out)
    r(+W, +Rd, -Rde, -W, -Rd, +Rd4, -Rd)  # w3 bmm: dW, dx; copies released; dx to fp32
    weight("w3")
    r(+Rde, +Rde, -Rde, -Rde)  # silu = a·σ(a)
    r(+Rde, -Rde, -Rde, _Copy(Rde), -Rde)  # sigmoid backward; sum of the two paths
    r(+W, +Rd, -Rde, -W, -Rd, +Rd4, -Rd, _Copy(Rd4), -Rd4)  # w1 bmm: dW, dx; copies released; dx fp32, joins w3's
    weight("w1")


def _mixed_weighting_backward(r: _Replay, Tkd4, Tkd2, Tk4, mix, rerun: bool) -> None:
    """The weighting mul's backward when routed is bf16 (T·k·d·2: ``Tkd2``) and the weights and the
    gradient g are fp32 (amp-bf16; FSDP2's bf16 policy with autocast): g·routed (fp32; on the CPU through
    an fp32 copy of routed, ``mix``, freed with the op), g·weights (fp32); d(routed) cast to routed's bf16
    (the fp32 one dies); g·routed summed to d(weights) (``Tk4``); the product, g, the saved weights and
    routed die.  ``rerun``: the rerun's routed and weights, only unpacked, die before the engine's cast
    and sum."""
    r(+mix, +Tkd4, -mix, +Tkd4)
    if rerun:
        r(-Tkd2, -Tk4, +Tkd2, -Tkd4, +Tk4, -Tkd4, -Tkd4)
    else:
        r(+Tkd2, -Tkd4, +Tk4, -Tkd4, -Tkd4, -Tk4, -Tkd2)


def _amp_moe_backward(
    r: _Replay, z: Sizes, p: dict[str, int], m: _MoeSplit, copied: bool = False, rerun: bool = False
) -> None:
    """``_moe_backward`` under amp-bf16 (see ``_amp_moe_forward`` for the dtypes): the shared experts as
    the dense amp FFN, then the experts' parts, repeat_interleave, topk, softmax (fp32 from exp on), the
    router; ends with d(flat) (T, d, fp32) live."""
    c = z.cfg
    d, E, k = c.d_model, c.num_experts, c.experts_per_token
    b, full, rem = _amp_moe_sizes(z, m)
    Td, Td2, TE2, TE4, Tr4 = z.act(d), b.act(d), b.act(E), z.act(E), z.act(1)
    Tkd4, Tkd2, Tk4 = z.act(d) * k, b.act(d) * k, z.T * k * 4
    if c.shared_experts:  # (the add's backward cast d(out) to bf16 for them first: ``_amp_layer_backward``)
        Sf, x = b.act(c.shared_width), "moe.shared."
        w = {n: p[x + n] // 2 for n in ("w1", "w2", "w3")}
        r(+w["w2"], +Sf, -Td2, -w["w2"], -Sf, +p[x + "w2"], -w["w2"])  # w2: dW, d gate; dW to fp32
        r(+Sf, +Sf, -Sf, -Sf, -Sf)  # gate: d silu, d(w3 out)
        r(+w["w3"], +Td2, -Sf, -w["w3"], -Td2, +Td, -Td2, +p[x + "w3"], -w["w3"])  # w3
        r(+Sf, +Sf, -Sf, -Sf)  # silu = a·σ(a)
        r(+Sf, -Sf, -Sf, _Copy(Sf), -Sf)  # sigmoid backward; sum of the two paths
        r(+w["w1"], +Td2, -Sf, -w["w1"], -Td2, +Td, -Td2, _Copy(Td), -Td, +p[x + "w1"], -w["w1"])  # w1
    if not copied:
        r(+Tkd4)  # sum over k backward: d(out) expanded and viewed as (T·k, d), a copy (fp32)
    _mixed_weighting_backward(r, Tkd4, Tkd2, Tk4, z.mixed_add_temp(d) * k, rerun)
    if rem is not None:
        _amp_expert_branch_backward(r, z, p, rem, last=full is None, join=False)
        r(+Tkd4, -2 * rem[1])  # slots[q·E:] slice backward: zeros (T·k, d) fp32; the (R, 1, d) grad dies
    if full is not None:
        _amp_expert_branch_backward(r, z, p, full, last=True, join=rem is not None)
        Fd4 = 2 * full[1]
        if m.q > 1:
            r(+Fd4, -Fd4)  # (E, q, d) -> (q·E, d) through the transpose: a copy
        r(+Tkd4, -Fd4)  # slots[:q·E] slice backward: zeros (T·k, d); the part's grad dies
        if rem is not None:
            r(_Copy(Tkd4), -Tkd4)  # the two slice backwards summed (in place when plain)
    r(+Td, -Tkd4)  # repeat_interleave backward: sum over the k copies -> (T, d)
    if c.shared_experts:
        r(_Copy(Td), -Td)  # joins the shared experts' d(flat)
    r(+TE4, _Copy(TE4), -Tk4, -z.T * k * 8)  # topk backward: zeros, scatter; d weights, indices die
    r(+TE4, +TE4, +TE4, +TE4, -TE4, -TE4, -TE4, +TE4)  # softmax's divide backward (fp32): d e, d Σ
    if rerun:
        r(-Tr4, +Tr4, -TE4, -TE4, _Copy(TE4), -Tr4)  # Σ backward; paths summed
    else:
        r(+Tr4, -TE4, -TE4, -Tr4, _Copy(TE4), -Tr4)  # Σ backward; paths summed
    r(+TE4, -TE4, -TE4)  # exp backward; exp released
    r(+TE2, -TE4)  # back through exp's fp32 cast
    wr = p["moe.router"] // 2
    # router mm: dW, dx (bf16); d(logits), weight and input copies released; dx to fp32 joins d(flat); dW to fp32
    r(+wr, +Td2, -TE2, -wr, -Td2, +Td, -Td2, _Copy(Td), -Td, +p["moe.router"], -wr)


def _amp_layer_forward(
    r: _Replay,
    z: Sizes,
    p: dict[str, int],
    recompute: bool = False,
    cached: bool = False,
    moe: _MoeSplit | None = None,
) -> None:
    """One block under bf16 autocast (CUDA's lists, ``model/autocast.py``), autograd saving.

    The residual stream and ln1/ln2 stay fp32 (``e`` = 4).  Each matmul casts its arguments last
    first: the weight's transposed view to a bf16 copy (saved: ``w``), then an fp32 input to a bf16
    copy (saved; one per projection: autocast caches only leaf tensors), and returns bf16.  RoPE,
    the scores, softmax's max-shift, SiLU and the gate run in bf16; ``exp`` is on CUDA's fp32 list,
    so exp, Σ and the probabilities are fp32, and AV takes a bf16 copy of the probabilities.
    ``recompute``/``cached``: as ``_layer_forward``.

    Sequence parallel (``z.sp``): ln1, ln2 and the residual stream at T/M rows (fp32); each norm's fp32
    output all-gathered (T·d·4), from which each projection takes its bf16 copy; each row-parallel
    output a bf16 partial sum, reduce-scattered in bf16 (``_sp_reduce_scatter`` on ``z.bf16``), then
    added to the fp32 residual stream; the gathered and the norm's own output die before the add."""
    c, T, b = z.cfg, z.T, z.bf16
    Td, Td2, Tq, Tkv, Tf, w = _amp_sizes(z, p)
    Sc, Sr, Sc4, Sr4 = b.scores, b.score_rows, z.scores, z.score_rows
    n = 0 if cached else 1  # 0: a matmul output handed back by the SAC cache
    mix = z.mixed_add_temp(c.d_model)  # CPU only: the bf16 operand of fp32 + bf16, copied to fp32
    sp, Tr, Tr2 = z.sp > 1, z.residual, b.residual  # the residual stream (fp32) and its bf16 twin, T/M rows
    _norm_forward(r, z, z.rows, c.d_model)  # ln1 (fp32)
    _sp_all_gather(r, z)  # its fp32 output gathered (the projections take their bf16 copies of it)
    _amp_qkv_forward(r, z, w, n)
    a, Qa, KVa, casts = _amp_attention_sizes(z)  # q, k, v: bf16, or fp32 with q/k/v biases
    if c.qk_norm:
        _norm_forward(r, z, T * c.num_heads, c.d_head, xe=a.e)
        _norm_forward(r, z, T * c.kv_heads, c.d_head, xe=a.e)
        if not casts:
            r(-Tq, -Tkv)  # the bf16 projections die (the norms kept fp32 copies)
    _rope_forward(r, a, c.q_dim)
    _rope_forward(r, a, c.kv_dim)
    r(-KVa, -Qa)  # un-rotated q, k die
    if z.sdpa:  # the CPU flash op stands in for CUDA's (``CPU_STAND_INS``): bf16 q, k, v in (fp32: copies made
        # last first, saved), bf16 output, fp32 logsumexp; fp32 q, k, v die with attention's return
        r(*casts * (+Tkv, +Tkv, +Tq))
        _flash_forward(r, z, n, Tq, 2)  # flash kernel (both saved)
        r(+Tq * _merge_copy(z))  # merge heads (saved by output_proj; a view: ``Sizes.merge_copy``)
        gone = casts * (Qa + 2 * KVa)
        if sp:  # output proj (a bf16 partial sum), reduce-scattered; ln1's two outputs die; residual add
            r(+w["attn.output_proj"], +Td2 * n)
            _sp_reduce_scatter(r, b, Td2)
            r(-gone, -Td, -Tr, +mix, +Tr, -mix, -Tr2)
        else:  # output proj (TP: all-reduced); ln1 output dies; add
            r(+w["attn.output_proj"], +Td2 * n)
            _tp_all_reduce(r, z, Td2)
            r(-gone, -Td, +mix, +Td, -mix, -Td2)
    else:
        w8, we = z.wrap(2)  # CPU: the wrapped 1/√d_head, saved until the scale's backward (a rerun's dies at once)
        r(*casts * (+Tkv, +Tq))  # fp32 q, k: bf16 copies of kᵀ, then q (saved)
        r(+Sc * n, +w8, +we, +Sc, -we, -w8 * recompute, -Sc)  # QKᵀ; · 1/√d_head; raw scores die
        r(+b.e, +Sc, -b.e, -Sc)  # where(mask, scores, -inf)
        r(+Sr, +Sc, -Sr)  # softmax: z = x − max(x) (bf16)
        r(+Sc4, +Sc4, -Sc4, +Sr4, +Sc4, -Sc)  # exp: fp32 copy, exp (saved), copy dies; Σ (saved); divide; z dies
        r(*casts * (+Tkv,))  # fp32 v: its bf16 copy (cast first: the last argument)
        r(+Sc, +Tkv, +Tq * n, -Sc, -Sc4)  # probs to bf16, V contiguous (both saved); AV; masked scores, fp32 probs die
        r(*casts * (-Tkv,))  # the strided bf16 copy of v dies with the matmul
        r(+Tq, -Tq)  # merge heads (saved by output_proj)
        gone = KVa + casts * (Qa + KVa)  # v; fp32 q, k (only their bf16 copies are saved)
        if sp:  # output proj (a bf16 partial sum), reduce-scattered (in its hook); then v (attention's local)
            r(+w["attn.output_proj"], +Td2 * n)  # and ln1's two outputs die; residual add
            _sp_reduce_scatter(r, b, Td2)
            r(-gone, -Td, -Tr, +mix, +Tr, -mix, -Tr2)
        else:  # output proj (TP: all-reduced); v, ln1 output die; add
            r(+w["attn.output_proj"], +Td2 * n)
            _tp_all_reduce(r, z, Td2)
            r(-gone, -Td, +mix, +Td, -mix, -Td2)
    _norm_forward(r, z, z.rows, c.d_model)  # ln2 (fp32)
    if moe is None:
        _sp_all_gather(r, z)  # its fp32 output gathered
    if moe is not None:
        _amp_moe_forward(r, z, p, moe, recompute, cached)
        if recompute:  # early stop (see ``_amp_moe_forward``)
            r(-Td)  # ln2's fp32 output (only its bf16 copies were saved) dies as the rerun unwinds
            return
        r(-Td, +Td, -Td)  # ln2's output dies; residual add (fp32 + fp32); the MoE output dies
        return
    r(+w["ffn.w1"], +Td2, +Tf * n, +Tf, +Tf)  # w1 (copies saved); sigmoid; silu
    r(+w["ffn.w3"], +Td2, +Tf * n, +Tf)  # w3 (copies saved); gate
    r(+w["ffn.w2"])  # w2's weight copy (the gate is bf16 already)
    if recompute:  # early stop: w2's saved inputs are packed
        r(-Td, -Tr * sp)  # ln2's fp32 output(s) (only bf16 copies were saved) die as the rerun unwinds
        return
    if sp:  # w2 (a bf16 partial sum), reduce-scattered; ln2's two outputs die; residual add (fp32)
        r(+Td2)
        _sp_reduce_scatter(r, b, Td2)
        r(-Td, -Tr, +mix, +Tr, -mix, -Tr2)
    else:  # w2 (TP: all-reduced); ln2 output dies; residual add (fp32); FFN output dies
        r(+Td2)
        _tp_all_reduce(r, z, Td2)
        r(-Td, +mix, +Td, -mix, -Td2)


def _amp_moe_forward_unsaved(r: _Replay, z: Sizes, p: dict[str, int], m: _MoeSplit, cached: bool = False) -> None:
    """``_amp_moe_forward`` inside a checkpoint: nothing saved, Python lifetimes (autocast's copies die
    with their matmul); ``cached``: the SAC cache keeps every mm and bmm output (``k0 = 0``)."""
    c = z.cfg
    d, E, k = c.d_model, c.num_experts, c.experts_per_token
    b, full, rem = _amp_moe_sizes(z, m)
    k0 = 0 if cached else 1
    Td, Td2, TE2, TE4, Tr2, Tr4 = z.act(d), b.act(d), b.act(E), z.act(E), b.act(1), z.act(1)
    Tkd4, Tkd2, Tk4 = z.act(d) * k, b.act(d) * k, z.T * k * 4
    wr = p["moe.router"] // 2
    r(+wr, +Td2, +TE2, -Td2, -wr)  # router; the weight and input copies die with the matmul
    r(+Tr2, +TE2, -Tr2, +TE4, +TE4, -TE4, +Tr4, +TE4)  # softmax: max, z; exp's fp32 copy (dies), exp; Σ; divide
    r(-TE2, -TE4, -Tr4, -TE2 * k0)  # on return z, exp, Σ and the logits die
    r(+Tk4, +z.T * k * 8, -TE4, -z.T * k * 8)  # topk: values, indices; the probabilities and the indices die
    r(+Tkd4)  # repeat_interleave: fp32 slots
    for part in (full, rem):
        if part is None:
            continue
        Rde, Rd, W = part
        r(+W, +Rd, +Rde, -Rd, -W, +Rde, +Rde, -Rde, -Rde * k0)  # w1 (copies die); sigmoid; silu; σ, w1 out die
        r(+W, +Rd, +Rde, -Rd, -W, +Rde, -Rde, -Rde * k0)  # w3 (copies die); gate; silu, w3 out die
        r(+W, +Rd, -W, -Rde)  # w2 (its weight copy dies); the gate dies
        if part is full and m.q > 1:
            r(+Rd)  # transpose + reshape to slot order, a copy
    if m.q and m.rem:
        r(+Tkd2)  # cat
    mixk = z.mixed_add_temp(d) * k  # CPU only: routed's fp32 copy for the bf16 · fp32 product
    r(+mixk, +Tkd4, -mixk, +Td, -Tkd4)  # routed · weights (fp32); sum over k; the product dies
    if c.shared_experts:
        Sf, ws = b.act(c.shared_width), {x: p[f"moe.shared.{x}"] // 2 for x in ("w1", "w2", "w3")}
        mix = z.mixed_add_temp(d)  # CPU only: the bf16 operand of fp32 + bf16, copied to fp32
        r(+ws["w1"], +Td2, +Sf, -Td2, -ws["w1"], +Sf, +Sf, -Sf, -Sf * k0)  # shared w1; sigmoid; silu
        r(+ws["w3"], +Td2, +Sf, -Td2, -ws["w3"], +Sf, -Sf, -Sf * k0)  # w3; gate
        r(+ws["w2"], +Td2, -ws["w2"], -Sf)  # w2; the gate dies
        r(+mix, +Td, -mix, -Td2 * k0, -Td)  # routed + shared (fp32); both summands die
    Fd, Rd = (full[1] if full else 0), (rem[1] if rem else 0)
    # on return: the weights, the fp32 slots, both parts' w2 outputs (kept by the SAC cache), the reshape copy, the cat
    r(-Tk4, -Tkd4, -Fd * k0, -Rd * k0, -(Fd if m.q > 1 else 0), -(Tkd2 if m.q and m.rem else 0))


def _amp_layer_forward_unsaved(
    r: _Replay, z: Sizes, p: dict[str, int], cached: bool = False, moe: _MoeSplit | None = None
) -> None:
    """``_amp_layer_forward`` inside a checkpoint: nothing saved, Python lifetimes (see
    ``_layer_forward_unsaved``)."""
    c, T, b = z.cfg, z.T, z.bf16
    Td, Td2, Tq, Tkv, Tf, w = _amp_sizes(z, p)
    Sc, Sr, Sc4, Sr4 = b.scores, b.score_rows, z.scores, z.score_rows
    k = 0 if cached else 1  # 0: a matmul output the SAC cache keeps alive
    out = 1 if z.all_reduce else k  # a projection's output handed on: TP's all-reduced one is in no cache
    mix = z.mixed_add_temp(c.d_model)  # CPU only: the bf16 operand of fp32 + bf16, copied to fp32
    sp, Tr, Tr2 = z.sp > 1, z.residual, b.residual  # sequence parallel: T/M rows (see ``_amp_layer_forward``)
    _norm_forward_unsaved(r, z, z.rows, c.d_model)  # ln1
    _sp_all_gather(r, z)  # its fp32 output gathered
    _amp_qkv_forward(r, z, w, kept=k, saved=False)
    a, Qa, KVa, casts = _amp_attention_sizes(z)  # q, k, v: bf16, or fp32 with q/k/v biases
    proj = 1 if casts else k  # q, k, v: a bias add's output is in no cache
    if c.qk_norm:
        _norm_forward_unsaved(r, z, T * c.num_heads, c.d_head, xe=a.e)
        _norm_forward_unsaved(r, z, T * c.kv_heads, c.d_head, xe=a.e)
        r(-Qa * proj, -KVa * proj)
    _rope_forward_unsaved(r, a, c.q_dim)
    _rope_forward_unsaved(r, a, c.kv_dim)
    unrotated = 1 if c.qk_norm else proj
    r(-KVa * unrotated, -Qa * unrotated)
    if z.sdpa:
        r(*casts * (+Tkv, +Tkv, +Tq))  # fp32 q, k, v: bf16 copies (v, k, q), which die with the kernel
        _flash_forward(r, z, 1, Tq, 2)
        r(*casts * (-Tq, -Tkv, -Tkv), -z.lse * k)  # the copies die; the logsumexp dies on return
        r(+Tq * _merge_copy(z), -Tq * k * _merge_copy(z))  # merge heads; kernel output dies
    else:
        r(*casts * (+Tkv, +Tq))  # fp32 q, k: bf16 copies of kᵀ, then q
        r(+Sc, *casts * (-Tq, -Tkv))  # QKᵀ; the copies die with it
        r(+z.wrap(2)[0], +z.wrap(2)[1], +Sc, -z.wrap(2)[1], -Sc * k)  # scale (CPU: the 8 bytes stay)
        r(+b.e, +Sc, -b.e, -Sc)  # where
        r(+Sr, +Sc, -Sr, +Sc4, +Sc4, -Sc4, +Sr4, +Sc4, -Sr4, -Sc, -Sc4)  # softmax; z and exp die on return
        r(*casts * (+Tkv,))  # fp32 v: its bf16 copy (cast first: the last argument)
        # probs copy; V contiguous; AV; the copies (v's too), scores and probs die
        r(+Sc, +Tkv, +Tq, -Tkv, -Sc, *casts * (-Tkv,), -Sc, -Sc4)
        r(+Tq, -Tq * k)  # merge heads
    r(+w["attn.output_proj"], +Td2, -w["attn.output_proj"])  # output projection; weight copy dies
    _tp_all_reduce(r, z, Td2, Td2 * k)  # (TP: all-reduced; the SAC cache keeps the partial)
    heads = _merge_copy(z) or k  # merged heads: a copy dies; a view of the kernel's output dies with it
    if sp:  # the bf16 partial sum reduce-scattered; q, k, v, merged heads, ln1's two outputs die; add
        _sp_reduce_scatter(r, b, Td2 * k)
        r(-Qa, -KVa, -KVa * proj, -Tq * heads, -Td, -Tr)
        r(+mix, +Tr, -mix, -Tr2)
    else:
        r(-Qa, -KVa, -KVa * proj, -Tq * heads, -Td)  # q, k, v, merged heads and ln1 output die
        r(+mix, +Td, -mix, -Td2 * out)  # residual add; attention output dies
    _norm_forward_unsaved(r, z, z.rows, c.d_model)  # ln2
    if moe is None:
        _sp_all_gather(r, z)  # its fp32 output gathered
    if moe is not None:
        _amp_moe_forward_unsaved(r, z, p, moe, cached)
        r(-Td, +Td, -Td, -Td)  # ln2 output dies; residual add (fp32); the MoE output and the middle stream die
        return
    r(+w["ffn.w1"], +Td2, +Tf, -Td2, -w["ffn.w1"], +Tf, +Tf, -Tf, -Tf * k)  # w1; sigmoid; silu
    r(+w["ffn.w3"], +Td2, +Tf, -Td2, -w["ffn.w3"], +Tf, -Tf, -Tf * k)  # w3; gate
    if sp:  # w2 (a bf16 partial sum), reduce-scattered; the gate and ln2's two outputs die; add
        r(+w["ffn.w2"], +Td2, -w["ffn.w2"])
        _sp_reduce_scatter(r, b, Td2 * k)
        r(-Tf, -Td, -Tr)
        r(+mix, +Tr, -mix, -Tr2, -Tr)  # residual add; FFN output and middle stream die
    else:  # w2 (TP: all-reduced); gate and ln2 output die
        r(+w["ffn.w2"], +Td2, -w["ffn.w2"])
        _tp_all_reduce(r, z, Td2, Td2 * k)
        r(-Tf, -Td)
        r(+mix, +Td, -mix, -Td2 * out, -Td)  # residual add; FFN output and middle stream die


def _amp_layer_backward(r: _Replay, z: Sizes, p: dict[str, int], last: bool, moe: _MoeSplit | None = None) -> None:
    """One block's backward under amp-bf16: each matmul's gradients come out bf16 and are cast back
    through autocast's copies (``_to_copy`` backward): dx to fp32 for an fp32 input, dW to fp32
    (the parameter's dtype); the fp32 residual gradient is cast to bf16 where it enters a matmul.
    Sequence parallel: that cast is of the T/M rows, then all-gathered in bf16 (the backward of the bf16
    reduce-scatter), before the rerun; an fp32 input gradient of the projections is reduce-scattered in
    fp32 to the norm's T/M rows; the norms' backward as ``_norm_backward``'s ``sp``."""
    c, T, b = z.cfg, z.T, z.bf16
    Td, Td2, Tq, Tkv, Tf, w = _amp_sizes(z, p)
    a, Qa, KVa, casts = _amp_attention_sizes(z)  # q, k, v: bf16, or fp32 with q/k/v biases
    Sc, Sc4, Sr4 = b.scores, z.scores, z.score_rows
    checkpointed = z.setup.checkpoint != "none"
    rerun = checkpointed
    # the residual add's backward casts the fp32 gradient to the FFN output's bf16 (MoE: the shared experts'
    # output's; without them the MoE output is fp32, and the sum's backward copies d(out) first)
    early = _moe_grad_copy(z, moe)  # fp32 (T·k·d·4): the MoE output is fp32
    sp, Tr2 = z.sp > 1, b.residual  # sequence parallel: the cast is of T/M rows, then all-gathered (bf16)

    def joined(key: str) -> None:
        """A projection's fp32 dx joins the other path's, then its dW is cast back to fp32; under TP the dx
        goes to ``from_local``'s backward first, which runs after the cast (an earlier node): all-reduced."""
        if z.all_reduce:
            r(+p[key], -w[key])
            _tp_all_reduce(r, z, Td)
            r(*_join(Td, False))
        else:
            r(*_join(Td, sp), +p[key], -w[key])

    if sp:
        r(+Tr2)
        _sp_all_gather(r, b)
        r(-Tr2)
    else:
        r(+Td2 if not early else early)
    if rerun:  # ... before w2's node unpacks its saved tensors, which starts the rerun
        _amp_layer_forward(r, z, p, recompute=True, cached=z.setup.checkpoint == "selective", moe=moe)
    frame: tuple = ()
    if checkpointed and last:
        frame = (8 * z.seq,) if z.sdpa else (8 * z.seq, z.seq * z.seq)
    if z.setup.checkpoint == "selective" and (moe is None or c.shared_experts):
        frame += (Td2,)  # w2's output (MoE: the shared experts'), left in the SAC cache

    if moe is not None:
        _amp_moe_backward(r, z, p, moe, copied=bool(early), rerun=rerun)
    else:
        # w2 (its input, the gate, is bf16: no dx cast)
        r(+w["ffn.w2"], +Tf, -Td2, -w["ffn.w2"], -Tf, +p["ffn.w2"], -w["ffn.w2"])
        r(+Tf, +Tf, -Tf, -Tf, -Tf)  # gate: d silu, d(w3 out)
        r(+w["ffn.w3"], +Td2, -Tf, -w["ffn.w3"], -Td2, +Td, -Td2, +p["ffn.w3"], -w["ffn.w3"])  # w3
        _tp_all_reduce(r, z, Td)
        r(+Tf, +Tf, -Tf, -Tf)  # silu = a·σ(a)
        r(+Tf, -Tf, -Tf, _Copy(Tf), -Tf)  # sigmoid backward; sum of the two paths
        # w1; its fp32 dx joins w3's (in place when plain; out of place under sequence parallel: ``_join``)
        r(+w["ffn.w1"], +Td2, -Tf, -w["ffn.w1"], -Td2, +Td, -Td2)
        joined("ffn.w1")
        if sp:
            _sp_reduce_scatter(r, z, Td)  # d(gathered ln2 output), fp32, to ln2's T/M rows
    _norm_backward(r, z, z.rows, c.d_model, residual=True, rerun=rerun, sp=sp)  # ln2
    out = "attn.output_proj"
    if sp:  # the grad cast to bf16 at T/M rows, all-gathered
        r(+Tr2)
        _sp_all_gather(r, b)
        r(-Tr2)
    else:
        r(+Td2)  # the grad to bf16
    # output_proj: dW, d(heads); merged heads released (a view: with the kernel's output)
    r(+w[out], +Tq, -Td2, -w[out], -Tq * _merge_copy(z), +p[out], -w[out])
    if z.sdpa:
        _flash_backward(r, z, Tq, Tkv, 2)
        r(-Tq, -Tkv, -Tq, -Tkv, -z.lse, -Tq)  # flash backward's saved tensors released
        r(*casts * (+Qa, -Tq, +KVa, -Tkv, +KVa, -Tkv))  # fp32 q, k, v: dQ, dK, dV cast back (q's copy was last)
    else:
        r(+Tq, -Tq)  # contiguous d(heads)
        r(+Tkv, +Sc, -Tq, -Tkv, -Sc, +Sc4, -Sc)  # AV: dV, d(probs) bf16; released; d(probs) to fp32
        r(*casts * (+KVa, -Tkv))  # fp32 v: dV cast back (v's copy came after the scores' ops)
        r(+Sc4, +Sc4, +Sc4, +Sc4, -Sc4, -Sc4, -Sc4, +Sc4)  # divide backward (fp32)
        if rerun:
            r(-Sr4, +Sr4, -Sc4, -Sc4, _Copy(Sc4), -Sr4)  # Σ backward; paths summed
        else:
            r(+Sr4, -Sc4, -Sc4, -Sr4, _Copy(Sc4), -Sr4)  # Σ backward; paths summed
        r(+Sc4, -Sc4, -Sc4)  # exp backward; exp released
        r(+Sc, -Sc4)  # back through exp's fp32 cast
        r(+b.e, +Sc, -b.e, -Sc)  # where backward
        if last and not checkpointed:
            r(-z.seq * z.seq)  # the shared causal mask dies with the last where node
        r(+z.wrap(2)[1], +Sc, -z.wrap(2)[1], -Sc, -z.wrap(2)[0])  # scale backward
        r(+Tkv, +Tq, -Sc, -Tkv, -Tq)  # QKᵀ: dK, dQ
        r(*casts * (+Qa, -Tq, +KVa, -Tkv))  # fp32 q, k: dQ, dK cast back (q's copy was made last)
    _rope_backward(r, a, c.kv_dim, freed=_ring(z) is None)
    _rope_backward(r, a, c.q_dim)
    if c.qk_norm:
        _norm_backward(r, z, T * c.kv_heads, c.d_head, residual=False, rerun=rerun, xe=a.e)
        _norm_backward(r, z, T * c.num_heads, c.d_head, residual=False, rerun=rerun, xe=a.e)
    v, k, q = "attn.v_proj", "attn.k_proj", "attn.q_proj"
    dv = _dv_grad(r, z, p, c.kv_dim)
    r(+w[v], +Td2, -Tkv * dv, -w[v], -Td2, +Td, -Td2, +p[v], -w[v])  # v_proj
    _tp_all_reduce(r, z, Td)
    _proj_grad(r, z, p, "k_proj", c.kv_dim, contiguous=True)
    r(+w[k], +Td2, -Tkv, -w[k], -Td2, +Td, -Td2)  # k_proj; joins v's
    joined(k)
    _proj_grad(r, z, p, "q_proj", c.q_dim, contiguous=True)
    r(+w[q], +Td2, -Tq, -w[q], -Td2, +Td, -Td2)  # q_proj; joins
    joined(q)
    if sp:
        _sp_reduce_scatter(r, z, Td)  # d(gathered ln1 output), fp32, to ln1's T/M rows
    _norm_backward(r, z, z.rows, c.d_model, residual=True, frame=frame, rerun=rerun, sp=sp)  # ln1


MODES = ("plain", "traced")
"""``plain``: a run with no Python dispatch mode on cpu or cuda (what a user gets); ``traced``: what
the storage tracker sees (under any dispatch mode, and on meta, autograd picks out-of-place variants
of three backward ops)."""


def replay_unsupported(cfg: ModelConfig, setup: TrainingSetup | None = None, seq: int | None = None) -> list[str]:
    """What the replay does not model for ``cfg``: the architecture options of ``unsupported_for_replay``
    except the mixture of experts, which the replay models under every setup (the ``_moe_*`` functions;
    ``setup`` is accepted for the callers that pass it).  Empty: ``predict_training_step`` is exact.
    With ``seq``, also whether the peaks are exact lines in the batch (``moe_lines_in_batch``), which
    the capacity figures need.  Of the checkpoint modes it models none, full and selective; torchtitan's per-op
    checkpointing (``op``) is the op library's (``analytic.ops.course``), which the single-GPU memory account uses."""
    out = [u for u in cfg.unsupported_for_replay() if u != "mixture of experts"]
    if setup is not None and setup.checkpoint == "op":
        out.append(
            "torchtitan's per-op checkpointing (--checkpoint op; on one GPU the op library's course program models it)"
        )
    if seq is not None and not moe_lines_in_batch(cfg, seq):
        out.append(f"mixture of experts at context {seq} (S·k not a multiple of E, or below 2·E)")
    return out


def moe_lines_in_batch(cfg: ModelConfig, seq: int) -> bool:
    """Whether a mixture of experts' step is one replay for every batch (always, for a dense model): when
    E divides S·k and S·k >= 2·E, every batch puts q = B·S·k/E >= 2 slots on each expert and none in a
    remainder, so the MoE ops and their sizes (lines in B) are the same for all B (``_MoeSplit``)."""
    if not cfg.moe:
        return True
    slots = seq * cfg.experts_per_token
    return slots % cfg.num_experts == 0 and slots >= 2 * cfg.num_experts


def replay_supported(cfg: ModelConfig, setup: TrainingSetup | None = None) -> bool:
    """Whether the implementation-exact replay models ``cfg`` under ``setup`` (``replay_unsupported``)."""
    return not replay_unsupported(cfg, setup)


def check_replay_supported(cfg: ModelConfig, setup: TrainingSetup | None = None) -> None:
    unsupported = replay_unsupported(cfg, setup)
    if unsupported:
        raise AccountingError(
            f"the implementation-exact memory replay covers the course architecture only, not {', '.join(unsupported)}"
        )


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise AccountingError(f"unknown mode '{mode}' (valid: {', '.join(MODES)})")


def check_device(device: str) -> None:
    if device not in DEVICES:
        raise AccountingError(f"unknown device '{device}' (valid: {', '.join(DEVICES)})")


def as_setup(
    setup: TrainingSetup | None,
    dtype: str | None = None,
    optimizer: str | None = None,
    default_optimizer: str = "for-loop",
) -> tuple[TrainingSetup, str]:
    """One ``TrainingSetup`` (and the dtype name of its parameters) from either a setup or the older
    ``dtype``/``optimizer`` arguments (``dtype`` "fp32" or a 16-bit dtype = precision "fp32"/"bf16").
    Given both, they must agree."""
    if setup is None:
        dtype = dtype or "fp32"
        if dtype not in DTYPE_BYTES:
            raise AccountingError(f"unknown dtype '{dtype}'")
        precision = "fp32" if DTYPE_BYTES[dtype] == 4 else "bf16"
        return TrainingSetup(precision=precision, optimizer=optimizer or default_optimizer), dtype
    if dtype is not None and DTYPE_BYTES.get(dtype) != DTYPE_BYTES[setup.param_dtype]:
        raise AccountingError(f"dtype {dtype!r} contradicts precision {setup.precision!r}")
    if optimizer is not None and optimizer != setup.optimizer:
        raise AccountingError(f"optimizer {optimizer!r} contradicts the setup's {setup.optimizer!r}")
    return setup, dtype or setup.param_dtype


def adamw_step_scalar_bytes(z: Sizes) -> int:
    """CPU only: at the AdamW step's highest point a Python number is wrapped (8 bytes) and copied to
    the parameters' dtype (for-loop and foreach: "sqrt(v) / bias_correction2_sqrt"; fused: a scalar
    argument, fp32)."""
    return sum(z.wrap(4 if z.setup.optimizer == "fused" else z.e))


def replay_training_step(
    cfg: ModelConfig,
    seq: int,
    dtype: str | None = None,
    optimizer: str | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    mode: str = "plain",
    cpu_threads: int = 1,
    batch: int = 1,
    units: FsdpUnits | None = None,
    sp: int = 1,
    ep: tuple[int, int] = (1, 0),
    all_reduce: bool = False,
    cuda_batch: int | None = None,
) -> StepInBatch:
    """Replay one training step with the batch B as a variable (see the module docstring).

    ``setup`` picks attention, checkpointing, precision and AdamW (or, as before, ``dtype`` and
    ``optimizer``: pure fp32/bf16, naive attention, no checkpointing).  ``mode``: "traced" is
    what the storage tracker (any Python dispatch mode, and every meta run) sees; "plain" is a
    run with no dispatch mode on cpu/cuda, where autograd does three backward ops in place
    (``plain_run_savings``).

    The baseline is the parameters, AdamW m and v, the RoPE tables and the input and target
    ids, plus the AdamW step counters that live on ``device`` (``adamw_step_counter_bytes``).
    ``batch`` (a mixture of experts, and sequence parallel): the batch whose split of the routed slots is
    replayed, the result exact for every batch that splits alike (``_MoeSplit``, ``moe_lines_in_batch``);
    under sequence parallel the result holds for B = 1 if ``batch`` is 1, else for every B > 1 (the
    all-gathers' ``cat``: ``Sizes.gather_cat``).
    ``units``: one rank of an FSDP2 job; its all-gather, reshard and reduce-scatter events are
    replayed at the unit boundaries (``analytic.fsdp``).  The baseline stays the single-GPU one
    (whole parameters and AdamW state): the caller shifts it to the rank's shards.  ``sp``: a
    sequence-parallel rank of ``sp`` ranks (``cfg`` the TP-local model, dense blocks): the residual
    stream and the norms at T/M rows, with the all-gathers and reduce-scatters around the projections
    (``_sp_all_gather``, ``_sp_reduce_scatter``); ``all_reduce``: a tensor-parallel rank without it (``cfg``
    the TP-local model): the row-parallel outputs and the column-parallel inputs' gradients all-reduced
    out of place (``_tp_all_reduce``).  ``ep``: (ranks, rank): ep rank ``rank`` of an
    expert-parallel job (``cfg`` the whole model; ``units`` with the experts' own unit): its E/ep experts'
    gradients, its dispatch and combine (``_ep_routed_forward``, ``_ep_routed_backward``); the
    baseline stays the whole model's, as with ``units``.  ``cuda_batch`` (device "cuda"): the result
    holds at that batch only, with CUDA's reduction and sort scratch (``Sizes.cuda_batch``); None: the
    lines without them."""
    from .memory import adamw_step_counter_bytes, adamw_step_temporary_bytes

    setup, dtype = as_setup(setup, dtype, optimizer)
    optimizer = setup.optimizer
    check_replay_supported(cfg, setup)
    check_mode(mode)
    check_batch_seq(batch, seq)
    check_device(device)
    if sp > 1 and (cfg.moe or seq % sp):
        raise ValueError("sequence parallel is replayed for dense blocks, S divisible by M")
    if ep[0] > 1 and (not cfg.moe or setup.autocast):
        raise ValueError(
            "expert parallel is replayed for a mixture of experts in fp32 and bf16 (the amp blocks lack it)"
        )
    split = _MoeSplit(cfg, seq, batch, ep) if cfg.moe else None
    plain = mode == "plain"
    softmax32 = units is not None and units.float_logits
    cpu, cuda = plain and device == "cpu", device == "cuda"
    cat = sp > 1 and batch > 1  # ``Sizes.gather_cat``
    z = Sizes(
        cfg, Affine(1), seq, DTYPE_BYTES[dtype], setup, plain, cpu, cpu_threads, softmax32, cuda, sp, cat, all_reduce,
        cuda_batch if cuda else None,
    )  # fmt: skip
    c, e, T = cfg, z.e, z.T
    pb = parameter_breakdown(cfg)
    params = pb.total * e
    p = {it.key.removeprefix("layers.*."): it.per_layer * e for it in pb if it.per_layer is not None}  # gradients
    for key in ("moe.experts.w1", "moe.experts.w2", "moe.experts.w3") if ep[0] > 1 else ():
        p[key] //= ep[0]  # expert parallel: the rank's E/ep experts' gradients
    rope_buffers = 2 * c.context_length * (c.rope_dim // 2) * 4  # fp32 cos and sin tables
    counters = adamw_step_counter_bytes(cfg, optimizer, device)
    baseline = 3 * params + rope_buffers + counters + 2 * 8 * T  # params, exp_avg, exp_avg_sq; int64 token ids
    Td, TV, Tr, emb = z.act(c.d_model), z.act(c.vocab_size), z.act(1), pb["token_embeddings"].total * e

    ev = FsdpEvents(cfg, units, z.cpu) if units is not None else None
    r = _Replay(baseline, traced=not plain)
    if ev:
        ev.root_pre_forward(r)
    r(+8 * seq)  # positions
    if not z.sdpa:
        r(+seq * seq, +seq * seq, -seq * seq)  # ones(S, S).tril(): the causal mask (the fused kernel needs none)
    r(+Td)  # embedding lookup
    sp, Tres = z.sp > 1, z.residual  # the residual stream (T/M rows under sequence parallel)
    if sp:  # sequence parallel (Replicate -> Shard(1)): this rank's S/M positions copied; the lookup dies
        r(+Tres, -Td)
    cached = z.setup.checkpoint == "selective"
    if z.amp and z.setup.checkpoint != "none":
        _layer_runs(r, c, split, False, lambda q, m: _amp_layer_forward_unsaved(q, z, p, cached=cached, moe=m), ev)
    elif z.amp:
        _layer_runs(r, c, split, False, lambda q, m: _amp_layer_forward(q, z, p, moe=m), ev)
    elif z.setup.checkpoint != "none":
        _layer_runs(r, c, split, False, lambda q, m: _layer_forward_unsaved(q, z, cached=cached, moe=m), ev)
    else:
        _layer_runs(r, c, split, False, lambda q, m: _layer_forward(q, z, moe=m), ev)
    layer_backward = _amp_layer_backward if z.amp else _layer_backward
    _norm_forward(r, z, z.rows, c.d_model)  # ln_final
    _sp_all_gather(r, z)  # its output gathered for the LM head (saved by it)
    head2 = emb // 2  # amp: autocast's bf16 copy of the LM head's weight (the embedding's when tied)
    if z.amp:  # weight copy, input copy (saved), bf16 logits; ln_final's fp32 output(s) die
        r(+head2, +z.bf16.act(c.d_model), +z.bf16.act(c.vocab_size), -Td, -Tres * sp)
    r(+TV)  # logits (amp: logits.float(), an fp32 copy)
    if sp and not z.amp:
        r(-Tres)  # ln_final's own output dies
    fl = ev is not None and ev.units.float_logits  # FSDP2's bf16 parameters under autocast
    if fl:
        r(+4 * T * c.vocab_size)  # logits.float()
    if z.setup.checkpoint == "none":
        r(-8 * seq)  # positions die with forward's locals (a checkpoint's recompute closure keeps them)
    if z.amp or fl:
        r(-z.bf16.act(c.vocab_size))  # the bf16 logits die with forward's locals
    if e != 4:
        r(-Tres)  # 16-bit: the last residual stream dies (ln_final kept an fp32 copy)
    if ev:
        ev.root_post_forward(r)
    if fl:  # the loss reads the fp32 logits: its tensors are fp32
        e, Tr, TV = 4, 4 * T, 4 * T * c.vocab_size
    r(+Tr, +TV, -Tr)  # cross-entropy: z = logits − max
    # CPU-only kernel internals of a 16-bit cross-entropy (``k16``): gather's T·4-byte scratch; mean
    # sums an fp32 copy of its input into an fp32 result (T·4 and 4 bytes) before casting back
    k16 = 1 if (z.cpu and e != 4) else 0
    w8, w4 = z.wrap(4 if k16 else e)  # CPU only: mean's "/ T" wraps a Python number
    r(+TV, +Tr, +Tr, +Tr, +k16 * 4 * T, -k16 * 4 * T, +Tr)  # exp (saved); Σ (saved); log; gather; subtract
    r(+e, +k16 * 4, +k16 * 4 * T, -k16 * 4 * T, +w8, +w4, -w4, -w8, -k16 * 4)  # mean (the loss)
    r(-Tr, -TV, -Tr, -Tr)  # logits die (gather keeps z)
    forward = PhaseInBatch(r.peak(), r.live, r.copy_peak())

    r = _Replay(r.live, traced=not plain)
    # d loss; mean backward; gather backward: zeros, scatter_add into them (a copy when traced); z released
    w8, we = z.wrap(e)  # CPU only: mean backward's "/ T" wraps a Python number
    # CPU only: a 16-bit scatter_add_ accumulates in an fp32 copy of its output (T·V·4 bytes)
    r(+e, +w8, +we, +Tr, -we, -w8, +Tr, +TV, +k16 * 2 * TV, -k16 * 2 * TV, _Copy(TV), -Tr, -TV)
    r(+Tr, -Tr, -Tr, +TV, -Tr, -TV, _Copy(TV), -TV)  # log and exp backward; paths summed
    if ev:
        ev.root_pre_backward(r)
    TV2, Td2 = z.bf16.act(c.vocab_size), z.bf16.act(c.d_model)
    if z.amp or fl:
        r(+TV2, -TV)  # logits.float() backward: the gradient to bf16
    if z.amp:
        # lm_head: dW, dx (bf16); grad, weight and input copies released; dx and dW cast to fp32
        r(+head2, +Td2, -TV2, -head2, -Td2, +Td, -Td2, +emb, -head2)
    else:
        r(+emb, +Td, -(TV2 if fl else TV), -Td)  # lm_head: dW, dx; ln_final output released
    if sp:  # dx split along the sequence (the backward of Shard(1) -> Replicate: a chunk copied); dx dies
        r(+Tres, -Td)
    _norm_backward(r, z, z.rows, c.d_model, residual=False, sp=sp)  # ln_final
    # layers L-1 .. 1, then layer 0, which also releases the shared mask
    _layer_runs(r, c, split, True, lambda q, m: layer_backward(q, z, p, last=False, moe=m), ev)
    _block(r, split if c.layer_moe(0) else None, 0, lambda q, m: layer_backward(q, z, p, last=True, moe=m), ev, True)
    if sp:  # the gradient of this rank's S/M positions gathered to the whole output's; the local one dies
        _sp_all_gather(r, z)
        r(-Tres)
    # embedding backward: zeros, index_put (in place when plain; on CUDA with its id copies and sort storage)
    r(+emb, _Copy(emb), +z.embedding_grad_scratch(), -z.embedding_grad_scratch(), -Td)
    if c.tie_embeddings:
        # accumulated onto the LM head's gradient, a transposed view (TBackward): out of place in both runs
        r(+emb, -emb, -emb)
    if ev:
        ev.root_post_backward(r)
    r(-e, -e)  # the loss and its gradient seed
    backward = PhaseInBatch(r.peak(), r.live, r.copy_peak())

    # AdamW step: its temporaries on top of the gradients, then zero_grad frees the gradients.
    extra = adamw_step_temporary_bytes(cfg, dtype, optimizer) + adamw_step_scalar_bytes(z)
    top = backward.end + extra
    step = PhaseInBatch(PeakEnvelope(((top.a, top.b),)), backward.end - params)
    return StepInBatch(baseline, forward, backward, step)


def predict_training_step(
    cfg: ModelConfig,
    seq: int,
    batch: int = 1,
    dtype: str | None = None,
    optimizer: str | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    mode: str = "plain",
    cpu_threads: int = 1,
) -> StepMemory:
    """Bytes of one training step at ``batch`` on ``device`` (``replay_training_step`` at one batch).

    ``mode="plain"`` (the default) is a run with no dispatch mode: what a GPU user gets, and on ``cpu``
    what the CPU allocator's own events show; ``mode="traced"`` is exactly what the storage tracker
    counts (pass it when comparing with the tracker, or with any run under a dispatch mode or on meta).
    ``cpu_threads`` (``torch.get_num_threads()`` of the run) matters only for a plain CPU run with
    sdpa: the CPU flash kernel's scratch is per thread.
    ``device`` matters only for the AdamW step counters (``adamw_step_counter_bytes``): on
    ``cpu`` the for-loop and foreach implementations keep them on the CPU, with the model."""
    check_batch_seq(batch, seq)
    step = replay_training_step(
        cfg, seq, dtype, optimizer, device, setup=setup, mode=mode, cpu_threads=cpu_threads, batch=batch,
        cuda_batch=batch,
    )  # fmt: skip
    return step.at(batch)


def traced_minus_plain(
    cfg: ModelConfig, seq: int, batch: int = 1, *, setup: TrainingSetup | None = None, device: str = "meta"
) -> dict[str, int]:
    """How much higher each phase peaks under a dispatch mode (or on meta) than in a plain run, per phase.

    Derivation.  A traced run is the plain run plus, at each backward op that autograd does out of
    place only when ``isTensorSubclassLike`` is true (aten/src/ATen/TensorSubclassLikeUtils.h), one
    transient tensor that a plain run never allocates; before and after the op the two runs hold the
    same bytes:

    1. ``InputBuffer::accumulate`` (torch/csrc/autograd/input_buffer.cpp): two gradients into one
       tensor.  Plain: ``old.add_(new)`` when ``old`` is a dense, non-view tensor nobody else holds;
       traced: ``old + new``, a copy of X bytes.  Sites: the residual stream joining ln1/ln2's input
       gradient (T·d·e), RMSNorm's two paths to x (T·d·4), RoPE's two paths to each half
       (T·(h|kv)·d_head·e/2) and the two strided halves (T·(h|kv)·d_head·e), softmax's Σ and division
       paths (B·h·S²·e), SiLU's two paths (T·d_ff·e), q_proj's dx into the k + v sum (T·d·e; the v + k
       and w1 + w3 sums take views, so both runs copy), the cross-entropy's z (T·V·e) (tied, the
       embedding's gradient joins the LM head's, a transposed view: both runs copy); a mixture of
       experts adds each expert matrix's two parts (E·out·in·e), each part's w1 + w3 dx, the two slot
       slices (T·k·d·e), the shared experts' w1 + w3 dx, the router's dx (T·d·e) and top-k's scatter
       into zeros (T·E·e, ``value_selecting_reduction_backward``); expert parallel's index_selects
       (``index_select_backward``: ``index_add_`` into zeros, T·k·d·e and R·d·e) and the two parts' slices
       of the received rows (R·d·e);
    2. ``gather_backward`` (torch/csrc/autograd/FunctionsManual.cpp): ``zeros.scatter_add_`` vs
       ``zeros.scatter_add``, a copy of T·V·e (e of the loss: 4 under amp-bf16);
    3. ``index_backward``: ``zeros.index_put_`` vs ``index_put``, a copy of V·d·e (the embedding).

    So with L_k the plain run's live bytes just before copy k of size X_k, and P the plain peak:
    traced − plain = max(0, max_k (L_k + X_k) − P).  The optimizer step has no such op (0).  Evaluated
    from the plain replay (``PhaseInBatch.traced_excess``); ``tests/test_plain_run.py`` checks it
    against the traced replay and the tracker."""
    check_batch_seq(batch, seq)
    step = replay_training_step(cfg, seq, device=device, setup=setup, mode="plain", batch=batch)
    return {name: phase.traced_excess(batch) for name, phase in step.phases().items()}
