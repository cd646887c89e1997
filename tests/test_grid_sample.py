"""The grid sample of tests/conftest.py, run on a small suite of its own: a grid function keeps
--grid-cases cases, chosen by the seed; a test without the grid marker is never sampled away."""

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

SUITE = """
import pytest

@pytest.mark.grid
@pytest.mark.parametrize("a", range(4))
@pytest.mark.parametrize("b", range(5))
def test_grid(a, b):
    pass

@pytest.mark.grid
@pytest.mark.parametrize("a", range(2))
def test_small_grid(a):
    pass

@pytest.mark.parametrize("a", range(7))
def test_plain(a):
    pass

def test_alone():
    pass
"""


@pytest.fixture
def suite(pytester, monkeypatch):
    pytester.makeconftest((Path(__file__).parent / "conftest.py").read_text())
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.delenv("LM_GRID_SEED", raising=False)
    return pytester


def ran(recorder):
    return [r.nodeid.split("::")[1] for r in recorder.getreports("pytest_runtest_logreport") if r.when == "call"]


def test_a_sample_of_each_grid_and_every_other_test(suite, monkeypatch):
    monkeypatch.setenv("LM_GRID_SEED", "abc")
    first = suite.inline_run()
    names = ran(first)
    first.assertoutcome(passed=3 + 2 + 7 + 1)
    assert sum(n.startswith("test_grid[") for n in names) == 3  # 3 of 20
    assert sum(n.startswith("test_small_grid[") for n in names) == 2  # both: fewer than 3
    assert sum(n.startswith("test_plain[") for n in names) == 7 and "test_alone" in names
    assert ran(suite.inline_run()) == names  # the same seed, the same sample
    samples = []
    for seed in "defgh":
        monkeypatch.setenv("LM_GRID_SEED", seed)
        samples.append(ran(suite.inline_run()))
    assert any(s != names for s in samples)  # another seed, another sample (1,140 samples of 3 of 20)


def test_every_case_and_the_printed_seed(suite, monkeypatch):
    monkeypatch.setenv("LM_GRID_SEED", "s33d")
    out = suite.runpytest("--grid=all")
    out.assert_outcomes(passed=20 + 2 + 7 + 1)
    out.stdout.fnmatch_lines(["grid: 22 of 22 cases run (--grid=all)"])
    out = suite.runpytest("--grid-cases=5")
    out.assert_outcomes(passed=5 + 2 + 7 + 1, deselected=15)
    out.stdout.fnmatch_lines(
        ["grid: 7 of 22 cases run (a sample of 5 of each grid function), seed s33d (rerun: LM_GRID_SEED=s33d;*"]
    )


def test_grid_cases_are_slow(suite):
    out = suite.runpytest("-m", "not slow")
    out.assert_outcomes(passed=7 + 1, deselected=22)
    out.stdout.fnmatch_lines(["grid: 0 of 22 cases run *"])
