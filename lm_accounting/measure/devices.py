"""Refuse a live run that cannot fit, before it dies with an out-of-memory error."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..config import AccountingError, ModelConfig
from ..units import fmt_bytes

PROC, CGROUP_ROOT = "/proc", "/sys/fs/cgroup"
"""Where ``memory_limits`` reads the process's memory and its control groups (tests point them at a fake tree)."""

NO_LIMIT = 2**60
"""A limit at or above this many bytes is no limit (cgroup v1 writes 2^63 − 4,096 for "unlimited")."""


def _read(path: str) -> str | None:
    try:
        with open(path) as fh:
            return fh.read()
    except (OSError, UnicodeDecodeError):
        return None


def _int(text: str | None) -> int | None:
    text = (text or "").strip()
    return int(text) if text.isdigit() else None  # "max" (cgroup v2's unlimited), missing or garbled: none


def _kib(fields: str | None, key: str) -> int | None:
    """``key:   123 kB`` of /proc/meminfo or /proc/self/status, in bytes."""
    for line in (fields or "").splitlines():
        if line.startswith(key + ":") and len(line.split()) >= 2 and line.split()[1].isdigit():
            return int(line.split()[1]) * 1024
    return None


def _cgroup_dirs() -> list[tuple[str, str, str, str]]:
    """(version, folder, limit file, usage file) for this process's memory cgroup and each ancestor up to the
    mount's root (a cgroup's limit binds its descendants): v2 from the ``0::/path`` line of /proc/self/cgroup
    (``memory.max``, ``memory.current``), v1 from the ``memory`` controller's line (``memory.limit_in_bytes``,
    ``memory.usage_in_bytes``)."""
    out = []
    for line in (_read(f"{PROC}/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            version, base, files = "v2", CGROUP_ROOT, ("memory.max", "memory.current")
        elif "memory" in parts[1].split(","):
            version, base, files = "v1", f"{CGROUP_ROOT}/memory", ("memory.limit_in_bytes", "memory.usage_in_bytes")
        else:
            continue
        rel = [p for p in parts[2].split("/") if p and p not in (".", "..")]
        for depth in range(len(rel), -1, -1):
            out.append((version, "/".join([base, *rel[:depth]]), *files))
    return out


def memory_limits() -> dict[str, int]:
    """Bytes this process may still allocate on the CPU, per limit that applies (the least of them binds):

    * ``MemAvailable`` of /proc/meminfo (the kernel's estimate of what can be allocated without swapping);
    * ``RLIMIT_AS`` less the address space in use (``VmSize``), ``RLIMIT_DATA`` less the data segment
      (``VmData``): an allocation past either fails at once, whatever the machine has;
    * cgroup v2 ``memory.max`` − ``memory.current`` and cgroup v1 ``memory.limit_in_bytes`` −
      ``memory.usage_in_bytes``, of the process's cgroup and every ancestor (a container's limit):
      past it the kernel's OOM killer ends the process."""
    import resource

    limits: dict[str, int] = {}
    meminfo = _kib(_read(f"{PROC}/meminfo"), "MemAvailable")
    if meminfo is not None:
        limits["MemAvailable"] = meminfo
    status = _read(f"{PROC}/self/status")
    for name, used_key in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        soft, _hard = resource.getrlimit(getattr(resource, name))
        if soft != resource.RLIM_INFINITY and 0 <= soft < NO_LIMIT:
            limits[name] = max(soft - (_kib(status, used_key) or 0), 0)
    for version, folder, limit_file, usage_file in _cgroup_dirs():
        limit = _int(_read(f"{folder}/{limit_file}"))
        if limit is not None and limit < NO_LIMIT:
            key = f"cgroup {version} {limit_file}"
            left = max(limit - (_int(_read(f"{folder}/{usage_file}")) or 0), 0)
            limits[key] = min(left, limits.get(key, left))
    return limits


def available_bytes(device: str) -> int | None:
    """Free memory on ``device``: CUDA from the driver; CPU the least of ``memory_limits`` (MemAvailable,
    the rlimits' and the cgroups' headroom); None for meta, or where nothing can be read."""
    if device == "meta":
        return None
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise AccountingError("cuda: no CUDA GPU is available on this machine (use meta)")
        free, _total = torch.cuda.mem_get_info()
        return int(free)
    limits = memory_limits()
    return min(limits.values()) if limits else None


def counting_run_bytes(cfg: ModelConfig, seq: int, batch: int, backward: bool) -> int:
    """Upper bound for a FLOP-counting run (forward, or forward + backward, no optimizer): the exact
    training-step peak of ``predict_training_step`` minus the AdamW moments.  The replay models the
    course architecture only; a variant is bounded by its course twin (same shapes) × 3/2, an
    estimate with room for LayerNorm's extra saved tensors, biases and position tables."""
    from ..analytic.memory import model_state_breakdown
    from ..analytic.replay import predict_training_step

    twin = cfg if cfg.course_architecture else cfg.course_twin()
    step = predict_training_step(twin, seq, batch, mode="traced")  # the tracker's run: the higher one
    peak = max(step.forward.peak, step.backward.peak) if backward else step.forward.peak
    states = model_state_breakdown(twin)
    exact = peak - states["adamw.exp_avg"].total - states["adamw.exp_avg_sq"].total
    return exact if twin is cfg else exact * 3 // 2


def check_device_fits(device: str, need: int, what: str, hint: str = "a smaller --context/--batch") -> None:
    """Raise a one-line error when ``need`` bytes exceed what a live run may take on ``device``: on the CPU
    ``CPU_MEMORY_FRACTION`` of ``available_bytes`` (the least of MemAvailable, the rlimits and the cgroups),
    on a GPU its free memory.  The one rule of every live run (``check_live_run``, ``infer --measure``)."""
    free = available_bytes(device)  # raises for cuda without a GPU
    if free is None:
        return
    allowed = int(free * CPU_MEMORY_FRACTION) if device == "cpu" else free
    if need > allowed:
        share = (
            f"{CPU_MEMORY_FRACTION:.0%} of the {fmt_bytes(free)} available (the least of MemAvailable, "
            "the rlimits and the cgroup limits)"
            if device == "cpu"
            else f"the {fmt_bytes(free)} free"
        )
        raise AccountingError(
            f"{what} on {device} needs {fmt_bytes(need)}, more than {share}; use meta (counts with no memory) or {hint}"
        )


# ---------------------------------------------------------------- refusing impossible live runs
TORCH_STORAGE_LIMIT = 2**63
"""torch computes a tensor's storage size in bytes as a signed 64-bit int: ``numel × element size``
must stay below 2^63 (checked on torch 2.13: ``torch.empty(2**61, device="meta")`` in fp32 raises
"Storage size calculation overflowed", ``2**61 - 1`` elements do not)."""

COUNTING_HOST_BYTES_PER_LAYER = 3 * 10**6
"""Real host memory per layer of a FLOP-counting run (``crosscheck``), on any device, meta included:
the modules, fvcore's traced graph and FlopCounterMode's autograd graph are Python objects.
Measured (peak RSS growth from ``resource.getrusage``, torch 2.13, this 2-core machine):
~1.9 MB/layer (forward) and ~2.3 MB/layer (with ``--backward``) for d_model 64 and 1,600 at
100-1,000 layers, after a ~90 MB fixed cost for fvcore.  3 MB leaves a 30 % margin."""

TRAINING_HOST_BYTES_PER_LAYER = 10**6
"""Real host memory per layer of a measured training step (``measure_step``), any device.
Measured as above: 0.2-0.64 MB/layer (d_model 64 and 1,600, 100-1,000 layers; the meta model
itself ``build_model(cfg, "meta")`` is ~40 KB/layer).  1 MB leaves a margin of 1.5x."""

MAX_HOST_BYTES = 10**9
"""Largest host memory a live run's per-layer objects may need (1 GB): 333 layers for a
cross-check, 1,000 for a measured step.  Llama-3-405B has 126 layers."""

CPU_MEMORY_FRACTION = 0.8
"""A CPU run may use at most this fraction of ``available_bytes`` (the rest is the OS and other programs)."""

COUNTING_SECONDS = (1.5, 0.12, 0.30)
"""Seconds of a meta cross-check: fixed, per layer forward, per layer forward + backward (measured
on this 2-core machine: 1.4 s for 1 layer; 11.6 s / 28.4 s for 100 layers of GPT-2 XL width)."""

TRAINING_SECONDS = (3.0, 0.18)
"""Seconds of a measured meta training step: fixed, per layer (measured: 2.8 s for 1 layer, 18 s for
100 layers of GPT-2 XL width; 0.07-0.08 s/layer at d_model 64)."""

CPU_FLOPS_PER_SECOND = 2 * 10**10
"""Assumed sustained fp32 matmul rate of the CPU for time estimates (20 GFLOP/s: a low figure for a
few cores, so the estimate errs long)."""

GPU_FLOPS_PER_SECOND = 10**13
"""Assumed sustained rate of a GPU for time estimates (10 TFLOP/s)."""

CPU_INIT_SECONDS_PER_PARAMETER = 2e-7
"""Seconds to build a live model on the CPU, per parameter: ``Linear``/``Embedding`` initialise their
weights with ``trunc_normal_`` (measured on this 2-core machine, torch 2.13: gpt2-small's 190 M
parameters in 25 s in bf16, 33 s in fp32, 1.3-1.75e-7 s each; rounded up).  With the fixed and
per-layer costs below, ``infer gpt2-small -P 24 -G 5 --measure cpu`` is estimated at 45 s and took 47.6 s
of wall time (interpreter start and imports included); Llama-3-8B on meta, 13 s estimated, 8.4 s taken.
A rough estimate, for a bound, not a prediction.  On meta nothing is initialised; on a GPU it is fast
next to the FLOPs."""

INFERENCE_SECONDS = (3.0, 0.05)
"""Seconds of a measured inference (``infer --measure``) beside its FLOPs and initialisation: fixed, and
per layer per pass (six passes: the prefill twice, the decode step four times).  Measured on meta:
gpt2-small (12 layers) 3.3 s in all, the interpreter's start and imports included."""

MAX_LIVE_SECONDS = 15 * 60
"""A live run estimated to take longer than this (15 minutes) is refused unless the caller allows it
(the CLI's ``--allow-long``: ``sweep`` with live points, ``infer --measure``)."""


def _tensor_sizes(cfg: ModelConfig, seq: int, batch: int, element: int) -> list[tuple[str, str, int, int]]:
    """(name, formula, elements, bytes per element) of the largest tensors a live run creates."""
    B, S, d, V = batch, seq, cfg.d_model, cfg.vocab_size
    act = max(element, 4)  # softmax and cross-entropy may work in fp32
    return [
        ("the attention scores", "B·heads·S²", B * cfg.num_heads * S * S, act),
        ("the causal mask", "S²", S * S, 1),
        ("the logits", "B·S·vocab", B * S * V, act),
        ("the FFN activations", "B·S·d_ff", B * S * cfg.d_ff, act),
        ("the query activations", "B·S·heads·head_dim", B * S * cfg.q_dim, act),
        ("the residual stream", "B·S·d_model", B * S * d, act),
        ("the token ids", "B·S", B * S, 8),
        ("the token embedding", "vocab·d_model", V * d, element),
        ("an FFN weight", "d_ff·d_model", cfg.d_ff * d, element),
        ("the query projection", "heads·head_dim·d_model", cfg.q_dim * d, element),
        ("the RoPE tables", "context_length·head_dim/2", cfg.context_length * (cfg.rope_dim // 2), 4),
        *_moe_and_mla_tensors(cfg, B * S, element, act),
    ]


def inference_tensors(cfg: ModelConfig, prompt: int, capacity: int, batch: int, element: int):
    """(name, formula, elements, bytes per element) of the largest tensors of a measured inference
    (``measure.inference``): the training step's at S = P (``_tensor_sizes``: scores, logits, weights...) and
    the static cache's: one layer's K (or MLA latent) for C = P + G slots, the prefill's scores over the
    cache and the slot mask (P × C)."""
    B, P, C = batch, prompt, capacity
    width = cfg.kv_cache_width if cfg.mla else cfg.kv_dim
    return _tensor_sizes(cfg, P, B, element) + [
        ("a layer's KV cache", "B·C·kv width", B * C * width, element),
        ("the scores over the cache", "B·heads·P·C", B * cfg.num_heads * P * C, max(element, 4)),
        ("the slot mask", "P·C", P * C, 1),
    ]


def _moe_and_mla_tensors(cfg: ModelConfig, tokens: int, element: int, act: int) -> list[tuple[str, str, int, int]]:
    """The stacked expert weights and their token rows; the latent-attention projections."""
    out = []
    if cfg.moe:
        k, E, f = cfg.experts_per_token, cfg.num_experts, cfg.expert_width
        out += [
            ("a stacked expert matrix", "experts·d_model·expert_d_ff", E * cfg.d_model * f, element),
            ("the routed token rows", "B·S·k·expert_d_ff", tokens * k * f, act),
            ("the shared experts' weight", "d_model·shared width", cfg.d_model * cfg.shared_width, element),
        ]
    if cfg.mla:
        kv_up = cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim)
        out += [
            ("the KV up-projection", "kv_lora_rank·heads·(d_nope + d_v)", cfg.kv_lora_rank * kv_up, element),
            ("the expanded keys and values", "B·S·heads·(d_nope + d_v)", tokens * kv_up, act),
            ("the KV down-projection", "d_model·(kv_lora_rank + d_rope)", cfg.d_model * cfg.kv_cache_width, element),
        ]
        if cfg.q_lora_rank is not None:
            out.append(("the Q up-projection", "q_lora_rank·heads·head_dim", cfg.q_lora_rank * cfg.q_dim, element))
    return out


def fmt_seconds(seconds: float) -> str:
    """A rough duration for an estimate: 45 s, 12 min, 3.5 h, 12 days."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:,.0f} days"


def estimate_live_seconds(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    device: str,
    *,
    counting: bool = False,
    backward: bool = False,
    training: bool = False,
) -> float:
    """Rough wall time of one live point: a cross-check (``counting``) and/or a measured step
    (``training``), from the per-layer costs above plus, off meta, the FLOPs at an assumed rate."""
    from ..analytic.flops import forward_flops

    seconds = 0.0
    flops = 0
    if counting:
        fixed, fwd, fwd_bwd = COUNTING_SECONDS
        seconds += fixed + cfg.num_layers * (fwd_bwd if backward else fwd)
        flops += (6 if backward else 2) * forward_flops(cfg, seq, batch).total  # fvcore + FlopCounterMode (+ bwd)
    if training:
        fixed, per_layer = TRAINING_SECONDS
        seconds += fixed + cfg.num_layers * per_layer
        flops += 2 * 3 * forward_flops(cfg, seq, batch).total  # warm-up step + measured step
    if device == "cpu":
        seconds += flops / CPU_FLOPS_PER_SECOND
    elif device == "cuda":
        seconds += flops / GPU_FLOPS_PER_SECOND
    return seconds


def estimate_inference_seconds(result, device: str) -> float:
    """Rough wall time of ``measure.inference.measure_inference(result, device)``: building the model
    (``CPU_INIT_SECONDS_PER_PARAMETER`` on cpu), the per-layer passes (``INFERENCE_SECONDS``) and, off
    meta, the FLOPs at ``CPU_FLOPS_PER_SECOND`` or ``GPU_FLOPS_PER_SECOND``: the prefill twice (counted,
    then tracked) and four decode steps, each priced as the last (the dearest)."""
    from ..analytic.params import parameter_breakdown

    cfg = result.config
    fixed, per_layer = INFERENCE_SECONDS
    seconds = fixed + 6 * cfg.num_layers * per_layer
    flops = 2 * result.prefill.total + 4 * result.decode_last
    if device == "cpu":
        seconds += parameter_breakdown(cfg).total * CPU_INIT_SECONDS_PER_PARAMETER + flops / CPU_FLOPS_PER_SECOND
    elif device == "cuda":
        seconds += flops / GPU_FLOPS_PER_SECOND
    return seconds


def check_tensors(what: str, sizes: list[tuple[str, str, int, int]]) -> None:
    """Refuse a run one of whose tensors, (name, formula, elements, bytes per element), would reach torch's
    storage limit (``TORCH_STORAGE_LIMIT``) on any device, meta included."""
    from ..units import fmt_sci

    for name, formula, numel, size in sizes:
        if numel * size >= TORCH_STORAGE_LIMIT:
            raise AccountingError(
                f"{what} cannot run: {name} ({formula} = {fmt_sci(numel)} elements × {size} bytes) would exceed "
                "torch's 2^63-byte limit for one tensor on any device; the analytic commands still count it"
            )


def check_host_layers(what: str, layers: int, per_layer: int, device: str) -> None:
    """Refuse a run whose ``layers`` live layers' Python objects would need more than ``MAX_HOST_BYTES`` of real
    host memory at ``per_layer`` bytes each (any device, meta included)."""
    host = layers * per_layer
    if host > MAX_HOST_BYTES:
        raise AccountingError(
            f"{what} would build {layers:,} live layers, about {fmt_bytes(host)} of host memory even on "
            f"{device} ({per_layer // 1000:,} KB per layer); the limit is {fmt_bytes(MAX_HOST_BYTES)} "
            f"({MAX_HOST_BYTES // per_layer:,} layers); the analytic commands still count it"
        )


LONG_RUNS: contextvars.ContextVar[bool] = contextvars.ContextVar("lm_accounting_long_runs", default=False)
"""Whether live runs estimated past ``MAX_LIVE_SECONDS`` may go ahead: set by ``long_runs_allowed``."""


@contextlib.contextmanager
def long_runs_allowed(allowed: bool = True) -> Iterator[None]:
    """Within the block, every ``check_live_run`` lets a run past the time bound go ahead (a command's
    ``--allow-long``: its measurement may build several runs, each checked where it is built)."""
    token = LONG_RUNS.set(allowed)
    try:
        yield
    finally:
        LONG_RUNS.reset(token)


def check_live_seconds(what: str, seconds: float, allow_long: bool, advice: str) -> None:
    """Refuse a live run estimated past ``MAX_LIVE_SECONDS`` unless ``allow_long`` (or ``long_runs_allowed``)."""
    if seconds > MAX_LIVE_SECONDS and not (allow_long or LONG_RUNS.get()):
        raise AccountingError(
            f"{what} would take about {fmt_seconds(seconds)} (estimated); the limit is "
            f"{fmt_seconds(MAX_LIVE_SECONDS)} (--allow-long lifts it); {advice}"
        )


def check_live_run(
    cfg: ModelConfig,
    seq: int,
    batch: int,
    device: str,
    what: str,
    *,
    backward: bool = False,
    training: bool = False,
    dtype: str = "fp32",
    optimizer: str = "foreach",
    need: int | None = None,
    allow_long: bool = False,
    extra_tensors: tuple[tuple[str, str, int, int], ...] = (),
) -> None:
    """Refuse, before any torch model is built, a live run that cannot exist or would blow up.

    ``training`` is a measured training step (``measure_step``); otherwise a FLOP-counting run
    (``crosscheck``; ``backward`` adds its backward pass).  ``what`` names the run in the message.
    Raises ``AccountingError`` when

    (a) any tensor of the run (and of ``extra_tensors``) would reach torch's storage limit (numel ×
        element size ≥ 2^63);
    (b) the run's per-layer Python objects would need more than ``MAX_HOST_BYTES`` of real host
        memory (any device, meta included; see the measured per-layer figures above);
    (c) on ``cpu``, the predicted peak (``predict_training_step(...).peak`` for a training step,
        ``counting_run_bytes`` for a counting run, ``need`` where given: one rank of a parallel layout)
        exceeds ``CPU_MEMORY_FRACTION`` of ``available_bytes`` (the least of MemAvailable, the rlimits
        and the cgroups' limits); on ``cuda``, it exceeds the GPU's free memory (``check_device_fits``);
    (d) ``cuda`` is asked for without a CUDA GPU;
    (e) it is estimated (``estimate_live_seconds``) to run past ``MAX_LIVE_SECONDS``, unless ``allow_long``.

    Also refuses bad arguments (an unknown device, dtype or optimizer, a non-positive or absurd
    ``seq``/``batch``, ``seq`` beyond ``cfg.context_length``, fused AdamW on meta).  Imports torch
    only for ``cuda``."""
    from ..config import check_positive_int
    from ..names import ADAMW_KWARGS, DEVICES, DTYPE_BYTES, TORCH_DTYPES

    if not isinstance(cfg, ModelConfig):
        raise AccountingError(f"{what}: expected a ModelConfig, got {type(cfg).__name__}")
    check_positive_int("seq", seq)
    check_positive_int("batch", batch)
    if device not in DEVICES:
        raise AccountingError(f"{what}: unknown device {device!r:.40} (choose from {', '.join(DEVICES)})")
    if dtype not in TORCH_DTYPES:
        raise AccountingError(f"{what}: unknown dtype {dtype!r:.40} (choose from {', '.join(TORCH_DTYPES)})")
    if optimizer not in ADAMW_KWARGS:
        raise AccountingError(f"{what}: unknown optimizer {optimizer!r:.40} (choose from {', '.join(ADAMW_KWARGS)})")
    if seq > cfg.context_length:
        raise AccountingError(
            f"{what}: sequence length {seq:,} exceeds the model's context_length "
            f"{cfg.context_length:,}; use cfg.with_context({seq})"
        )
    if training and optimizer == "fused" and device == "meta":
        raise AccountingError("fused AdamW has no meta kernels; use --optimizer for-loop or foreach with meta")
    check_tensors(what, _tensor_sizes(cfg, seq, batch, DTYPE_BYTES[dtype]) + list(extra_tensors))  # (a)
    per_layer = TRAINING_HOST_BYTES_PER_LAYER if training else COUNTING_HOST_BYTES_PER_LAYER
    check_host_layers(what, cfg.num_layers, per_layer, device)  # (b)
    if device != "meta":  # (c), (d) first: what cannot fit (no flag lifts it)
        if need is None and training:
            from ..analytic.replay import predict_training_step, replay_supported

            if replay_supported(cfg):
                need = predict_training_step(cfg, seq, batch, dtype, optimizer, mode="traced").peak  # as the tracker
            else:  # the architectures only the op library's program of our model replays (analytic.ops.course)
                from ..analytic.ops.course import predict_step
                from ..setup import TrainingSetup

                setup = TrainingSetup(precision="bf16" if DTYPE_BYTES[dtype] == 2 else "fp32", optimizer=optimizer)
                need = predict_step(cfg, seq, setup, batch=batch).at(batch).peak
        elif need is None:
            need = counting_run_bytes(cfg, seq, batch, backward)
        check_device_fits(device, need, what, "a smaller context or batch")
    seconds = estimate_live_seconds(
        cfg, seq, batch, device, counting=not training, backward=backward, training=training
    )
    advice = "use meta, fewer layers or a smaller context or batch; the analytic commands still count it"
    check_live_seconds(what, seconds, allow_long, advice)  # (e)
