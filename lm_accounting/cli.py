"""``lm-account``: a thin click layer.  Heavy libraries (torch, pandas, matplotlib) are
imported inside the commands that need them, never at module import.

Bad input of any kind is reported on one line with exit code 2; a cross-check
mismatch exits 1.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from typing import Any, Callable, Sequence

import click

from .config import MAX_SIZE, AccountingError, ModelConfig, apply_overrides, load_config, parse_override, preset_names
from .views.tables import Table, render_csv, render_markdown, render_records_csv, render_text

FORMATS = ("table", "markdown", "csv", "json")
SHAPE_FLAGS = {  # dedicated flags for common overrides: option name -> ModelConfig field
    "layers": "num_layers",
    "d_model": "d_model",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "d_ff": "d_ff",
    "vocab_size": "vocab_size",
}


class PositiveInt(click.ParamType):
    """An integer >= 1, with a plain message for anything else."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        try:
            number = int(str(value).replace("_", ""))
        except ValueError:
            self.fail(f"must be a positive integer, got {value!r}", param, ctx)
        if number < 1:
            self.fail(f"must be a positive integer, got {number}", param, ctx)
        if number > MAX_SIZE:
            self.fail(f"{number:.3e} is beyond the supported 10^18", param, ctx)
        return number


POSITIVE = PositiveInt()


class DefaultGroup(click.Group):
    """``lm-account gpt2-xl ...`` runs the ``account`` command when no subcommand is named."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h", "--version"):
            args = ["account", *args]
        return super().parse_args(ctx, args)


def model_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """PRESET_OR_FILE plus --context/--batch/--set/shape flags/--format, resolved to ``cfg``."""

    @click.argument("preset_or_file", metavar="PRESET_OR_FILE")
    @click.option("--context", "-S", type=POSITIVE, help="Sequence length S (default: the preset's context_length).")
    @click.option("--batch", "-B", type=POSITIVE, default=1, show_default=True, help="Batch size B.")
    @click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override any config field, e.g. --set d_ff=4288 (repeatable).")
    @click.option("--layers", type=int, help="Override num_layers.")
    @click.option("--d-model", type=int, help="Override d_model.")
    @click.option("--heads", type=int, help="Override num_heads.")
    @click.option("--kv-heads", type=int, help="Override num_kv_heads (GQA).")
    @click.option("--head-dim", type=int, help="Override head_dim.")
    @click.option("--d-ff", type=int, help="Override d_ff.")
    @click.option("--vocab-size", type=int, help="Override vocab_size.")
    @click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True, help="Output format.")
    @functools.wraps(func)
    def wrapper(preset_or_file: str, context: int | None, overrides: Sequence[str], **kw: Any) -> Any:
        cfg = load_config(preset_or_file)
        changes = dict(parse_override(o) for o in overrides)
        for flag, field in SHAPE_FLAGS.items():
            value = kw.pop(flag)
            if value is not None:
                changes[field] = value
        if changes and "name" not in changes:
            changes["name"] = f"{cfg.name} (modified: {', '.join(f'{k}={v}' for k, v in changes.items())})"
        cfg = apply_overrides(cfg, changes)
        preset_context = cfg.context_length
        if context is not None:
            cfg = cfg.with_context(context)
        return func(cfg=cfg, preset_context=preset_context, **kw)

    return wrapper


def emit(
    fmt: str,
    data: dict[str, Any],
    tables: list[Table],
    header: Sequence[str] = (),
    footer: Sequence[str] = (),
    records: list[dict[str, Any]] | None = None,
) -> None:
    """Print in the chosen format; ``records`` (tidy rows), when given, is the CSV form."""
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
    elif fmt == "csv":
        click.echo(render_records_csv(records) if records is not None else render_csv(tables), nl=False)
    elif fmt == "markdown":
        click.echo(render_markdown(tables, header, footer), nl=False)
    else:
        click.echo(render_text(tables, header, footer), nl=False)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lm-accounting")
def cli() -> None:
    """Exact parameter, FLOP and memory accounting for Transformer LMs.

    \b
    lm-account gpt2-xl --context 16384     the headline answer for a preset
    lm-account my_model.toml --set d_ff=4288
    lm-account presets                     list the presets
    """


@cli.command("account")
@model_options
def account_cmd(cfg: ModelConfig, preset_context: int, batch: int, fmt: str) -> None:
    """Parameters, forward FLOPs per component with shares, training FLOPs, KV cache (analytic)."""
    from .account import account
    from .views.account import account_tables

    acc = account(cfg, cfg.context_length, batch)
    header, tables, footer = account_tables(acc, preset_context)
    emit(fmt, acc.to_dict(), tables, header, footer, records=acc.records())


@cli.command("presets")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
def presets_cmd(fmt: str) -> None:
    """List the presets with their key dimensions and parameter counts."""
    from .analytic.params import parameter_breakdown
    from .views.tables import Column

    cols = [Column(n, "int") for n in ("layers", "d_model", "heads", "kv_heads", "head_dim", "d_ff", "vocab", "context")]
    columns = [Column("preset"), *cols, Column("tied"), Column("qk_norm"), Column("parameters", "int")]
    rows, data = [], []
    configs = [load_config(name) for name in preset_names()]
    for c in sorted(configs, key=lambda c: parameter_breakdown(c).total):
        name, n = c.name, parameter_breakdown(c).total
        dims = (c.num_layers, c.d_model, c.num_heads, c.kv_heads, c.d_head, c.d_ff, c.vocab_size, c.context_length)
        rows.append((name, *dims, "yes" if c.tie_embeddings else "no", "yes" if c.qk_norm else "no", n))
        data.append({**c.resolved(), "parameters": n})
    emit(fmt, {"presets": data}, [Table("Presets (lm_accounting/presets/*.toml)", columns, rows)])


@cli.command("crosscheck")
@model_options
@click.option("--device", type=click.Choice(["meta", "cpu", "cuda"]), default="meta", show_default=True,
              help="Where to build the live model (meta holds no memory).")
@click.option("--backward", is_flag=True, help="Also count forward+backward with FlopCounterMode.")
def crosscheck_cmd(cfg: ModelConfig, preset_context: int, batch: int, fmt: str, device: str, backward: bool) -> int:
    """Build the live model and prove the analytic FLOPs and parameters with fvcore and FlopCounterMode.

    Exits 1 and names the component if any matmul FLOP count or parameter count differs.
    """
    from .measure.crosscheck import crosscheck
    from .measure.devices import check_device_fits, counting_run_bytes
    from .views.crosscheck import crosscheck_tables

    if device != "meta":
        check_device_fits(device, counting_run_bytes(cfg, cfg.context_length, batch, backward), "this cross-check")
    cc = crosscheck(cfg, cfg.context_length, batch, device=device, backward=backward)
    header, tables, footer = crosscheck_tables(cc)
    emit(fmt, cc.to_dict(), tables, header, footer, records=cc.records())
    return 1 if cc.mismatches() else 0


@cli.command("memory")
@model_options
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True,
              help="Parameter/activation dtype (gradients and AdamW moments follow it).")
@click.option("--optimizer", type=click.Choice(["foreach", "for-loop", "fused"]), default="foreach", show_default=True,
              help="torch.optim.AdamW implementation (foreach is torch's default on CUDA).")
@click.option("--budget", default="80GB", show_default=True, help="Memory budget with an explicit unit: 80GB or 80GiB.")
@click.option("--measure", type=click.Choice(["none", "meta", "cpu", "cuda"]), default="none", show_default=True,
              help="Also measure one training step of the live model.")
def memory_cmd(cfg: ModelConfig, preset_context: int, batch: int, fmt: str, dtype: str, optimizer: str,
               budget: str, measure: str) -> None:
    """Training memory: model states, activations, peak per phase (predicted vs measured), capacity."""
    from .analytic.memory_report import memory_account
    from .views.memory import memory_records, memory_tables
    from .units import parse_size

    m = memory_account(cfg, cfg.context_length, batch, dtype, optimizer, parse_size(budget))
    measured = None
    if measure != "none":
        from .measure.devices import check_device_fits
        from .measure.memory import measure_step

        check_device_fits(measure, m.step.peak, "this training step")
        measured = measure_step(cfg, cfg.context_length, batch, dtype, measure, optimizer)
    header, tables, footer = memory_tables(m, measured, measure if measured else "not measured")
    data = m.to_dict()
    if measured:
        data["measured"] = {"device": measure, **measured.to_dict()}
    emit(fmt, data, tables, header, footer, records=memory_records(m, measured))


@cli.command("train-time")
@model_options
@click.option("--steps", type=POSITIVE, default=400_000, show_default=True, help="Optimizer steps.")
@click.option("--gpu", default="a100", show_default=True, help="GPU from the built-in table (a100, h100-sxm, ...).")
@click.option("--gpu-dtype", default="fp32", show_default=True, help="Matmul dtype for the GPU's peak: fp32, tf32, bf16, fp16.")
@click.option("--peak-flops", type=float, help="Override the peak FLOP/s (e.g. 19.5e12).")
@click.option("--mfu", type=float, default=0.5, show_default=True, help="Model FLOPs utilisation in (0, 1].")
@click.option("--method", type=click.Choice(["3x", "6nd", "palm"]), default="3x", show_default=True,
              help="Step FLOPs: 3 × forward, 6·N·D, or the PaLM formula.")
def train_time_cmd(cfg: ModelConfig, preset_context: int, batch: int, fmt: str, steps: int, gpu: str, gpu_dtype: str,
                   peak_flops: float | None, mfu: float, method: str) -> None:
    """Days to train: step FLOPs × steps / (GPU peak × MFU), plus AdamW step FLOPs."""
    from .analytic.training import gpu_peak_flops
    from .views.training import training_report

    if peak_flops is not None:
        peak, label = peak_flops, "custom peak"
    else:
        peak, label = gpu_peak_flops(gpu, gpu_dtype), f"{gpu} {gpu_dtype}"
    data, header, tables, footer = training_report(cfg, cfg.context_length, batch, steps, peak, mfu, method, label)
    records = [{"section": "training_time", "key": k, **v} for k, v in data["methods"].items()]
    records += [{"section": "adamw_step_flops", "key": k, "flops_per_step": v} for k, v in data["adamw_step_flops"].items()]
    emit(fmt, data, tables, header, footer, records=records)


@cli.command("sweep")
@click.argument("presets", nargs=-1, required=True, metavar="PRESET_OR_FILE...")
@click.option("--contexts", default="128:16384:x2", show_default=True,
              help="Context lengths: a list (128,256,512) or a range (128:16384:x2, 256:2048:+256).")
@click.option("--batch", "-B", type=POSITIVE, default=1, show_default=True, help="Batch size B.")
@click.option("--dtype", type=click.Choice(["fp32", "bf16"]), default="fp32", show_default=True)
@click.option("--optimizer", type=click.Choice(["foreach", "for-loop", "fused"]), default="foreach", show_default=True)
@click.option("--budget", default="80GB", show_default=True, help="Memory budget for the memory plot (80GB or 80GiB).")
@click.option("--crosscheck", is_flag=True, help="Count every point's FLOPs on the live model (meta) too.")
@click.option("--measure-memory", type=click.Choice(["meta", "cpu", "cuda"]), help="Measure every point's training step.")
@click.option("--out", type=click.Path(file_okay=False), default="reports/sweep", show_default=True,
              help="Directory for the tables and plots.")
@click.option("--no-plots", is_flag=True, help="Write the tables only.")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True,
              help="Format of the summary printed to stdout.")
def sweep_cmd(presets: Sequence[str], contexts: str, batch: int, dtype: str, optimizer: str, budget: str,
              crosscheck: bool, measure_memory: str | None, out: str, no_plots: bool, fmt: str) -> int:
    """Context-length sweep of one or more models: tables (CSV, markdown, JSON) and plots in --out."""
    from pathlib import Path

    from .sweep import parse_contexts, sweep
    from .views.sweep import sweep_tables, write_sweep
    from .units import parse_size, size_label

    budget_bytes = parse_size(budget)
    configs = [load_config(p) for p in presets]
    result = sweep(configs, parse_contexts(contexts), batch, dtype=dtype, optimizer=optimizer, budget=budget_bytes,
                   crosscheck=crosscheck, measure=measure_memory, progress=True)
    paths = write_sweep(result, Path(out), budget_bytes, size_label(budget), plots=not no_plots)
    footer = [f"wrote {len(paths)} files to {out}/: " + ", ".join(p.name for p in paths)]
    if result.mismatches:
        footer += ["CROSS-CHECK MISMATCHES:", *[f"  - {m}" for m in result.mismatches]]
    emit(fmt, result.to_dict(), sweep_tables(result), [], footer)
    return 1 if result.mismatches else 0


@cli.command("report")
@click.option("--out", type=click.Path(file_okay=False), default="reports", show_default=True,
              help="Directory to (re)generate.")
@click.option("--no-live", is_flag=True, help="Skip the live cross-checks and meta measurements (faster).")
@click.option("--no-plots", is_flag=True, help="Skip the figures.")
def report_cmd(out: str, no_live: bool, no_plots: bool) -> int:
    """Regenerate the course answers (assignment.md), their tables, the sweep and the plots."""
    from pathlib import Path

    from .course.assignment import write_report

    answers, paths = write_report(Path(out), live=not no_live, plots=not no_plots, progress=True)
    click.echo(f"wrote {len(paths)} files under {out}/")
    problems = answers.mismatches()
    for problem in problems:
        click.echo(f"MISMATCH: {problem}", err=True)
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: one-line errors with exit code 2, never a traceback, for bad input."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name="lm-account")))
        sys.exit(0)
    try:
        code = cli.main(args=args, prog_name="lm-account", standalone_mode=False)
    except click.UsageError as err:  # includes BadParameter, NoSuchOption, MissingParameter
        _fail(err.format_message())
    except AccountingError as err:
        _fail(str(err))
    except click.Abort:
        _fail("aborted")
    except BrokenPipeError:
        sys.exit(0)
    code = code if isinstance(code, int) else 0
    if "torch" in sys.modules and argv is None:
        # Tearing down an interpreter that imported torch takes ~0.8 s; everything is
        # written (reports are closed and renamed atomically), so flush and leave.
        with contextlib.suppress(BrokenPipeError):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _fail(message: str) -> None:
    click.echo("lm-account: error: " + " ".join(message.split()), err=True)
    sys.exit(2)
