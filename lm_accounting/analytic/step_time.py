"""Step time on one GPU: the op library's plain CUDA run, op by op, priced by a table measured on that GPU.

A slice of issue 28 (one GPU, no communication; ``train-time`` prints it).  The program is the one the memory
replay walks (``ops.predict_step(..., mode="plain", device="cuda")``), recorded by ``ops.tensors.recording_work``;
the prices come from ``lm_accounting/calibration/<gpu>/``, written by ``benchmarks/cuda_calibrate.py`` on that GPU
(env.json: the GPU, driver and torch).  Per op, numbered as the code applies them:

1. A matrix product (``mm``, ``addmm``, ``bmm``; forward, input and weight gradients): 2·m·n·k FLOPs at the rate
   ``torch.mm`` reached at that dtype and operand layout (gemm.csv), interpolated linearly in log m, log n, log k
   (log rate) between the grid's points, clamped at its edges.  A GEMM with a dimension that is no multiple of 8
   (a vocabulary such as GPT-2's 50,257: cuBLAS then runs cutlass's ``align1`` kernels) costs that aligned price
   times the slowdown measured on the LM head's GEMMs (gemm_unaligned.csv: each unaligned GEMM over the same GEMM
   with the vocabulary rounded up to a multiple of 8, 4-8x in bf16 on Hopper), log-interpolated the same way.
1b. transformers' experts (``torch._grouped_mm`` over every (token, expert) slot, the routing taken as balanced):
   E products of (S/E, n, k), priced as in 1 from grouped.csv (the forward, ``grouped_nt``, and both gradients,
   ``grouped_bwd``, measured at three models' expert shapes; each row's seconds / E per product).
1c. ``batch`` products of one shape in one kernel (``bmm``) as one GEMM of batch·m rows (``batched_seconds``).
1d. A product that reads an operand in place from rows of an odd length (gpt-oss's ``probs[..., :-1] @ v``: 2,048 of
   each 2,049-wide row; ``aten._odd_lead``), forward and the gradient that reads it again: cuBLAS's ``align1``
   kernels, priced as in 1 times the slowdown odd_width.csv measured on such a ``bmm`` (``bmm_rows``: 2.1x in bf16,
   none in fp32), linear in log-log between its widths, clamped at its ends.
2. Fused attention: seconds per unit of B·h·S²·d_head measured at that backend, d_head (64 or 128) and dtype with
   ``is_causal`` (attention.csv), interpolated in log S; the backward is the forward + backward less the forward.
   cuDNN attention is priced at flash's rate (not measured separately).
2b. llm-foundry's Triton FlashAttention (``ops.llmfoundry``: flash-attn's ``flash_attn_triton.py`` on the
   pre-MLIR Triton, "only tested on A100") at flash's measured time times ``TRITON_FLASH_SLOWDOWN``: no H100
   measurement of that kernel is published; two A100 ones bound it (see the constant).
3. Every other storage an op makes: a memory-bound kernel moving ``TRAFFIC[label]`` times its bytes (an elementwise
   binary op reads two operands and writes one) at the measured bandwidth, plus a fixed per-kernel time; both from
   memory_bound.csv (``Calibration.bandwidth``, ``Calibration.kernel_overhead``).  A softmax (forward, log and
   backward) and a LayerNorm move theirs at their own measured rate in the storage's dtype (``RATED``: bf16's
   softmax reaches 1.27 TB/s on the H100 where a copy reaches 2.92).  A reduction also reads its whole input
   (``reads``), and autograd's in-place gradient sums are kernels of their own (``in_place``).  A ``cat`` along
   the last dimension (``cat_column``: rotary halves, gpt-oss's sink column) is rated too: a third of the copy's.
3b. A softmax, its backward or a ``cat_column`` over rows of an odd length (gpt-oss's 2,049 wide scores; GPT-2's
   50,257-wide logits) runs slower than over even rows: their rate over the slowdown odd_width.csv measured at odd
   widths (softmax 1.8x at 2,049 in bf16, 1.07x at 4,097), linear in log-log, clamped at the table's widest.
4. AdamW: 7 reads and writes of every parameter element (p, g, m, v read; p, m, v written) at the rate the
   implementation reached on the largest tensors (optimizer.csv).
5. The backward of ``t[ids]``: ``index_put_`` accumulating the gradient's rows into ``t``'s, which CUDA runs by
   sorting the ids and summing each slot's rows one after another (``indexing_backward_kernel``): few slots taking
   many rows (gpt-oss's expert biases gathered per routed token: 32 slots, 512 rows each) run 5-30x under the
   copy's bandwidth.  Priced from index_put.csv (rows, width, slots; ids uniform over the slots), interpolated
   (``index_put_seconds``).

6. Sequence parallel (``plan``, a TP-local program under SP): the norms, residual adds and their gradients run on
   the rank's S/tp tokens (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
   §4.2.2; torchtitan's ``SequenceParallel`` on the norms, Megatron's ``sequence_parallel``).  In the TP-local
   program those are the activations whose rows are d_model wide (the heads, d_ff and the vocabulary are the
   TP-local widths; a weight's bytes are no line in B): their memory-bound bytes (``Program.at``'s
   ``sequence_shards``) are priced at a tp-th, their kernels one each as before.  A TP-local width that equals
   d_model would be counted with them (none among the presets at tp >= 2).

What it leaves out, named on each result (``StepTime.caveats``): a GEMM dimension that is no multiple of 8 on a
table without gemm_unaligned.csv (priced as if aligned), the programs' other in-place ops
(the norms' ``add_``, the optimizer's are priced in 4), and the host: the model is the GPU's busy time, right when
the GPU, not Python, is the bottleneck.  gpt-oss's gathers' backward took 2.3x what index_put.csv's uniform ids
price (benchmarks/step_time_report.py).

A GPU with no table of its own (A100, ...) gets a derived one, labelled "scaled from the H100 calibration"
(``Calibration.scaled_from``): the H100's measured seconds scaled by the ratio of the two GPUs' datasheet figures in
``gpus.GPUS`` (each cited there): GEMMs and fused attention by the dense peak of their dtype (bf16, fp32), the
memory-bound bandwidth and AdamW's rates by the HBM bandwidth; the per-kernel time is kept.  A GPU lacking one of
those figures is refused in one line.  How far that rule is off is measured where a published run used such a GPU
(``published_runs``: the A100 rows).

``program`` records one step once per (model, context, setup, implementation), at micro-batch 2, whose records are
lines in B (``ops.predict_step``: exact for B >= 2; at B = 1 torch views what it copies at B >= 2, a copy of under
a millionth of the step priced anyway), and compiles them (``Program``): per phase the GEMM shapes with their
counts, the attention calls, and the memory-bound bytes as a line in B.  Pricing a compiled program at any B and on
any GPU is then a few dozen table look-ups, which is what lets ``plan`` price thousands of candidates.  No torch.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from ..config import AccountingError, ModelConfig
from ..setup import TrainingSetup
from .ops.engine import Affine

CALIBRATION_DIR = Path(__file__).resolve().parent.parent / "calibration"
DTYPES = {"bf16": "bfloat16", "fp16": "bfloat16", "fp32": "float32"}
TRAFFIC = {
    "add": 3,
    "mul": 3,
    "sub": 3,
    "div": 3,
    "where": 3,
    "_to_copy": 2.5,
    "_softmax_backward_data": 3,
    "_log_softmax_backward_data": 3,
}
"""Bytes moved per byte made, by the op that made it (default 2: read one operand, write one).  ``_to_copy``
between fp32 and bf16 reads 4 or 2 bytes per 2 or 4 written: 2.5 on average.  A softmax's backward reads the
gradient and the saved output."""
SKIP = (
    *("mm", "addmm", "bmm", "grouped_mm", "flash", "cudnn", "efficient", "exp_avg", "exp_avg_sq", "step"),
    *("softmax_backward_tmp", "index_put_sort"),
)
"""Storages priced elsewhere (1, 2, 4, 5: CUDA's ``grad * output`` inside the softmax backward is part of the
measured op, the ids' sort part of the measured ``index_put_``) or made outside the timed step."""
RATED = {
    "_softmax": "softmax",
    "_log_softmax": "softmax",
    "_softmax_backward_data": "softmax_backward",
    "native_layer_norm": "layer_norm",
    "cat_column": "cat_column",
}
"""(3) A storage's label -> the op of memory_bound.csv (odd_width.csv: the softmax backward and a ``cat`` along the
last dimension) whose own measured rate prices it, at the storage's dtype: a softmax moves its bytes at under half
the copy's bandwidth in bf16, a ``cat`` of rows at about a third."""
ODD = ("softmax", "softmax_backward", "cat_column")
"""(3b) The RATED ops odd_width.csv measures at rows of an odd length beside the even length one less."""
ADAMW_BYTES_PER_ELEMENT = 7  # p, g, m, v read; p, m, v written
TRITON_FLASH_SLOWDOWN = 1.7
"""(2b) The Triton FlashAttention's forward + backward time over torch's flash kernel (FlashAttention-2), the
published lower bound on an A100 (no H100 figure exists): (1) Dao 2023, "FlashAttention-2", arXiv:2307.08691 §4.1:
FlashAttention-2 is 1.7-3.0x faster than FlashAttention (forward + backward, A100 80GB); (2) the Triton kernel's own
docstring (flash-attn eff9fe6 flash_attn_triton.py, copied as llm-foundry's layers/flash_attn_triton.py):
"Overall Triton forward + backward is slightly slower than CUDA forward + backward" (FlashAttention's CUDA).  So
the Triton kernel takes at least 1.7x FlashAttention-2's time; the bound is taken, not fitted."""


def calibrations() -> list[str]:
    return sorted(p.name for p in CALIBRATION_DIR.iterdir() if (p / "gemm.csv").exists())


def _rows(gpu: str, name: str) -> list[dict]:
    with (CALIBRATION_DIR / gpu / name).open(newline="") as fh:
        return [r for r in csv.DictReader(fh) if not r.get("error")]


@dataclass(frozen=True)
class Calibration:
    """One GPU's measured rates (``benchmarks/cuda_calibrate.py``)."""

    gpu: str
    env: dict
    gemm: dict  # (dtype, layout) -> {(m, n, k): seconds}
    attention: list
    bandwidth: float  # bytes/s: the largest copy or add in memory_bound.csv, bytes read + written
    kernel_overhead: float  # seconds a memory-bound kernel takes beyond its bytes at ``bandwidth``
    optimizer: dict  # (impl, dtype) -> bytes/s on the largest tensors
    scaled_from: str | None = None  # the measured GPU a derived table is scaled from (module docstring)
    unaligned: dict = field(default_factory=dict)  # (dtype, layout) -> {(m, n, k): slowdown}; (1)
    rates: dict = field(default_factory=dict)  # (op, dtype) -> bytes/s of a RATED op; (3)
    index_put: dict = field(default_factory=dict)  # dtype -> {(rows, width): [(repeats, seconds), ...]}; (5)
    odd: dict = field(default_factory=dict)  # (op, dtype) -> [(odd width, slowdown), ...] ascending; (3b)

    @property
    def label(self) -> str:
        """The GPU and where its prices come from, as every output names them."""
        if self.scaled_from:
            return f"{self.gpu} scaled from the H100 calibration ({self.scaled_from})"
        return f"{self.gpu} calibration ({self.env.get('gpu', self.gpu)}, torch {self.env.get('torch', '?')})"


REFERENCE = "h100-80gb"
"""The measured GPU a derived table is scaled from."""
TORCH_DTYPES = {"bfloat16": "bf16", "float32": "fp32"}  # a table's dtype -> the peak it runs at (``gpus.GPU.peak``)


@cache
def load(gpu: str) -> Calibration:
    """``gpu``'s own table, or one scaled from ``REFERENCE``'s (module docstring); ``gpu`` is a ``gpus`` name."""
    if gpu not in calibrations():
        return _scaled(gpu)
    gemm: dict = {}
    for r in _rows(gpu, "gemm.csv"):
        gemm.setdefault((r["dtype"], r["layout"]), {})[int(r["m"]), int(r["n"]), int(r["k"])] = float(r["seconds"])
    if (CALIBRATION_DIR / gpu / "grouped.csv").exists():  # (1b): per expert's product, E per row
        for r in _rows(gpu, "grouped.csv"):
            per_product = float(r["seconds"]) / int(r["experts"])
            gemm.setdefault((r["dtype"], r["layout"]), {})[int(r["m"]), int(r["n"]), int(r["k"])] = per_product
    bound = _rows(gpu, "memory_bound.csv")
    largest = max(int(r["numel"]) for r in bound)
    bandwidth = max(
        int(r["bytes"]) / float(r["seconds"])
        for r in bound
        if r["op"] in ("copy", "add") and int(r["numel"]) == largest
    )
    # the per-kernel time: a 2^24-element copy or add less its bytes at that bandwidth (the smaller sizes are
    # timed at the host's launch rate, not the GPU's)
    mid = [
        float(r["seconds"]) - int(r["bytes"]) / bandwidth
        for r in bound
        if r["op"] in ("copy", "add") and int(r["numel"]) == 2**24
    ]
    optimizer: dict = {}
    for r in _rows(gpu, "optimizer.csv"):
        key, size = (r["impl"], r["dtype"]), int(r["tensors"]) * int(r["numel"])
        if size >= optimizer.get(key, (0, 0))[0]:
            optimizer[key] = (size, int(r["bytes"]) / float(r["seconds"]))
    env = json.loads((CALIBRATION_DIR / gpu / "env.json").read_text())
    return Calibration(
        gpu,
        env,
        gemm,
        _rows(gpu, "attention.csv"),
        bandwidth,
        max(0.0, sorted(mid)[len(mid) // 2]),
        {k: v[1] for k, v in optimizer.items()},
        unaligned=_slowdowns(gpu),
        rates=_rates(gpu, bound, largest),
        index_put=_index_puts(gpu),
        odd=_odd_slowdowns(gpu),
    )


def _rates(gpu: str, bound: list[dict], largest: int) -> dict:
    """(3): each RATED op's bytes/s at memory_bound.csv's largest size; those it lacks (the softmax backward,
    ``cat_column``) at odd_width.csv's widest even rows (where the table has them)."""
    ops = set(RATED.values())
    rates = {(r["op"], r["dtype"]): int(r["bytes"]) / float(r["seconds"])
             for r in bound if r["op"] in ops and int(r["numel"]) == largest}  # fmt: skip
    if (CALIBRATION_DIR / gpu / "odd_width.csv").exists():
        lacking = ops - {r["op"] for r in bound}
        even = [r for r in _rows(gpu, "odd_width.csv") if r["op"] in lacking and int(r["width"]) % 2 == 0]
        for r in sorted(even, key=lambda r: int(r["width"])):  # the widest last, so it stays
            rates[r["op"], r["dtype"]] = int(r["bytes"]) / float(r["seconds"])
    return rates


def _odd_slowdowns(gpu: str) -> dict:
    """(1d), (3b): each op's seconds at an odd width over its seconds at the even width one less (odd_width.csv:
    the same bytes or FLOPs), by (op, dtype), ascending in width; {} for a table without the file."""
    if not (CALIBRATION_DIR / gpu / "odd_width.csv").exists():
        return {}
    seconds = {(r["op"], r["dtype"], int(r["width"])): float(r["seconds"]) for r in _rows(gpu, "odd_width.csv")}
    out: dict = {}
    for (op, dtype, w), s in sorted(seconds.items()):
        if w % 2 and (op, dtype, w - 1) in seconds:
            out.setdefault((op, dtype), []).append((w, s / seconds[op, dtype, w - 1]))
    return out


def odd_slowdown(cal: Calibration, op: str, dtype: str, width: int) -> float:
    """(3b), (1d): how much slower ``op`` runs over rows ``width`` long (odd) than over even rows: the measured ratio,
    linear in log-log between the table's odd widths, clamped at its ends (1 where the table has none)."""
    points = cal.odd.get((op, dtype))
    return _on_curve(points, width) if points else 1.0


def _index_puts(gpu: str) -> dict:
    """(5): index_put.csv's seconds by dtype, then (rows, width), as (rows per slot, seconds) in ascending
    repeats; {} for a table without the file."""
    if not (CALIBRATION_DIR / gpu / "index_put.csv").exists():
        return {}
    out: dict = {}
    for r in _rows(gpu, "index_put.csv"):
        rows, width, slots = int(r["rows"]), int(r["width"]), int(r["slots"])
        out.setdefault(r["dtype"], {}).setdefault((rows, width), []).append((rows / slots, float(r["seconds"])))
    return {dtype: {key: sorted(points) for key, points in cells.items()} for dtype, cells in out.items()}


def _slowdowns(gpu: str) -> dict:
    """(1): each unaligned GEMM of gemm_unaligned.csv over its partner with every dimension rounded up to a
    multiple of 8, keyed by the unaligned shape; {} for a table without the file."""
    if not (CALIBRATION_DIR / gpu / "gemm_unaligned.csv").exists():
        return {}
    seconds = {
        (r["dtype"], r["layout"], int(r["m"]), int(r["n"]), int(r["k"])): float(r["seconds"])
        for r in _rows(gpu, "gemm_unaligned.csv")
    }
    out: dict = {}
    for (dtype, layout, *mnk), s in seconds.items():
        partner = (dtype, layout, *(x + (-x) % 8 for x in mnk))
        if partner != (dtype, layout, *mnk) and partner in seconds:
            out.setdefault((dtype, layout), {})[tuple(mnk)] = s / seconds[partner]
    return out


def _scaled(name: str) -> Calibration:
    """The H100's table scaled to ``name``'s datasheet figures: seconds × the H100's peak / the GPU's for GEMMs and
    attention (per dtype), bandwidths × the GPU's HBM bandwidth / the H100's.  A GPU with no bf16 in its datasheet
    (the V100) gets the fp32 rows only: its bf16 steps are refused (``check_precision``)."""
    from ..gpus import gpu

    g, ref = gpu(name), gpu(REFERENCE)
    missing = [d for d in ("fp32",) if d not in g.peak] + ([] if g.bandwidth else ["HBM bandwidth"])
    if missing:
        raise AccountingError(
            f"the step-time model needs {g.name}'s dense {' and '.join(missing)} figure(s), which gpus.py lacks"
        )
    base = load(REFERENCE)
    flops = {t: ref.peak[d] / g.peak[d] for t, d in TORCH_DTYPES.items() if d in g.peak}  # seconds scale
    memory = g.bandwidth / ref.bandwidth  # bytes/s scale
    gemm = {(t, lay): {mnk: s * flops[t] for mnk, s in table.items()}
            for (t, lay), table in base.gemm.items() if t in flops}  # fmt: skip
    attention = [{**r, "seconds": str(float(r["seconds"]) * flops[r["dtype"]])}
                 for r in base.attention if r["dtype"] in flops]  # fmt: skip
    peaks = ", ".join(f"{d} x{1 / flops[t]:.3f}" for t, d in TORCH_DTYPES.items() if t in flops)
    return Calibration(
        g.name,
        {"gpu": g.label, "torch": base.env.get("torch", "?")},
        gemm,
        attention,
        base.bandwidth * memory,
        base.kernel_overhead,
        {k: v * memory for k, v in base.optimizer.items() if k[1] in flops},
        f"{ref.label}: dense peak {peaks}{'' if 'bfloat16' in flops else ' (no bf16)'}, HBM x{memory:.3f}",
        unaligned=base.unaligned,  # a ratio of two times on one GPU: kept as measured
        rates={k: v * memory for k, v in base.rates.items() if k[1] in flops},
        index_put={dtype: _scaled_puts(cells, memory) for dtype, cells in base.index_put.items() if dtype in flops},
        odd=base.odd,  # ratios of two times on one GPU: kept as measured
    )


def check_precision(cal: Calibration, setup: TrainingSetup) -> None:
    """Refuse, in one line, a bf16 or amp-bf16 step on a GPU whose table has no bf16 rows (``_scaled``)."""
    if setup.precision != "fp32" and ("bfloat16", "nt") not in cal.gemm:
        raise AccountingError(
            f"{cal.gpu} has no bf16 (its datasheet's tensor cores take fp16, which lm-accounting does not train in): "
            f"the step-time model prices --precision fp32 there, not {setup.precision}"
        )


def _scaled_puts(cells: dict, memory: float) -> dict:
    return {key: [(repeats, sec / memory) for repeats, sec in points] for key, points in cells.items()}


def best_rates(gpu: str) -> tuple[float, float, str] | None:
    """(the fastest bf16 ``torch.mm`` of the grid in FLOP/s, the measured memory-bound bandwidth in bytes/s, the
    GPU and torch they were measured with), or None for a GPU with no calibration table: what a serving
    roofline may call realistic (``inference_report``)."""
    if gpu not in calibrations():
        return None
    cal = load(gpu)
    flops = max(2 * m * n * k / s for (dtype, _), table in cal.gemm.items() if dtype == "bfloat16"
                for (m, n, k), s in table.items())  # fmt: skip
    return flops, cal.bandwidth, f"{cal.env.get('gpu', gpu)}, torch {cal.env.get('torch', '?')}"


def _corners(v: float, grid: list[int]) -> list[tuple[int, float]]:
    """The grid points around ``v`` with their weights, linear in log v (clamped at the grid's ends)."""
    lo = max([g for g in grid if g <= v] or [grid[0]])
    hi = min([g for g in grid if g >= v] or [grid[-1]])
    if lo == hi:
        return [(lo, 1.0)]
    w = (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
    return [(lo, 1 - w), (hi, w)]


@cache
def _axes(gpu: str, key: tuple) -> list[list[int]]:
    """The m, n and k values of ``gpu``'s GEMM grid for (dtype, layout)."""
    table = load(gpu).gemm[key]
    return [sorted({mnk[i] for mnk in table}) for i in range(3)]


@cache
def _nearest(gpu: str, key: tuple, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The point of ``gpu``'s GEMM grid for (dtype, layout) nearest (m, n, k) in log space (as ``_axes``, on the
    grid of ``load(gpu)``: the LM head's shapes recur at every micro-batch of every program)."""
    return min(load(gpu).gemm[key], key=lambda p: sum(math.log(x / y) ** 2 for x, y in zip(p, (m, n, k), strict=True)))


def slowdown(cal: Calibration, dtype: str, layout: str, m: int, n: int, k: int) -> float | None:
    """(1): how many times longer an unaligned GEMM takes than the aligned one, log-interpolated between the
    measured head GEMMs of that dtype and layout (clamped at their edges); 1 for an aligned GEMM, None where the
    table has no such measurement."""
    if not (m % 8 or n % 8 or k % 8):
        return 1.0
    table = cal.unaligned.get((DTYPES[dtype], layout))
    if not table:
        return None
    axes = [sorted({mnk[i] for mnk in table}) for i in range(3)]
    total = weight = 0.0
    for a, wa in _corners(m, axes[0]):
        for b, wb in _corners(n, axes[1]):
            for c, wc in _corners(k, axes[2]):
                if (a, b, c) in table and wa * wb * wc > 0:
                    total += wa * wb * wc * math.log(table[a, b, c])
                    weight += wa * wb * wc
    if weight == 0:  # the unaligned dimension elsewhere than the head puts it: the nearest point in log space
        near = min(table, key=lambda p: sum(math.log(x / y) ** 2 for x, y in zip(p, (m, n, k), strict=True)))
        return table[near]
    return math.exp(total / weight)


def batched_seconds(cal: Calibration, dtype: str, layout: str, batch: int, m: int, n: int, k: int) -> float:
    """(1c): ``batch`` products of one (m, n, k) run as one kernel.  A batched GEMM (``bmm``: naive attention's
    scores and values, our experts) is priced as one GEMM of batch·m rows: cuBLAS's strided-batched kernels tile
    each product as a tall GEMM's rows are tiled, one launch for all (pricing ``batch`` separate GEMMs put our
    Qwen3-30B-A3B step 30% high on the H100, reports/calibration).  The grouped GEMM has rates of its own per product
    (1b)."""
    if layout.startswith("grouped"):
        return batch * gemm_seconds(cal, dtype, layout, m, n, k)
    return gemm_seconds(cal, dtype, layout, batch * m, n, k)


def gemm_seconds(cal: Calibration, dtype: str, layout: str, m: int, n: int, k: int) -> float:
    """(1): 2·m·n·k at the log-interpolated rate of the grid's corners around (m, n, k); corners the grid lacks
    (its vocabulary widths are measured at two k only) are left out and the weights renormalised; times the
    unaligned slowdown where one is measured."""
    return _aligned_seconds(cal, dtype, layout, m, n, k) * (slowdown(cal, dtype, layout, m, n, k) or 1.0)


def _aligned_seconds(cal: Calibration, dtype: str, layout: str, m: int, n: int, k: int) -> float:
    key = (DTYPES[dtype], layout) if (DTYPES[dtype], layout) in cal.gemm else (DTYPES[dtype], "nt")  # fp32: nt only
    table, axes = cal.gemm[key], _axes(cal.gpu, key)
    total = weight = 0.0
    for a, wa in _corners(m, axes[0]):
        for b, wb in _corners(n, axes[1]):
            for c, wc in _corners(k, axes[2]):
                if (a, b, c) in table and wa * wb * wc > 0:
                    total += wa * wb * wc * math.log(2 * a * b * c / table[a, b, c])
                    weight += wa * wb * wc
    if weight == 0:  # no corner measured (a vocabulary width at another k): the nearest point in log space
        a, b, c = _nearest(cal.gpu, key, m, n, k)
        return 2 * m * n * k / (2 * a * b * c / table[a, b, c])
    return 2 * m * n * k / math.exp(total / weight)


def attention_seconds(cal: Calibration, backend: str, kind: str, b: int, h: int, s: int, d: int, dtype: str) -> float:
    """(2): seconds per unit of B·h·S²·d at the measured backend, d_head and dtype, log-interpolated in S; (2b)
    the Triton kernel at flash's times ``TRITON_FLASH_SLOWDOWN``."""
    if backend == "triton":
        return TRITON_FLASH_SLOWDOWN * attention_seconds(cal, "flash", kind, b, h, s, d, dtype)
    measured = "efficient" if backend == "efficient" else "flash"
    rows = [
        r
        for r in cal.attention
        if r["backend"] == measured
        and r["dtype"] == DTYPES[dtype]
        and r["causal"] == "True"
        and int(r["d_head"]) == (128 if d > 96 else 64)
    ]

    def per_unit(what: str) -> float:
        points = {
            int(r["seq"]): float(r["seconds"])
            / (int(r["batch"]) * int(r["heads"]) * int(r["seq"]) ** 2 * int(r["d_head"]))
            for r in rows
            if r["pass"] == what
        }
        return math.exp(sum(w * math.log(points[g]) for g, w in _corners(s, sorted(points))))

    unit = per_unit("forward") if kind == "forward" else per_unit("forward+backward") - per_unit("forward")
    return unit * b * h * s * s * d


@dataclass(frozen=True)
class PhaseTime:
    gemm: float = 0.0
    attention: float = 0.0
    memory_bound: float = 0.0
    kernels: int = 0  # memory-bound kernels priced (one per storage made)

    @property
    def seconds(self) -> float:
        return self.gemm + self.attention + self.memory_bound


@dataclass(frozen=True)
class StepTime:
    """One training step's predicted GPU time on ``gpu``: the forward and backward by kind, and AdamW."""

    gpu: str
    forward: PhaseTime
    backward: PhaseTime
    optimizer_step: float
    caveats: tuple[str, ...] = field(default=())

    @property
    def seconds(self) -> float:
        return self.forward.seconds + self.backward.seconds + self.optimizer_step

    def to_dict(self) -> dict:
        def phase(p: PhaseTime) -> dict:
            return {
                "seconds": p.seconds,
                "gemm": p.gemm,
                "attention": p.attention,
                "memory_bound": p.memory_bound,
                "kernels": p.kernels,
            }

        return {
            "gpu": self.gpu,
            "step_seconds": self.seconds,
            "forward": phase(self.forward),
            "backward": phase(self.backward),
            "optimizer_step_seconds": self.optimizer_step,
            "caveats": list(self.caveats),
        }


def _line(x) -> tuple[int, int]:
    """A record's size as (a, b), a·B + b: an ``Affine`` or a constant."""
    return (x.a, x.b) if isinstance(x, Affine) else (0, x)


def _at(line: tuple, batch: int):
    return line[0] * batch + line[1]


@dataclass(frozen=True)
class Program:
    """One step's records compiled (module docstring): per phase, GEMM shapes and attention calls with their counts
    (sizes as lines in B), the memory-bound bytes as lines in B per rate (None: the copy's; (op, dtype): a RATED
    op's), the kernels and the accumulating ``index_put_`` calls, and the part of those bytes in activations whose
    rows are ``hidden`` wide (6); and the parameters' bytes as AdamW's ``exp_avg`` holds them (4)."""

    phases: tuple  # per phase: (gemms {key: count}, attention {key: count}, {rate: (a, b)}, kernels, index_puts,
    # {rate: (a, b)} of the hidden-wide activations)
    param_bytes: int

    @staticmethod
    def compile(work: list, hidden: int | None = None) -> Program:
        phases, param_bytes = [], 0
        gemm, attention, traffic, kernels, puts, rows = Counter(), Counter(), {}, 0, Counter(), {}
        for kind, times, *f in work:
            if kind == "phase":
                phases.append(_phase(gemm, attention, traffic, kernels, puts, rows))
                gemm, attention, traffic, kernels, puts, rows = Counter(), Counter(), {}, 0, Counter(), {}
                continue
            if kind == "gemm":  # (dtype, layout, batch, m, n, k, the odd row stride read in place or None)
                gemm[(f[0], f[1], *map(_line, f[2:6]), f[6] if len(f) > 6 else None)] += times
                continue
            if kind == "attention":
                backend, what, b, h, seq, d, dtype = f
                attention[backend, what, _line(b), h, seq, d, dtype] += times
                continue
            if kind == "index_put":
                puts[(f[0], *map(_line, f[1:]))] += times
                continue
            if kind == "alloc" and f[0] == "exp_avg":  # (4)'s parameter bytes; AdamW's state moves no bytes (SKIP)
                param_bytes += _at(_line(f[1]), 2)
                continue
            rate = None
            if kind == "alloc" and not f[0].startswith(SKIP):
                moved, kernels = TRAFFIC.get(f[0], 2), kernels + times
                dtype, width = (f[2] if len(f) > 2 else None), (f[3] if len(f) > 3 else None)
                rate = (RATED[f[0]], DTYPES.get(dtype, dtype)) if f[0] in RATED and dtype else None
                if rate and rate[0] in ODD and isinstance(width, int) and width % 2:  # (3b): rows of odd length
                    rate += (width,)
            elif kind == "in_place":  # a kernel that makes no storage (autograd's in-place gradient sums)
                moved, kernels, width = 1, kernels + times, (f[1] if len(f) > 1 else None)
            elif kind == "reads":  # a reduction's input, beyond the storage it makes (priced with it)
                moved, width = 1, (f[1] if len(f) > 1 else None)
            else:
                continue
            a, b = _line(f[1] if kind == "alloc" else f[0])
            sinks = (traffic, rows) if hidden is not None and a and isinstance(width, int) and width == hidden else ()
            for sink in sinks or (traffic,):
                line = sink.setdefault(rate, [0.0, 0.0])
                line[0] += times * moved * a
                line[1] += times * moved * b
        phases.append(_phase(gemm, attention, traffic, kernels, puts, rows))
        return Program(tuple(phases), param_bytes)

    def at(
        self, batch: int, cal: Calibration, sequence_shards: int = 1, memo: dict | None = None
    ) -> tuple[list[PhaseTime], set[int]]:
        """(1)-(3), (5) at micro-batch ``batch`` on ``cal``'s GPU: one ``PhaseTime`` per phase, and the GEMM
        dimensions that are no multiple of 8 and that no measured slowdown prices.  ``sequence_shards`` (6): the
        hidden-wide activations' bytes at a ``sequence_shards``-th of the sequence (their kernels as many).
        ``memo``: a dict kept by a caller that prices many programs on ``cal`` (``plan``), of each GEMM's and
        attention call's pricing at its sizes (the same shapes recur across checkpointings and micro-batches)."""
        out, unaligned = [], set()
        memo = {} if memo is None else memo
        for gemms, attentions, traffic, kernels, puts, rows in self.phases:
            g = a = 0.0
            for (dtype, layout, *dims, lead), times in gemms.items():
                sizes = tuple(_at(d, batch) for d in dims)  # (batch, m, n, k)
                if (got := memo.get((dtype, layout, sizes, lead))) is None:
                    got = memo[dtype, layout, sizes, lead] = _gemm_pricing(cal, dtype, layout, *sizes, lead)
                seconds, slower, odd = got
                g += times * seconds * slower
                unaligned |= odd
            for (backend, what, b, h, seq, d, dtype), times in attentions.items():
                key = (backend, what, _at(b, batch), h, seq, d, dtype)
                if (unit := memo.get(key)) is None:
                    unit = memo[key] = attention_seconds(cal, *key)
                a += times * unit
            bound = sum(_at(line, batch) / traffic_rate(cal, rate) for rate, line in traffic.items())
            sharded = sum(_at(line, batch) / traffic_rate(cal, rate) for rate, line in rows.items())
            bound -= sharded * (1 - 1 / sequence_shards)  # (6)
            bound += kernels * cal.kernel_overhead
            for (dtype, *dims), times in puts.items():
                bound += times * index_put_seconds(cal, dtype, *(_at(d, batch) for d in dims))
            out.append(PhaseTime(g, a, bound, kernels))
        return out, unaligned


def _gemm_pricing(cal, dtype, layout, n_batch, m, n, k, lead) -> tuple[float, float, set[int]]:
    """``Program.at``'s GEMM at its sizes: (1c)'s seconds, (1d)'s slowdown of odd rows read in place, and its
    dimensions that are no multiple of 8 and that no measured slowdown prices."""
    slower = odd_slowdown(cal, "bmm_rows", DTYPES[dtype], lead) if lead else 1.0  # (1d)
    odd = set()
    if slowdown(cal, dtype, layout, m, n, k) is None:
        # a grouped GEMM's m is the tokens per expert, an average: its kernels take any row count
        checked = (n, k) if layout.startswith("grouped") else (m, n, k)
        odd = {x for x in checked if x % 8}
    return batched_seconds(cal, dtype, layout, n_batch, m, n, k), slower, odd


def _phase(gemm, attention, traffic, kernels, puts, rows) -> tuple:
    """One compiled phase of ``Program.phases`` (its lines frozen)."""
    return (dict(gemm), dict(attention), _frozen(traffic), kernels, dict(puts), _frozen(rows))


def _frozen(traffic: dict) -> dict:
    return {k: tuple(v) for k, v in traffic.items()}


def traffic_rate(cal: Calibration, rate: tuple | None) -> float:
    """(3): the bytes/s of a compiled traffic key: None the copy's, (op, dtype) a RATED op's (the copy's where the
    table lacks it), (op, dtype, width) the same over odd rows, slower by ``odd_slowdown`` (3b)."""
    if rate is None:
        return cal.bandwidth
    even = cal.rates.get(rate[:2], cal.bandwidth)
    return even / odd_slowdown(cal, *rate) if len(rate) > 2 else even


def index_put_seconds(cal: Calibration, dtype: str, rows: int, width: int, slots: int) -> float:
    """(5): ``index_put_`` accumulating ``rows`` rows of ``width`` elements into ``slots`` slots (the backward of
    ``t[ids]``): index_put.csv's seconds, interpolated linearly in log rows and log width between the grid's cells
    (clamped at its edges; beyond its largest cell, in proportion to the elements) and, within a cell, in log of
    the rows per slot; without the table, the gradient read and the slots' rows read and written at the copy's
    bandwidth."""
    cells = cal.index_put.get(DTYPES[dtype])
    itemsize = 2 if DTYPES[dtype] == "bfloat16" else 4
    if not cells:
        return (rows + 2 * min(rows, slots)) * width * itemsize / cal.bandwidth
    repeats = rows / max(slots, 1)
    axes = [sorted({key[i] for key in cells}) for i in (0, 1)]
    total = weight = 0.0
    for r, wr in _corners(rows, axes[0]):
        for w, ww in _corners(width, axes[1]):
            if (r, w) in cells and wr * ww > 0:
                total += wr * ww * math.log(_on_curve(cells[r, w], repeats))
                weight += wr * ww
    if weight == 0:  # a corner the grid leaves out (rows x width over 2^28): the nearest cell in log space
        r, w = min(cells, key=lambda c: math.log(c[0] / rows) ** 2 + math.log(c[1] / width) ** 2)
        total, weight = math.log(_on_curve(cells[r, w], repeats)), 1.0
    beyond = max(1.0, rows / axes[0][-1]) * max(1.0, width / axes[1][-1])
    return math.exp(total / weight) * beyond


def _on_curve(points: list[tuple[float, float]], x: float) -> float:
    """The seconds at ``x`` rows per slot on one cell's measured (rows per slot, seconds), linear in log-log,
    clamped at the ends."""
    lo = max([p for p in points if p[0] <= x] or [points[0]])
    hi = min([p for p in points if p[0] >= x] or [points[-1]])
    if lo[0] == hi[0]:
        return lo[1]
    w = (math.log(x) - math.log(lo[0])) / (math.log(hi[0]) - math.log(lo[0]))
    return math.exp((1 - w) * math.log(lo[1]) + w * math.log(hi[1]))


def price(work: list, batch: int, cal: Calibration) -> tuple[list[PhaseTime], set[int]]:
    """(1)-(3) over ``recording_work``'s records at micro-batch ``batch``: ``Program.compile(work).at(batch, cal)``."""
    return Program.compile(work).at(batch, cal)


@cache
def program(cfg: ModelConfig, seq: int, setup: TrainingSetup, impl: str) -> Program:
    """``impl``'s step of ``cfg`` at context ``seq``, recorded once at micro-batch 2 (lines in B) and compiled.
    Raises ``ValueError`` for a step the op library does not model on cuda."""
    from .ops import predict_step
    from .ops.tensors import recording_work

    work: list = []
    with recording_work(work, memory=False):  # the memory replay's peaks are not read
        predict_step(cfg, seq, setup, impl=impl, batch=2, mode="plain", device="cuda", optimizer_step=False)
    return Program.compile(work, cfg.d_model)


def optimizer_seconds(param_bytes: int, setup: TrainingSetup, cal: Calibration) -> float:
    """(4): AdamW over parameters holding ``param_bytes`` (of the setup's parameter dtype)."""
    param_dtype = "float32" if setup.precision in ("fp32", "amp-bf16") else "bfloat16"
    return ADAMW_BYTES_PER_ELEMENT * param_bytes / cal.optimizer[setup.optimizer, param_dtype]


def unaligned_caveat(unaligned: set[int]) -> list[str]:
    if not unaligned:
        return []
    dims = ", ".join(f"{d:,}" for d in sorted(unaligned))
    return [
        (
            f"GEMM dimensions {dims} are no multiple of 8: cuBLAS takes slower align1 kernels, which this GPU's "
            "table does not measure (priced as aligned)"
        )
    ]


HOST_CAVEAT = "the GPU's busy time: a step whose host cannot launch kernels as fast is slower"


def predict_step_time(
    cfg: ModelConfig, seq: int, setup: TrainingSetup, *, impl: str, batch: int = 1, gpu: str = "h100-80gb"
) -> StepTime:
    """The GPU time of one training step of ``impl``'s model of ``cfg`` at context ``seq`` and micro-batch ``batch``
    on ``gpu`` (one GPU): see the module docstring.  Raises ``AccountingError`` for a GPU lacking a figure the
    model needs and ``ValueError`` for a step the op library does not model on cuda."""
    cal = load(gpu)
    check_precision(cal, setup)
    prog = program(cfg, seq, setup, impl)
    phases, unaligned = prog.at(batch, cal)
    optimizer = optimizer_seconds(prog.param_bytes, setup, cal)
    caveats = [HOST_CAVEAT, *unaligned_caveat(unaligned)]
    if cal.scaled_from:
        caveats.append(f"no {gpu} table: {cal.label}")
    return StepTime(gpu, phases[1], phases[2], optimizer, tuple(caveats))
