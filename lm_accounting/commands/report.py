"""``report``: regenerate ``reports/`` (the course answers, their tables, the sweep and the plots)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..output import check_output_dir


@dataclass(frozen=True)
class Request:
    out: str = "reports"
    live: bool = True  # the live cross-checks and meta measurements
    plots: bool = True

    def __post_init__(self) -> None:
        from ..course.assignment import is_report_file

        check_output_dir(self.out, is_report_file)  # not a report set: refused before any work


def run(request: Request, progress: bool = False) -> tuple[Any, list[Path]]:
    """(the ``Answers``, the paths written); ``Answers.mismatches()`` names any live count that differs."""
    from ..course.assignment import write_report

    return write_report(Path(request.out), live=request.live, plots=request.plots, progress=progress)
