"""The evaluation engine of the memory replay: live bytes as exact lines in the micro-batch B.

Moved from ``analytic/replay.py`` (issue 26), unchanged but for public names.  A replay is fed signed
allocation sizes in program order; every size is an ``int`` or an ``Affine`` a·B + b, so one run gives
each phase's peak as an exact function of B (``PeakEnvelope``) and its end as a line (``Affine``).

* ``Affine``: a·B + b bytes.
* ``PeakEnvelope``: max over lines; ``PhaseInBatch`` / ``StepInBatch``: a phase / a step in B.
* ``Replay``: running live bytes and the highest intercept per slope; ``Copy`` / ``Join``: an
  out-of-place copy that only a traced run makes; ``Grad``: a parameter gradient's bytes, tagged.
* ``repeat`` / ``apply_segment``: n identical segments (layers) in O(1).
No torch here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...phases import PHASES, PhaseBytes, StepMemory


class Affine:
    """a·B + b bytes, exact ints: a tensor size (or a sum of them) as a function of the batch B."""

    __slots__ = ("a", "b")

    def __init__(self, a: int, b: int = 0):
        self.a, self.b = a, b

    def at(self, batch: int) -> int:
        return self.a * batch + self.b

    def __add__(self, other: Affine | int) -> Affine:
        if isinstance(other, Affine):
            return Affine(self.a + other.a, self.b + other.b)
        return Affine(self.a, self.b + other)

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(-self.a, -self.b)

    def __pos__(self) -> Affine:
        return self

    def __sub__(self, other: Affine | int) -> Affine:
        return self + (-other)

    def __rsub__(self, other: int) -> Affine:
        return -self + other

    def __mul__(self, k: int) -> Affine:
        if isinstance(k, Affine):
            raise TypeError("a size is never quadratic in the batch")
        return Affine(self.a * k, self.b * k)

    __rmul__ = __mul__

    def __floordiv__(self, k: int) -> Affine:
        """Exact division only (e.g. half a (B, h, S, d_head) tensor: d_head·e is even)."""
        if self.a % k or self.b % k:
            raise ArithmeticError(f"{self!r} is not divisible by {k}")
        return Affine(self.a // k, self.b // k)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Affine) and (self.a, self.b) == (other.a, other.b)

    def __hash__(self) -> int:
        return hash((self.a, self.b))

    def __repr__(self) -> str:
        return f"Affine({self.a}, {self.b})"


@dataclass(frozen=True)
class PeakEnvelope:
    """max over candidate lines of a·B + b: a phase's peak as an exact function of the batch.

    ``lines`` maps each slope a to the highest intercept b seen with it (a lower one can never
    be the maximum).  Every slope is >= 0 (a live byte count never shrinks when B grows), so
    the peak is convex and non-decreasing in B."""

    lines: tuple[tuple[int, int], ...]  # (a, b), sorted by a

    def at(self, batch: int) -> int:
        return max(a * batch + b for a, b in self.lines)

    @classmethod
    def of(cls, best: dict[int, int]) -> PeakEnvelope:
        return cls(tuple(sorted(best.items())))


class Copy:
    """An out-of-place copy that only a traced run makes: where a plain run works in place
    (``InputBuffer::accumulate``, ``gather_backward``, ``index_backward``), a traced run allocates a
    result of ``size`` and frees the old tensor right after, a transient spike of ``size`` bytes."""

    __slots__ = ("size",)

    def __init__(self, size: Affine | int):
        self.size = size


class Join(Copy):
    """A ``Copy`` where a norm's input gradient joins the residual stream's (``_norm_backward``): the
    old gradient is the one the block received (a pipeline stage's top block: the receive buffer)."""

    __slots__ = ()


class Grad(int):
    """A parameter gradient's bytes, tagged (a plain ``int`` to ``Replay``): a pipeline stage's later
    micro-batches accumulate each one into ``.grad`` and free it (``analytic.pipeline``)."""

    def __pos__(self) -> Grad:
        return self


class Replay:
    """Running live bytes a·B + b and, per slope a, the highest intercept b reached: fed with
    signed allocation sizes (ints, or ``Affine`` for sizes that grow with B) in program order.

    ``traced``: a ``Copy`` is replayed (+size, −size); otherwise (a plain run) it allocates nothing
    and its would-be peak, live + size, is kept apart in ``copies``: the traced run's extra candidates."""

    def __init__(self, live: Affine, traced: bool = True):
        self.a, self.b = live.a, live.b
        self.best: dict[int, int] = {live.a: live.b}
        self.traced = traced
        self.copies: dict[int, int] = {}

    @property
    def live(self) -> Affine:
        return Affine(self.a, self.b)

    def __call__(self, *deltas: Affine | int | Copy) -> None:
        a, b, best = self.a, self.b, self.best
        for delta in deltas:
            if isinstance(delta, int):  # a plain size, a Grad too (an int subclass)
                b += delta
            elif isinstance(delta, Copy):
                size = delta.size
                sa, sb = (0, size) if type(size) is int else (size.a, size.b)
                if self.traced:
                    if b + sb > best.get(a + sa, b + sb - 1):
                        best[a + sa] = b + sb
                elif b + sb > self.copies.get(a + sa, b + sb - 1):
                    self.copies[a + sa] = b + sb
                continue
            else:
                a, b = a + delta.a, b + delta.b
            if b > best.get(a, b - 1):
                best[a] = b
        self.a, self.b = a, b

    def fresh(self) -> Replay:
        """An empty replay of the same kind (``repeat``'s probe of one layer)."""
        return Replay(Affine(0), self.traced)

    def peak(self) -> PeakEnvelope:
        return PeakEnvelope.of(self.best)

    def copy_peak(self) -> PeakEnvelope | None:
        """Plain run: the highest live + copy over the traced run's out-of-place copies (None: none)."""
        return PeakEnvelope.of(self.copies) if self.copies else None


def repeat(r: Replay, times: int, body: Callable[[Replay], None]) -> None:
    """Replay ``body`` (one layer) ``times`` times in O(1).

    1. Identical layers move the live bytes by the same ``step`` each time, so run k (k = 0 ..
       times−1) reaches live + k·step + h at each of the body's candidate points h.
    2. For any fixed B that is linear in k, so its maximum over k is at k = 0 or k = times−1:
       the candidates of the first and the last run are the only ones that can be the peak."""
    if times <= 0:
        return
    probe = r.fresh()
    body(probe)
    apply_segment(r, probe, times)


def apply_segment(r: Replay, probe: Replay, times: int = 1) -> None:
    """Continue ``r`` with ``times`` runs of ``probe``, a replay of one segment from zero (``repeat``'s
    steps 1 and 2): its candidate peaks shifted by where each run starts."""
    step_a, step_b = probe.a, probe.b  # net change of one layer
    for run in {0, times - 1}:
        base_a, base_b = r.a + run * step_a, r.b + run * step_b
        for best, seen in ((r.best, probe.best), (r.copies, probe.copies)):
            for a, b in seen.items():
                a, b = base_a + a, base_b + b
                if b > best.get(a, b - 1):
                    best[a] = b
    r.a, r.b = r.a + times * step_a, r.b + times * step_b


@dataclass(frozen=True)
class PhaseInBatch:
    """One phase as a function of the batch B: its peak (an envelope of lines) and its end (a line)."""

    peak: PeakEnvelope
    end: Affine
    copies: PeakEnvelope | None = None  # plain replay only: live + each out-of-place copy a traced run makes

    def at(self, batch: int) -> PhaseBytes:
        return PhaseBytes(self.peak.at(batch), self.end.at(batch))

    def traced_excess(self, batch: int) -> int:
        """(traced − plain) peak of this phase, from the plain replay: max(0, max over the copies of
        (live before the copy + its size) − the plain peak)."""
        if self.copies is None:
            return 0
        return max(0, self.copies.at(batch) - self.peak.at(batch))


@dataclass(frozen=True)
class StepInBatch:
    """A training step with the batch B as a variable: ``at(B)`` is the ``StepMemory`` at B."""

    baseline: Affine
    forward: PhaseInBatch
    backward: PhaseInBatch
    optimizer_step: PhaseInBatch

    def phases(self) -> dict[str, PhaseInBatch]:
        return {name: getattr(self, name) for name in PHASES}

    def at(self, batch: int) -> StepMemory:
        return StepMemory(self.baseline.at(batch), *(p.at(batch) for p in self.phases().values()))
