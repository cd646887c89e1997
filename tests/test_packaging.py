"""The README's two set-up commands and CI stay in sync; presets ship with the package."""

import re
import tomllib
from pathlib import Path

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
