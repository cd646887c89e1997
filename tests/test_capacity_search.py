"""The largest-context search (``capacity.largest_within``) against a plain bisection written here, and its
probe count: every probe is a whole replay of the step (hostile finding F16: 26 replays per ``memory`` call)."""

from __future__ import annotations

import random

import pytest

from lm_accounting.analytic.capacity import largest_within


def bisection(value, budget, limit=None):
    """The reference: the largest n with value(n) <= budget by doubling then halving (value non-decreasing)."""
    if value(1) > budget:
        return 0
    if limit is not None and value(limit) <= budget:
        return limit
    lo, hi = 1, 2
    while (limit is None or hi < limit) and value(hi) <= budget:
        lo, hi = hi, 2 * hi
    hi = hi if limit is None else min(hi, limit)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if value(mid) <= budget else (lo, mid)
    return lo


def counted(value):
    calls = []

    def f(n):
        calls.append(n)
        return value(n)

    return f, calls


def shapes(rng):
    """Non-decreasing peaks of the kinds a step has: a quadratic in S, one rounded to allocator blocks, a
    sliding window's kink (S² up to the window, linear after), a staircase, a constant then a jump."""
    a, b, c = rng.randint(0, 50), rng.randint(10**3, 10**6), rng.randint(0, 10**9)  # answers below 10¹⁰
    w = rng.randint(2, 5000)
    yield lambda n: a * n * n + b * n + c
    yield lambda n: -(-(a * n * n + b * n + c) // 512) * 512
    yield lambda n: -(-(a * n * n + b * n + c) // (2 << 20)) * (2 << 20)
    yield lambda n: a * min(n, w) * n + b * n + c
    yield lambda n: c + b * w * (n // w)
    yield lambda n: c if n < w else c + 10**14


def test_same_answer_as_bisection_on_every_kind_of_peak():
    rng = random.Random(26)
    cases = 0
    for _ in range(150):
        for value in shapes(rng):
            for budget in (rng.randint(0, 10**10), rng.randint(0, 10**13), value(1), value(1) - 1):
                for limit in (None, rng.randint(1, 10**5)):
                    assert largest_within(value, budget, limit) == bisection(value, budget, limit)
                    cases += 1
    assert cases == 150 * 6 * 4 * 2


def test_a_quadratic_peak_takes_a_handful_of_probes():
    # peak = 3·S² + 1,000·S + 10⁹ ≤ 10¹¹ ⇔ 3S² + 1,000S − 9.9·10¹⁰ ≤ 0 ⇔ S ≤ (−1,000 + √(10⁶ + 12·9.9·10¹⁰)) / 6
    #      = (−1,000 + 1,089,954.59) / 6 = 181,492.43: the answer by hand, then the probe count.
    value, calls = counted(lambda n: 3 * n * n + 1000 * n + 10**9)
    got = largest_within(value, 10**11)
    assert 3 * got**2 + 1000 * got + 10**9 <= 10**11 < 3 * (got + 1) ** 2 + 1000 * (got + 1) + 10**9
    assert got == 181_492
    assert len(set(calls)) <= 8  # doubling and halving: 2·log2(181,500) ≈ 35


@pytest.mark.parametrize("kink", [300, 4096])
def test_a_sliding_window_kink_still_converges_in_few_probes(kink):
    value, calls = counted(lambda n: 7 * min(n, kink) * n + 5000 * n + 10**8)
    reference, ref_calls = counted(lambda n: 7 * min(n, kink) * n + 5000 * n + 10**8)
    assert largest_within(value, 8 * 10**9) == bisection(reference, 8 * 10**9)
    assert len(set(calls)) <= len(set(ref_calls))


def test_the_memory_command_replays_the_step_a_few_times(monkeypatch):
    """qwen3-0.6b's config.json at 2,048 tokens on the H100 (transformers' program): the largest context is the
    bisection's, found in at most 10 replays where the bisection takes 26."""
    from lm_accounting.analytic import ops, program_report
    from lm_accounting.config import load_config
    from lm_accounting.setup import TrainingSetup

    cfg = load_config("qwen3-0.6b")
    setup = TrainingSetup(attention="sdpa")
    replays = []
    real = ops.predict_step

    def spy(*args, **kw):
        replays.append(args[1])
        return real(*args, **kw)

    monkeypatch.setattr(ops, "predict_step", spy)
    budget = 81_944_000_000
    got = program_report.largest_context(cfg, budget, 1, impl="transformers", setup=setup, device="cuda")
    found = len(replays)

    def peak(s):
        return real(cfg.with_context(s), s, setup, impl="transformers", batch=1, mode="plain", device="cuda").at(1).peak

    assert got == bisection(peak, budget)
    assert found <= 10
