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
