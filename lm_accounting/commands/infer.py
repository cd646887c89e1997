"""``infer``: serving one model: prefill and decode FLOPs, KV cache, memory per GPU, how many sequences
fit, and the roofline (analytic, exact); ``measure`` runs the live model with a static KV cache.

The budget per GPU is ``gpus.memory_budget`` (the GPU's CUDA total less the allowance, or ``budget`` as
given), the rule of ``memory`` and ``plan`` too.  A batch over the budget is an answer, not a refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..analytic.engine_sizing import SglangOptions, VllmOptions
from ..analytic.inference_report import Inference, check_infer, check_weights, infer
from ..analytic.sizes import at_context
from ..config import AccountingError, ModelConfig
from ..gpus import DEFAULT_GPU, MemoryBudget, memory_budget
from ..gpus import gpu as lookup_gpu
from ..names import MEASURE_CHOICES


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    prompt: int
    generate: int
    batch: int = 1
    context: int | None = None
    weights: str = "bf16"
    kv_dtype: str = "bf16"
    gpu: str = DEFAULT_GPU
    tp: int = 1
    allowance: int | None = None  # default gpus.DEFAULT_ALLOWANCE
    budget: int | None = None  # the usable bytes per GPU, as given (no allowance subtracted)
    semantics: str = "filled"
    attention: str | None = None  # None: inference.default_attention(semantics)
    program: str | None = None  # None: inference.default_program(semantics, attention)
    engine: VllmOptions | SglangOptions | None = None  # --engine vllm|sglang and its options
    compute: str | None = None  # None: inference.COMPUTE's first for the weights (fp8, int8: w8a8)
    group_size: int | None = None  # int4: weights per scale and zero-point (None: 128)
    quantize_embeddings: bool = False
    efficiency: float | None = None  # the realistic figure's fraction (None: the GPU's calibration)
    measure: str = "none"
    allow_long: bool = False  # a measurement estimated past measure.devices.MAX_LIVE_SECONDS
    budget_basis: MemoryBudget = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.measure not in MEASURE_CHOICES:
            raise AccountingError(f"unknown --measure '{self.measure}' (valid: {', '.join(MEASURE_CHOICES)})")
        run = at_context(self.config, self.context)
        check_infer(
            run, self.prompt, self.generate, self.batch, self.weights, self.kv_dtype, self.tp, self.semantics,
            self.attention, self.device, self.program,
        )  # fmt: skip
        object.__setattr__(self, "budget_basis", memory_budget(self.gpu, self.allowance, self.budget))
        check_weights(run, self.weights, self.compute, lookup_gpu(self.gpu), self.group_size, self.quantize_embeddings)

    @property
    def device(self) -> str:
        """Whose kernels the temporaries are: a GPU's, or the CPU flash kernel's for a meta/cpu measurement."""
        return self.measure if self.measure in ("meta", "cpu") else "cuda"


def run(request: Request) -> Inference:
    r = request
    return infer(
        r.config, r.prompt, r.generate, r.batch, weights=r.weights, kv_dtype=r.kv_dtype, gpu=r.gpu, tp=r.tp,
        budget=r.budget_basis, semantics=r.semantics, context=r.context, attention=r.attention, device=r.device,
        program=r.program, engine=r.engine, compute=r.compute, group_size=r.group_size,
        quantize_embeddings=r.quantize_embeddings, efficiency=r.efficiency,
    )  # fmt: skip


def measure(request: Request, result: Inference, note: Callable[[str], None] | None = None) -> Inference:
    """``result`` with the live model's FLOPs, cache bytes and memory; ``note`` receives the estimated time
    and memory before the run.  A cuda run over the budget, or one estimated too long, is refused."""
    from ..measure.inference import check_measure_time, measure_inference

    r = request
    if r.measure == "none":
        return result
    if r.measure == "cuda" and result.over_budget:  # meta allocates nothing; cpu is bounded by measure.devices
        raise AccountingError(f"not measured on cuda: {result.over_budget}")
    estimate = check_measure_time(result, r.measure, r.allow_long)
    if note is not None:
        note(estimate)
    return result.with_measurement(measure_inference(result, device=r.measure))
