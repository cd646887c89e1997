"""``lm-account``: a thin click layer.  Each command maps its options to a request of the command layer
(``commands``: the request refuses bad input, ``run`` and ``measure`` compute) and renders the result
with ``views.render``.  Heavy libraries (torch,
pandas, matplotlib) are imported inside the commands that need them, never at module import.

Bad input of any kind is reported on one line with exit code 2; a cross-check mismatch exits 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

from .analytic.inference import ATTENTIONS as INFER_ATTENTIONS
from .analytic.inference import KV_DTYPES, PROGRAMS, SEMANTICS, WEIGHT_BYTES
from .config import (
    MAX_SIZE,
    AccountingError,
    ModelConfig,
    apply_overrides,
    is_config_path,
    load_config,
    parse_override,
    preset_names,
)
from .gpus import DEFAULT_ALLOWANCE, DEFAULT_GPU
from .implementations import IMPLS, default_impl
from .names import (
    ADAMW_IMPLS,
    CLI_TRAINING_DTYPES,
    DEFAULT_ADAMW,
    DEVICES,
    FORMATS,
    MEASURE_CHOICES,
    MEASURE_METHODS,
    STEP_FLOPS_METHODS,
)
from .setup import CHECKPOINTS as CHECKPOINT_CHOICES

PROG = "lm-account"
COMPLETE_VAR = "_LM_ACCOUNT_COMPLETE"  # click's shell-completion variable for the prog name
SHAPE_FLAGS = {  # dedicated flags for common overrides: option name -> ModelConfig field
    "layers": "num_layers",
    "d_model": "d_model",
    "heads": "num_heads",
    "kv_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "d_ff": "d_ff",
    "vocab_size": "vocab_size",
}


SCIENTIFIC = re.compile(r"(\d+)(?:\.(\d+))?[eE]\+?(\d{1,2})")  # 1e12, 1.5E+13: an exact integer, exponent < 100
HUGE_EXPONENT = re.compile(r"\d+(?:\.\d+)?[eE]\+?\d{3,}")  # 1e100: beyond any bound, said so


def scientific_digits(text: str) -> str:
    """The decimal digits of ``text`` written as m·10^k (``15e12``, ``1.5e13``) when that is a whole
    number; ``text`` itself otherwise (left to the integer check).  Built as text: no float rounding."""
    match = SCIENTIFIC.fullmatch(text)
    if match is None:
        return text
    whole, frac, exp = match.group(1), (match.group(2) or "").rstrip("0"), int(match.group(3))
    if len(frac) > exp:
        return text  # a fraction: not an integer
    return whole + frac + "0" * (exp - len(frac))


class PositiveInt(click.ParamType):
    """An integer >= 1 and <= 10^18 (also written 1e12 or 1.5e13), with a plain message (and no echo of
    a huge number) otherwise."""

    name = "integer"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            text = str(value)
        else:
            text = str(value).strip().replace("_", "")
        digits = scientific_digits(text.lstrip("+"))
        if HUGE_EXPONENT.fullmatch(text.lstrip("+")) or (
            SCIENTIFIC.fullmatch(text.lstrip("+")) and digits.isdigit() and len(digits.lstrip("0")) > len(str(MAX_SIZE))
        ):
            self.fail(f"{text[:40]!r} is beyond the supported 10^18", param, ctx)
        if not (digits.isascii() and digits.isdigit()):  # ASCII digits only: int() would take '١٠٢٤'
            shown = text if len(text) <= 40 else text[:20] + f"…({len(text)} characters)"
            self.fail(f"must be a positive integer, got {shown!r}", param, ctx)
        if len(digits.lstrip("0")) > len(str(MAX_SIZE)):  # compared as text: no int() of a huge string
            self.fail(f"a {len(digits.lstrip('0'))}-digit number is beyond the supported 10^18", param, ctx)
        number = int(digits)
        if number < 1:
            self.fail(f"must be a positive integer, got {number}", param, ctx)
        if number > MAX_SIZE:
            self.fail(f"{number:.3e} is beyond the supported 10^18", param, ctx)
        return number


POSITIVE = PositiveInt()


class BoundedFloat(click.ParamType):
    """A finite number in (low, high] (``low`` itself allowed when ``closed``), given in plain or
    scientific notation: nan, inf and values that would make a result overflow are refused in one line."""

    name = "number"

    def __init__(self, low: float, high: float, closed: bool = False, what: str = "") -> None:
        self.low, self.high, self.closed, self.what = low, high, closed, what

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        text = str(value).strip()
        try:
            number = float(text) if text.isascii() else math.nan
        except ValueError:
            self.fail(f"must be a number, got {text[:40]!r}", param, ctx)
        above = number > self.low or (self.closed and number == self.low)
        if not (math.isfinite(number) and above and number <= self.high):
            bracket = "[" if self.closed else "("
            self.fail(f"must be a finite number in {bracket}{self.low:,.10g}, {self.high:,.10g}]{self.what}, got {text[:40]!r}",
                      param, ctx)  # fmt: skip
        return number


UTILIZATION = BoundedFloat(0.0, 1.0, what=" (vLLM's fraction of the GPU's total: 0.9 is 90 %)")
PRICE = BoundedFloat(0.0, 1e6, closed=True, what=" (currency units per GPU-hour)")
PEAK_FLOPS = BoundedFloat(1.0, 1e20, closed=True, what=" FLOP/s")


def _complete_models(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[Any]:
    from click.shell_completion import CompletionItem

    if is_config_path(incomplete):
        return [CompletionItem(incomplete, type="file")]
    return [CompletionItem(name) for name in preset_names() if name.startswith(incomplete)]


COMMAND_CUTOFF = 0.7
"""How close (difflib's ratio) a first word must be to a command name to be called a typo of it:
``memroy``/``memory`` 0.83, ``infr``/``infer`` 0.89; ``nosuch``/``crosscheck`` 0.5 is not."""


def unknown_first_word(word: str, commands: list[str]) -> str:
    """The message for a first word that is neither a command, a preset nor a config path."""
    shown = word if len(word) <= 60 else word[:60] + "…"
    low = word.lower()
    presets = difflib.get_close_matches(low, preset_names(), n=3, cutoff=0.5)
    command = difflib.get_close_matches(low, commands, n=1, cutoff=COMMAND_CUTOFF)

    def ratio(name: str) -> float:
        return difflib.SequenceMatcher(None, low, name).ratio()

    if command and (not presets or ratio(command[0]) > ratio(presets[0])):
        hint = f"; did you mean '{command[0]}' (a command)?"
    elif presets:
        hint = "; did you mean " + " or ".join(f"'{p}'" for p in presets) + "?"
    else:
        hint = ""
    return (
        f"'{shown}' is neither a command nor a preset{hint} (presets: {', '.join(preset_names())}; a model of "
        "your own: a path to its Hugging Face config.json or a .toml file, e.g. ./config.json (a bare name "
        f"needs a '/' or a .json/.toml suffix); commands: {', '.join(commands)})"
    )


class DefaultGroup(click.Group):
    """``lm-account gpt2-xl ...`` runs ``account`` when the first word is a preset or a path.

    Any other first word is a mistyped command or an unknown model: exit 2 with a "did you mean" (the
    close presets, or a command only when the word is close to one: ``memroy``), the presets, and how to
    pass a model of one's own (a bare name that exists on disk goes on to ``load_config``, which asks
    for ``./name``)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            word = args[0]
            if word not in preset_names() and not is_config_path(word) and not os.path.lexists(word):
                raise click.UsageError(unknown_first_word(word, list(self.commands)))
            args = ["account", *args]
        return super().parse_args(ctx, args)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[Any]:
        """Complete the first word with the commands and the presets."""
        return [*super().shell_complete(ctx, incomplete), *_complete_models(ctx, None, incomplete)]  # type: ignore[arg-type]


def override_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--set KEY=VALUE and the shape flags (--layers, --d-model, ...), passed on as ``changes``: a dict
    of config fields for ``modified``."""

    @click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override any config field, e.g. --set d_ff=4288 (repeatable).",
    )
    @click.option("--layers", type=POSITIVE, help="Override num_layers.")
    @click.option("--d-model", type=POSITIVE, help="Override d_model.")
    @click.option("--heads", type=POSITIVE, help="Override num_heads.")
    @click.option("--kv-heads", type=POSITIVE, help="Override num_kv_heads (GQA).")
    @click.option("--head-dim", type=POSITIVE, help="Override head_dim.")
    @click.option("--d-ff", type=POSITIVE, help="Override d_ff.")
    @click.option("--vocab-size", type=POSITIVE, help="Override vocab_size.")
    @functools.wraps(func)
    def wrapper(*args: Any, overrides: Sequence[str], **kw: Any) -> Any:
        changes = dict(parse_override(o) for o in overrides)
        for flag, field in SHAPE_FLAGS.items():
            value = kw.pop(flag)
            if value is not None:
                changes[field] = value
        return func(*args, changes=changes, **kw)

    return wrapper


def modified(cfg: ModelConfig, changes: dict[str, Any]) -> ModelConfig:
    """``cfg`` with the command line's ``changes``, renamed to say so unless a name is given."""
    if changes and "name" not in changes:
        changes = {**changes, "name": f"{cfg.name} (modified: {', '.join(f'{k}={v}' for k, v in changes.items())})"}
    return apply_overrides(cfg, changes)


def model_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """PRESET_OR_FILE plus --context/--batch/--set/shape flags/--format, resolved to ``cfg``."""

    @click.argument("preset_or_file", metavar="PRESET_OR_FILE", shell_complete=_complete_models)
    @click.option("--context", "-S", type=POSITIVE, help="Sequence length S (default: the preset's context_length).")
    @click.option("--batch", "-B", type=POSITIVE, default=1, show_default=True, help="Batch size B.")
    @override_options
    @click.option("--verbose", "-v", is_flag=True, help="List the config.json fields that were ignored (on stderr).")
    @format_option
    @functools.wraps(func)
    def wrapper(preset_or_file: str, context: int | None, changes: dict, verbose: bool, **kw: Any) -> Any:
        cfg = load_config(preset_or_file)
        if verbose:
            ignored = ", ".join(cfg.ignored_fields) or "none"
            click.echo(f"ignored config fields (they change no count): {ignored}", err=True)
        return func(cfg=modified(cfg, changes), context=context, **kw)

    return wrapper


optimizer_option = click.option(
    "--optimizer",
    type=click.Choice(ADAMW_IMPLS),
    default=DEFAULT_ADAMW,
    show_default=True,
    help="torch.optim.AdamW implementation (foreach is torch's default on CUDA).",
)


def implementation_setup(setup: Any, impl: str, cfgs: Sequence[ModelConfig] = ()) -> Any:
    """``setup`` for implementation ``impl``: transformers' own default attention when --attention was not given,
    sdpa (``PreTrainedModel._check_and_adjust_attn_implementation`` picks sdpa where torch has it; eager is opt-in),
    unless a model of ``cfgs`` runs eager only (Gemma 2's soft-capping); our model's (naive) otherwise."""
    from .analytic.ops import unsupported

    ctx = click.get_current_context()
    if impl != "transformers" or ctx.get_parameter_source("attention") is not click.core.ParameterSource.DEFAULT:
        return setup
    sdpa = dataclasses.replace(setup, attention="sdpa")
    eager_only = any(len(unsupported(c, sdpa, impl)) > len(unsupported(c, setup, impl)) for c in cfgs)
    return setup if eager_only else sdpa


def format_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table (fits the terminal), markdown, csv (tidy records) or json.",
    )(func)


def setup_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--attention/--checkpoint/--precision, resolved to ``setup`` (a ``TrainingSetup``) with ``--optimizer``
    when the command has one."""
    from .setup import ATTENTIONS, CHECKPOINTS, PRECISIONS

    @click.option(
        "--attention",
        type=click.Choice(ATTENTIONS),
        default="naive",
        show_default=True,
        help="naive: S×S scores kept (the course model; transformers' eager); sdpa: torch's fused attention kernel.  "
        "With --impl transformers the default is sdpa, as transformers' own.",
    )
    @click.option(
        "--checkpoint",
        type=click.Choice(CHECKPOINTS),
        default="none",
        show_default=True,
        help="Activation checkpointing per block: none, full, selective (matmul outputs kept), or op "
        "(torchtitan's per-op SAC: every second mm rerun).",
    )
    @click.option(
        "--precision",
        type=click.Choice(PRECISIONS),
        default="fp32",
        show_default=True,
        help="fp32, pure bf16, or amp-bf16 (fp32 master weights, bf16 autocast compute).",
    )
    @functools.wraps(func)
    def wrapper(attention: str, checkpoint: str, precision: str, **kw: Any) -> Any:
        from .setup import TrainingSetup

        cp_note = context_parallel_attention(attention, kw.get("cp"))
        attention = "sdpa" if cp_note else attention
        optimizer = kw.get("optimizer", DEFAULT_ADAMW)
        setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision, optimizer=optimizer)
        result = func(setup=setup, **kw)
        if cp_note:  # after the command ran: a refused one prints its one line only
            echo_err(cp_note)
        return result

    return wrapper


CP_ATTENTION_NOTE = (
    "attention sdpa: the only attention context parallel runs (torch's ring attention of the fused kernel)"
)


def context_parallel_attention(attention: str, cp: int | None) -> str | None:
    """The note when --cp > 1 (a command with layout flags) takes sdpa for an --attention not given (the only
    attention context parallel runs, ``parallelisms.cp.check_attention``), else None: an explicit other one is left
    to that check's one-line refusal."""
    ctx = click.get_current_context()
    if not cp or cp == 1 or ctx.get_parameter_source("attention") is not click.core.ParameterSource.DEFAULT:
        return None
    return None if attention == "sdpa" else f"--cp {cp}: {CP_ATTENTION_NOTE}"


def with_dtype(setup: Any, dtype: str | None) -> Any:
    """``setup`` with ``--dtype`` applied: the shorthand for pure precision (``--dtype bf16`` is
    ``--precision bf16``; ``--dtype fp32`` keeps fp32 parameters).  A ``--dtype`` that contradicts an
    explicit ``--precision`` (``--dtype bf16 --precision amp-bf16``) is an ``AccountingError``."""
    if dtype is not None and dtype != setup.param_dtype:
        if dtype == "bf16" and setup.precision == "fp32":
            return dataclasses.replace(setup, precision="bf16")
        raise AccountingError(f"--dtype {dtype} contradicts --precision {setup.precision}")
    return setup


def dtype_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--dtype",
        type=click.Choice(CLI_TRAINING_DTYPES),
        default=None,
        help="Shorthand for --precision fp32|bf16 (pure; gradients and AdamW moments follow it).",
    )(func)


def layout_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--dp/--zero/--tp/--sp/--vocab-parallel/--pp/--ep/--micro-batches/--virtual-stages/--replicate/--cp, resolved to ``layout`` (None when
    no layout flag is given: the single-GPU command), plus --rank."""

    @click.option("--dp", type=POSITIVE, help="Data-parallel degree (layout: world = dp·cp·tp·pp).")
    @click.option("--zero", type=click.IntRange(0, 3), help="0 DDP, 1 ZeRO-1, 2 FSDP2 no reshard, 3 FSDP2 full shard.")
    @click.option("--tp", type=POSITIVE, help="Tensor-parallel degree (Megatron column/row splits).")
    @click.option("--sp", is_flag=True, help="Sequence parallel (with --tp).")
    @click.option("--vocab-parallel", is_flag=True, help="Vocab-parallel embedding, LM head and loss (with --tp).")
    @click.option(
        "--pp",
        type=POSITIVE,
        help="Pipeline stages, 1F1B (stages replayed beside --dp/--tp/--sp/--vocab-parallel; estimated beside DDP/ZeRO-1 x --tp).",
    )
    @click.option("--ep", type=POSITIVE, help="Expert parallel over the dp ranks (MoE, FSDP2; torchtitan's rules).")
    @click.option(
        "--replicate",
        type=POSITIVE,
        help="HSDP: FSDP2 over a (replicate, dp/replicate) mesh, torchtitan's dp_replicate (--zero 2 or 3).",
    )
    @click.option(
        "--cp",
        type=POSITIVE,
        help="Context parallel: each sequence over cp ranks, torch's ring attention (--attention sdpa; "
        "FSDP2/DDP over dp·cp).",
    )
    @click.option("--micro-batches", type=POSITIVE, help="Micro-batches per step under --pp (default: pp).")
    @click.option(
        "--virtual-stages",
        type=POSITIVE,
        help="Model chunks per pipeline rank under --pp: interleaved 1F1B over pp·v stages (default: 1).",
    )
    @click.option("--rank", type=click.IntRange(0), help="Rank to predict and measure (default: the worst).")
    @functools.wraps(func)
    def wrapper(**kw: Any) -> Any:
        from .layout import ParallelLayout

        names = (
            "dp", "zero", "tp", "sp", "vocab_parallel", "pp", "micro_batches", "ep", "virtual_stages", "replicate", "cp",
        )  # fmt: skip
        flags = [kw.pop(k) for k in names]
        dp, zero, tp, sp, vocab, pp, micro, ep, virtual, replicate, cp = flags
        layout = None
        if any(f not in (None, False) for f in flags):
            pp = pp or 1
            layout = ParallelLayout(
                dp=dp or 1,
                zero=zero or 0,
                tp=tp or 1,
                sequence_parallel=sp,
                vocab_parallel=vocab,
                pp=pp,
                micro_batches=micro or pp,
                ep=ep or 1,
                virtual_stages=virtual or 1,
                replicate=replicate or 1,
                cp=cp or 1,
            )
        return func(layout=layout, **kw)

    return wrapper


def gpu_memory_options(budget: bool = True) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--gpu and --allowance (and, with ``budget``, --budget), parsed: the budget per GPU is the GPU's
    CUDA total less the allowance, or --budget as given (``gpus.memory_budget``)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        @click.option("--gpu", "gpu_name", default=DEFAULT_GPU, show_default=True, help="GPU from the GPU table.")
        @click.option(
            "--allowance",
            default=None,
            help="Kept back per GPU for the CUDA context, communication buffers and fragmentation (default "
            f"{DEFAULT_ALLOWANCE / 1e9:g}GB): budget = the GPU's CUDA-reported total − allowance.",
        )
        @functools.wraps(func)
        def wrapper(allowance: str | None, budget: str | None = None, **kw: Any) -> Any:
            from .units import parse_size

            kw["allowance"] = None if allowance is None else parse_size(allowance)
            if with_budget:
                kw["budget"] = None if budget is None else parse_size(budget)
            return func(**kw)

        with_budget = budget
        if budget:
            wrapper = click.option(
                "--budget",
                default=None,
                help="Usable bytes per GPU, taken as given instead of the GPU's CUDA total − allowance "
                "(an explicit unit: 80GB is 10^9 bytes, 80GiB 2^30).",
            )(wrapper)
        return wrapper

    return decorate


VLLM_FLAGS = ("max_model_len", "utilization", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory",
              "non_torch", "cuda_graphs")  # fmt: skip
FLAG_NAMES = {"utilization": "--gpu-memory-utilization", "non_torch": "--non-torch-memory",
              "cuda_graphs": "--cuda-graph-memory"}  # fmt: skip


def _flag(dest: str) -> str:
    return FLAG_NAMES.get(dest, "--" + dest.replace("_", "-"))


def _engine(engine: str | None, flags: dict[str, Any], kw: dict[str, Any]) -> Any:
    """The ``engine_sizing`` options of ``--engine`` from its flags, or None; a flag of another engine, or
    vLLM's --gpu-memory-utilization beside --allowance/--budget (two ways to leave room), is refused."""
    from fractions import Fraction

    from .analytic.engine_sizing import DEFAULT_NON_TORCH, DEFAULT_UTILIZATION, SglangOptions, VllmOptions
    from .units import parse_size

    vllm = [k for k in VLLM_FLAGS if flags[k] is not None]
    mfs = flags["mem_fraction_static"]
    if engine != "vllm" and vllm:
        fix = "not SGLang's" if engine == "sglang" else "add --engine vllm"
        raise AccountingError(f"{_flag(vllm[0])} is one of vLLM's flags: {fix}")
    if engine != "sglang" and mfs is not None:
        raise AccountingError("--mem-fraction-static is SGLang's flag: add --engine sglang")
    if engine is None:
        return None
    if engine == "sglang":
        if mfs is None:
            raise AccountingError(
                "--engine sglang needs --mem-fraction-static: its default depends on SGLang's version, the GPU and "
                "the CUDA graph settings (the server's log prints the value it chose)"
            )
        return SglangOptions(Fraction(str(mfs)))
    if flags["utilization"] is not None and (kw.get("allowance") is not None or kw.get("budget") is not None):
        raise AccountingError(
            "--gpu-memory-utilization is vLLM's way to leave room, --allowance and --budget ours: give one"
        )

    def size_of(text: str | None, zero: bool) -> int | None:  # the measured inputs may be 0 ("0B")
        if text is None:
            return None
        return 0 if zero and text.strip() in ("0", "0B") else parse_size(text)

    size = {k: size_of(flags[k], k != "kv_cache_memory") for k in ("kv_cache_memory", "non_torch", "cuda_graphs")}
    return VllmOptions(
        max_model_len=flags["max_model_len"],
        utilization=DEFAULT_UTILIZATION if flags["utilization"] is None else Fraction(str(flags["utilization"])),
        max_num_seqs=flags["max_num_seqs"],
        max_num_batched_tokens=flags["max_num_batched_tokens"],
        non_torch=DEFAULT_NON_TORCH if size["non_torch"] is None else size["non_torch"],
        cuda_graphs=size["cuda_graphs"] or 0,
        kv_cache_memory=size["kv_cache_memory"],
    )


def engine_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """--engine vllm|sglang and the engines' start-up flags, parsed into ``engine`` (``_engine``)."""

    @functools.wraps(func)
    def wrapper(engine: str | None, **kw: Any) -> Any:
        flags = {k: kw.pop(k) for k in (*VLLM_FLAGS, "mem_fraction_static")}
        return func(engine=_engine(engine, flags, kw), **kw)

    for dest, kind, text in reversed((
        ("engine", click.Choice(("vllm", "sglang")),
         "Size the KV cache as this engine does at start-up (vLLM V1 with v0.11's rules; SGLang's pool)."),
        ("max_model_len", POSITIVE, "vLLM: tokens per request (default: the model's context)."),
        ("utilization", UTILIZATION,
         "vLLM: fraction of the GPU's CUDA total it may use (default 0.9; not with --allowance or --budget)."),
        ("max_num_seqs", POSITIVE,
         "vLLM: sequences per step (default 1,024 on a GPU of 70 GiB or more but an A100, else 256)."),
        ("max_num_batched_tokens", POSITIVE,
         "vLLM: tokens per step (default 8,192 on a GPU of 70 GiB or more but an A100, else 2,048)."),
        ("kv_cache_memory", None, "vLLM: the KV cache's bytes, as given (no profiling; e.g. 40GiB)."),
        ("non_torch", None, "vLLM measures it; assumed here (default 0.1GiB)."),
        ("cuda_graphs", None, "vLLM >= 0.21 subtracts its estimate of CUDA graphs; assumed here (default 0)."),
        ("mem_fraction_static", BoundedFloat(0.0, 0.999, what=" (SGLang's fraction of the free memory)"),
         "SGLang: --mem-fraction-static (required with --engine sglang)."),
    )):  # fmt: skip
        wrapper = click.option(_flag(dest), dest, type=kind, default=None, help=text)(wrapper)
    return wrapper


def allow_long_option(func: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--allow-long",
        is_flag=True,
        help="Run live work estimated past 15 minutes (measure.devices.MAX_LIVE_SECONDS); refused otherwise.",
    )(func)


def emit(result: Any, fmt: str) -> None:
    """Render ``result`` on stdout; a terminal table is fitted to the terminal's width."""
    from .views import render

    width = shutil.get_terminal_size().columns if fmt == "table" and sys.stdout.isatty() else None
    click.echo(render(result, fmt, width=width), nl=False)


def echo_err(line: str) -> None:
    click.echo(line, err=True)


@click.group(cls=DefaultGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="lm-accounting", prog_name=PROG)
def cli() -> None:
    """Exact parameter, FLOP and memory accounting for Transformer LMs.

    \b
    lm-account gpt2-xl --context 16384     the headline answer for a preset
    lm-account ./my_model.toml --set d_ff=4288
    lm-account presets                     list the presets
    """


@cli.command("account", short_help="Parameters, FLOPs per component, training FLOPs, KV cache (the default).")
@model_options
def account_cmd(cfg: ModelConfig, context: int | None, batch: int, fmt: str) -> None:
    """Parameters, forward FLOPs per component with shares, training FLOPs and the KV cache
    (analytic, exact; no torch)."""
    from .commands import account

    emit(account.run(account.Request(cfg, context, batch)), fmt)


@cli.command("presets", short_help="List the presets with their dimensions and parameter counts.")
@format_option
def presets_cmd(fmt: str) -> None:
    """List the presets (presets/*.toml) with their key dimensions and exact parameter counts."""
    from .commands import presets

    emit(presets.run(presets.Request()), fmt)


@cli.command("crosscheck", short_help="Prove the FLOPs and parameters on the live model (fvcore, FlopCounterMode).")
@model_options
@click.option(
    "--device",
    type=click.Choice(DEVICES),
    default="meta",
    show_default=True,
    help="Where to build the live model (meta holds no memory).",
)
@click.option("--backward", is_flag=True, help="Also count forward+backward with FlopCounterMode.")
@allow_long_option
@setup_options
def crosscheck_cmd(
    cfg: ModelConfig,
    context: int | None,
    batch: int,
    fmt: str,
    device: str,
    backward: bool,
    allow_long: bool,
    setup: Any,
) -> int:
    """Build the live model and prove the analytic FLOPs and parameters with fvcore and FlopCounterMode.

    Exits 1 and names the component if any matmul FLOP count or parameter count differs.
    """
    from .commands import crosscheck

    request = crosscheck.Request(
        cfg, context, batch, device=device, backward=backward, setup=setup, allow_long=allow_long
    )
    cc = crosscheck.run(request)
    emit(cc, fmt)
    return 1 if cc.mismatches() else 0


@cli.command("memory", short_help="Training memory per phase, predicted (and measured), and capacity.")
@model_options
@dtype_option
@optimizer_option
@gpu_memory_options()
@click.option(
    "--measure",
    type=click.Choice(MEASURE_CHOICES),
    default="none",
    show_default=True,
    help="Also measure one training step of the live model.",
)
@click.option(
    "--measure-method",
    type=click.Choice(MEASURE_METHODS),
    default=None,
    help="tracker (default on meta/cpu): the storage tracker, a dispatch mode (the traced run); "
    "allocator (--measure cpu only): the CPU allocator's own events, no dispatch mode (the plain run). "
    "--measure cuda reads the caching allocator.",
)
@click.option(
    "--impl",
    type=click.Choice(IMPLS),
    default=None,
    help="The model code predicted: course (our TransformerLM), transformers (its modeling code, training mode) "
    "or torchtitan (not offered: its training step cannot run on CPU or meta here; it says why).  Default: "
    "transformers for a config.json, course for a preset or a TOML file (and under a "
    "parallel layout).",
)
@click.option(
    "--find-unused-parameters/--no-find-unused-parameters",
    "find_unused",
    default=None,
    help="DDP or ZeRO-1 over --impl transformers: DistributedDataParallel's find_unused_parameters (default: the "
    "HF Trainer's, on without --checkpoint; on, the used-parameter maps are measured with --measure cpu only).",
)
@allow_long_option
@setup_options
@layout_options
def memory_cmd(
    cfg: ModelConfig,
    context: int | None,
    batch: int,
    fmt: str,
    dtype: str | None,
    optimizer: str,
    gpu_name: str,
    allowance: int | None,
    budget: int | None,
    measure: str,
    measure_method: str | None,
    allow_long: bool,
    setup: Any,
    impl: str | None,
    find_unused: bool | None,
    layout: Any = None,
    rank: int | None = None,
) -> None:
    """Training memory: model states, activations, peak per phase (predicted vs measured), capacity.
    The budget per GPU is the GPU's CUDA-reported total less the allowance, or --budget as given.
    With a parallel layout (--dp/--zero/--tp/--sp/--pp): the worst rank's per-GPU memory, FLOPs and
    collectives; --measure meta runs one rank of the real job on torch's fake process group."""
    from .commands import memory

    impl = impl or default_impl(click.get_current_context().params["preset_or_file"], layout is not None)
    request = memory.Request(
        cfg, context, batch, with_dtype(implementation_setup(setup, impl, [cfg]), dtype), layout, gpu=gpu_name,
        allowance=allowance, budget=budget, rank=rank, measure=measure, measure_method=measure_method,
        allow_long=allow_long, impl=impl, find_unused=find_unused,
    )  # fmt: skip
    emit(memory.measure(request, memory.run(request)), fmt)


@cli.command("plan", short_help="Which parallel layout trains MODEL on N GPUs, and how long it takes.")
@click.argument("preset_or_file", metavar="PRESET_OR_FILE", shell_complete=_complete_models)
@gpu_memory_options(budget=False)
@click.option("--gpus", default="8..1024", show_default=True, help="GPU count or range LOW..HIGH.")
@click.option("--context", "-S", type=POSITIVE, help="Sequence length (default: the preset's context_length).")
@click.option("--global-batch-tokens", type=POSITIVE, default=4 * 1024 * 1024, show_default=True)
@click.option("--tokens", type=POSITIVE, required=True, help="Training tokens D.")
@click.option("--price-per-gpu-hour", type=PRICE, help="Price per GPU-hour, for the cost column.")
@click.option(
    "--efficiency",
    type=float,
    default=1.0,
    show_default=True,
    help="Scale the calibrated step-time model's compute: 1 as calibrated, 1.2 a stack 20% faster, in (0, 1.5].",
)
@click.option("--interconnect-bw", default="50GB", show_default=True, help="Inter-node bytes/s per GPU (e.g. 50GB).")
@click.option("--top", type=POSITIVE, default=10, show_default=True, help="Layouts to print.")
@click.option("--plot", "plot_stem", metavar="PATH_STEM", help="Also write PATH_STEM.png/.svg: memory vs GPUs.")
@layout_options
@click.option(
    "--checkpoint",
    type=click.Choice(CHECKPOINT_CHOICES),
    default=None,
    help="With your own layout (--dp/--tp/...): price this checkpointing only (default: each).",
)
@click.option(
    "--micro-batch",
    type=POSITIVE,
    default=None,
    help="With your own layout: sequences per micro-batch (default: each).",
)
@override_options
@format_option
def plan_cmd(
    preset_or_file: str,
    changes: dict,
    gpu_name: str,
    allowance: int | None,
    gpus: str,
    context: int | None,
    global_batch_tokens: int,
    tokens: int,
    price_per_gpu_hour: float | None,
    efficiency: float,
    interconnect_bw: str,
    top: int,
    fmt: str,
    plot_stem: str | None = None,
    layout: Any = None,
    rank: int | None = None,
    checkpoint: str | None = None,
    micro_batch: int | None = None,
) -> None:
    """Enumerate layouts (ZeRO stage, TP, SP, PP, checkpointing, micro-batch), keep those whose per-GPU
    peak fits the GPU's CUDA total less the allowance, rank them by GPU-hours (analytic; no torch).  With
    --dp/--zero/--tp/--sp/--vocab-parallel/--pp/--ep: price that layout only (--checkpoint and --micro-batch
    pin the rest)."""
    from .commands import plan
    from .layout import parse_gpu_count
    from .plan import OwnLayout
    from .units import parse_size

    if rank is not None:
        raise AccountingError("plan prices a layout's worst rank: --rank is memory's")
    if click.get_current_context().params.get("micro_batches") is not None:
        raise AccountingError(
            "plan picks the pipeline's micro-batches: pin the sequences per micro-batch with --micro-batch"
        )
    if layout is None and (checkpoint is not None or micro_batch is not None):
        raise AccountingError("--checkpoint and --micro-batch pin your own layout: give it with --dp/--zero/--tp/...")
    own = None if layout is None else OwnLayout(layout, checkpoint, micro_batch)

    request = plan.Request(
        modified(load_config(preset_or_file), changes), tokens, gpu=gpu_name, gpus=parse_gpu_count(gpus),
        context=context, global_batch_tokens=global_batch_tokens, price_per_gpu_hour=price_per_gpu_hour,
        efficiency=efficiency, internode_bw=parse_size(interconnect_bw), allowance=allowance, top=top, plot_stem=plot_stem, own=own,
    )  # fmt: skip
    result = plan.run(request)
    for path in plan.plot(request, result):  # written before the table: a failure prints nothing
        echo_err(f"wrote {path}")
    emit(result, fmt)


@cli.command("train-time", short_help="Days to train on one GPU, and AdamW step FLOPs.")
@model_options
@click.option("--steps", type=POSITIVE, default=400_000, show_default=True, help="Optimizer steps.")
@click.option("--gpu", default="a100", show_default=True, help="GPU from the built-in table (a100, h100-sxm, ...).")
@click.option(
    "--gpu-dtype",
    default=None,
    help="The peak MFU is quoted against: fp32, tf32, bf16, fp16 (default: the setup's compute dtype).",
)
@click.option("--peak-flops", type=PEAK_FLOPS, help="Override the peak MFU is quoted against (e.g. 19.5e12).")
@click.option(
    "--method",
    type=click.Choice(STEP_FLOPS_METHODS),
    default="3x",
    show_default=True,
    help="Step FLOPs: 3 × forward, 6·N·D, or the PaLM formula.",
)
@click.option(
    "--impl",
    type=click.Choice(("course", "transformers")),
    default=None,
    help="The model code the calibrated step time prices (as memory's --impl).  Default: transformers for a "
    "config.json, course otherwise.",
)
@optimizer_option
@click.option(
    "--efficiency",
    type=float,
    default=1.0,
    show_default=True,
    help="Scale the calibrated step-time model's compute: 1 as calibrated, 1.2 a stack 20% faster, in (0, 1.5].",
)
@setup_options
@layout_options
def train_time_cmd(
    cfg: ModelConfig,
    context: int | None,
    batch: int,
    fmt: str,
    steps: int,
    gpu: str,
    gpu_dtype: str | None,
    peak_flops: float | None,
    method: str,
    impl: str | None,
    optimizer: str,
    efficiency: float,
    setup: Any,
    layout: Any = None,
    rank: int | None = None,
) -> None:
    """Days to train on one GPU: the calibrated step time of the step's own ops (the model plan prints; a GPU
    without a table of its own: the H100's scaled to it), its MFU and HFU, plus AdamW step FLOPs.  With
    --dp/--zero/--tp/--sp/--vocab-parallel/--pp/--ep/--replicate/--cp: that job's step as plan prices the layout
    (--batch sequences a micro-batch, --micro-batches of them per data-parallel rank)."""
    from .commands import train_time

    if rank is not None:
        raise AccountingError("train-time prices a layout's busiest rank: --rank is memory's")
    impl = impl or default_impl(click.get_current_context().params["preset_or_file"], layout is not None)
    request = train_time.Request(
        cfg, context, batch, steps, gpu=gpu, gpu_dtype=gpu_dtype, peak_flops=peak_flops, method=method,
        setup=implementation_setup(setup, impl, [cfg]), impl=impl, efficiency=efficiency, layout=layout,
    )  # fmt: skip
    emit(train_time.run(request), fmt)


@cli.command("sweep", short_help="Context-length sweep: tables and plots written to --out.")
@click.argument("presets", nargs=-1, required=True, metavar="PRESET_OR_FILE...", shell_complete=_complete_models)
@click.option(
    "--contexts",
    default="128:16384:x2",
    show_default=True,
    help="Context lengths: a list (128,256,512) or a range (128:16384:x2, 256:2048:+256).",
)
@click.option("--batch", "-B", type=POSITIVE, default=1, show_default=True, help="Batch size B.")
@dtype_option
@click.option("--optimizer", type=click.Choice(ADAMW_IMPLS), default=DEFAULT_ADAMW, show_default=True)
@gpu_memory_options()
@click.option("--crosscheck", is_flag=True, help="Count every point's FLOPs on the live model (meta) too.")
@click.option("--measure-memory", type=click.Choice(DEVICES), help="Measure every point's training step.")
@click.option(
    "--impl",
    type=click.Choice(IMPLS),
    default=None,
    help="The model code of the memory columns (as memory's --impl).  Default: transformers for a "
    "config.json, course for a preset or a TOML file, per model.",
)
@allow_long_option
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="lm-account-sweep",
    show_default=True,
    help="Directory for the tables and plots (replaced as a whole, atomically).",
)
@click.option("--no-plots", is_flag=True, help="Write the tables only.")
@override_options
@format_option
@setup_options
def sweep_cmd(
    presets: Sequence[str],
    changes: dict,
    contexts: str,
    batch: int,
    dtype: str | None,
    optimizer: str,
    budget: int | None,
    gpu_name: str,
    allowance: int | None,
    crosscheck: bool,
    measure_memory: str | None,
    impl: str | None,
    allow_long: bool,
    out: str,
    no_plots: bool,
    fmt: str,
    setup: Any,
) -> int:
    """Context-length sweep of one or more models: tables (CSV, markdown, JSON) and plots in --out."""
    from .commands import sweep
    from .views.sweep import check_sweep_out

    check_sweep_out(out)  # a bad --out fails before the models are read
    impls = tuple(impl or default_impl(p) for p in presets)
    cfgs = tuple(modified(load_config(p), changes) for p in presets)
    setup = implementation_setup(setup, impls[0] if len(set(impls)) == 1 else "course", cfgs)  # one for every model
    request = sweep.Request(
        cfgs, contexts, batch, with_dtype(setup, dtype), budget, gpu=gpu_name, allowance=allowance,
        crosscheck=crosscheck, measure=measure_memory, allow_long=allow_long, out=out, plots=not no_plots,
        impls=impls,
    )  # fmt: skip
    result = sweep.run(request, progress=True)
    paths = sweep.write(request, result)
    emit(result, fmt)
    echo_err(f"wrote {len(paths)} files to {out}/: " + ", ".join(p.name for p in paths))
    for problem in result.mismatches:
        echo_err(f"MISMATCH: {problem}")
    return 1 if result.mismatches else 0


@cli.command("infer", short_help="Serving: prefill/decode FLOPs, KV cache, memory, capacity and roofline.")
@model_options
@click.option("--prompt", "-P", type=POSITIVE, required=True, help="Prompt tokens per sequence.")
@click.option("--generate", "-G", type=POSITIVE, required=True, help="Tokens generated per sequence.")
@click.option(
    "--weights",
    type=click.Choice(tuple(WEIGHT_BYTES)),
    default="bf16",
    show_default=True,
    help="Weight storage (quantised: the embeddings, head and norms stay bf16; int4 with its group scales).",
)
@click.option(
    "--compute",
    type=click.Choice(("fp32", "bf16", "fp8", "int8")),
    default=None,
    help="The matmuls' dtype: fp8/int8 weights as w8a8 (the default; the GPU's FP8/INT8 peak) or weight-only (bf16).",
)
@click.option("--group-size", type=POSITIVE, default=None, help="int4: weights per scale and zero-point (default 128).")
@click.option("--quantize-embeddings", is_flag=True, help="Quantise the embedding table and LM head too.")
@click.option(
    "--efficiency",
    type=BoundedFloat(0.001, 1.0, closed=True, what=" (a fraction of the peak and the bandwidth)"),
    default=None,
    help="The realistic figure's fraction of the peak and bandwidth, in [0.001, 1] (default: the GPU's calibration).",
)
@click.option(
    "--kv-dtype", type=click.Choice(tuple(KV_DTYPES)), default="bf16", show_default=True, help="KV-cache storage."
)
@gpu_memory_options()
@click.option("--tp", type=POSITIVE, default=1, show_default=True, help="Tensor-parallel degree.")
@click.option(
    "--cache",
    "semantics",
    type=click.Choice(SEMANTICS),
    default="filled",
    show_default=True,
    help="filled: attend over filled positions; static: over all slots (transformers' StaticCache).",
)
@click.option(
    "--attention",
    type=click.Choice(INFER_ATTENTIONS),
    default=None,
    help="sdpa: a fused kernel, no P×P scores (default with --cache filled: what serving runs); "
    "naive: the S×S scores kept (default, and the only choice, with --cache static).",
)
@click.option(
    "--program",
    type=click.Choice(PROGRAMS),
    default=None,
    help="engine: what vLLM/SGLang run (last-token logits, paged cache, causal kernel, MLA absorbed; the default); "
    "generate: transformers' generate() (the default with --cache static or --attention naive); "
    "forward: the full forward, logits at every prompt position.",
)
@click.option(
    "--measure",
    type=click.Choice(MEASURE_CHOICES),
    default="none",
    show_default=True,
    help="Also run the live model with a static KV cache and compare FLOPs, cache bytes and memory.",
)
@engine_options
@allow_long_option
def infer_cmd(
    cfg: ModelConfig,
    context: int | None,
    batch: int,
    fmt: str,
    prompt: int,
    generate: int,
    weights: str,
    compute: str | None,
    group_size: int | None,
    quantize_embeddings: bool,
    efficiency: float | None,
    kv_dtype: str,
    gpu_name: str,
    allowance: int | None,
    budget: int | None,
    tp: int,
    semantics: str,
    attention: str | None,
    program: str | None,
    engine: Any,
    measure: str,
    allow_long: bool,
) -> None:
    """Inference: prefill and decode FLOPs, KV cache, memory per GPU, concurrent sequences, roofline
    (analytic, exact; no torch unless --measure).  The budget per GPU is the GPU's CUDA-reported total
    less the allowance, or --budget as given.  A batch over the budget is an answer (exit 0): the output
    says OVER BUDGET and how many sequences fit."""
    from .commands import infer

    request = infer.Request(
        cfg, prompt, generate, batch, context, weights=weights, kv_dtype=kv_dtype, gpu=gpu_name, tp=tp,
        allowance=allowance, budget=budget, semantics=semantics, attention=attention, program=program,
        engine=engine, compute=compute, group_size=group_size, quantize_embeddings=quantize_embeddings,
        efficiency=efficiency, measure=measure, allow_long=allow_long,
    )  # fmt: skip
    emit(infer.measure(request, infer.run(request), note=echo_err), fmt)


@cli.command("report", short_help="Regenerate reports/ (the course answers, tables and plots) from code.")
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="reports",
    show_default=True,
    help="Directory to (re)generate, replaced as a whole, atomically.",
)
@click.option("--no-live", is_flag=True, help="Skip the live cross-checks and meta measurements (faster).")
@click.option("--no-plots", is_flag=True, help="Skip the figures.")
def report_cmd(out: str, no_live: bool, no_plots: bool) -> int:
    """Regenerate the course answers (assignment.md), their tables, the sweep and the plots."""
    from .commands import report

    answers, paths = report.run(report.Request(out, live=not no_live, plots=not no_plots), progress=True)
    click.echo(f"wrote {len(paths)} files under {out}/")
    problems = answers.mismatches()
    for problem in problems:
        echo_err(f"MISMATCH: {problem}")
    return 1 if problems else 0


INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


@contextlib.contextmanager
def _interrupts() -> Any:  # a context manager yielding [seen]
    """Ctrl-C while ``main`` runs: the first raises ``KeyboardInterrupt`` (cleanups run: ``atomic_dir`` removes
    its temporary folder) and is remembered (``seen[0]``), so one swallowed by library code (an import's bare
    ``except``) still ends the run with 130; a second leaves at once.  Installed at the start of ``main``,
    before any command's heavy imports (torch, pandas, matplotlib)."""
    import signal
    import threading

    seen = [False]

    def handler(signum: int, frame: object) -> None:
        if seen[0]:  # a second Ctrl-C: no more cleanup
            os.write(2, b"lm-account: interrupted\n")
            os._exit(INTERRUPTED)
        seen[0] = True
        raise KeyboardInterrupt

    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, handler) if main_thread else None
    try:
        yield seen
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: one-line errors with exit code 2, never a traceback, for bad input; Ctrl-C exits 130
    with one line; a closed or failing standard output (``> /dev/full``) is one line and exit 2."""
    real = argv is None  # a process of its own (the console script), not a call from Python
    with _interrupts() as seen:
        try:
            code = _main(argv, real)
            if seen[0]:  # swallowed on the way: the user still asked to stop
                raise KeyboardInterrupt
            _flush_stdout(real)
        except (click.Abort, KeyboardInterrupt):
            _leave(real, INTERRUPTED, "interrupted")
        except OSError as err:  # writing the output: a full disk or device, a closed stream
            _leave(real, 2, f"error: cannot write {err.filename or 'the output'}: {err.strerror or err}")
    if "torch" in sys.modules and real:
        # Tearing down an interpreter that imported torch takes ~0.8 s; everything is
        # written (reports are closed and renamed atomically), so leave.
        os._exit(code)
    sys.exit(code)


def _main(argv: Sequence[str] | None, real: bool) -> int:
    if COMPLETE_VAR in os.environ:  # shell completion: click answers and exits (argv is empty then)
        cli.main(prog_name=PROG, complete_var=COMPLETE_VAR)
        return 0
    if sys.stdout is None:  # started with standard output closed (``>&-``): nothing could be printed
        _fail("standard output is closed: redirect it to a file or to /dev/null instead")
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        click.echo(cli.get_help(click.Context(cli, info_name=PROG)))
        return 0
    try:
        code = cli.main(args=args, prog_name=PROG, standalone_mode=False)
    except click.UsageError as err:  # includes BadParameter, NoSuchOption, MissingParameter
        _fail(err.format_message())
    except AccountingError as err:
        _fail(str(err))
    except BrokenPipeError:  # the reader left (``| head``): not an error
        _silence_stdout(real)
        return 0
    return code if isinstance(code, int) else 0


def _flush_stdout(real: bool) -> None:
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout(real)


def _silence_stdout(real: bool) -> None:
    """In a process of its own: point standard output at /dev/null, so the interpreter's flush at exit finds
    nothing to write (no "Exception ignored" after the one line)."""
    if real:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _leave(real: bool, code: int, text: str) -> None:
    """Print ``lm-account: TEXT`` on stderr and exit with ``code``, the unwritten output dropped."""
    import signal

    if real:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # no second traceback while leaving
    _silence_stdout(real)
    with contextlib.suppress(OSError, ValueError, AttributeError):
        click.echo(f"{PROG}: {text}", err=True)
        sys.stderr.flush()
    if real:  # the buffered output must not be flushed again at exit
        os._exit(code)
    sys.exit(code)


def _fail(message: str) -> None:
    text = " ".join(message.split())
    if len(text) > 1000:  # one readable line, whatever the input echoed into it
        text = text[:1000] + "…"
    click.echo("lm-account: error: " + text, err=True)
    sys.exit(2)
