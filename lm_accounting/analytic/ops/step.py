"""One training step of a program, as ``measure.tracker.measure_training_step`` runs it.

``training_step(make, ...)`` creates the program's parameters, buffers and inputs (``make()``), AdamW's
state, then replays forward (``program.loss()``), ``backward(loss)`` and the loss dropped, and the AdamW
step with ``zero_grad(set_to_none=True)``: a ``StepInBatch`` (the bytes live at the start and each phase's
peak and end, exact functions of the micro-batch B).  A program is any object with ``parameters()`` (in
``model.parameters()`` order) and ``loss()``; it holds its parameters, buffers and inputs itself.

AdamW (torch 2.13 ``torch/optim/adam.py``; ``analytic.memory.adamw_step_temporary_bytes`` derives the same
bytes): ``foreach`` (``_multi_tensor_adam``) makes ``_foreach_sqrt`` of every v at once (per dtype group, the
previous group's freed once the next exists), then works in place;
``for-loop`` (``_single_tensor_adam``) makes per tensor ``exp_avg_sq.sqrt()`` and its quotient, the previous
tensor's ``denom`` still bound to the loop variable; ``fused`` makes nothing.  The step counters live on the
CPU for foreach and the for-loop (``Adam._init_group``), on the device for fused, and on a cpu target for all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .aten import cast_scalar, wrap_scalar
from .cuda import Cuda
from .engine import StepInBatch
from .tensors import Run, Tensor, backward, empty


class StepProgram(Protocol):
    def parameters(self) -> list[Tensor]: ...

    def loss(self) -> Tensor: ...


class Sharding(Protocol):
    """A data-parallel wrapper of the program (``ops.fsdp.FullyShard``): ``shard(program)`` installs its hooks
    and returns the parameters AdamW steps (the rank's shards); ``forward_end`` returns the wrapped forward's
    output for the loss; ``backward_end`` runs in backward's final callback; ``zero_grad`` frees what it holds of
    the gradients.  One may have an ``adamw(params, v, optimizer)`` of its own in place of ``adamw_step``
    (``ops.tp``: AdamW's parameter groups)."""

    def shard(self, program: StepProgram) -> list[Tensor]: ...

    def forward_end(self, loss: Tensor) -> Tensor: ...

    def backward_end(self) -> None: ...

    def zero_grad(self) -> None: ...


def adamw_step(params: list[Tensor], v: list[Tensor], optimizer: str) -> None:
    """The temporaries of ``AdamW.step()`` (see the module docstring); the updates are in place."""
    if optimizer == "foreach":
        # one pass per dtype group (``_group_tensors_by_device_and_dtype``: DeepSeek's fp32 router weights in a
        # bf16 model); the previous group's ``exp_avg_sq_sqrt`` dies when the next one's is bound
        groups: dict[str, list[Tensor]] = {}
        for x in v:
            groups.setdefault(x.dtype, []).append(x)
        sqrt = None
        for dtype, group in groups.items():
            new = [empty(x.shape, x.dtype, "_foreach_sqrt") for x in group]
            sqrt = new  # the previous group's list dies here
            del new
            _scalar(dtype)  # _foreach_div_(sqrt, bias_correction2_sqrt): a wrapped number at the top
        del sqrt
    elif optimizer == "for-loop":
        denom = None
        for x in v:  # denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
            root = empty(x.shape, x.dtype, "sqrt")
            wrapped = wrap_scalar(x.dtype)
            cast = cast_scalar(wrapped, x.dtype)
            quotient = empty(x.shape, x.dtype, "div")
            del cast, wrapped, root
            denom = quotient  # the previous tensor's denom dies here
            del quotient
        del denom
    elif optimizer == "fused":
        _scalar("fp32")  # _fused_adamw_'s scalar arguments
    else:
        raise ValueError(f"unknown AdamW implementation {optimizer!r}")


def _scalar(dtype: str) -> None:
    """A plain CPU run: a Python number wrapped (8 bytes) and cast to ``dtype``, both dying at once."""
    wrapped = wrap_scalar(dtype)
    cast = cast_scalar(wrapped, dtype)
    del cast, wrapped


def training_step(
    make: Callable[[], StepProgram],
    *,
    optimizer: str = "foreach",
    device: str = "meta",
    traced: bool = True,
    log: list | None = None,
    log_batch: int = 1,
    cpu_threads: int = 1,
    sharding: Sharding | None = None,
    cuda_batch: int | None = None,
    optimizer_step: bool = True,
) -> StepInBatch:
    """Replay one steady-state training step of ``make()``'s program (see the module docstring), on one rank
    of ``sharding``'s job if given.  Without ``optimizer_step`` it stops after the backward (``step_time`` prices
    the forward and the backward, AdamW from ``exp_avg``'s bytes): its last phase is empty.

    ``traced``: what the storage tracker sees (every meta run); ``log``: receives every allocation and free
    as ``(label, bytes at log_batch)``, with a ``("PHASE", 0)`` line at each phase's end.  A plain run on
    ``device`` "cpu" (what the CPU allocator sees) adds the wrapped Python numbers and the kernels' scratch
    (per thread: ``cpu_threads``, ``torch.get_num_threads()``); on "cuda", CUDA's kernel facts (``cuda.Cuda``: the
    scratch that is no line in B taken at ``cuda_batch``)."""
    target = Cuda(cuda_batch) if device == "cuda" else None
    with Run(traced, log, log_batch, wraps=not traced and device == "cpu", threads=cpu_threads, target=target) as run:
        program = make()
        params = program.parameters() if sharding is None else sharding.shard(program)
        if sharding is None and hasattr(program, "untrained"):
            # a parameter no gradient reaches (DSA's indexer, under torch.no_grad()): AdamW makes no state for it
            untrained = {id(p) for p in program.untrained()}
            params = [p for p in params if id(p) not in untrained]
        m = [empty(p.shape, p.dtype, "exp_avg") for p in params]
        v = [empty(p.shape, p.dtype, "exp_avg_sq") for p in params] if optimizer_step else []
        on_device = optimizer == "fused" or device == "cpu"
        steps = [empty((), "fp32", "step") for _ in params] if on_device and optimizer_step else []
        run.phase()
        baseline = run.live
        loss = program.loss()
        if sharding is not None:
            loss = sharding.forward_end(loss)
        forward = run.phase()
        backward(loss, final=sharding.backward_end if sharding is not None else None)
        del loss
        back = run.phase()
        if optimizer_step:  # a sharding's own step (``ops.tp``: per parameter group), else one group
            getattr(sharding, "adamw", adamw_step)(params, v, optimizer)
        for p in params:
            p.grad = None
        if sharding is not None:
            sharding.zero_grad()
        if run.virtual_grads:  # the gradients of repeated blocks' copies (``tensors.repeated``)
            run.charge(-run.virtual_grads, "zero_grad of repeated blocks", kernel=False)
        step = run.phase()
        del program, params, m, v, steps
    return StepInBatch(baseline, forward, back, step)
