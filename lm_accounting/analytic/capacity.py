"""Capacity planning from the implementation-exact step model: the peak of each phase as lines
in the batch B, the largest batch and the largest context that fit a budget.

Why one line per phase, and why a phase can need more than one
----------------------------------------------------------------
1. Every tensor of a training step has a size a·B + b: activations grow with B (b = 0); the
   weights, gradients, AdamW state, RoPE tables and causal mask do not (a = 0).
2. So the live bytes at each point of the replay are one line a_j·B + b_j, and the peak of a
   phase is the highest of its points: peak_i(B) = max_j (a_j·B + b_j), convex in B.
3. A single line is exact only while one point stays the highest.  Backward is where that
   fails in practice (every preset at short contexts, Llama-3-8B at 1,024): early in backward
   all activations are live (large a, small b); late in backward, while the embedding's
   gradient is built, nearly all gradients exist (small a, large b).  At a small batch the
   late point is the highest, at a large batch the early one.  Across phases the same happens:
   the optimizer step (a = the token ids only) sets the step's peak at small batches.
4. ``replay_training_step`` keeps every candidate line (per slope, the highest intercept), so
   ``phase_peak_lines`` turns that envelope into consecutive integer ranges of B, each with
   the one line that equals the phase's peak there; the last range is open-ended: no other
   candidate line can overtake it, so it is exact for every larger B (a proof, not a test).
5. The step's peak is max over phases of those lines.  The largest batch within a budget is
   then closed-form: the smallest floor((budget − b)/a) over all lines of all phases.

Every figure comes from the replay (exact for our live model, byte for byte against the
storage tracker), so these are exact too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..config import AccountingError, ModelConfig
from ..phases import PHASES, StepMemory
from ..setup import TrainingSetup
from .replay import PeakEnvelope, moe_lines_in_batch, predict_training_step, replay_training_step

MAX_SEARCH = 1 << 40  # far beyond any real context; keeps the context search finite


@dataclass(frozen=True)
class PeakLine:
    """peak = a·B + b bytes, exactly, for every batch B from ``first`` to ``last`` (None: no end)."""

    a: int  # bytes per sequence
    b: int  # bytes
    first: int
    last: int | None

    def at(self, batch: int) -> int:
        return self.a * batch + self.b

    def covers(self, batch: int) -> bool:
        return self.first <= batch and (self.last is None or batch <= self.last)

    def to_dict(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "from_batch": self.first, "to_batch": self.last}


def envelope_lines(lines: tuple[tuple[int, int], ...], start: int = 1) -> tuple[PeakLine, ...]:
    """The pieces of max over ``lines`` of a·B + b on the integers B >= ``start``.

    From ``start`` on, the highest line (the steeper one on a tie) holds until a steeper line
    is strictly higher: for a line with a > a₀ that is at B = ⌊(b₀ − b)/(a − a₀)⌋ + 1.  The
    earliest such B starts the next piece, with the highest line there.  Lines with a smaller
    slope than the current one never come back (they were not higher at the piece's start)."""

    def best_at(batch: int, candidates) -> tuple[int, int]:
        return max(candidates, key=lambda ab: (ab[0] * batch + ab[1], ab[0]))

    a0, b0 = best_at(start, lines)
    first, out = start, []
    while True:
        steeper = [(a, b) for a, b in lines if a > a0]
        if not steeper:
            out.append(PeakLine(a0, b0, first, None))
            return tuple(out)
        switch = min(max(first + 1, (b0 - b) // (a - a0) + 1) for a, b in steeper)
        out.append(PeakLine(a0, b0, first, switch - 1))
        (a0, b0), first = best_at(switch, steeper), switch


@dataclass(frozen=True)
class PhasePeakLines:
    """One phase's peak as a function of the batch: consecutive lines from B = 1, the last open-ended."""

    phase: str
    lines: tuple[PeakLine, ...]
    candidates: tuple[tuple[int, int], ...]  # every (a, b) the replay reached; the peak is their max

    def line_at(self, batch: int) -> PeakLine:
        return next(line for line in self.lines if line.covers(batch))

    def at(self, batch: int) -> int:
        return self.line_at(batch).at(batch)

    @property
    def final(self) -> PeakLine:
        """The line that holds for every batch from its ``first`` on."""
        return self.lines[-1]

    def max_batch(self, budget: int) -> int:
        """Largest B with this phase's peak <= budget (0 if none), piece by piece (the peak grows with B): in
        the first piece whose line passes the budget, ⌊(budget − b)/a⌋."""
        best = 0
        for line in self.lines:
            if line.at(line.first) > budget:
                return best
            if line.a == 0:  # not in a real step (its token ids grow with B) unless the piece is closed
                if line.last is None:
                    raise AccountingError(f"the {self.phase} peak does not grow with the batch: no largest batch")
                best = line.last
                continue
            top = (budget - line.b) // line.a
            if line.last is None or top < line.last:
                return top
            best = line.last
        return best


def lines_with_one(name: str, envelope: PeakEnvelope, one: int) -> PhasePeakLines:
    """A phase's peak from a replay whose lines are exact for B >= 2 (``envelope``) and its exact peak at B = 1
    (``one``): the B = 1 piece has the slope of the line at B = 2 (the envelope itself where it agrees at 1)."""
    if envelope.at(1) == one:
        return PhasePeakLines(name, envelope_lines(envelope.lines), envelope.lines)
    lines = envelope_lines(envelope.lines, 2)
    a = lines[0].a
    return PhasePeakLines(name, (PeakLine(a, one - a, 1, 1), *lines), envelope.lines)


@dataclass(frozen=True)
class StepPeakLines:
    """peak(B) = max over phases i of the phase's line at B: the whole training step, exact for every B >= 1."""

    forward: PhasePeakLines
    backward: PhasePeakLines
    optimizer_step: PhasePeakLines

    def phases(self) -> dict[str, PhasePeakLines]:
        return {name: getattr(self, name) for name in PHASES}

    def at(self, batch: int) -> int:
        return max(p.at(batch) for p in self.phases().values())

    def phase_at(self, batch: int) -> str:
        """The phase that sets the step's peak at ``batch`` (the first one, on a tie)."""
        return max(PHASES, key=lambda name: (self.phase(name).at(batch), -PHASES.index(name)))

    def phase(self, name: str) -> PhasePeakLines:
        return getattr(self, name)

    def max_batch(self, budget: int) -> int:
        """Largest batch whose step peak is within ``budget`` bytes (0 if none), closed-form."""
        return min(p.max_batch(budget) for p in self.phases().values())

    def step_lines(self) -> list[tuple[str, PeakLine]]:
        """The step's peak as consecutive pieces over B, each with the phase whose line it is: between two
        starts of any phase's pieces, the envelope of the phases' lines there (an earlier phase wins a tie)."""
        starts = sorted({line.first for p in self.phases().values() for line in p.lines})
        out: list[tuple[str, PeakLine]] = []
        for i, start in enumerate(starts):
            stop = starts[i + 1] - 1 if i + 1 < len(starts) else None
            owner = {}
            for name, phase in reversed(self.phases().items()):
                line = phase.line_at(start)
                owner[(line.a, line.b)] = name
            for p in envelope_lines(tuple(owner), start):
                if stop is not None and p.first > stop:
                    break
                last = stop if stop is not None and (p.last is None or p.last > stop) else p.last
                name = owner[(p.a, p.b)]
                if out and out[-1][0] == name and (out[-1][1].a, out[-1][1].b) == (p.a, p.b):
                    out[-1] = (name, PeakLine(p.a, p.b, out[-1][1].first, last))
                else:
                    out.append((name, PeakLine(p.a, p.b, p.first, last)))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            **{name: [line.to_dict() for line in p.lines] for name, p in self.phases().items()},
            "step": [{"phase": name, **line.to_dict()} for name, line in self.step_lines()],
        }


def phase_peak_lines(name: str, envelope: PeakEnvelope) -> PhasePeakLines:
    return PhasePeakLines(name, envelope_lines(envelope.lines), envelope.lines)


def peak_lines_in_batch(
    cfg: ModelConfig,
    seq: int,
    dtype: str | None = None,
    optimizer: str | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    mode: str = "plain",
) -> StepPeakLines:
    """Each phase's peak as exact lines in the batch (see the module docstring), for ``setup`` (or the
    older ``dtype``/``optimizer``) and ``mode``: "plain" (the default: a run with no dispatch mode, what a
    GPU user gets) or "traced" (what the storage tracker sees), as ``predict_training_step``."""
    if not moe_lines_in_batch(cfg, seq):
        raise AccountingError(
            f"at context {seq} the mixture of experts splits its slots differently for different batches "
            "(S·k not a multiple of E, or below 2·E): its peaks are no lines in B; use predict_training_step"
        )
    step = replay_training_step(cfg, seq, dtype, optimizer, device, setup=setup, mode=mode)
    return StepPeakLines(*(phase_peak_lines(name, p.peak) for name, p in step.phases().items()))


def largest_within(value: Callable[[int], int], budget: int, limit: int | None = None) -> int:
    """Largest n in [1, limit] with value(n) <= budget, for a non-decreasing ``value`` (a step's peak against
    its context); 0 if none.  It ends on value(lo) <= budget < value(lo + 1), as a bisection would; only the probes
    differ, each a whole replay of the step:

    1. A step's peak is close to a quadratic in the context S (attention's S×S terms, the activations' S, the
       model states' constant), so the root of the quadratic through the last three probes (two: a line) lands
       next to the answer: usually 4-8 probes where doubling and bisection take 2·log2(S), 26 at 5,000 tokens.
    2. Each guess is kept inside the bracket [lo fits, hi does not] (at most 64 × lo while no hi is known),
       and a guess that did not halve the bracket is followed by a bisection, so a peak far from a quadratic
       (a sliding window's kink, a learned table's end) still converges.  Values are compared as exact integers;
       floats only choose the next probe.
    """
    probes: dict[int, int] = {}

    def fits(n: int) -> bool:
        if n >= MAX_SEARCH:
            raise AccountingError("the budget is so large that the search did not terminate; give a smaller budget")
        if n not in probes:
            probes[n] = value(n)
        return probes[n] <= budget

    if not fits(1):
        return 0
    if limit is not None and fits(limit):
        return limit
    lo, hi = 1, limit  # fits(lo); hi, where known, does not
    while hi is None:  # no bracket yet: past the root, and at least 5/4 of lo (never crawling)
        root = _root(sorted(probes.items())[-3:], budget)
        n = min(max(lo + 1 + lo // 4, int(root) + 1 if root is not None and root < 64 * lo else 64 * lo), 64 * lo)
        lo, hi = (n, None) if fits(n) else (lo, n)
    bisect = False
    while hi - lo > 1:
        width = hi - lo
        if bisect:
            n = (lo + hi) // 2
        else:
            root = _root(_nearest(probes, lo, hi), budget)
            n = min(max(lo + 1, int(root) if root is not None and root < hi else hi - 1), hi - 1)
        lo, hi = (n, hi) if fits(n) else (lo, n)
        bisect = not bisect and 2 * (hi - lo) > width
    return lo


def _nearest(probes: dict[int, int], lo: int, hi: int) -> list[tuple[int, int]]:
    """The bracket's ends and the probe nearest to them: the three points the quadratic goes through."""
    rest = sorted((n for n in probes if n not in (lo, hi)), key=lambda n: min(abs(n - lo), abs(n - hi)))
    return sorted([(n, probes[n]) for n in (lo, hi, *rest[:1])])


def _root(points: list[tuple[int, int]], budget: int) -> float | None:
    """The largest x where the polynomial through ``points`` (Newton's divided differences, degree
    len(points) − 1 ≤ 2) equals ``budget``; None where it never does (or one point only)."""
    if len(points) < 2:
        return None
    (x0, v0), (x1, v1) = points[0], points[1]
    d01 = (v1 - v0) / (x1 - x0)
    a = 0.0
    if len(points) == 3:
        x2, v2 = points[2]
        a = ((v2 - v1) / (x2 - x1) - d01) / (x2 - x0)
    # v0 + d01·(x − x0) + a·(x − x0)(x − x1) = budget  →  a·x² + b·x + c = 0
    b, c = d01 - a * (x0 + x1), v0 - d01 * x0 + a * x0 * x1 - budget
    if abs(a) * max(x0, x1, 1) ** 2 < 1e-9 * max(abs(b) * max(x0, x1, 1), abs(c), 1):
        return -c / b if b > 0 else None
    disc = b * b - 4 * a * c
    # the root on the rising side: the larger of a convex parabola's, the smaller of a concave one's
    return None if disc < 0 else (-b + disc**0.5) / (2 * a)


def max_batch_that_fits(
    cfg: ModelConfig,
    seq: int,
    budget: int,
    dtype: str | None = None,
    optimizer: str | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    mode: str = "plain",
) -> int:
    """Largest batch whose training-step peak is within ``budget`` bytes (0 if none), from the
    per-phase lines (exact for every batch, so no search is needed)."""
    return peak_lines_in_batch(cfg, seq, dtype, optimizer, device, setup=setup, mode=mode).max_batch(budget)


def max_context_that_fits(
    cfg: ModelConfig,
    budget: int,
    batch: int = 1,
    dtype: str | None = None,
    optimizer: str | None = None,
    device: str = "meta",
    *,
    setup: TrainingSetup | None = None,
    mode: str = "plain",
    predict: Callable[[ModelConfig, int], StepMemory] | None = None,
) -> int:
    """Largest context (tokens) whose training-step peak at ``batch`` fits ``budget`` (0 if none).

    The model is rebuilt at each context (its RoPE tables grow with it); the peak is not
    linear in the context (S² attention terms), so this one is a search, up to a learned position table's
    rows where its size is given (``max_position_embeddings``: GPT-2's 1,024).  ``predict(cfg, seq)``: the
    step at ``batch`` of another program (default: the replay's, ``predict_training_step``)."""

    def peak(seq: int) -> int:
        if predict is not None:
            return predict(cfg.with_context(seq), seq).peak
        return predict_training_step(
            cfg.with_context(seq), seq, batch, dtype, optimizer, device, setup=setup, mode=mode
        ).peak

    return largest_within(peak, budget, limit=context_limit(cfg))


def context_limit(cfg: ModelConfig) -> int | None:
    """The longest context the model can run: the positions its learned table serves where given, else None."""
    return cfg.max_positions if cfg.positions == "learned" and cfg.max_position_embeddings is not None else None
