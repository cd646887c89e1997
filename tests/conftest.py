"""Shared fixtures.

Markers (declared in pyproject.toml, --strict-markers):

* ``slow``: a test that takes more than ~3 s on a 2-core machine (live report regeneration,
  cross-checks and memory measurements of the larger presets, big-int plots).  The quick loop
  skips them::

      python -m pytest -m "not slow"

  CI runs the full suite.
* ``cuda``: needs a CUDA GPU; each such test also carries
  ``skipif(not torch.cuda.is_available())``, so it skips cleanly on a CPU-only machine and runs
  for real on a GPU.  ``python -m pytest -m cuda`` runs just those.
"""

import pytest

from lm_accounting.cli import main


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
