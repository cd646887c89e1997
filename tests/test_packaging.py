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
    folders = {  # every depth: a nested package missing here is missing from a non-editable install
        ".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "lm_accounting").rglob("__init__.py")
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


def is_live(command: str) -> bool:
    """A transcript that builds the live model (seconds, not milliseconds): the quick loop skips it."""
    return command.split()[1] == "crosscheck" or "--measure" in command.split()


def test_readme_has_transcripts():
    commands = [c for c, _ in TRANSCRIPTS]
    assert "lm-account gpt2-xl --context 16384" in commands and len(commands) >= 2


@pytest.mark.parametrize(
    ("command", "lines"),
    [pytest.param(c, lines, marks=[pytest.mark.slow] if is_live(c) else [], id=c) for c, lines in TRANSCRIPTS],
)
def test_readme_transcripts_are_real_output(run_cli, command, lines):
    check_transcript(run_cli, command, lines)


README_WORD_LIMIT = 1_500
"""The README is a user's manual: set-up, five journeys, the conventions in brief; the reference is docs/."""


def test_readme_is_short_and_the_reference_is_in_docs():
    """`wc -w README.md` under the limit (issue 25: it had grown to ~7,000 words), and docs/ holds the rest."""
    assert len((ROOT / "README.md").read_text().split()) < README_WORD_LIMIT
    for page in ("commands", "config", "conventions", "proofs", "limits", "api", "reports", "testing", "layout"):
        assert (ROOT / "docs" / f"{page}.md").is_file(), page


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_between_readme_and_docs_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists, and a #section one of its
    headings."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert len(pages) > 1
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            assert linked.is_file(), f"{page.name} links to {target}, which does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.MULTILINE)
                assert anchor in {heading_anchor(h) for h in headings}, f"{page.name}: no section #{anchor}"


def test_docs_name_every_option_of_every_command():
    """docs/commands.md mentions every long option each command takes (read from the click commands), so an
    option added to the CLI without a word in the reference fails here."""
    from lm_accounting.cli import cli

    text = (ROOT / "docs" / "commands.md").read_text()
    missing = [
        f"{name} {opt}"
        for name, command in cli.commands.items()
        for param in command.params
        for opt in param.opts
        if opt.startswith("--") and opt != "--help" and f"`{opt}" not in text and f" {opt}" not in text
    ]
    assert not missing, missing


def test_docs_say_which_toml_keys_are_required():
    """docs/config.md's required keys are exactly the ModelConfig fields without a default."""
    import dataclasses

    from lm_accounting.config import ModelConfig

    required = {f.name for f in dataclasses.fields(ModelConfig) if f.default is dataclasses.MISSING}
    required -= {f.name for f in dataclasses.fields(ModelConfig) if f.default_factory is not dataclasses.MISSING}
    line = re.search(r"\*\*Required\*\* \(no default\): (.+)\.", (ROOT / "docs" / "config.md").read_text())
    assert line, "docs/config.md must state the required TOML keys"
    assert (
        set(re.findall(r"`(\w+)`", line.group(1)))
        == required
        == {
            "vocab_size",
            "context_length",
            "num_layers",
            "d_model",
            "num_heads",
            "d_ff",
        }
    )
