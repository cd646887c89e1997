"""The README's two set-up commands and CI stay in sync; presets ship with the package."""

import re
import tomllib
from pathlib import Path

import pytest

from lm_accounting.config import PRESET_DIR

ROOT = Path(__file__).resolve().parents[1]


def setup_commands():
    text = (ROOT / "README.md").read_text()
    return dict(re.findall(r"<!-- setup:(\w+) -->\s*```bash\n(.+?)\n```", text))


def test_readme_has_exactly_two_setup_commands():
    cmds = setup_commands()
    assert set(cmds) == {"main", "test"}
    assert "lm-account gpt2-xl --context 16384" in cmds["main"]
    assert "pytest" in cmds["test"] and ".[dev]" in cmds["test"]


def test_ci_runs_the_readme_test_command_after_cpu_torch():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "torch==2.13.0" in ci and "setup:test" in ci and "set -euo pipefail" in ci


def test_presets_are_package_data():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["tool"]["setuptools"]["package-dir"]["lm_accounting.presets"] == "presets"
    assert "*.toml" in project["tool"]["setuptools"]["package-data"]["lm_accounting.presets"]
    assert PRESET_DIR.resolve() == (ROOT / "presets").resolve()  # the editable install maps the top-level folder
    assert len(list(PRESET_DIR.glob("*.toml"))) >= 6
    packages = set(project["tool"]["setuptools"]["packages"])
    folders = {
        "lm_accounting",
        *("lm_accounting." + p.parent.name for p in (ROOT / "lm_accounting").glob("*/__init__.py")),
    }
    assert folders | {"lm_accounting.presets"} == packages
    for path in PRESET_DIR.glob("*.toml"):
        assert path.read_text().startswith("#"), f"{path.name} must open with a comment citing its source"


def readme_transcripts() -> list[tuple[str, list[str]]]:
    """The README's terminal examples: ``$ lm-account ARGS`` followed by the lines it prints ('...' on
    its own skips lines; a line ending in '...' is a prefix)."""
    text = (ROOT / "README.md").read_text()
    out: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```\n(\$ lm-account .+?)\n```", text, flags=re.DOTALL):
        for chunk in re.split(r"^\$ ", block, flags=re.MULTILINE)[1:]:
            command, *lines = chunk.splitlines()
            out.append((command, lines))
    return out


def check_transcript(run_cli, command: str, lines: list[str]) -> None:
    """Every shown line is real output, in order (a README example once said '(preset context_length'
    where the CLI prints '(config context_length')."""
    r = run_cli(*command.split()[1:])
    assert r.code == 0, r.err
    real, at = r.out.splitlines(), 0
    for line in (s for s in lines if s != "..."):
        prefix = line.endswith("...")
        want = line.removesuffix("...").rstrip() if prefix else line
        found = [i for i in range(at, len(real)) if (real[i].startswith(want) if prefix else real[i] == want)]
        assert found, f"README's `{command}` shows {line!r}, which it does not print"
        at = found[0] + 1


TRANSCRIPTS = readme_transcripts()


def test_readme_has_transcripts():
    commands = [c for c, _ in TRANSCRIPTS]
    assert "lm-account gpt2-xl --context 16384" in commands and len(commands) >= 2


@pytest.mark.parametrize(
    ("command", "lines"),
    [
        pytest.param(c, lines, marks=[pytest.mark.slow] if c.split()[1] == "crosscheck" else [], id=c)
        for c, lines in TRANSCRIPTS
    ],
)
def test_readme_transcripts_are_real_output(run_cli, command, lines):
    check_transcript(run_cli, command, lines)
