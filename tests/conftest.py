"""Shared fixtures, markers and the grid sample.

Commands (the figures are printed by ``python benchmarks/bench_tests.py``)::

    python -m pytest -q                          # the default run, what CI runs: every test, a sample of each grid
    python -m pytest -q -m "not slow"            # the quick loop: no slow test, no grid case
    python -m pytest -q -m grid --grid=all       # every case of every grid
    LM_GRID_SEED=1a2b3c4d5e6f python -m pytest -q   # a default run's sample again, from its printed seed

Markers (declared in pyproject.toml, --strict-markers):

* ``grid``: one case of an exhaustive parametrized grid (put it on the function, or ``pytestmark`` on a
  module).  The default run keeps a seeded sample of ``--grid-cases`` cases (3 unless told) of each
  grid function, drawn again for every commit: the seed is ``git rev-parse HEAD`` (a fixed default outside
  a git checkout), or ``LM_GRID_SEED`` when set.  The seed and the sample size are printed after
  collection, so a failing sample can be rerun.  ``--grid=all`` runs every case (the sample is drawn
  before ``-m``/``-k``/node ids select, so a named case outside it needs ``--grid=all``).  A test without
  the marker is never sampled away, and a grid case is also ``slow``.  Mark every new grid of live runs
  ``grid``: the default run then grows by 3 cases, not by the grid.
* ``slow``: a test (or a parametrized function, all its cases together) over ~0.7 CPU-second: live
  runs, report regeneration, plots, fresh interpreters.  The quick loop skips them.
* ``cuda``: needs a CUDA GPU; each such test also carries ``skipif(not torch.cuda.is_available())``, so
  it skips cleanly on a CPU-only machine and runs for real on a GPU.  ``python -m pytest -m cuda`` runs
  just those.

No test asserts wall-clock time: a machine shared with other jobs may be many times slower.  Work is
bounded by counts (modules built, layouts evaluated), peak RSS or a refusal before any build; a
subprocess ``timeout=`` is a hang guard only, and hypothesis runs without its per-example deadline.
Timings live in ``benchmarks/``.
"""

import os
import random
import subprocess
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, settings

from lm_accounting.cli import main

# hypothesis times each example (200 ms) and its data generation: wall clock, so off on a shared machine
settings.register_profile("shared-machine", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("shared-machine")

GRID_CASES = 3  # cases of each grid function in the default run
DEFAULT_SEED = "lm-accounting"  # outside a git checkout


def pytest_addoption(parser):
    parser.addoption(
        "--grid", choices=("sample", "all"), default="sample", help="grid cases: a seeded sample (default) or all"
    )
    parser.addoption(
        "--grid-cases", type=int, default=GRID_CASES, help=f"cases of each grid function sampled (default {GRID_CASES})"
    )


def grid_seed(rootpath) -> str:
    """``LM_GRID_SEED``, else the checkout's commit (12 hex digits), else a fixed default."""
    if os.environ.get("LM_GRID_SEED"):
        return os.environ["LM_GRID_SEED"]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=rootpath, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_SEED
    return head.stdout.strip()[:12] or DEFAULT_SEED


def pytest_configure(config):
    config.grid_seed = grid_seed(config.rootpath)
    config.grid_total = config.grid_run = 0  # grid cases collected; run after the sample, -m and -k


@pytest.hookimpl(tryfirst=True)  # before -m and -k: the sample is the same whatever they select
def pytest_collection_modifyitems(config, items):
    groups = defaultdict(list)
    for item in items:
        if item.get_closest_marker("grid"):
            item.add_marker(pytest.mark.slow)
            groups[item.nodeid.split("[")[0]].append(item)
    config.grid_total = sum(map(len, groups.values()))
    if config.getoption("grid") == "all":
        return
    k = max(1, config.getoption("grid_cases"))
    dropped = []
    for key, cases in groups.items():
        cases = sorted(cases, key=lambda i: i.nodeid)
        keep = random.Random(f"{config.grid_seed}:{key}").sample(cases, min(k, len(cases)))
        dropped += [c for c in cases if c not in keep]
    if dropped:
        gone = set(map(id, dropped))
        items[:] = [i for i in items if id(i) not in gone]
        config.hook.pytest_deselected(items=dropped)


def grid_line(config) -> str:
    run = f"grid: {config.grid_run:,} of {config.grid_total:,} cases run"
    if config.getoption("grid") == "all":
        return f"{run} (--grid=all)"
    return (
        f"{run} (a sample of {config.getoption('grid_cases')} of each grid function), seed {config.grid_seed} "
        f"(rerun: LM_GRID_SEED={config.grid_seed}; every case: --grid=all)"
    )


def pytest_report_collectionfinish(config, items):  # the header line of a -q run; items: after -m and -k
    config.grid_run = sum(1 for item in items if item.get_closest_marker("grid"))
    return grid_line(config) if config.grid_total else []


def pytest_terminal_summary(terminalreporter, config):
    if config.grid_total and (terminalreporter.stats.get("failed") or terminalreporter.stats.get("error")):
        terminalreporter.write_line(grid_line(config))


class Result:
    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err


@pytest.fixture
def run_cli(capsys):
    """Run ``lm-account ARGS`` in-process; returns exit code, stdout and stderr."""

    def run(*args):
        with pytest.raises(SystemExit) as exc:
            main([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(exc.value.code, captured.out, captured.err)

    return run
