"""Counting the live model's FLOPs with two independent counters, per component.

* fvcore ``FlopCountAnalysis`` traces with torch.jit and counts MACs (one per fused
  multiply-add), so its figures are doubled here.  Its default ``aten::matmul`` handle
  assumes the first operand carries the broadcast batch, and its ``aten::einsum`` handle
  falls back to numpy's path optimiser (rounded, and it allocates float64 arrays the
  size of the operands: a MemoryError at 16k context even on meta).  We replace both
  with exact integer handles below.
* torch's ``FlopCounterMode`` counts FLOPs (2 per MAC) at the dispatcher level, forward
  and backward, with per-module attribution.

Module paths are normalised to the analytic keys: the root class prefix is dropped and
``layers.<i>.`` becomes ``layers.*.`` (summed over layers, and checked layer by layer).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from math import prod
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

LAYER_INDEX = re.compile(r"(^|\.)layers\.(\d+)(?=\.|$)")


def analytic_key(module_path: str) -> tuple[str, int | None]:
    """``layers.7.attn.qk`` -> (``layers.*.attn.qk``, 7); other paths -> (path, None)."""
    match = LAYER_INDEX.search(module_path)
    if not match:
        return module_path, None
    return LAYER_INDEX.sub(r"\1layers.*", module_path, count=1), int(match.group(2))


@dataclass
class CounterResult:
    """One counter's FLOPs (not MACs) per analytic key, with what it could not count."""

    counter: str
    by_key: dict[str, int]
    per_layer: dict[str, dict[int, int]]
    total: int
    skipped_ops: dict[str, int] = field(default_factory=dict)
    note: str = ""

    def unattributed(self, keys: Iterable[str]) -> int:
        """FLOPs counted outside the given components (must be 0 for a clean cross-check)."""
        return self.total - sum(self.by_key.get(k, 0) for k in keys)


def _collect(leaf_counts: dict[str, int], keys: Iterable[str]) -> tuple[dict[str, int], dict[str, dict[int, int]]]:
    wanted = set(keys)
    by_key: dict[str, int] = defaultdict(int)
    per_layer: dict[str, dict[int, int]] = defaultdict(dict)
    for path, flops in leaf_counts.items():
        key, layer = analytic_key(path)
        if key in wanted:
            by_key[key] += flops
            if layer is not None:
                per_layer[key][layer] = flops
    return dict(by_key), dict(per_layer)


# -- fvcore ---------------------------------------------------------------------------
def _shape(value: Any) -> list[int]:
    from fvcore.nn.jit_handles import get_shape

    return list(get_shape(value))


def exact_matmul_macs(a: list[int], b: list[int]) -> int:
    """MACs of torch.matmul for operand shapes ``a`` and ``b`` (broadcast batch, 1-D cases)."""
    a, b = list(a), list(b)
    if len(a) == 1:
        a = [1, a[0]]
    if len(b) == 1:
        b = [b[0], 1]
    if a[-1] != b[-2]:
        raise ValueError(f"matmul shapes do not match: {a} @ {b}")
    batch = torch.broadcast_shapes(torch.Size(a[:-2]), torch.Size(b[:-2]))
    return prod(batch) * a[-2] * a[-1] * b[-1]


def exact_einsum_macs(equation: str, shapes: list[list[int]]) -> int:
    """MACs of torch.einsum, contracting operands pairwise left to right (torch's order when
    opt_einsum is not installed).  A pairwise contraction costs the product of the sizes of
    every index of both operands."""
    lhs, _, out = equation.replace(" ", "").partition("->")
    terms = lhs.split(",")
    sizes: dict[str, int] = {}
    expanded = []
    for term, shape in zip(terms, shapes, strict=False):
        if "..." in term:  # name broadcast dims with upper-case letters, aligned from the right
            n = len(shape) - (len(term) - 3)
            term = term.replace("...", "".join(chr(ord("Z") - i) for i in reversed(range(n))))
        expanded.append(term)
        for letter, size in zip(term, shape, strict=False):
            sizes[letter] = max(sizes.get(letter, 1), size)
    if not out:  # implicit output: letters seen once, sorted
        seen = Counter("".join(expanded))
        out = "".join(sorted(k for k, v in seen.items() if v == 1))
    elif "..." in out:
        out = out.replace("...", "".join(sorted((k for k in sizes if k.isupper()), reverse=True)))
    macs, current = 0, expanded[0]
    for i, term in enumerate(expanded[1:], start=1):
        letters = dict.fromkeys(current + term)
        macs += prod(sizes[k] for k in letters)
        later = set("".join(expanded[i + 1 :]) + out)
        current = "".join(k for k in letters if k in later)
    return macs


def _fvcore_matmul(inputs: list[Any], outputs: list[Any]) -> int:
    return exact_matmul_macs(_shape(inputs[0]), _shape(inputs[1]))


def _fvcore_einsum(inputs: list[Any], outputs: list[Any]) -> int:
    equation = inputs[0].toIValue()
    shapes = [_shape(v) for v in inputs[1].node().inputs()]
    return exact_einsum_macs(equation, shapes)


def count_fvcore(model: torch.nn.Module, tokens: torch.Tensor, keys: Iterable[str]) -> CounterResult:
    """Forward FLOPs (2 × fvcore MACs) per component, with fvcore's unsupported ops."""
    from fvcore.nn import FlopCountAnalysis

    from .attention_flops import FVCORE_HANDLES

    analysis = FlopCountAnalysis(model, (tokens,))
    analysis.set_op_handle(
        "aten::matmul",
        _fvcore_matmul,
        "aten::mm",
        _fvcore_matmul,
        "aten::bmm",
        _fvcore_matmul,
        "aten::einsum",
        _fvcore_einsum,
    )
    analysis.set_op_handle(**FVCORE_HANDLES)  # fused attention, which fvcore counts as 0
    analysis.unsupported_ops_warnings(False).uncalled_modules_warnings(False).tracer_warnings("none")
    with torch.no_grad():
        by_module = analysis.by_module()
    leaf = {path: 2 * int(macs) for path, macs in by_module.items() if path}
    by_key, per_layer = _collect(leaf, keys)
    return CounterResult(
        "fvcore",
        by_key,
        per_layer,
        2 * int(analysis.total()),
        dict(analysis.unsupported_ops()),
        "2 × MACs; exact matmul/einsum/fused-attention handles registered",
    )


# -- torch FlopCounterMode ----------------------------------------------------------------
class _OpRecorder(TorchDispatchMode):
    """Counts the aten ops dispatched, to list those FlopCounterMode has no formula for."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Without this, TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo,
        # which costs more per op than the counting; we never run under torch.compile.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[Any] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[func._overloadpacket] += 1
        return func(*args, **(kwargs or {}))


def _flop_counter_run(model: torch.nn.Module, tokens: torch.Tensor, backward: bool):
    from torch.utils.flop_counter import FlopCounterMode, flop_registry

    from ..model import cross_entropy
    from .attention_flops import install

    install()  # the CPU flash kernel's formulas; before FlopCounterMode copies the registry
    recorder = _OpRecorder()
    with FlopCounterMode(display=False, depth=None) as counter, recorder:
        if backward:
            logits = model(tokens)
            cross_entropy(logits, tokens).backward()
        else:
            with torch.no_grad():
                model(tokens)
    root = type(model).__name__ + "."
    leaf = {
        name.removeprefix(root): int(sum(ops.values()))
        for name, ops in counter.get_flop_counts().items()
        if name.startswith(root)
    }
    skipped = {str(op).removeprefix("aten."): n for op, n in recorder.calls.items() if op not in flop_registry}
    return leaf, int(counter.get_total_flops()), skipped


def count_flop_counter(
    model: torch.nn.Module, tokens: torch.Tensor, keys: Iterable[str], backward: bool = False
) -> CounterResult:
    """FLOPs per component from FlopCounterMode: forward, or forward + backward (cross-entropy loss)."""
    leaf, total, skipped = _flop_counter_run(model, tokens, backward)
    by_key, per_layer = _collect(leaf, keys)
    name = "FlopCounterMode (fwd+bwd)" if backward else "FlopCounterMode"
    return CounterResult(name, by_key, per_layer, total, skipped, "ops without a FLOP formula count 0")
