"""Parallelisms as plug-ins (issue 27): one module each, one protocol, applied in ``PARALLELISMS`` order.

``layout.ParallelLayout`` is the degrees; what is particular to each parallelism lives in its module here:

* ``name``: how outputs call it; ``fields``: the ``ParallelLayout`` fields it reads (every field is some
  parallelism's, tests/test_parallelisms.py);
* ``validate(layout)``: refuse, in one line (``AccountingError``), a layout that cannot run it, whatever the model;
* ``check(layout, cfg, seq)``: refuse a layout the model ``cfg`` (at ``seq`` tokens) cannot take;
* ``label(layout)``: its part of ``ParallelLayout.label`` ('' when it does not run);
* ``groups(layout)``: the process groups its collectives run over, each as (ranks, stride of those ranks on the
  (pp, dp, tp) mesh): ``analytic.collectives.Collective.group`` names them and ``plan`` prices each over its own
  ring (``plan.ring_bandwidth``).

Not yet here (issue 27 item 1, a slice): each parallelism's share of the model states (``analytic.parallel``),
its collectives' rules (``analytic.collectives``, rules 1-12), its replay hooks (``analytic.ops.fsdp``,
``analytic.pipeline``) and its ``apply`` for the fake-process-group proof (``measure.parallelize``).  No torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from . import cp, ddp, ep, fsdp2, hsdp, pp, sp, tp, vp, zero1

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..layout import ParallelLayout


class Parallelism(Protocol):
    name: str
    fields: tuple[str, ...]

    def validate(self, layout: ParallelLayout) -> None: ...

    def check(self, layout: ParallelLayout, cfg: ModelConfig, seq: int | None) -> None: ...

    def label(self, layout: ParallelLayout) -> str: ...

    def groups(self, layout: ParallelLayout) -> dict[str, tuple[int, int]]: ...


PARALLELISMS: tuple[Parallelism, ...] = (
    ddp.DDP,
    zero1.ZERO1,
    fsdp2.FSDP2,
    hsdp.HSDP,
    cp.CP,
    tp.TP,
    sp.SP,
    vp.VP,
    ep.EP,
    pp.PP,
)
"""Every parallelism, in the order ``ParallelLayout.label`` names them."""


_VALIDATE = tuple({type(p).validate: p.validate for p in PARALLELISMS}.values())
"""One ``validate`` per distinct rule set (DDP, ZeRO-1 and FSDP2 share the data-parallel one): ``plan`` builds
tens of thousands of layouts."""


def validate(layout: ParallelLayout) -> None:
    for check_layout in _VALIDATE:
        check_layout(layout)


def check(layout: ParallelLayout, cfg: ModelConfig, seq: int | None) -> None:
    for p in PARALLELISMS:
        p.check(layout, cfg, seq)


def label(layout: ParallelLayout) -> str:
    return f"dp{layout.dp}" + "".join(p.label(layout) for p in PARALLELISMS)


def group_ranks(layout: ParallelLayout, group: str) -> tuple[int, int]:
    """(ranks, stride) of process group ``group`` on ``layout``'s mesh, from the parallelism that runs it."""
    for p in PARALLELISMS:
        found = p.groups(layout).get(group)
        if found:
            return found
    raise KeyError(f"no parallelism of {layout.label} runs the process group {group!r}")
