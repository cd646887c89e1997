"""What the reader sees is what the JSON says: no table crops or silently truncates a value.

Two levels:

* ``render_text`` on hand-made tables at terminal widths where rich alone would crop: every cell whole,
  no line wider than the terminal, and the layout (whole, split into parts, stacked) named by hand.
* Every command run in a real pseudo-terminal (``pty``, the window size set with ``TIOCSWINSZ``; no
  ``COLUMNS`` in the environment) at 60, 80, 120 and 200 columns: each printed number with thousands
  separators parses back to an integer in the same command's ``--format json``, and the printed numbers
  are the same at every width.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import pty
import re
import struct
import sys
import termios
from collections import Counter

import pytest
from rich.cells import cell_len

from lm_accounting.views.tables import Column, Table, render_text

BIG = 405_853_388_800  # llama-3.1-405b's parameters: cropped to 405,853,388 at 80 columns before


def wide_table(rows: int = 3) -> Table:
    """A key, a long text column and six wide numbers: 10 + 30 + 6 * 15 + gaps = 144 cells natural width."""
    columns = [Column("preset"), Column("family"), *[Column(f"count_{i}", "int") for i in range(6)]]
    data = [(f"model-{r}", "course (Llama-style) with a long note", *[BIG + r] * 6) for r in range(rows)]
    return Table("wide", columns, data)


def numbers(text: str) -> list[str]:
    """Every run of digits and commas that contains a comma (a printed integer of 1,000 or more)."""
    return [t for t in re.findall(r"\d[\d,]*\d", text) if "," in t]


GROUPED = re.compile(r"\d{1,3}(,\d{3})+")


def test_a_table_that_fits_is_one_table():
    table = Table("t", [Column("key"), Column("n", "int")], [("a", BIG)])
    text = render_text([table], width=80)
    # key column 3 cells, a 2-cell gap, the number column 15 cells (right-aligned): 20 in all
    assert text.splitlines() == ["t", "key" + " " * 16 + "n", "─" * 20, "a    405,853,388,800"]


@pytest.mark.parametrize("width", [60, 80, 120])
def test_a_table_too_wide_is_split_or_stacked_never_cropped(width):
    text = render_text([wide_table()], width=width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    # 3 rows x 6 counts, each printed whole (the old renderer cut them to fit 80 columns)
    assert Counter(numbers(text)) == Counter({f"{BIG:,}": 6, f"{BIG + 1:,}": 6, f"{BIG + 2:,}": 6})
    assert all(GROUPED.fullmatch(n) for n in numbers(text))


def test_the_layout_chosen_at_each_width():
    """By hand: key 7 cells, family 36 (floor 16: its longest word is 'course'), counts 15 each, gaps 2.
    Whole: 7 + 36 + 6*15 + 7*2 = 147 > 120; wrapped family: 7 + 16 + 90 + 14 = 127 > 120.  Split beside the
    key: [family, 4 counts] = 7 + 16 + 60 + 5*2 = 93 <= 120, [2 counts] fits: 2 parts at 120.  At 80:
    [family, 3 counts] = 7+16+45+8 = 76, [3 counts] = 7+45+6 = 58: 2 parts.  At 60: [family, 2 counts] =
    7+16+30+6 = 59, [3 counts] = 58, [1 count]: 3 parts.  At 40: [family, 1 count] = 7+16+15+4 = 42 > 40,
    so the family goes alone, then 2 counts a part (7+30+4 = 41 > 40: one a part): 7 parts > 3, stacked."""
    heads = {w: [line for line in render_text([wide_table(1)], width=w).splitlines() if line.startswith("preset")]
             for w in (200, 120, 80, 60, 40)}  # fmt: skip
    assert [len(heads[w]) for w in (200, 120, 80, 60)] == [1, 2, 2, 3]
    assert heads[40] == ["preset: model-0"]  # stacked: one block per row


def test_stacked_records_keep_every_value_whole_and_aligned():
    text = render_text([wide_table(1)], width=40)
    lines = text.splitlines()
    assert lines[1] == "preset: model-0"
    assert lines[2].startswith("  family   ") and "course (Llama-style)" in text
    counts = [line for line in lines if line.startswith("  count_")]
    assert len(counts) == 6 and len({line.index(",") for line in counts}) == 1  # right-aligned
    assert max(len(line) for line in lines) <= 40


def test_a_pipe_never_wraps():
    text = render_text([wide_table(1)], width=None)
    assert len(text.splitlines()) == 4  # title, header, rule, the one row


# --- every command in a real pseudo-terminal ------------------------------------------------------------

COMMANDS = {
    "account": ["gpt2-xl", "--context", "16384"],
    "presets": ["presets"],
    "memory": ["memory", "gpt2-xl", "--context", "4096"],
    "memory-layout": ["memory", "llama-3-8b", "--dp", "64", "--zero", "3"],
    "plan": ["plan", "llama-3.1-70b", "--tokens", "15e12", "--gpus", "64..256"],
    "train-time": ["train-time", "gpt2-xl"],
    "infer": ["infer", "llama-3-8b", "-P", "4096", "-G", "512"],
    "infer-vllm": [
        "infer",
        "deepseek-v3",
        "-P",
        "4096",
        "-G",
        "512",
        "--tp",
        "8",
        "--weights",
        "fp8",
        "--engine",
        "vllm",
    ],
    "infer-sglang": [
        "infer",
        "qwen3-30b-a3b",
        "-P",
        "2048",
        "-G",
        "128",
        "--engine",
        "sglang",
        "--mem-fraction-static",
        "0.88",
    ],
    "crosscheck": ["crosscheck", "gpt2-small", "--layers", "2"],
    "sweep": ["sweep", "gpt2-small", "--contexts", "128,1024", "--no-plots", "--out", "{out}"],
}
WIDTHS = (60, 80, 120, 200)


def run_in_terminal(args: list[str], columns: int) -> str:
    """``lm-account ARGS`` with its stdout on a pseudo-terminal ``columns`` wide; what it printed."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdout is the terminal; its size is what shutil.get_terminal_size reads
        try:  # fd 1 is the terminal (pytest's sys.stdout is its capture, not a file)
            os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # progress and 'wrote ...' lines: not the result
            fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack("HHHH", 500, columns, 0, 0))
            env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
            os.execve(sys.executable, [sys.executable, "-m", "lm_accounting", *args], env)
        finally:
            os._exit(127)  # never return into pytest in the child
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    _, status = os.waitpid(pid, 0)  # before closing the terminal, which would hang the child up
    os.close(fd)
    assert os.waitstatus_to_exitcode(status) == 0, b"".join(chunks).decode()[-2000:]
    return b"".join(chunks).decode().replace("\r\n", "\n")


def json_integers(value) -> set[int]:
    """Every integer in a JSON document: the numbers, and the integers written inside its strings."""
    if isinstance(value, bool):
        return set()
    if isinstance(value, int):
        return {value}
    if isinstance(value, float):  # printed rounded or truncated to a whole number
        return {math.floor(value), round(value)} if math.isfinite(value) else set()
    if isinstance(value, str):
        return {int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", value)}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return set().union(*(json_integers(v) for v in items)) if items else set()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_command_prints_every_number_whole_at_every_width(name, run_cli, tmp_path):
    args = [a.format(out=tmp_path / "sweep") for a in COMMANDS[name]]
    result = run_cli(*args, "--format", "json")
    assert result.code == 0, result.err
    truth = json_integers(json.loads(result.out))
    printed = {w: run_in_terminal(args, w) for w in WIDTHS}
    for width, text in printed.items():
        assert max(cell_len(line) for line in text.splitlines()) <= width, (name, width)  # m̂: 1 cell, 2 chars
        bad = [n for n in numbers(text) if not GROUPED.fullmatch(n) or int(n.replace(",", "")) not in truth]
        assert not bad, (name, width, bad[:10])
    # the same numbers at every width (a split table repeats its row keys, so compared as sets)
    assert len({frozenset(numbers(t)) for t in printed.values()}) == 1, name
