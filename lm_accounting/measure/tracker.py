"""Peak memory of forward / backward / optimizer step, with or without a GPU.

``StorageTracker`` (a ``TorchDispatchMode``) counts each op output's storage
once, at ``untyped_storage().nbytes()``, and uncounts it when the storage dies.
Outputs the op schema marks as aliasing an input (views, in-place, out=) never
count as new.  Deaths come from a ``weakref`` callback on the storage's Python
object, which torch keeps alive exactly as long as the C++ ``StorageImpl``
(PyObject preservation; checked on torch 2.13, cpu and meta).  This is the
mechanism of torch's private ``distributed._tools.mem_tracker.MemTracker``,
without its per-module hooks and snapshots: one dict lookup per op output.
On ``meta`` nothing is allocated, and each op's meta kernel runs once per distinct
input (``meta_memo``), so a training step of GPT-2-XL at 16k context takes ~0.3 s.
``measure_training_step_cuda`` reads the CUDA caching allocator's counters.
"""

from __future__ import annotations

import contextlib
import gc
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..phases import PhaseBytes, StepMemory
from .meta_memo import MetaMemo, MetaMemoMode

CUDA_MIN_BLOCK = 512  # c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512


def cuda_rounding(nbytes: int) -> int:
    """Bytes the CUDA caching allocator reports for a request of ``nbytes``.

    ``memory_allocated()`` counts each block rounded up to a multiple of
    kMinBlockSize = 512 (c10/cuda/CUDACachingAllocator.cpp, ``round_size``);
    a 0-byte request allocates nothing.  This is exact for the small pool
    (requests <= 1 MiB).  A large-pool block is split only if more than 1 MiB
    would remain (``should_split``), so a large request can be charged up to
    1 MiB more than this.
    """
    return -(-nbytes // CUDA_MIN_BLOCK) * CUDA_MIN_BLOCK


class StorageTracker(TorchDispatchMode):
    """Live storage bytes per device: ``current[dev]``, ``peak[dev]`` (exact ints).

    ``rounding`` maps a storage's nbytes to the bytes charged (``cuda_rounding``).
    Storages from before the mode are invisible unless registered with
    ``track`` / ``track_module`` / ``track_optimizer``.  Not seen: direct
    ``UntypedStorage.resize_`` (not an op) and kernel-internal scratch buffers.

    ``listener(phase, op, delta, device)``, if given, hears every charge (+bytes, ``op`` the aten op whose
    output it is) and every release (−bytes, ``op`` the last op dispatched before the storage died), with
    the phase running (``"setup"`` before the first): ``measure.trace`` prints them.
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps every subclass's __torch_dispatch__ in torch._disable_dynamo
        # unless this says False; the wrapper costs ~4% of a training step on meta,
        # and we never run under torch.compile.
        return False

    def __init__(self, rounding: Callable[[int], int] | None = None, listener: Callable | None = None):
        super().__init__()
        self.rounding = rounding
        self.listener, self.phase_name, self.op_name = listener, "setup", ""
        self.current: dict[torch.device, int] = {}
        self.peak: dict[torch.device, int] = {}
        self.phases: OrderedDict[str, dict[torch.device, PhaseBytes]] = OrderedDict()
        self._live: dict[int, list] = {}  # id(storage) -> [weakref, bytes, device]
        self._fresh: dict = {}  # op -> per-return flag: True unless it aliases an input
        self.memo = MetaMemo()  # meta kernels run once per distinct input (measure.meta_memo)

    # -- bookkeeping -------------------------------------------------------
    def _on_free(self, key: int, _ref) -> None:
        entry = self._live.pop(key, None)
        if entry is not None:
            self.current[entry[2]] -= entry[1]
            if self.listener is not None:
                self.listener(self.phase_name, self.op_name, -entry[1], entry[2])

    def _see(self, t: torch.Tensor, fresh: bool = True) -> None:
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested, ...
            return
        nbytes = st.nbytes()
        if self.rounding is not None:
            nbytes = self.rounding(nbytes)
        key = id(st)
        entry = self._live.get(key)
        if entry is None:  # new storage: charge it, watch its death
            if not fresh:  # alias of an untracked tensor from before the mode
                return
            dev = st.device
            self._live[key] = [weakref.ref(st, lambda r, k=key: self._on_free(k, r)), nbytes, dev]
        elif entry[1] != nbytes:  # known storage was resized (aten.resize_, out=)
            dev, delta = entry[2], nbytes - entry[1]
            entry[1] = nbytes
            nbytes = delta
        else:  # view, in-place op, already-tracked tensor: nothing new
            return
        cur = self.current.get(dev, 0) + nbytes
        self.current[dev] = cur
        if self.listener is not None:
            self.listener(self.phase_name, self.op_name, nbytes, dev)
        if cur > self.peak.get(dev, 0):
            self.peak[dev] = cur

    def _visit(self, out, fresh: bool = True) -> None:
        if isinstance(out, torch.Tensor):
            self._see(out, fresh)
        elif isinstance(out, (tuple, list)):
            for o in out:
                self._visit(o, fresh)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.listener is not None:
            self.op_name = func.__name__
        out = self.memo(func, args, kwargs)
        flags = self._fresh.get(func)
        if flags is None:
            schema = getattr(func, "_schema", None)
            rets = schema.returns if schema is not None else ()
            flags = self._fresh[func] = tuple(r.alias_info is None for r in rets) or (True,)
        if len(flags) == 1:  # one Tensor, or one Tensor[] return
            self._visit(out, flags[0])
        else:
            for o, fresh in zip(out, flags, strict=False):
                self._visit(o, fresh)
        return out

    # -- registering pre-existing tensors ----------------------------------
    def track(self, *tensors) -> StorageTracker:
        """Count tensors that were created outside the mode (None is ignored)."""
        for t in tensors:
            self._visit(t)
        return self

    def track_module(self, module: torch.nn.Module) -> StorageTracker:
        """Count a module's parameters, their ``.grad`` if any, and buffers."""
        for p in module.parameters():
            self.track(p, p.grad)
        return self.track(*module.buffers())

    def track_optimizer(self, optimizer: torch.optim.Optimizer) -> StorageTracker:
        """Count optimizer state tensors (AdamW exp_avg, exp_avg_sq, step)."""
        for state in optimizer.state.values():
            self.track(*(v for v in state.values() if isinstance(v, torch.Tensor)))
        return self

    # -- queries -----------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str):
        """Record the peak inside the block and the live bytes at its end.

        The running peak of every device is reset to its current value on entry.
        """
        for dev, cur in self.current.items():
            self.peak[dev] = cur
        self.phase_name = name
        try:
            yield self
        finally:
            self.phases[name] = {
                dev: PhaseBytes(max(self.peak.get(dev, 0), cur), cur) for dev, cur in self.current.items()
            }

    def phase_table(self, device) -> OrderedDict[str, PhaseBytes]:
        """name -> PhaseBytes(peak, end) for one device (0 where never used)."""
        dev = _norm_device(device)
        return OrderedDict((n, d.get(dev, PhaseBytes(0, 0))) for n, d in self.phases.items())

    def live_bytes(self, device) -> int:
        return self.current.get(_norm_device(device), 0)


def _norm_device(device) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def _train_step(model, inputs, targets, loss_fn, opt, phase=lambda name: contextlib.nullcontext()):
    with phase("forward"):
        loss = loss_fn(model(inputs), targets)
    with phase("backward"):
        loss.backward()
        del loss  # the graph is already freed; the 0-d loss dies here
    with phase("optimizer_step"):
        opt.step()
        opt.zero_grad(set_to_none=True)


def init_optimizer_state(opt: torch.optim.Optimizer) -> None:
    """Create the state of every parameter that has none (AdamW: step, exp_avg, exp_avg_sq).

    One ``opt.step()`` on zero gradients leaves the same tensors (shapes, dtypes, devices) as
    a first training step, without its forward and backward: the tracker counts storages,
    not values.  The gradients are then dropped, as ``zero_grad(set_to_none=True)`` does.
    """
    params = [
        p
        for group in opt.param_groups
        for p in group["params"]
        if p.requires_grad and p not in opt.state and not getattr(p, "unreached", False)
    ]  # a frozen parameter never gets a grad, nor one no gradient reaches (``hf.mark_unreached``)
    if not params:
        return
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    opt.zero_grad(set_to_none=True)


def _warm_up(model, inputs, targets, loss_fn, optimizer, optimizer_kwargs, steps):
    if isinstance(optimizer, torch.optim.Optimizer):
        opt = optimizer
    elif optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), **(optimizer_kwargs or {}))
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}")
    for _ in range(steps):
        _train_step(model, inputs, targets, loss_fn, opt)
    if steps:  # storages of a full step kept only by reference cycles would die at random times
        gc.collect()  # (~0.15 s with torch loaded; init_optimizer_state leaves nothing to collect)
    init_optimizer_state(opt)
    return opt, next(model.parameters()).device


def measure_training_step(
    model,
    inputs,
    targets,
    loss_fn,
    *,
    optimizer="adamw",
    optimizer_kwargs=None,
    warmup_steps=0,
    rounding=None,
    listener=None,
) -> dict:
    """Steady-state memory of one training step, via ``StorageTracker``.

    Runs ``warmup_steps`` full steps, creates any missing optimizer state
    (``init_optimizer_state``: no forward or backward needed), then measures
    one: forward (model and loss), backward (``loss.backward()``, then the loss
    is dropped), optimizer_step (``step()`` then ``zero_grad(set_to_none=True)``).
    Returns a ``StepMemory``: the bytes live when the step starts (params,
    optimizer state, inputs, targets) and each phase's ``PhaseBytes(peak, end)``,
    for the device of the model's first parameter.  ``optimizer``: "adamw" or an
    optimizer instance.  Note: non-fused AdamW keeps ``step`` on the cpu.  ``listener``: see
    ``StorageTracker`` (``measure.trace.trace_step`` uses it).
    """
    tracker = StorageTracker(rounding, listener)
    memo = MetaMemoMode(tracker.memo) if next(model.parameters()).is_meta else contextlib.nullcontext()
    with memo:  # on meta the warm-up runs the measured step's kernels: the step takes them from memory
        opt, dev = _warm_up(model, inputs, targets, loss_fn, optimizer, optimizer_kwargs, warmup_steps)
    tracker.track_module(model).track_optimizer(opt).track(inputs, targets)
    baseline = tracker.live_bytes(dev)
    with tracker:
        _train_step(model, inputs, targets, loss_fn, opt, tracker.phase)
    return StepMemory(baseline, **tracker.phase_table(dev))


def measure_forward(model, inputs, *, grad: bool = False, rounding=None) -> tuple[int, PhaseBytes]:
    """Memory of ``model(inputs)``; with ``grad=True`` autograd saves activations.

    Returns ``(baseline bytes, PhaseBytes(peak, end))``; ``end`` includes the
    output (and, with grad, everything saved for backward).
    """
    gc.collect()
    dev = next(model.parameters()).device
    tracker = StorageTracker(rounding).track_module(model).track(inputs)
    baseline = tracker.live_bytes(dev)
    with tracker, torch.set_grad_enabled(grad), tracker.phase("forward"):
        out = model(inputs)  # noqa: F841  (kept alive until the phase ends)
    return baseline, tracker.phase_table(dev)["forward"]


CUBLAS_WORKSPACES = "cuBLAS/cuBLASLt workspaces (measured)"
ALLOCATOR_ROUNDING = (
    "caching allocator: 512-byte rounding and unsplit blocks (peak allocated − peak requested, measured)"
)


def cuda_counters(dev) -> tuple[int, int, int, int]:
    """(requested current, requested peak, allocated current, allocated peak) bytes of the caching
    allocator on ``dev``: ``requested_bytes`` is what the program asked for (a storage's nbytes),
    ``allocated_bytes`` what the allocator charged (``memory_allocated``)."""
    import torch

    torch.cuda.synchronize(dev)
    s = torch.cuda.memory_stats(dev)
    return (
        s["requested_bytes.all.current"],
        s["requested_bytes.all.peak"],
        s["allocated_bytes.all.current"],
        s["allocated_bytes.all.peak"],
    )


def cublas_workspace_bytes(dev) -> int:
    """Bytes the cuBLAS/cuBLASLt workspaces hold on ``dev`` (torch allocates them through the caching
    allocator at a thread's first matmul on a stream); measured by freeing them
    (``torch._C._cuda_clearCublasWorkspaces``: they are allocated again at the next matmul)."""
    before = cuda_counters(dev)[0]
    torch._C._cuda_clearCublasWorkspaces()
    return before - cuda_counters(dev)[0]


def measure_training_step_cuda(
    model, inputs, targets, loss_fn, *, optimizer="adamw", optimizer_kwargs=None, warmup_steps=1
) -> StepMemory:
    """``measure_training_step`` from the CUDA caching allocator's counters: a plain run.

    Figures are the bytes the program's tensors requested (``requested_bytes``, comparable byte for
    byte with the storage tracker and the replay's plain run) less the cuBLAS workspaces, which the
    warm-up step allocates (each thread's first matmul: the forward's and autograd's) and which stay
    live from then on.  What the device really holds beyond them is in ``overheads``, labelled and
    measured: the workspaces, and allocated − requested at the step's peak (``memory_allocated``
    charges each block rounded up to 512 bytes, and a whole cached block when less than 1 MiB would
    remain after a split: c10/cuda/CUDACachingAllocator.cpp, ``round_size``, ``should_split``).  Note
    that torch's default AdamW is foreach on cuda but the for-loop on cpu and meta.
    """
    opt, dev = _warm_up(model, inputs, targets, loss_fn, optimizer, optimizer_kwargs, warmup_steps)
    table: OrderedDict[str, PhaseBytes] = OrderedDict()
    allocated = [0]  # the step's peak of allocated_bytes

    @contextlib.contextmanager
    def phase(name):
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)  # peak := current
        yield
        requested, peak, _allocated, allocated_peak = cuda_counters(dev)
        table[name] = PhaseBytes(peak, requested)
        allocated[0] = max(allocated[0], allocated_peak)

    baseline = cuda_counters(dev)[0]
    _train_step(model, inputs, targets, loss_fn, opt, phase)
    ws = cublas_workspace_bytes(dev)
    less = {name: PhaseBytes(p.peak - ws, p.end - ws) for name, p in table.items()}
    rounding = allocated[0] - max(p.peak for p in table.values())
    return StepMemory(baseline - ws, **less, overheads=((CUBLAS_WORKSPACES, ws), (ALLOCATOR_ROUNDING, rounding)))
