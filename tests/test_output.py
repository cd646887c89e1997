"""Atomic output sets: a killed run leaves the old set intact, no temporary files survive the next
run, two writers never mix files, and a folder with files we did not write is never replaced."""

import filecmp
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lm_accounting import AccountingError
from lm_accounting import output as output_module
from lm_accounting.course.assignment import is_report_file
from lm_accounting.output import atomic_dir, write_atomic
from lm_accounting.views.sweep import check_sweep_out, is_sweep_file

ROOT = Path(__file__).resolve().parents[1]
REPORTS = ROOT / "reports"


def snapshot(folder: Path) -> dict[str, bytes]:
    """The set's files, less the marker every set carries (``output.MARKER``)."""
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return {rel: data for rel, data in files.items() if rel != output_module.MARKER}


def side_entries(parent: Path, name: str) -> list[str]:
    """Temporary folders, moved-aside folders and lock files beside ``parent / name``."""
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def owns_csv(rel: str) -> bool:
    return rel.endswith(".csv")


def make_set(folder: Path, files: dict[str, str]) -> None:
    """An earlier output set: ``files`` and the marker lm-account writes (``output.MARKER``)."""
    files = {output_module.MARKER: output_module.MARKER_TEXT, **files}
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


# ------------------------------------------------------------------ the mechanism
def test_swap_replaces_the_whole_set(tmp_path):
    out = tmp_path / "out"
    make_set(out, {"a.csv": "old a", "sub/b.csv": "old b"})
    with atomic_dir(out, owns=owns_csv) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".out.tmp-")
        assert snapshot(out) == {"a.csv": b"old a", "sub/b.csv": b"old b"}  # untouched while writing
        write_atomic(tmp / "a.csv", "new a")
    assert snapshot(out) == {"a.csv": b"new a"}  # b.csv was not rewritten: gone with the old set
    assert side_entries(tmp_path, "out") == []


@pytest.mark.parametrize("exchange", [True, False])
def test_an_error_leaves_the_old_set(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(output_module, "_exchange", lambda a, b: False)  # the two-rename fallback
    out = tmp_path / "out"
    make_set(out, {"a.csv": "old"})
    with pytest.raises(KeyboardInterrupt), atomic_dir(out, owns=owns_csv) as tmp:
        write_atomic(tmp / "a.csv", "new")
        raise KeyboardInterrupt
    assert snapshot(out) == {"a.csv": b"old"} and side_entries(tmp_path, "out") == []
    with atomic_dir(out, owns=owns_csv) as tmp:
        write_atomic(tmp / "a.csv", "new")
    assert snapshot(out) == {"a.csv": b"new"} and side_entries(tmp_path, "out") == []


def test_keep_carries_unwritten_files(tmp_path):
    out = tmp_path / "out"
    make_set(out, {"a.csv": "old", "fig.png.csv": "figure"})
    with atomic_dir(out, owns=owns_csv, keep=lambda rel: rel.startswith("fig")) as tmp:
        write_atomic(tmp / "a.csv", "new")
    assert snapshot(out) == {"a.csv": b"new", "fig.png.csv": b"figure"}


def test_foreign_folders_are_never_replaced(tmp_path):
    out = tmp_path / "out"
    make_set(out, {"a.csv": "ours", "notes.txt": "the user's"})
    with pytest.raises(AccountingError, match=r"did not write \(e\.g\. notes\.txt\)"), atomic_dir(out, owns=owns_csv):
        pytest.fail("entered")
    assert snapshot(out) == {"a.csv": b"ours", "notes.txt": b"the user's"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(AccountingError, match="exists and is not a directory"), atomic_dir(tmp_path / "file"):
        pass
    assert side_entries(tmp_path, "out") == [] and side_entries(tmp_path, "file") == []


def test_the_committed_reports_are_safe_from_a_sweep():
    assert all(is_report_file(rel) for rel in snapshot(REPORTS))  # report may regenerate reports/
    with pytest.raises(AccountingError, match="holds files lm-account did not write"):
        check_sweep_out(REPORTS)  # a sweep may not replace reports/
    with pytest.raises(AccountingError, match="part of the report"):
        check_sweep_out(REPORTS / "sweep")  # nor the report's own sweep folder
    with pytest.raises(AccountingError, match="did not write"):
        check_sweep_out(ROOT)  # nor the repository
    assert not is_sweep_file("../x.csv") and not is_report_file("tables/../../x.md")


def test_stale_temporary_folders_of_dead_runs_are_removed(tmp_path):
    out = tmp_path / "out"
    make_set(out, {"a.csv": "old"})
    dead = dead_pid()
    make_set(tmp_path / f".out.tmp-{dead}-0badcafe", {"a.csv": "half"})
    make_set(tmp_path / f".out.tmp-{os.getppid()}-00c0ffee", {"a.csv": "a live writer's"})
    with atomic_dir(out, owns=owns_csv) as tmp:
        write_atomic(tmp / "a.csv", "new")
    assert side_entries(tmp_path, "out") == [f".out.tmp-{os.getppid()}-00c0ffee"]  # a live pid's is kept


def test_a_run_killed_between_the_two_renames_is_repaired(tmp_path):
    """Fallback swap killed after moving the old set aside: the next run puts it back first."""
    out = tmp_path / "out"
    make_set(tmp_path / f".out.old-{dead_pid()}-0badcafe", {"a.csv": "old"})
    with pytest.raises(RuntimeError), atomic_dir(out, owns=owns_csv):
        assert snapshot(out) == {"a.csv": b"old"}  # restored before this run writes anything
        raise RuntimeError
    assert snapshot(out) == {"a.csv": b"old"} and side_entries(tmp_path, "out") == []


# ------------------------------------------------------------------ concurrent writers
def test_a_second_writer_fails_fast(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out, owns=is_sweep_file) as tmp:
        write_atomic(tmp / "sweep.csv", "first writer")
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "lm_accounting",
                "sweep",
                "gpt2-small",
                "--contexts",
                "128",
                "--no-plots",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,  # a hang guard: the second writer must not wait for the first's lock
            check=False,
        )
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
        assert "being written by another lm-account run" in proc.stderr
        with pytest.raises(AccountingError, match="being written by another"), atomic_dir(out, owns=is_sweep_file):
            pass
    assert snapshot(out) == {"sweep.csv": b"first writer"}
    assert side_entries(tmp_path, "out") == []


# ------------------------------------------------------------------ the kill test
def _wait_for_writing(parent: Path, name: str, proc: subprocess.Popen, timeout: float) -> Path:
    """The temporary folder of ``proc``, once it holds at least one finished file."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for tmp in parent.glob(f".{name}.tmp-{proc.pid}-*"):
            if any(p.is_file() and not p.name.startswith(".") for p in tmp.rglob("*")):
                return tmp
        time.sleep(0.02)
    pytest.fail("the run never started writing")


@pytest.mark.slow
def test_report_killed_midway_leaves_the_previous_set(tmp_path):
    previous = tmp_path / "reports"
    shutil.copytree(REPORTS, previous)
    before = snapshot(previous)
    proc = subprocess.Popen(
        [sys.executable, "-m", "lm_accounting", "report", "--out", str(previous), "--no-live"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        tmp = _wait_for_writing(tmp_path, "reports", proc, timeout=600)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL
    assert snapshot(previous) == before  # byte-identical
    assert not filecmp.dircmp(REPORTS, previous).diff_files
    assert tmp.exists()  # SIGKILL cannot be caught: the next run removes it
    done = subprocess.run(
        [sys.executable, "-m", "lm_accounting", "report", "--out", str(previous), "--no-live", "--no-plots"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    assert side_entries(tmp_path, "reports") == []  # no temporary folder, no lock
    assert {p for p in snapshot(previous) if p.endswith((".png", ".svg"))} == {
        p for p in before if p.endswith((".png", ".svg"))
    }  # --no-plots kept the figures


def test_sigterm_cleans_up(tmp_path):
    out = tmp_path / "s"
    make_set(out, {"sweep.csv": "previous"})
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lm_accounting",
            "sweep",
            "gpt2-small",
            "gpt2-medium",
            "--contexts",
            "128:16384:x2",
            "--out",
            str(out),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for_writing(tmp_path, "s", proc, timeout=600)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert snapshot(out) == {"sweep.csv": b"previous"}
    assert side_entries(tmp_path, "s") == []
