"""The *plain* run measured: one training step on CPU tensors with no Python dispatch mode, read
from the CPU allocator's own events.

Why a second measurement: any ``TorchDispatchMode`` (our ``StorageTracker``, torch's MemTracker,
even a no-op mode), and every meta tensor, makes autograd pick out-of-place variants of backward
ops that a plain cpu/cuda run does in place (``isTensorSubclassLike`` in
``aten/src/ATen/TensorSubclassLikeUtils.h`` is true whenever a Python dispatch mode is active or a
tensor has the Meta key; ``torch/csrc/autograd/input_buffer.cpp`` ``accumulate``,
``torch/csrc/autograd/FunctionsManual.cpp`` ``gather_backward`` and ``index_backward`` branch on
it).  So the tracker measures the *traced* run; this module measures the *plain* one.

Method: ``torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=False)``
(RecordFunction callbacks and the allocator's memory reporter, no dispatch mode) around each
phase.  Every CPU allocation and free the allocator makes is one ``Allocation`` event of the
profiler's event tree (``alloc_size`` > 0 or < 0, in time order).  A phase's live bytes are the
bytes live when it starts plus the running sum of those deltas; its peak is the highest point.
The bytes live when the step starts are counted from the storages that exist then (parameters,
buffers, AdamW state, token ids), as the storage tracker does.

What the CPU allocator sees that a GPU does not (CPU-only; ``analytic.replay`` models them for
``device="cpu"`` only): AdamW's ``step`` counters (for-loop and foreach keep them on the CPU),
the 0-dim tensors that wrap Python scalars (8 and 4 bytes, live inside one op), the CPU flash
kernel's scratch buffers, and bf16 ``scatter_add_``'s fp32 copy of its output.

oneDNN is switched off for the measured step (``torch.backends.mkldnn``): on a CPU with AVX512-BF16
or AMX, ATen sends bf16 matmuls to oneDNN, whose reorders and scratchpad go through the same
allocator and depend on the ISA (measured: +11,774 bytes at the forward peak of a 2-layer toy on an
AMD EPYC with AVX512-BF16; none with ``ONEDNN_MAX_CPU_ISA=AVX2``).  Off, every CPU runs ATen's own
kernels, which allocate only the program's tensors: the figure is the same on every CI machine.
"""

from __future__ import annotations

import gc

import torch

from ..phases import PHASES, PhaseBytes, StepMemory


def _storages_bytes(*tensors) -> dict[int, int]:
    out = {}
    for t in tensors:
        if hasattr(t, "to_local"):  # a DTensor (FSDP2's sharded parameters): its local shard's storage
            t = t.to_local()
        if isinstance(t, torch.Tensor) and t.device.type == "cpu":
            st = t.untyped_storage()
            out[st.data_ptr()] = st.nbytes()
    return out


def live_step_bytes(model: torch.nn.Module, inputs, targets, opt: torch.optim.Optimizer) -> int:
    """CPU bytes of the storages live when a step starts: parameters (and grads), buffers, the
    optimizer's state, inputs and targets, each storage once."""
    seen: dict[int, int] = {}
    for p in model.parameters():
        seen.update(_storages_bytes(p, p.grad))
    seen.update(_storages_bytes(*model.buffers()))
    for state in opt.state.values():
        seen.update(_storages_bytes(*(v for v in state.values() if isinstance(v, torch.Tensor))))
    seen.update(_storages_bytes(inputs, targets))
    return sum(seen.values())


def allocation_deltas(prof) -> list[int]:
    """The CPU allocator's allocations (+bytes) and frees (−bytes) recorded by ``prof``, in time order."""
    from torch._C._profiler import _EventType

    events = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            fields = node.extra_fields
            if fields.device.type == "cpu":
                events.append((node.start_time_ns, fields.id, fields.alloc_size))
        stack.extend(node.children)
    events.sort()
    return [size for _, _, size in events]


KINETO_QUIET = "6"
"""``KINETO_LOG_LEVEL`` above kineto's USDT level: without it every profiler start and stop writes a
``USDT: ... profiler_start`` line on stderr (torch 2.13, CPU build), noise on a successful command.
Read when the profiler starts, so setting it here (unless the user set it) is enough."""


def _profile(fn) -> list[int]:
    """The allocator's deltas while ``fn`` runs, with oneDNN off (see the module's docstring)."""
    import os

    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", KINETO_QUIET)
    onednn = torch._C._get_mkldnn_enabled()
    torch._C._set_mkldnn_enabled(False)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
            fn()
    finally:
        torch._C._set_mkldnn_enabled(onednn)
    return allocation_deltas(prof)


def measure_training_step_plain(model, inputs, targets, loss_fn, opt: torch.optim.Optimizer) -> StepMemory:
    """Steady-state memory of one training step on CPU tensors with no dispatch mode installed.

    Same phases and semantics as ``tracker.measure_training_step``: forward (model and loss),
    backward (``loss.backward()``, then the loss is dropped), optimizer_step (``step()`` then
    ``zero_grad(set_to_none=True)``); each ``PhaseBytes(peak, end)``.  The optimizer's state must
    exist already (``tracker.init_optimizer_state``)."""
    if next(model.parameters()).device.type != "cpu":
        raise ValueError("the allocator measurement reads the CPU allocator: the model must be on cpu")
    gc.collect()
    baseline = live_step_bytes(model, inputs, targets, opt)
    box = {}

    def forward():
        box["loss"] = loss_fn(model(inputs), targets)

    def backward():
        box["loss"].backward()
        del box["loss"]

    def step():
        opt.step()
        opt.zero_grad(set_to_none=True)

    phases, live = {}, baseline
    for name, fn in zip(PHASES, (forward, backward, step), strict=True):
        peak = live
        for delta in _profile(fn):
            live += delta
            peak = max(peak, live)
        phases[name] = PhaseBytes(peak, live)
    return StepMemory(baseline, **phases)
