"""``lm-account report``: regenerate ``reports/`` (assignment.md, tables, sweep, plots) from code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from ..config import load_config
from ..output import SAFE_NAME, atomic_dir, write_atomic, write_json, write_table_files
from ..views.account import breakdown_table
from ..views.crosscheck import crosscheck_view
from ..views.infer_report import write_inference
from ..views.plan import write_parallel
from ..views.published_runs import write_published
from ..views.setups import plot_setups, setup_rows, setup_table
from ..views.sweep import SWEEP_FILES, write_sweep
from .answer_tables import (
    adamw_table,
    convention_table,
    exact_memory_table,
    long_context_table,
    size_table,
    training_table,
)
from .answers import BUDGETS, LONG, SIZES, Answers, collect
from .assignment_text import assignment_markdown

CUDA_FILES = (
    r"cuda/(README\.md|env\.json|(memory|flops|inference|parallel|timing|kernels)\.csv)"
    r"|cuda-[a-z0-9-]+/(README\.md|env\.json|(memory|hf_memory)\.csv|traces/[a-z0-9_]+\.txt)"
    r"|calibration/([a-z0-9-]+\.md|[a-z0-9-]+/(step_kernels\.csv|steps_rerun\.csv|env\.json))"
)
REPORT_FILES = re.compile(
    rf"answers\.json|assignment\.md|tables/{SAFE_NAME}\.(md|csv)|sweep/({SWEEP_FILES})"
    r"|setups/peak_vs_context\.(md|csv|png|svg)"
    r"|inference/((serving|engine_startup|trtllm_throughput)\.(md|csv)|(decode_tokens_per_s|memory_vs_sequences)\.(png|svg))"
    r"|parallel/(llama-3-8b|llama-3\.1-70b)-8k-(plan\.md|memory-vs-gpus\.(png|svg))"
    r"|published/runs\.(md|csv|json)"
    r"|\.[A-Za-z0-9._+-]+\.[a-z0-9_]{8}\.(json|md)"
    rf"|{CUDA_FILES}"
)
"""Every file a report writes (and the temporary files a killed older version could leave), and the GPU
validations' files (``benchmarks/cuda_validation.py``, ``cuda_calibrate_run.sh``, ``step_time_report.py``), which a
report carries over unchanged."""
SETUP_CONTEXTS = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


def is_report_file(rel: str) -> bool:
    """True for a path (relative to the report folder) that ``write_report`` writes."""
    return REPORT_FILES.fullmatch(rel) is not None


def _is_gpu_validation(rel: str) -> bool:
    """A file of ``benchmarks/cuda_validation.py --out reports/cuda``: measured on a GPU, never rewritten here."""
    return re.fullmatch(CUDA_FILES, rel) is not None


def _is_report_figure(rel: str) -> bool:
    return (
        rel.startswith(("sweep/", "setups/", "inference/", "parallel/"))
        and rel.endswith((".png", ".svg"))
        and is_report_file(rel)
    )


def write_report(
    out: Path, live: bool = True, plots: bool = True, progress: bool = False
) -> tuple[Answers, list[Path]]:
    """Compute everything, write the whole set into a temporary folder beside ``out``, swap it in.

    ``out`` must be new, empty, or an earlier report (every file in it one that a report writes,
    ``is_report_file``); anything else is refused before any work.  A second run on the same ``out``
    fails at once (lock); a killed run leaves the earlier set as it was (``output.atomic_dir``).
    Without ``plots`` the earlier figures are kept.  The paths returned are the final ones."""
    out = Path(out)
    keep = (lambda rel: _is_gpu_validation(rel) or _is_report_figure(rel)) if not plots else _is_gpu_validation
    with atomic_dir(out, owns=is_report_file, keep=keep) as tmp:
        ans, written = _write_report_files(tmp, live, plots, progress)
    return ans, [out / p.relative_to(tmp) for p in written]


def _write_report_files(out: Path, live: bool, plots: bool, progress: bool) -> tuple[Answers, list[Path]]:
    ans = collect(live=live, progress=progress)
    tables = out / "tables"
    paths: list[Path] = []
    L = ans.xl.num_layers
    paths += write_table_files(
        tables / "xl_parameters", [breakdown_table("GPT-2 XL parameters", ans.at_1024.params, L)]
    )
    paths += write_table_files(
        tables / "xl_forward_1024", [breakdown_table("GPT-2 XL forward FLOPs, S = 1,024", ans.at_1024.forward, L)]
    )
    paths += write_table_files(tables / "model_sizes_1024", [size_table(ans)])
    paths += write_table_files(tables / f"xl_forward_{LONG}", [long_context_table(ans)])
    paths += write_table_files(tables / "adamw_conventions", [convention_table(ans)], ans.course_conventions)
    paths += write_table_files(tables / "adamw_flops", [adamw_table(ans)], ans.adamw)
    paths += write_table_files(tables / "training_days", [training_table(ans)], ans.training)
    paths += write_table_files(tables / "exact_memory_xl", [exact_memory_table(ans)])
    for seq, cc in ans.crosschecks.items():
        cc_tables = crosscheck_view(cc).tables
        paths += write_table_files(tables / f"xl_crosscheck_{seq}", cc_tables[:2])
    paths += write_sweep(ans.sweep, out / "sweep", BUDGETS["80 GB"], "80 GB", plots=plots, atomic=False)
    paths += write_setups(out / "setups" / "peak_vs_context", plots)
    paths += write_inference(out / "inference", plots)  # issue 12: serving Llama-3-8B and an MoE on an H100
    paths += write_parallel(out / "parallel", plots)  # issue 11: the planner for Llama-3-8B and -70B at 8k
    paths += write_published(out / "published")  # issue 28: published training runs beside the predicted step
    paths.append(write_json(out / "answers.json", answers_json(ans)))
    paths.append(write_atomic(out / "assignment.md", assignment_markdown(ans, live)))
    return ans, paths


def write_setups(stem: Path, plots: bool) -> list[Path]:
    """Peak memory vs context for naive, sdpa, sdpa + full and sdpa + selective checkpointing, for
    GPT-2 XL and Llama-3-8B, with the largest context that fits 80 GB (issue: real training setups)."""
    rows = setup_rows([load_config("gpt2-xl"), load_config("llama-3-8b")], list(SETUP_CONTEXTS), BUDGETS["80 GB"])
    records = [dataclasses.asdict(r) for r in rows]
    paths = write_table_files(stem, [setup_table(rows, "80 GB")], records)
    return paths + (plot_setups(rows, stem, BUDGETS["80 GB"], "80 GB") if plots else [])


def answers_json(ans: Answers) -> dict[str, Any]:
    xl, long = ans.at_1024, ans.at_long
    a, b = ans.course_conventions[0]["a"], ans.course_conventions[0]["b"]
    return {
        "schema": "lm-accounting/answers/1",
        "transformer_accounting": {
            "a": {"parameters": xl.params.total, "fp32_bytes": 4 * xl.params.total},
            "b": {
                "per_layer_flops": xl.forward.per_layer_total,
                "forward_flops": xl.forward.total,
                "lm_head_flops": xl.forward["lm_head"].total,
            },
            "c": {g: v / xl.forward.total for g, v in xl.forward.groups().items()},
            "d": {
                name: {g: v / acc.forward.total for g, v in acc.forward.groups().items()}
                for name, acc in ans.sizes.items()
            },
            "e": {
                "forward_flops": long.forward.total,
                "growth": long.forward.total / xl.forward.total,
                "shares": {g: v / long.forward.total for g, v in long.forward.groups().items()},
            },
        },
        "adamwAccounting": {
            "b": {"a_bytes": a, "b_bytes": b, "conventions": ans.course_conventions},
            "c": {**ans.adamw_default, "alternatives": ans.adamw},
            "d": {"days": ans.training[0]["days"], "alternatives": ans.training},
        },
        "exact_memory": {"peak_lines": ans.exact_lines.to_dict(), "max_batch_80GB": ans.exact_max_batch},
        "sizes": list(SIZES),
    }
