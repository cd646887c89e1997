"""Symbolic tensors and torch's autograd engine: the memory of a program, replayed without torch.

A program written against this module (``ops.aten`` for the compute ops) runs like the torch code it
transliterates, but its tensors hold no data: each ``Storage`` charges its bytes to the active ``Run``
when made and uncharges them when its last reference dies (CPython refcounting, ``__del__``: as
deterministic as torch's own frees, which follow the same Python references).  Views share a storage.
Shapes are tuples of ``int`` or ``Affine`` (a·B + b: the micro-batch B is a symbol), so one run gives
every phase's peak as an exact function of B (``engine``).

Autograd follows torch 2.13 (``torch/csrc/autograd/engine.cpp``, ``input_buffer.cpp``,
``functions/accumulate_grad.h``, ``torch/utils/checkpoint.py``):

* a ``Node`` per differentiable op, with a sequence number, edges to the nodes of its inputs (a leaf's
  ``AccumulateGrad``), the shapes of those inputs and its saved tensors (``SavedVar``: the storage, never
  the producing node, so no reference cycles);
* ``backward(loss)``: a node runs when every gradient it waits for has arrived; among ready nodes
  ``AccumulateGrad`` first, then the highest sequence number; a node's incoming gradients die when its
  function returns (with its outputs reduced to its inputs' shapes first: ``validate_outputs``' sum_to),
  then its saved tensors are released, then its outputs go to the next nodes' input buffers, where a
  second gradient is summed: out of place (a new tensor, then the old one dies) in a traced run, in place
  in a plain run when the old buffer is the only reference to its storage; the outputs list dies last;
* ``AccumulateGrad`` steals a gradient nothing else holds and whose layout is the parameter's, else
  clones it;
* ``checkpoint(fn, *args)``: torch's non-reentrant checkpoint (saved tensors become holders; the first
  unpack reruns ``fn`` with early stop, under the forward's autocast state; ``checkpoint.py``,
  ``_checkpoint_hook``); an op that saves inputs packs them before its outputs exist (``record_first``);
* ``autocast(dtype)``: a region with its weight cache (the op policies are ``aten.lower``/``upcast``).

Runs are ``traced`` (what the storage tracker sees: any dispatch mode, every meta run) or plain (no dispatch
mode; with ``wraps``, a CPU run as the CPU allocator sees it: wrapped Python numbers, kernel scratch, the
CPU RNG state a checkpoint saves).  ``repeated(n)`` replays one of n alike blocks for all of them (O(1) in
the layer count).  No torch.

API for programs: ``Run`` (a context manager), ``empty``/``parameter`` (allocations), ``Tensor`` (``shape``,
``dtype``, ``storage``, ``perm``/``zero`` layout, ``alias``/``detach``), ``record``/``record_first``/``view_of``/
``wants`` (autograd nodes for new ops), ``backward``, ``no_grad``/``grad_mode``, ``autocast``,
``saved_tensors_hooks``, ``checkpoint``, ``repeated``, ``current``.
"""

from __future__ import annotations

import heapq
import itertools
import sys
from collections.abc import Callable, Hashable, Sequence
from contextlib import contextmanager, nullcontext
from typing import Self

from ...config import ModelConfig
from .engine import Affine, PhaseInBatch, Replay, apply_segment

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "int64": 8, "int32": 4, "bool": 1, "uint8": 1, "complex64": 8}
"""Bytes per element of each dtype a program uses (torch's ``element_size()``)."""

Dim = int | Affine

_RUNS: list[Run] = []  # the stack of active runs (``Run.__enter__``)
_WORK: list[tuple[list, bool]] = []  # the sinks of ``recording_work``, each with its ``memory``


@contextmanager
def recording_work(sink: list, memory: bool = True):
    """Runs made inside the block append their work to ``sink`` (``analytic.step_time`` prices it), each record
    ``(kind, times, *fields)`` with ``times`` the blocks it stands for (``repeated``): ``("alloc", times, label,
    bytes, dtype)`` for each storage made, ``("phase", 1)`` at each phase's end, and the ops' own notes (``Run.note``:
    ``gemm``, ``attention``, ``reads``: what a reduction reads beyond the storage it makes, ``in_place``: the
    bytes an in-place kernel moves).  ``memory=False``: the runs skip the replay's book-keeping (their peaks and
    ends read 0), for a caller that reads only the work (``step_time.program``; the records are the same:
    tests/test_step_time.py compares the programs of every plannable preset and setup)."""
    entry = (sink, memory)
    _WORK.append(entry)
    try:
        yield sink
    finally:
        _WORK.remove(entry)


def current() -> Run:
    """The active ``Run`` (the innermost ``with run:``)."""
    return _RUNS[-1]


def numel(shape: Sequence[Dim]) -> Dim:
    n, line = 1, 1  # the int dims' product; the others' (an ``Affine``: one line in B), multiplied by n once
    for d in shape:
        if type(d) is int:
            n *= d
        else:
            line = d * line
    return n if line == 1 else line * n


class Target:
    """The device of a run, for the kernels' scratch that is no tensor of the program: none on meta (and on the CPU,
    whose scratch ``Run.wraps`` adds); ``cuda.Cuda`` for a GPU.  Hooks the ops call after allocating their result."""

    device = "meta"

    def sum_rows(self, grad: Tensor, kept: tuple) -> None:
        """A sum of ``grad`` to the shape ``kept`` (keepdim: ``sum_to``) made its result."""

    def index_put(self, ids: Tensor) -> None:
        """``index_put_`` with accumulate of ``ids`` (an index's backward) made its zeros."""

    def softmax_backward(self, grad: Tensor) -> None:
        """``_softmax_backward_data`` of ``grad`` made its result."""

    def safe_softmax(self, x: Tensor) -> None:
        """``_safe_softmax`` of ``x`` (sdpa's math path) made its result."""


class Run:
    """One replayed program run: the replay its storages charge, autograd's mode and counters.

    ``traced``: the storage tracker's run (out-of-place gradient sums); else a plain run.  ``log``: a
    list that receives ``(label, bytes)`` for every allocation (+) and free (−), bytes at ``log_batch``
    (for comparing with a torch trace).  Use as a context manager; ``phase()`` closes a phase."""

    def __init__(
        self,
        traced: bool = True,
        log: list | None = None,
        log_batch: int = 1,
        wraps: bool = False,
        threads: int = 1,
        target: Target | None = None,
    ):
        self.replay = Replay(Affine(0), traced)
        self.target = target or Target()  # the device's kernel scratch (``cuda.Cuda``)
        self.traced = traced
        self.wraps = wraps  # a plain CPU run: the allocator sees wrapped Python numbers and kernel scratch
        self.threads = threads  # torch.get_num_threads() of a plain CPU run (per-thread kernel scratch)
        self.grad = True  # torch.is_grad_enabled()
        self.hooks: list[tuple[Callable, Callable]] = []  # torch.autograd.graph.saved_tensors_hooks stack
        self.autocast: str | None = None  # the autocast dtype when autocast is on (``autocast``)
        self.autocast_cache: dict[int, tuple[Tensor, Tensor]] = {}  # id(leaf) -> (leaf, its cast)
        self.autocast_virtual: Dim = 0  # cached copies of repeated blocks' weights beyond the replayed one
        self.log, self.log_batch = log, log_batch
        self.seq = itertools.count()
        self.segment: Segment | None = None  # the ``repeated`` block being recorded (forward)
        self.backward_segment: Segment | None = None  # the repeated block whose backward node runs
        self.work, self.memory = _WORK[-1] if _WORK else (None, True)  # ``recording_work``'s sink
        self.virtual_grads: Dim = 0  # the grads of a repeated block's copies beyond the one replayed
        self.layer_key: Callable[[int], Hashable] | None = None  # a wrapper's events at layer i (``split_runs``)

    def __enter__(self) -> Self:
        _RUNS.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _RUNS.remove(self)

    def note(self, kind: str, *fields) -> None:
        """Record an op's work for ``recording_work`` (nothing when no sink listens)."""
        if self.work is not None:
            segment = self.segment or self.backward_segment
            self.work.append((kind, segment.times if segment else 1, *fields))

    def charge(
        self, nbytes: Dim, label: str, kernel: bool = True, dtype: str | None = None, width: Dim | None = None
    ) -> None:
        """Charge ``nbytes`` made (negative: freed) by ``label``; made by a kernel unless ``kernel`` is false (the
        replay's own book-keeping: the copies of repeated blocks freed at once), a storage ``recording_work``
        records with its ``dtype`` and row ``width`` (a tensor's and its last dimension; None for raw scratch)."""
        if self.work is not None and kernel and not label.startswith("free "):
            self.note("alloc", label, nbytes, dtype, width)
        if self.memory:
            self.replay(nbytes)
        if self.log is not None:
            self.log.append((label, nbytes.at(self.log_batch) if isinstance(nbytes, Affine) else nbytes))

    @property
    def live(self) -> Affine:
        return self.replay.live

    def phase(self) -> PhaseInBatch:
        """End the current phase (its peak, its end and, plain, the traced run's copies) and start the next."""
        r = self.replay
        self.replay = Replay(r.live, self.traced)
        if self.work is not None:
            self.work.append(("phase", 1))
        if self.log is not None:
            self.log.append(("PHASE", 0))
        return PhaseInBatch(r.peak(), r.live, r.copy_peak())


class Segment:
    """A block that stands for ``times`` alike blocks (``repeated``): its forward is replayed once and applied
    ``times`` times (``engine.apply_segment``: the candidates of the first and the last copy), and so is its
    backward (the nodes it recorded run contiguously: their sequence numbers lie between the blocks')."""

    __slots__ = ("grads", "times")

    def __init__(self, times: int):
        self.times, self.grads = times, 0


class _Open:
    """A segment being replayed into a probe: the replay it continues, the probe, the segment."""

    __slots__ = ("main", "probe", "segment")

    def __init__(self, run: Run, segment: Segment):
        self.main, self.segment = run.replay, segment
        self.probe = run.replay = run.replay.fresh()

    def close(self, run: Run) -> None:
        run.replay = self.main
        apply_segment(self.main, self.probe, self.segment.times)
        run.virtual_grads = self.segment.grads * (self.segment.times - 1) + run.virtual_grads


@contextmanager
def repeated(times: int):
    """``with repeated(n): block(x)``: the block stands for n alike blocks in a row (identical shapes, the
    output of one the input of the next), replayed once: exact (the peak of n runs of one segment is at the
    first or the last, ``engine.repeat``) and O(1) in n.  Its backward is applied n times as well; the
    gradients of the n − 1 copies not replayed are ``Run.virtual_grads`` (``training_step`` frees them with
    ``zero_grad``).  The program still lists all n blocks' parameters (their bytes, AdamW's state)."""
    run = current()
    if times <= 1 or run.segment is not None:
        yield
        return
    segment = Segment(times)
    opened = _Open(run, segment)
    run.segment = segment
    cached = set(run.autocast_cache)
    try:
        yield
    finally:
        run.segment = None
        opened.close(run)
        # autocast's weight copies that only the region's cache holds (a checkpointed block packs its saves)
        # die together when the region exits: all n blocks' copies, not one (``autocast``)
        for key in set(run.autocast_cache) - cached:
            cast = run.autocast_cache[key][1]
            if sys.getrefcount(cast) <= 3 and sys.getrefcount(cast.storage) <= 2:
                run.autocast_virtual = cast.nbytes * (times - 1) + run.autocast_virtual


def runs_of(kind: Sequence) -> list[tuple[int, int]]:
    """(first layer, count) for layers of kinds ``kind`` in order: the first and the last alone, the middle ones
    in runs of one kind, each run replayed once for all its layers (``repeated``, O(1) in the layer count)."""
    n = len(kind)
    runs, i = [(0, 1)], 1
    while i < n - 1:
        j = i
        while j < n - 1 and kind[j] == kind[i]:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs + ([(n - 1, 1)] if n > 1 else [])


def alike_runs(cfg: ModelConfig) -> list[tuple[int, int]]:
    """``runs_of`` the layers' kinds: a mixture of experts or not, a window or not, RoPE or not (the same ops on
    the same shapes and masks)."""
    nope = set(cfg.nope_layers)
    return runs_of([(cfg.layer_moe(i), cfg.layer_windowed(i), i in nope) for i in range(cfg.num_layers)])


def split_runs(runs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``runs`` of alike layers cut where a data-parallel wrapper's events differ (``Run.layer_key``: FSDP2's
    units before and after a layer, ``ops.fsdp``): a run's first layer follows a unit of another kind, its last
    one precedes one; without a wrapper, ``runs`` unchanged."""
    key = current().layer_key
    if key is None:
        return runs
    out = []
    for first, times in runs:
        start = first
        for i in range(first + 1, first + times):
            if key(i) != key(start):
                out.append((start, i - start))
                start = i
        out.append((start, first + times - start))
    return out


class Storage:
    """Bytes on the device: charged when made, uncharged when the last tensor (view) using it dies."""

    __slots__ = ("label", "nbytes", "run")

    def __init__(self, nbytes: Dim, label: str = "?", dtype: str | None = None, width: Dim | None = None):
        self.nbytes, self.run, self.label = nbytes, current(), label
        self.run.charge(nbytes, label, dtype=dtype, width=width)

    def __del__(self):
        run = self.run
        if run.memory or run.log is not None:  # else the free does nothing: ``Run.charge`` records no "free "
            run.charge(-self.nbytes, "free " + self.label)


def contiguous_perm(n: int) -> tuple[int, ...]:
    return tuple(range(n))


class Tensor:
    """A symbolic tensor: shape, dtype, storage, layout and autograd metadata; no data.

    ``perm``: the logical dims in memory order, outermost first (identity: contiguous); the layout
    decides whether a ``reshape`` is a view or a copy and what layout an elementwise op's output takes."""

    __slots__ = (
        "acc",
        "base",
        "dtype",
        "grad",
        "grad_fn",
        "name",
        "out_nr",
        "perm",
        "requires_grad",
        "shape",
        "storage",
        "zero",
    )  # fmt: skip

    def __init__(
        self,
        shape: Sequence[Dim],
        dtype: str = "fp32",
        storage: Storage | None = None,
        perm: tuple[int, ...] | None = None,
        label: str = "?",
    ):
        self.shape = tuple(shape)
        self.dtype = dtype
        self.storage = (
            storage
            if storage is not None
            else Storage(numel(self.shape) * ITEMSIZE[dtype], label, dtype, self.shape[-1] if self.shape else None)
        )
        self.perm = perm if perm is not None else contiguous_perm(len(self.shape))
        self.zero: tuple[int, ...] = ()  # dims of stride 0 (an ``expand``)
        self.grad_fn: Node | None = None
        self.out_nr = 0
        self.requires_grad = False
        self.grad: Tensor | None = None
        self.acc: AccumulateGrad | None = None
        self.base: Tensor | None = None  # a view's base, which it keeps alive (torch's ViewInfo)
        self.name = label

    # -- facts --------------------------------------------------------------
    @property
    def numel(self) -> Dim:
        return numel(self.shape)

    @property
    def nbytes(self) -> Dim:
        return self.numel * ITEMSIZE[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def is_contiguous(self) -> bool:
        if any(self.shape[d] != 1 for d in self.zero):
            return False
        order = [d for d in self.perm if self.shape[d] != 1]
        return order == sorted(order)

    def __repr__(self) -> str:
        return f"Tensor({self.shape}, {self.dtype}, {self.name})"

    # -- aliases (no bytes) ---------------------------------------------------
    def alias(self, shape: Sequence[Dim] | None = None, perm: tuple[int, ...] | None = None, zero=()) -> Tensor:
        """A view of this tensor (no autograd): it shares the storage and keeps its base alive, as a torch
        view's ``ViewInfo`` does (so a view never holds the only reference to its storage)."""
        t = self.detach(shape, perm, zero)
        t.base = self.base if self.base is not None else self
        return t

    def detach(self, shape=None, perm=None, zero=None) -> Tensor:
        """A tensor sharing this one's storage, without autograd and without a base."""
        shape = self.shape if shape is None else tuple(shape)
        perm = self.perm if perm is None and shape == self.shape else perm
        t = Tensor(shape, self.dtype, self.storage, perm if perm is not None else contiguous_perm(len(shape)))
        t.zero = tuple(self.zero if zero is None and shape == self.shape else zero or ())
        return t


class WrappedNumber(Tensor):
    """The 0-d CPU tensor wrapping a Python number operand (8 bytes, ``scalar_to_tensor``), as autograd saves
    it (``MulBackward0``'s other): saved-tensor hooks never pack it (``SavedVariable``: "Avoid wrapped numbers
    from being leaked"), so a checkpointed region holds it too."""

    __slots__ = ()


def empty(shape: Sequence[Dim], dtype: str = "fp32", label: str = "empty", like: Tensor | None = None) -> Tensor:
    """A new tensor (an allocation); ``like``: take its layout (``empty_like``/TensorIterator outputs)."""
    perm = like.perm if like is not None and like.shape == tuple(shape) else None
    return Tensor(shape, dtype, None, perm, label)


def parameter(shape: Sequence[Dim], dtype: str = "fp32", name: str = "param") -> Tensor:
    """A leaf that requires grad (``nn.Parameter``)."""
    t = Tensor(shape, dtype, label=name)
    t.requires_grad = True
    return t


# -- autograd modes ---------------------------------------------------------------------------


@contextmanager
def _setting(name: str, value):
    """The current run's ``name`` set to ``value`` inside the region, restored after it."""
    run = current()
    old = getattr(run, name)
    setattr(run, name, value)
    try:
        yield
    finally:
        setattr(run, name, old)


def grad_mode(enabled: bool):
    """``torch.no_grad()`` (False) / ``torch.enable_grad()`` (True)."""
    return _setting("grad", enabled)


def no_grad():
    return grad_mode(False)


@contextmanager
def autocast(dtype: str = "bf16"):
    """An autocast region (``torch.autocast(dtype=...)``; the op policies are ``aten``'s): its weight cache
    (``cached_cast``: the lower-precision copy of an fp32 leaf that requires grad) lives until the region
    exits, then its copies die unless something else holds them."""
    run = current()
    old = run.autocast, run.autocast_cache, run.autocast_virtual
    run.autocast, run.autocast_cache, run.autocast_virtual = dtype, {}, 0
    try:
        yield
    finally:
        virtual = run.autocast_virtual
        run.autocast, run.autocast_cache, run.autocast_virtual = old
        if virtual:
            run.charge(-virtual, "autocast cache of repeated blocks", kernel=False)


def autocast_off():
    """A region with autocast turned off inside an autocast region (``torch.autocast(..., enabled=False)``): no op
    casts; the weight cache is kept, as autocast clears it only on leaving the outermost region."""
    return _setting("autocast", None)


@contextmanager
def saved_tensors_hooks(pack: Callable, unpack: Callable):
    """``torch.autograd.graph.saved_tensors_hooks``: what a node saves from now on is ``pack(t)``."""
    run = current()
    run.hooks.append((pack, unpack))
    try:
        yield
    finally:
        run.hooks.pop()


# -- the graph ---------------------------------------------------------------------------------


class SavedVar:
    """``SavedVariable``: a saved tensor (its storage, without its node), or what a pack hook returned."""

    __slots__ = ("data", "packed", "unpack_hook")

    def __init__(self, t: Tensor | None, run: Run):
        self.packed = self.unpack_hook = None
        self.data = None
        if t is None:
            return
        if run.hooks and not isinstance(t, WrappedNumber):  # wrapped numbers are never packed (SavedVariable.cpp)
            pack, self.unpack_hook = run.hooks[-1]
            self.packed = pack(t)
        else:
            self.data = t.detach()

    def unpack(self) -> Tensor | None:
        if self.unpack_hook is not None:
            return self.unpack_hook(self.packed)
        return self.data


class Ctx:
    """What a node's backward function reads besides its saved tensors: ``need`` (per input, whether its
    gradient is computed: ``task_should_compute_output``) and the op's keyword facts."""

    def __init__(self, facts: dict):
        self.__dict__.update(facts)


def wants(*inputs: Tensor | None) -> tuple[bool, ...] | None:
    """Per input, whether autograd will want its gradient (None: no node will be made).  An op saves
    only what the wanted gradients read (the codegen's conditional ``SavedVariable``)."""
    if not current().grad or not any(t is not None and t.requires_grad for t in inputs):
        return None
    return tuple(t is not None and t.requires_grad for t in inputs)


class Node:
    """An autograd node: ``fn(ctx, grads, *saved) -> grads for the inputs`` (None where not needed).

    ``next``: per input, ``(node, input_nr)`` or None; ``shapes``: the inputs' shapes (``validate_outputs``
    reduces an output gradient to it with sum_to); ``n_in``: how many gradients it receives."""

    __slots__ = ("ctx", "dtypes", "fn", "n_in", "name", "next", "pre_hooks", "saved", "segment", "seq", "shapes")

    def __init__(self, name, seq, next_, shapes, dtypes, saved, fn, ctx, n_in):
        self.name, self.seq, self.next, self.shapes, self.dtypes = name, seq, next_, shapes, dtypes
        self.saved, self.fn, self.ctx, self.n_in = saved, fn, ctx, n_in
        self.segment = current().segment  # the repeated block that recorded it
        self.pre_hooks: list[Callable[[], None]] = []  # tensor hooks on its outputs (``register_hook``)

    def release(self) -> None:
        self.saved = ()


class AccumulateGrad(Node):
    """The node of a leaf: sequence number "infinity", so it runs as soon as it is ready."""

    __slots__ = ("redistribute", "variable")

    def __init__(self, variable: Tensor, redistribute: bool = False):
        super().__init__("AccumulateGrad", float("inf"), (), (variable.shape,), (variable.dtype,), (), None, {}, 1)
        self.variable = variable
        self.redistribute = redistribute  # the gradient is another DTensor layout's: redistributed (a clone) first


def edge(t: Tensor | None):
    if t is None or not t.requires_grad:
        return None
    if t.grad_fn is not None:
        return (t.grad_fn, t.out_nr)
    if t.acc is None:
        t.acc = AccumulateGrad(t)
    return (t.acc, 0)


def record(
    name: str,
    inputs: Sequence[Tensor | None],
    outputs: Sequence[Tensor],
    fn: Callable,
    saved: Sequence[Tensor | None] = (),
    **ctx,
) -> bool:
    """Make the autograd node of an op when grad mode is on and an input requires grad.

    ``fn(ctx, grads, *saved_tensors)`` returns one gradient (or None) per input, in input order; it runs
    with grad mode off.  ``saved`` tensors are held (or packed by the active saved-tensor hooks) until the
    node runs.  Returns whether a node was made.  (An op that saves only inputs should rather use
    ``record_first``: torch packs them before its kernel runs.)"""
    node = _node(name, inputs, fn, saved, ctx, len(outputs))
    if node is None:
        return False
    for i, o in enumerate(outputs):
        o.grad_fn, o.out_nr, o.requires_grad = node, i, True
    return True


def record_first(
    name: str,
    inputs: Sequence[Tensor | None],
    make: Callable[[], tuple[Tensor, ...]],
    fn: Callable,
    saved: Sequence[Tensor | None] = (),
    **ctx,
) -> tuple[Tensor, ...]:
    """``record`` in torch's order for an op whose saved tensors are all inputs: the node is made and its
    inputs saved (packed) *before* ``make()`` allocates the outputs (the generated ``VariableType`` kernel
    saves, then redispatches).  Under checkpoint's early stop the last pack raises before the outputs exist.
    Returns ``make()``'s outputs."""
    node = _node(name, inputs, fn, saved, ctx, None)
    outputs = make()
    if node is not None:
        node.n_in = len(outputs)
        for i, o in enumerate(outputs):
            o.grad_fn, o.out_nr, o.requires_grad = node, i, True
    return outputs


def _node(name, inputs, fn, saved, ctx, n_in) -> Node | None:
    run = current()
    if not run.grad or not any(t is not None and t.requires_grad for t in inputs):
        return None
    ctx["need"] = tuple(t is not None and t.requires_grad for t in inputs)
    return Node(
        name,
        next(run.seq),
        tuple(edge(t) for t in inputs),
        tuple(None if t is None else t.shape for t in inputs),
        tuple(None if t is None else t.dtype for t in inputs),
        tuple(SavedVar(t, run) for t in saved),
        fn,
        Ctx(ctx),
        n_in,
    )


def view_of(
    base: Tensor, shape: Sequence[Dim], perm: tuple[int, ...] | None, name: str, back: Callable, zero=()
) -> Tensor:
    """A differentiable view of ``base``: ``back(grad)`` maps the view's gradient to ``base``'s (a view
    op's backward is itself a view, or a copy where the layout asks for one)."""
    out = base.alias(shape, perm, zero)
    record(name, (base,), (out,), lambda ctx, grads: (back(grads[0]),))
    return out


# -- the engine ------------------------------------------------------------------------------


def _sum_to(grad: Tensor, shape: tuple) -> Tensor:
    """``at::sum_to`` (validate_outputs): one sum with keepdim, then a view."""
    lead = grad.ndim - len(shape)
    kept = tuple(
        1 if i < lead or (shape[i - lead] == 1 and grad.shape[i] != 1) else d for i, d in enumerate(grad.shape)
    )
    out = Tensor(kept, grad.dtype, label="sum")
    # a reduction reads more than it writes (``analytic.step_time``), rows of its input's width
    current().note("reads", grad.nbytes, grad.shape[-1])
    current().target.sum_rows(grad, kept)
    return out.alias(shape)


def _accumulate(buffer: list, pos: int, var: Tensor, run: Run) -> None:
    """``InputBuffer::add`` / ``accumulate`` (torch/csrc/autograd/input_buffer.cpp): a traced run sums out of
    place (``old + var``: a new tensor, then the old one dies); a plain run adds in place into ``old`` when
    it holds the last reference to a dense tensor and its storage (``var.add_(old)`` is only for a sparse
    ``old``: a dense ``old`` it cannot reuse, such as a view, is summed out of place)."""
    old = buffer[pos]
    if old is None:
        buffer[pos] = var
        return
    if not run.traced and _owns(old):
        run.note("in_place", old.nbytes * 3, old.shape[-1])  # old.add_(var): reads both, writes old; no storage
        return
    buffer[pos] = Tensor(old.shape, old.dtype, perm=old.perm, label="add")  # old + var


def _owns(t: Tensor) -> bool:
    """``can_accumulate_inplace``: dense (no broadcast dims), and the only reference to its tensor and its
    storage.  The references counted here: the engine's one (a buffer slot or the outputs list), the
    caller's local, this function's argument and ``getrefcount``'s (4); the tensor's own to its storage
    and ``getrefcount``'s (2)."""
    dense = not any(t.shape[d] != 1 for d in t.zero)
    return dense and sys.getrefcount(t) <= 4 and sys.getrefcount(t.storage) <= 2


def backward(loss: Tensor, final: Callable[[], None] | None = None) -> None:
    """``loss.backward()`` (torch.autograd.backward with a ones_like seed; the graph is freed).  A node's
    ``pre_hooks`` run before its function (``call_tensor_pre_hooks``); ``final`` runs once the graph is done,
    the seed still alive (a callback queued with ``Variable._execution_engine.queue_callback``)."""
    run = current()
    seed = Tensor(loss.shape, loss.dtype, label="ones_like")
    root = loss.grad_fn
    deps: dict[Node, int] = {}
    stack, seen = [root], {root}
    while stack:
        node = stack.pop()
        for e in node.next:
            if e is None:
                continue
            deps[e[0]] = deps.get(e[0], 0) + 1
            if e[0] not in seen:
                seen.add(e[0])
                stack.append(e[0])
    buffers: dict[Node, list] = {root: [None] * root.n_in}
    buffers[root][loss.out_nr] = seed
    ready: list = [(-root.seq, 0, root)]
    tie = itertools.count(1)
    opened: _Open | None = None
    with grad_mode(False):
        while ready:
            node = heapq.heappop(ready)[2]
            if (opened.segment if opened else None) is not node.segment:  # a repeated block starts or ends
                if opened is not None:
                    opened.close(run)
                opened = _Open(run, node.segment) if node.segment is not None else None
            inputs = buffers.pop(node)
            if isinstance(node, AccumulateGrad):
                run.backward_segment = node.segment  # each copy's gradient
                _accumulate_grad(node, inputs, buffers)
                run.backward_segment = None
                del inputs
                continue
            for hook in node.pre_hooks:
                hook()
            run.backward_segment = node.segment  # its work, its outputs' accumulations included, is each copy's
            outputs = _call(node, inputs)
            del inputs  # call_function's variable_list dies: the incoming gradients
            node.release()  # release_variables()
            for i, e in enumerate(node.next):
                if e is None:
                    continue
                nxt, nr = e
                if outputs[i] is not None:
                    buf = buffers.get(nxt)
                    if buf is None:
                        buf = buffers[nxt] = [None] * nxt.n_in
                    _accumulate(buf, nr, outputs[i], run)
                deps[nxt] -= 1
                if deps[nxt] == 0:
                    if nxt not in buffers:
                        buffers[nxt] = [None] * nxt.n_in
                    heapq.heappush(ready, (-nxt.seq, next(tie), nxt))
            run.backward_segment = None
            del outputs
        if opened is not None:
            opened.close(run)
        if final is not None:
            final()
    del seed


def _call(node: Node, inputs: list) -> list:
    saved = [s.unpack() for s in node.saved]
    outputs = list(node.fn(node.ctx, inputs, *saved))
    del saved
    for i in range(len(outputs)):  # validate_outputs: a broadcast input gets its gradient summed down (not
        g = outputs[i]  # ``enumerate``, whose cached pair would hold the unsummed gradient through the cast)
        if g is None or node.next[i] is None:
            outputs[i] = None
            continue
        shape = node.shapes[i]
        if g.shape != shape:
            outputs[i] = g = _sum_to(g, shape)
        if node.dtypes[i] != g.dtype:  # validate_outputs: grad.to(input dtype)
            outputs[i] = Tensor(g.shape, node.dtypes[i], perm=cast_perm(g), label="_to_copy")
    return outputs


def cast_perm(g: Tensor) -> tuple[int, ...]:
    """The layout of ``_to_copy``'s output (``empty_like``, preserve format): ``g``'s, except for an expanded ``g``
    (stride-0 dims: not dense), whose strides ``infer_dense_strides`` infers, never moving a dim across a stride-0
    one: contiguous when the other dims are in order (a sum's gradient ``grad.unsqueeze(0).expand(...)``; here
    ``unsqueeze`` puts its size-1 dim innermost)."""
    if not g.zero:
        return g.perm
    rest = [p for p in g.perm if p not in g.zero]
    return contiguous_perm(g.ndim) if rest == sorted(rest) else g.perm


def _accumulate_grad(node: AccumulateGrad, inputs: list, buffers: dict) -> None:
    """``AccumulateGrad::apply`` / ``accumulateGrad`` (functions/accumulate_grad.h): steal the gradient when
    nothing else holds it and its layout obeys the parameter's, else clone it; add to an existing grad."""
    new = inputs[0]
    inputs[0] = None
    if new is None:
        return
    var = node.variable
    shared = any(x is new for buf in buffers.values() for x in buf)
    if var.grad is None:
        if not shared and new.is_contiguous() and new.shape == var.shape:
            var.grad = new.detach()
        else:
            var.grad = Tensor(var.shape, var.dtype, label="clone")
        if node.segment is not None:
            node.segment.grads = var.grad.nbytes + node.segment.grads
    else:  # grad + new (out of place); a gradient of another layout (a tied head's whole embedding gradient,
        # ``ops.tp`` rule 4f) is first redistributed to the parameter's rows (a clone), which dies after the sum
        rows = Tensor(var.shape, var.dtype, label="clone") if node.redistribute else None
        var.grad = Tensor(var.shape, var.dtype, label="add")
        del rows


# -- checkpoint ------------------------------------------------------------------------------


class _StopRecomputation(Exception):
    pass


class _Handle:
    __slots__ = ("__weakref__",)


class _Holder:
    __slots__ = ("__weakref__", "handle")

    def __init__(self):
        self.handle: _Handle | None = None


class _Frame:
    """``_CheckpointFrame``: the saved inputs, weak references to the holders in pack order, and the
    recomputed tensors keyed (weakly) by their holder's handle."""

    def __init__(self, fn: Callable, args: tuple, preserve_rng_state: bool = True):
        import weakref

        self.fn = fn
        self.saved_args = list(args)  # save_inputs: SavedVariables of inputs unpack with their autograd metadata
        self.preserve_rng_state = preserve_rng_state
        # preserve_rng_state: fwd_cpu_state = torch.get_rng_state(), kept by the frame
        self.rng = _rng_state() if preserve_rng_state else None
        self.holders: list = []
        self.recomputed: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.counter = 0
        self.done = False


def checkpoint(fn: Callable, *args, preserve_rng_state: bool = True) -> Tensor:
    """``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=...)`` (torch 2.13
    ``torch/utils/checkpoint.py``: ``_checkpoint_without_reentrant_generator``, ``_checkpoint_hook``,
    ``_recomputation_hook``; early stop on; no grad mode: a plain call).

    The frame keeps the tensor ``args`` (``save_inputs``) for as long as a node of ``fn``'s region still
    holds one of its holders (the hooks close over the frame); ``fn``'s saved tensors become holders; the
    first unpack reruns ``fn(*args)`` under grad mode, keeps each tensor packed again in ``recomputed``
    (until its holder is unpacked or dies) and stops once the last one is packed.  Bind keyword arguments
    with ``functools.partial`` as transformers does (they live as long as the frame)."""
    import weakref

    run = current()
    if not run.grad:
        return fn(*args)
    frame = _Frame(fn, args, preserve_rng_state)
    amp = run.autocast  # the recompute runs under the forward's autocast state (``recompute_fn``)

    def pack(t: Tensor) -> _Holder:
        holder = _Holder()
        frame.holders.append(weakref.ref(holder))
        return holder

    def unpack(holder: _Holder) -> Tensor:
        if not frame.done:
            inputs = list(frame.saved_args)  # get_inputs()
            frame.counter = 0
            try:
                with saved_tensors_hooks(repack, _identity), grad_mode(True), autocast_or_not(amp):
                    # recompute_fn's fork_rng (preserve_rng_state): the CPU state saved, restored at exit
                    forked = _rng_state() if frame.preserve_rng_state else None
                    frame.fn(*inputs)
            except _StopRecomputation:
                pass
            del forked
            frame.done = True
        ret = frame.recomputed[holder.handle]
        holder.handle = None
        return ret

    def repack(t: Tensor) -> Tensor:
        x = t.detach()
        idx = frame.counter
        frame.counter += 1
        holder = frame.holders[idx]()
        if holder is not None:
            holder.handle = _Handle()
            frame.recomputed[holder.handle] = x
        if frame.counter == len(frame.holders):
            raise _StopRecomputation
        return x

    with saved_tensors_hooks(pack, unpack):
        return fn(*args)


CPU_RNG_STATE_BYTES = 5056
"""``torch.get_rng_state()``: the CPU generator's state, a uint8 tensor of 5,056 elements (torch 2.13)."""


def _rng_state() -> Storage | None:
    """The CPU RNG state checkpoint saves (``preserve_rng_state``): seen by a plain CPU run's allocator only
    (a CPU tensor made outside the dispatcher: the tracker never sees it, the meta device does not hold it)."""
    return Storage(CPU_RNG_STATE_BYTES, "rng_state") if current().wraps else None


def _identity(x):
    return x


def autocast_or_not(dtype: str | None):
    return autocast(dtype) if dtype else nullcontext()
