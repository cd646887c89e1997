"""Calibrate the step-time model on the GPU at hand: what each kind of op really runs at, and real steps.

    python benchmarks/cuda_calibrate.py --out DIR [--only gemm,attention,...] [--budget SECONDS] [--quick]

Needs a CUDA GPU (one line and exit 2 without one).  Each section writes one CSV in DIR, a row at a time (a
run stopped early keeps its rows), and stops adding rows when it has spent its share of ``--budget``:

1. ``gemm.csv``: ``torch.mm`` at each (m, n, k), dtype and operand layout a linear layer runs (``nt`` the
   forward ``x @ W.T``, ``nn`` the input gradient ``dy @ W``, ``tn`` the weight gradient ``dy.T @ x``);
   FLOPs 2·m·n·k.  fp32 with ``allow_tf32`` off, as torch's default.  ``gemm_unaligned.csv``: the LM head's
   three GEMMs at vocabularies no multiple of 8, each beside its vocabulary rounded up to one.  ``grouped.csv``:
   ``torch._grouped_mm`` as transformers' experts run it, forward and backward (``grouped_rows``).
2. ``attention.csv``: ``F.scaled_dot_product_attention`` pinned to one backend (flash, memory-efficient),
   forward and forward + backward, against (B, heads, S, d_head, causal, dtype).  ``flops`` is the full
   S x S count, 4·B·h·S²·d forward (QKᵀ and PV) and 2.5x that for forward + backward (backward 10·B·h·S²·d:
   dV, dP, dS→dQ, dK, and QKᵀ again); causal kernels skip about half.
3. ``memory_bound.csv``: elementwise, normalisation, softmax and dtype-cast kernels against their size;
   ``bytes`` counts each input read once and each output written once.  ``launch`` rows: a one-element
   op, per call, run eagerly (the CPU's dispatch and launch) and replayed from a CUDA graph (the GPU's).
4. ``optimizer.csv``: ``torch.optim.AdamW`` step (for-loop, foreach, fused) over parameter sets of a given
   count and tensor size; ``bytes`` = 7 per-element reads and writes (p, g, m, v read; p, m, v written).
5. ``steps.csv``: real training steps of the live model (ours and transformers') on this GPU: forward,
   backward and optimizer each timed with CUDA events (median of the timed steps), and one step under
   ``torch.profiler``, whose kernel times by kernel name land in ``step_kernels.csv``.

Timing: random data (never zeros), warm-up first, CUDA events around a repeated region sized to about
``TARGET`` seconds, the median of ``TRIALS`` such regions.  ``env.json`` holds the GPU, driver, clocks, CUDA
and torch versions.  Commit the tables under ``lm_accounting/calibration/<gpu>/`` (the GPU table's key: what
``analytic.step_time`` prices with) and ``step_kernels.csv`` under ``reports/calibration/<gpu>/``; then
``python benchmarks/step_time_report.py --gpu <gpu>`` compares the model with the steps.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

from cuda_validation import write_csv  # the sibling script (benchmarks/ is this script's sys.path[0])

TARGET, TRIALS = 0.02, 3
DIMS = (256, 1024, 2048, 3072, 4096, 8192, 14336, 16384)  # n and k: the widths of real models' linears
TOKENS = (512, 2048, 8192, 32768)  # m: tokens in a micro-batch (B·S)
VOCABS = (32000, 128256)  # the output projection's n
SEQS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
TOKENS_PER_ATTENTION = 32768  # B·S of each attention point: B = 32768 / S (at least 1)
SIZES = (2**12, 2**16, 2**20, 2**22, 2**24, 2**26)  # elements of each memory-bound op
WIDTH = 4096  # the row width of the normalisations and softmax
STEPS = (  # (implementation, preset, overrides, context, batch, precision, checkpointing)
    ("course", "gpt2-small", {}, 1024, 16, "amp-bf16", "none"),
    ("course", "qwen3-0.6b", {}, 2048, 8, "amp-bf16", "full"),
    ("course", "llama-3-8b", {"num_layers": 2}, 8192, 2, "amp-bf16", "none"),
    ("course", "llama-3-8b", {"num_layers": 4}, 4096, 4, "bf16", "full"),
    ("transformers", "qwen3-0.6b", {}, 2048, 4, "amp-bf16", "none"),
    ("transformers", "llama-3-8b", {"num_layers": 2}, 8192, 2, "amp-bf16", "none"),
    ("transformers", "llama-3-8b", {"num_layers": 4}, 4096, 4, "bf16", "full"),
    ("transformers", "openai-gpt2", {}, 1024, 8, "amp-bf16", "none"),
    # mixtures of experts: ours (a loop over experts) and transformers' (torch._grouped_mm over every slot)
    ("course", "qwen3-30b-a3b", {"num_layers": 2}, 2048, 4, "amp-bf16", "none"),
    ("transformers", "qwen3-30b-a3b", {"num_layers": 2}, 2048, 4, "amp-bf16", "none"),
    ("transformers", "mixtral-8x7b", {"num_layers": 2}, 2048, 2, "bf16", "full"),
    # the sigmoid-gated shared expert (Qwen2-MoE); gpt-oss: sinks, biased experts, alternating windows
    ("transformers", "qwen1.5-moe-a2.7b", {"num_layers": 2}, 2048, 4, "amp-bf16", "none"),
    ("transformers", "gpt-oss-20b", {"num_layers": 2}, 2048, 2, "bf16", "none"),
    # torchtitan's per-op selective checkpointing (--checkpoint op) on our model, beside the none/full steps above
    ("course", "qwen3-0.6b", {}, 2048, 8, "amp-bf16", "op"),
    ("course", "qwen3-0.6b", {}, 2048, 16, "amp-bf16", "op"),  # twice the kernels, the same Python dispatches
    ("course", "llama-3-8b", {"num_layers": 2}, 8192, 2, "amp-bf16", "op"),
    ("course", "llama-3-8b", {"num_layers": 4}, 4096, 4, "bf16", "op"),
    ("course", "qwen3-30b-a3b", {"num_layers": 2}, 2048, 4, "amp-bf16", "op"),
)
EAGER_ONLY = ("gpt-oss-20b",)  # transformers runs gpt-oss's sinks in eager attention only: our naive
STEP_MODELS = ""  # --step-models: only these presets' steps (comma-separated; empty: all)
STEP_CHECKPOINTS = ""  # --step-checkpoints: only the steps with these checkpointings (comma-separated; empty: all)
MOE_SHAPES = (  # (experts, top-k, d_model, expert d_ff): Qwen3-30B-A3B's, Mixtral-8x7B's and gpt-oss-20b's experts
    (128, 8, 2048, 768),
    (8, 2, 4096, 14336),
    (32, 4, 2880, 2880),
)


def env() -> dict:
    import torch

    if DEVICE != "cuda":
        return {"gpu": None, "device": DEVICE, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    smi = subprocess.run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit",
            "--format=csv,noheader",
        ],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": torch.cuda.get_device_name(),
        "nvidia_smi": "name, driver, memory, max SM clock, max memory clock, power limit: " + smi,
        "sm_count": props.multi_processor_count,
        "memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


DEVICE = "cuda"  # --device cpu: a smoke run of the script itself on a machine without a GPU (host timers)


def sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Event:
    """A CUDA event on cuda; the host clock after a synchronisation otherwise."""

    def __init__(self):
        import torch

        self.event = torch.cuda.Event(enable_timing=True) if DEVICE == "cuda" else None

    def record(self):
        if self.event is not None:
            self.event.record()
        else:
            self.at = time.perf_counter()

    def seconds_to(self, later: Event) -> float:
        return self.event.elapsed_time(later.event) / 1000 if self.event is not None else later.at - self.at


def seconds_per_call(fn) -> float:
    """The median over ``TRIALS`` of a region of n back-to-back calls (n sized to about ``TARGET`` s), per call."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    n = max(1, min(200, math.ceil(TARGET / max(time.perf_counter() - t0, 1e-6))))
    start, end = Event(), Event()
    trials = []
    for _ in range(TRIALS):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        sync()
        trials.append(start.seconds_to(end) / n)
    return statistics.median(trials)


def free() -> None:
    import torch

    gc.collect()
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def rand(*shape, dtype=None):
    import torch

    return torch.randn(*shape, device=DEVICE, dtype=dtype or torch.float32)


def mm_row(dtype, layout: str, m: int, n: int, k: int) -> dict:
    """``torch.mm`` of (m, k) by (k, n) with the operand layout a linear layer runs, timed."""
    import torch

    a = rand(k, m, dtype=dtype).t() if layout == "tn" else rand(m, k, dtype=dtype)
    b = rand(n, k, dtype=dtype).t() if layout == "nt" else rand(k, n, dtype=dtype)
    s = seconds_per_call(lambda a=a, b=b: torch.mm(a, b))
    del a, b
    flops = 2 * m * n * k
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "layout": layout,
        "m": m,
        "n": n,
        "k": k,
        "seconds": s,
        "flops": flops,
        "tflops": round(flops / s / 1e12, 2),
    }


def gemm_rows(quick: bool):
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default
    dims, tokens = ((256, 4096), (512, 8192)) if quick else (DIMS, TOKENS)
    shapes = [(m, n, k) for m in tokens for n in dims for k in dims]
    shapes += [(m, v, k) for m in tokens for v in VOCABS for k in (2048, 4096)]
    fp32 = [(m, n, k) for m, n, k in shapes if m * n * k <= 2**36]  # about 3 ms each at fp32's ~50 TFLOP/s
    for dtype, layouts, grid in ((torch.bfloat16, ("nt", "nn", "tn"), shapes), (torch.float32, ("nt",), fp32)):
        for layout in layouts:
            for m, n, k in grid:
                yield mm_row(dtype, layout, m, n, k)


def grouped_rows(quick: bool):
    """``torch._grouped_mm`` as transformers' experts run it (``integrations/moe.py``: the slots sorted by expert,
    ``grouped_mm(x, W.transpose(-2, -1), offs)``), each expert taking S/E of the S = tokens·top-k slots: gate_up
    (k = d_model, n = 2·d_ff) and down (k = d_ff, n = d_model).  ``grouped_nt``: the forward; ``grouped_bwd``: both
    gradients (forward + backward less the forward).  ``m`` is the slots per expert; FLOPs 2·S·n·k (each)."""
    import torch

    shapes = MOE_SHAPES[:1] if quick else MOE_SHAPES
    for dtype in (torch.bfloat16, torch.float32):
        for experts, top, d, ff in shapes:
            for tokens in (2048,) if quick else (2048, 8192, 32768):
                slots = tokens * top
                for k, n in ((d, 2 * ff), (ff, d)):
                    if dtype == torch.float32 and slots * n * k > 2**38:
                        continue
                    x = rand(slots, k, dtype=dtype).requires_grad_()
                    w = rand(experts, n, k, dtype=dtype).requires_grad_()
                    offs = torch.arange(1, experts + 1, device=DEVICE, dtype=torch.int32) * (slots // experts)
                    g = torch.randn(slots, n, device=DEVICE, dtype=dtype)

                    def forward(x=x, w=w, offs=offs):
                        return torch._grouped_mm(x, w.transpose(-2, -1), offs)

                    def both(forward=forward, x=x, w=w, g=g):
                        torch.autograd.grad(forward(), (x, w), g)

                    with torch.no_grad():
                        fwd = seconds_per_call(forward)
                    bwd = seconds_per_call(both) - fwd
                    del x, w, offs, g
                    flops = 2 * slots * n * k
                    base = {"dtype": str(dtype).removeprefix("torch."), "m": slots // experts, "n": n, "k": k}
                    for layout, sec, work in (("grouped_nt", fwd, flops), ("grouped_bwd", bwd, 2 * flops)):
                        yield {**base, "layout": layout, "experts": experts, "seconds": sec, "flops": work,
                               "tflops": round(work / sec / 1e12, 2)}  # fmt: skip


UNALIGNED_VOCABS = (32001, 50257)  # vocabularies no multiple of 8: Llama 2's 32,000 plus a pad token; GPT-2's
HEAD_WIDTHS = (768, 1024, 2048, 4096)  # d_model of the heads that carry them (GPT-2 small to Llama-2-7B)


def head_shape(layout: str, tokens: int, vocab: int, width: int) -> tuple[int, int, int]:
    """(m, n, k) of the output projection's three GEMMs as the linear layer runs them: the forward ``x @ W.T``
    (nt: tokens x vocab x width), the input gradient ``dy @ W`` (nn: tokens x width x vocab) and the weight
    gradient ``dy.T @ x`` (tn: vocab x width x tokens)."""
    return {"nt": (tokens, vocab, width), "nn": (tokens, width, vocab), "tn": (vocab, width, tokens)}[layout]


def gemm_unaligned_rows(quick: bool):
    """The LM head's GEMMs at a vocabulary that is no multiple of 8 (cuBLAS then runs cutlass's align1
    kernels), each beside the same GEMM at the vocabulary rounded up to a multiple of 8: the slowdown
    ``analytic.step_time`` applies to an unaligned GEMM (gemm_unaligned.csv)."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    tokens, widths = ((512, 8192), (768,)) if quick else (TOKENS, HEAD_WIDTHS)
    for dtype in (torch.bfloat16, torch.float32):
        for layout in ("nt", "nn", "tn"):
            for t in tokens:
                for d in widths:
                    for v in UNALIGNED_VOCABS:
                        for vocab in (v, v + (-v) % 8):
                            m, n, k = head_shape(layout, t, vocab, d)
                            if dtype == torch.float32 and m * n * k > 2**37:  # fp32 align1: ~10 TFLOP/s
                                continue
                            yield mm_row(dtype, layout, m, n, k)


def attention_rows(quick: bool):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = (
        ("flash", SDPBackend.FLASH_ATTENTION, torch.bfloat16),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.bfloat16),
        ("efficient", SDPBackend.EFFICIENT_ATTENTION, torch.float32),
    )
    for name, backend, dtype in backends:
        for d_head, heads in ((128, 32), (64, 16)):
            for causal in (True, False):
                for seq in (1024, 4096) if quick else SEQS:
                    batch = max(1, TOKENS_PER_ATTENTION // seq)
                    if dtype == torch.float32 and seq > 4096:  # ~25 TFLOP/s: seconds a point beyond
                        continue
                    q, k, v = (rand(batch, heads, seq, d_head, dtype=dtype).requires_grad_() for _ in range(3))
                    grad = torch.randn_like(q)
                    row = {
                        "backend": name,
                        "dtype": str(dtype).removeprefix("torch."),
                        "batch": batch,
                        "heads": heads,
                        "seq": seq,
                        "d_head": d_head,
                        "causal": causal,
                    }

                    def forward(q=q, k=k, v=v, causal=causal, backend=backend):
                        with sdpa_kernel(backend):
                            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

                    def both(forward=forward, grad=grad, q=q, k=k, v=v):  # no .grad accumulation
                        torch.autograd.grad(forward(), (q, k, v), grad)

                    full = 4 * batch * heads * seq * seq * d_head
                    try:
                        with torch.no_grad():
                            fwd = seconds_per_call(forward)
                        fb = seconds_per_call(both)
                    except RuntimeError as exc:  # a backend that refuses the shape or dtype: recorded
                        yield {**row, "error": str(exc).splitlines()[0][:200]}
                        continue
                    finally:
                        del q, k, v, grad
                    yield {
                        **row,
                        "pass": "forward",
                        "seconds": fwd,
                        "flops": full,
                        "tflops": round(full / fwd / 1e12, 2),
                    }
                    yield {
                        **row,
                        "pass": "forward+backward",
                        "seconds": fb,
                        "flops": full * 5 // 2,
                        "tflops": round(full * 5 / 2 / fb / 1e12, 2),
                    }


def moved(nbytes: int, seconds: float) -> dict:
    """A memory-bound row's bytes (read + written), seconds and rate."""
    return {"bytes": nbytes, "seconds": seconds, "gb_per_s": round(nbytes / seconds / 1e9, 1)}


def memory_bound_rows(quick: bool):
    import torch
    import torch.nn.functional as F

    ops = {  # name: (fn(x, y), tensors read, tensors written)
        "copy": (lambda x, y: x.clone(), 1, 1),
        "add": (lambda x, y: x + y, 2, 1),
        "mul": (lambda x, y: x * y, 2, 1),
        "silu": (lambda x, y: F.silu(x), 1, 1),
        "gelu_tanh": (lambda x, y: F.gelu(x, approximate="tanh"), 1, 1),
        "softmax": (lambda x, y: torch.softmax(x.view(-1, WIDTH), -1), 1, 1),
        "rms_norm": (lambda x, y: F.rms_norm(x.view(-1, WIDTH), (WIDTH,)), 1, 1),
        "layer_norm": (lambda x, y: F.layer_norm(x.view(-1, WIDTH), (WIDTH,)), 1, 1),
        "sum_rows": (lambda x, y: x.view(-1, WIDTH).sum(0), 1, 0),
    }
    for dtype in (torch.bfloat16, torch.float32):
        for size in (2**16, 2**24) if quick else SIZES:
            x, y = rand(size, dtype=dtype), rand(size, dtype=dtype)
            for name, (fn, reads, writes) in ops.items():
                s = seconds_per_call(lambda fn=fn, x=x, y=y: fn(x, y))
                nbytes = (reads + writes) * size * x.element_size()
                yield {"op": name, "dtype": str(dtype).removeprefix("torch."), "numel": size, **moved(nbytes, s)}
            cast = torch.bfloat16 if dtype == torch.float32 else torch.float32
            s = seconds_per_call(lambda x=x, cast=cast: x.to(cast))
            nbytes = size * (x.element_size() + torch.empty((), dtype=cast).element_size())
            op, dt = f"to_{str(cast).removeprefix('torch.')}", str(dtype).removeprefix("torch.")
            yield {"op": op, "dtype": dt, "numel": size, **moved(nbytes, s)}
            del x, y
    x = rand(1)
    yield {"op": "launch_eager", "dtype": "float32", "numel": 1, "bytes": 8, "seconds": seconds_per_call(lambda: x + 1)}
    if DEVICE != "cuda":
        return
    graph, calls = torch.cuda.CUDAGraph(), 100
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x + 1  # warm-up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            x + 1
    s = seconds_per_call(graph.replay) / calls
    yield {"op": "launch_graph", "dtype": "float32", "numel": 1, "bytes": 8, "seconds": s}


INDEX_ROWS = (2048, 8192, 32768, 131072)  # R: rows gathered (T·k for the experts' biases, T·k or T for hidden states)
INDEX_WIDTHS = (512, 2048, 8192)  # W: the gathered rows' width
INDEX_SLOTS = (8, 32, 128, 512)  # n: distinct rows written (experts); also R / 4 and R (few or no repeats)


def index_put_rows(quick: bool):
    """The backward of ``t[ids]`` (``IndexBackward0``) as CUDA runs it: ``zeros(n, W).index_put_((ids,), src,
    accumulate=True)``, which sorts the ids and then sums each slot's repeated rows in turn
    (``indexing_backward_kernel``): far below the copy bandwidth when few slots take many rows (gpt-oss's expert
    biases gathered per routed token: reports/calibration/h100-80gb/step_kernels.csv).  ``ids`` uniform over n."""
    import torch

    rows, widths = ((2048,), (512,)) if quick else (INDEX_ROWS, INDEX_WIDTHS)
    for dtype in (torch.bfloat16, torch.float32):
        for r in rows:
            for w in widths:
                if r * w > 2**28:
                    continue
                src = rand(r, w, dtype=dtype)
                for n in sorted({*(x for x in INDEX_SLOTS if x < r), r // 4, r}):
                    ids = torch.randint(0, n, (r,), device=DEVICE)
                    out = torch.zeros(n, w, device=DEVICE, dtype=dtype)
                    sec = seconds_per_call(
                        lambda out=out, ids=ids, src=src: out.index_put_((ids,), src, accumulate=True)
                    )
                    dt = str(dtype).removeprefix("torch.")
                    yield {"dtype": dt, "rows": r, "width": w, "slots": n, **moved(r * w * src.element_size(), sec)}
                    del ids, out
                del src
                free()


ODD_WIDTHS = (2048, 2049, 4096, 4097)  # a row length and one more: gpt-oss's scores with its sink column


def odd_width_rows(quick: bool):
    """Kernels over rows of an odd length beside the same at an even one: softmax forward and backward, ``cat`` of a
    (rows, W - 1) tensor with a column, and the batched product of a (W - 1)-wide slice of such rows with a
    (W - 1, 64) matrix (gpt-oss's ``probs[..., :-1] @ v``: its leading dimension W, odd, takes cuBLAS's align1
    kernels).  Rows: 2^26 elements in all (128 x S rows for the product's batch of 128)."""
    import torch

    for dtype in (torch.bfloat16, torch.float32):
        for w in (2048, 2049) if quick else ODD_WIDTHS:
            yield from odd_width_point(dtype, w)
            free()


def odd_width_point(dtype, w: int):
    import torch

    dt, rows = str(dtype).removeprefix("torch."), 2**26 // w
    x, g = rand(rows, w, dtype=dtype), rand(rows, w, dtype=dtype)
    y = torch.softmax(x, -1)
    n = rows * w * x.element_size()
    calls = {
        "softmax": (lambda: torch.softmax(x, -1), 2 * n),
        "softmax_backward": (lambda: torch._softmax_backward_data(g, y, -1, dtype), 3 * n),
        "cat_column": (lambda: torch.cat([x[:, : w - 1], x[:, :1]], -1), 2 * n),
    }
    for op, (fn, nbytes) in calls.items():
        yield {"op": op, "dtype": dt, "width": w, **moved(nbytes, seconds_per_call(fn))}
    seq = w - w % 2  # the product's k: the slice of an odd row, or the even row itself
    scores, v = rand(128, seq, w, dtype=dtype)[..., :seq], rand(128, seq, 64, dtype=dtype)
    sec = seconds_per_call(lambda: torch.bmm(scores, v))
    yield {"op": "bmm_rows", "dtype": dt, "width": w, "flops": 2 * 128 * seq * seq * 64, "seconds": sec}


def optimizer_rows(quick: bool):
    import torch

    sets = ((8, 2**20),) if quick else ((64, 2**22), (16, 2**24), (1024, 2**16), (4096, 2**10))
    for dtype in (torch.float32, torch.bfloat16):
        for count, numel in sets:
            params = [torch.nn.Parameter(rand(numel, dtype=dtype)) for _ in range(count)]
            for p in params:
                p.grad = torch.randn_like(p)
            for impl, kwargs in (
                ("for-loop", {"foreach": False}),
                ("foreach", {"foreach": True}),
                ("fused", {"fused": True}),
            ):
                if impl == "fused" and DEVICE != "cuda" and dtype != torch.float32:
                    continue
                opt = torch.optim.AdamW(params, **kwargs)
                s = seconds_per_call(opt.step)
                nbytes = 7 * count * numel * params[0].element_size()
                dt = str(dtype).removeprefix("torch.")
                yield {"impl": impl, "dtype": dt, "tensors": count, "numel": numel, **moved(nbytes, s)}
                del opt
                free()
            del params
            free()


KERNELS: list[dict] = []


def steps_rows(quick: bool):
    import dataclasses

    import torch

    from lm_accounting.config import load_config
    from lm_accounting.setup import TrainingSetup

    cases = (
        [
            ("course", "gpt2-small", {"num_layers": 2}, 256, 2, "amp-bf16", "none"),
            ("transformers", "qwen3-0.6b", {"num_layers": 2}, 256, 2, "bf16", "full"),
        ]
        if quick
        else [
            c
            for c in STEPS
            if (not STEP_MODELS or c[1] in STEP_MODELS.split(","))
            and (not STEP_CHECKPOINTS or c[6] in STEP_CHECKPOINTS.split(","))
        ]
    )
    for impl, preset, overrides, seq, batch, precision, ckpt in cases:
        attention = "naive" if preset in EAGER_ONLY else "sdpa"
        setup = TrainingSetup(attention=attention, precision=precision, checkpoint=ckpt, optimizer="fused")
        label = preset + "".join(f" {k}={v}" for k, v in overrides.items())
        row = {"impl": impl, "model": label, "context": seq, "batch": batch, "setup": setup.label}
        try:
            free()
            cfg = dataclasses.replace(load_config(preset), **overrides).with_context(seq)
            if impl == "course":
                from lm_accounting.measure.step import build_step
                from lm_accounting.model import cross_entropy

                model, inputs, labels, opt = build_step(cfg, seq, batch, setup, DEVICE)
                loss_fn = cross_entropy
            else:
                from lm_accounting.measure.hf import build_hf_step, patched_for

                with patched_for(DEVICE):
                    model, inputs, labels, opt, loss_fn = build_hf_step(cfg, seq, batch, setup, DEVICE)
            row.update(timed_steps(model, inputs, labels, opt, loss_fn, row))
            del model, inputs, labels, opt
        except Exception as exc:  # noqa: BLE001 - recorded in the table, the sweep goes on
            yield {**row, "error": f"{type(exc).__name__}: {exc}"[:300]}
            continue
        if DEVICE == "cuda":
            row["peak_allocated"] = torch.cuda.max_memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        yield row


def timed_steps(model, inputs, labels, opt, loss_fn, row, steps: int = 8) -> dict:
    """Median forward, backward and optimizer seconds over ``steps`` timed steps (3 warm-up), then one step
    under the profiler: its kernels' CUDA time by name goes to ``KERNELS``."""
    import torch

    def step(events=None):
        mark = (lambda i: events[i].record()) if events else (lambda i: None)
        mark(0)
        loss = loss_fn(model(inputs), labels)
        mark(1)
        loss.backward()
        mark(2)
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark(3)

    for _ in range(3):
        step()
    sync()
    times = []
    for _ in range(steps):
        events = [Event() for _ in range(4)]
        step(events)
        sync()
        times.append([events[i].seconds_to(events[i + 1]) for i in range(3)])
    t0 = time.perf_counter()
    for _ in range(3):
        step()
    sync()
    wall = (time.perf_counter() - t0) / 3
    activity = torch.profiler.ProfilerActivity
    with torch.profiler.profile(activities=[activity.CUDA if DEVICE == "cuda" else activity.CPU]) as prof:
        step()
        sync()
    busy, kind = 0.0, torch.autograd.DeviceType.CUDA if DEVICE == "cuda" else torch.autograd.DeviceType.CPU
    for e in prof.key_averages():
        own = e.self_device_time_total if DEVICE == "cuda" else e.self_cpu_time_total
        if e.device_type == kind and own > 0:
            KERNELS.append(
                {
                    "impl": row["impl"],
                    "model": row["model"],
                    "setup": row["setup"],
                    "kernel": e.key[:160],
                    "calls": e.count,
                    "seconds": e.self_device_time_total / 1e6,
                }
            )
            busy += own / 1e6
    fwd, bwd, optim = (statistics.median(t[i] for t in times) for i in range(3))
    return {
        "forward_seconds": fwd,
        "backward_seconds": bwd,
        "optimizer_seconds": optim,
        "step_seconds": fwd + bwd + optim,
        "wall_seconds": wall,
        "kernel_seconds": busy,
    }


SECTIONS = {
    "gemm": gemm_rows,
    "gemm_unaligned": gemm_unaligned_rows,
    "grouped": grouped_rows,
    "attention": attention_rows,
    "memory_bound": memory_bound_rows,
    "optimizer": optimizer_rows,
    "steps": steps_rows,
    "index_put": index_put_rows,
    "odd_width": odd_width_rows,
}
SHARES = {
    "gemm": 0.28,
    "gemm_unaligned": 0.12,
    "grouped": 0.1,
    "attention": 0.17,
    "memory_bound": 0.08,
    "optimizer": 0.1,
    "steps": 0.37,
    "index_put": 0.05,
    "odd_width": 0.05,
}  # of --budget


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for the CSV files and env.json")
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for all sections, shared equally")
    ap.add_argument("--quick", action="store_true", help="a few points of each section (a smoke run)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: a smoke run of this script")
    ap.add_argument("--step-models", default="", help="steps: only these presets (comma-separated)")
    ap.add_argument("--step-checkpoints", default="", help="steps: only these checkpointings (comma-separated)")
    args = ap.parse_args(argv)
    global DEVICE, STEP_MODELS, STEP_CHECKPOINTS
    DEVICE, STEP_MODELS, STEP_CHECKPOINTS = args.device, args.step_models, args.step_checkpoints
    names = args.only.split(",")
    unknown = sorted(set(names) - set(SECTIONS))
    if unknown or args.budget <= 0:
        print(
            f"cuda_calibrate: unknown section(s) {', '.join(unknown)}"
            if unknown
            else "cuda_calibrate: --budget must be > 0",
            file=sys.stderr,
        )
        return 2
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        print("cuda_calibrate: no CUDA GPU is available on this machine", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = env()
    (out / "env.json").write_text(json.dumps(info, indent=1) + "\n")
    print(json.dumps(info), flush=True)
    for name in names:
        share = args.budget * SHARES[name] / sum(SHARES[n] for n in names)
        t0, rows = time.perf_counter(), []
        try:
            for row in SECTIONS[name](args.quick):
                rows.append(row)
                write_csv(out / f"{name}.csv", rows)
                if time.perf_counter() - t0 > share:
                    print(f"{name}: budget of {share:.0f} s spent; stopped", flush=True)
                    break
        except Exception:  # noqa: BLE001 - keep what was measured
            traceback.print_exc()
        if name == "steps" and KERNELS:
            write_csv(out / "step_kernels.csv", KERNELS)
        free()
        print(f"{name}: {len(rows)} rows in {time.perf_counter() - t0:.1f} s", flush=True)
        for r in rows[-3:] if name != "steps" else rows:
            print("  ", json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
