"""vLLM's KV-cache sizing at start-up, as its V1 engine computes it: no torch, exact ints.

Source: vLLM v0.11.0 (commit f71952c1c), read from its released wheel:

1. ``v1/worker/gpu_worker.py`` ``Worker.init_device``: ``requested_memory = total_memory ×
   gpu_memory_utilization``, ``total_memory`` = ``torch.cuda.mem_get_info()[1]``, the CUDA total (taken
   after the CUDA context and NCCL exist, so neither counts against it).
2. ``determine_available_memory``: ``available = requested_memory − non_kv_cache_memory`` (or
   ``--kv-cache-memory`` as given), ``non_kv_cache_memory = weights + torch_peak_increase +
   non_torch_increase`` (``vllm/utils`` ``memory_profiling``).  CUDA graphs are captured after the cache
   is allocated and are not subtracted in v0.11 (v0.21+ estimates and subtracts them:
   ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS``): ``cuda_graphs`` here, default 0.
3. ``weights`` = torch bytes allocated while loading: the parameters and the rotary ``cos_sin_cache``
   (max_position_embeddings × rotary_dim in the model dtype).  Llama-3.1-8B: 8,030,261,248 × 2 +
   131,072 × 128 × 2 B = 14.9888 GiB, the figure its logs print ("Model loading took 14.9888 GiB").
4. ``torch_peak_increase``: what ``profile_run`` allocates above the weights.  It runs a forward of
   T = ``max_num_batched_tokens`` tokens split over R = min(T, ``max_num_seqs``) dummy requests with no
   attention metadata (the kernels return early), then the sampler on R rows: bf16 logits and their fp32
   copy (FlashInfer's top-k/top-p; ``v1/sample/sampler.py``), the T × d hidden states still alive.
   **An estimate**: vLLM measures it, under torch.compile's fusions; we take the larger of our replay
   of a T-token forward (``inference_memory.step_temporaries``, the head on one row) and the sampler's
   R·V·(e + 4) + (T + R)·d·e.  Published H100 runs of Llama-3-8B show 1.21-1.26 GiB.
5. ``non_torch_increase``: cuBLAS/NCCL workspaces made after the snapshot; measured by vLLM, an input
   here (``non_torch``, default ``DEFAULT_NON_TORCH`` = 0.1 GiB: v0.10.2 logged 0.07 GiB at tp 1).
6. The page (``v1/kv_cache_interface.py``): full attention ``2 · block · kv_heads/tp · head · bytes`` per
   layer; MLA ``block · (kv_lora_rank + qk_rope_head_dim) · bytes`` (one latent "head", no 2, replicated
   under tp).  Block size 16 (``platforms/cuda.py``), 64 with MLA (FlashMLA, Hopper's default backend).
7. Blocks (``v1/core/kv_cache_utils.py``): the layers are grouped by spec; with full and windowed layers
   mixed (``_get_kv_cache_groups_uniform_page_size``) the group size is the smaller layer count and each
   kind splits into ⌈n / size⌉ groups sharing one pool.  ``num_blocks = available // page // group_size``;
   "GPU KV cache size" = num_blocks // groups × block tokens; "Maximum concurrency for N tokens" =
   num_blocks / Σ_groups blocks a request needs (full: ⌈N / block⌉; windowed: ⌈min(w − 1 + T, N) / block⌉
   + 1, ``SlidingWindowSpec.max_memory_usage_bytes``).
8. Defaults (``engine/arg_utils.py`` ``_set_default_args``, the OpenAI server): a GPU of ≥ 70 GiB other
   than an A100: T 8,192, 1,024 sequences; otherwise T 2,048, 256.  ``gpu_memory_utilization`` 0.9.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from ..config import AccountingError, ModelConfig
from ..gpus import GIB, GPU
from ..names import DTYPE_BYTES
from . import inference as inf
from .inference_memory import step_temporaries

DEFAULT_UTILIZATION = Fraction(9, 10)
DEFAULT_NON_TORCH = GIB // 10
"""vLLM's non-torch increase at tp 1: 0.07 GiB logged by v0.10.2 on an H100 (llava-v1.6-mistral-7b); V0
logs show 0.16-0.35 GiB.  A labelled input (``--non-torch``)."""


def default_limits(g: GPU) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of ``vllm serve``: (8,192, 1,024) on a GPU of ≥ 70 GiB that
    is not an A100, else (2,048, 256) (``_set_default_args``; the ``LLM`` class doubles the tokens)."""
    big = g.cuda_total >= 70 * GIB and not g.name.startswith("a100")
    return (8192, 1024) if big else (2048, 256)


@dataclass(frozen=True)
class VllmSizing:
    """What vLLM logs at start-up for one model on one GPU (module docstring)."""

    total: int
    utilization: Fraction
    requested: int
    weights: int
    rope_cache: int
    activation_forward: int
    activation_sampler: int
    non_torch: int
    cuda_graphs: int
    kv_cache_memory: int  # available for the cache
    kv_cache_memory_given: bool
    block_size: int
    page_bytes: int  # one block of one layer
    group_size: int
    groups: int
    kv_cache_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float
    max_num_batched_tokens: int
    max_num_seqs: int
    request_blocks: int  # blocks one request of P + G − 1 positions needs
    requests_at_prompt: int  # such requests the pool holds at once
    starts: bool
    problem: str | None

    @property
    def activation_peak(self) -> int:
        return max(self.activation_forward, self.activation_sampler)

    @property
    def shortfall(self) -> int:
        """Bytes missing before the cache gets any (0 when ``kv_cache_memory`` is positive)."""
        return max(0, -self.kv_cache_memory)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "utilization"}
        return {"engine": "vllm", "gpu_memory_utilization": float(self.utilization), **out,
                "activation_peak": self.activation_peak, "shortfall": self.shortfall}  # fmt: skip


def _page(cfg: ModelConfig, block: int, kv_dtype: str, tp: int) -> int:
    e = DTYPE_BYTES[inf.KV_DTYPES[kv_dtype]]
    if cfg.mla:
        return block * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * e
    return 2 * block * max(1, cfg.kv_heads // tp) * cfg.d_head * e


def _groups(cfg: ModelConfig) -> tuple[int, list[bool]]:
    """(group size, one flag per group: windowed) of vLLM's grouping (module docstring, 7)."""
    windowed, full = cfg.windowed_layers, cfg.num_layers - cfg.windowed_layers
    if not windowed or not full:
        return cfg.num_layers, [bool(windowed)]
    size = min(windowed, full)
    return size, [False] * -(-full // size) + [True] * -(-windowed // size)


def _blocks_for(cfg: ModelConfig, groups: list[bool], tokens: int, batched: int, block: int) -> int:
    """Blocks one request of ``tokens`` positions needs, over the groups (module docstring, 7)."""
    need = 0
    for windowed in groups:
        if windowed:
            need += -(-min(cfg.sliding_window - 1 + batched, tokens) // block) + 1
        else:
            need += -(-tokens // block)
    return need


@dataclass(frozen=True)
class VllmOptions:
    """vLLM's start-up flags (None: vLLM's default) and the two figures it measures that we cannot derive."""

    max_model_len: int | None = None  # the model's context
    utilization: Fraction = DEFAULT_UTILIZATION  # --gpu-memory-utilization
    max_num_seqs: int | None = None  # default_limits
    max_num_batched_tokens: int | None = None  # default_limits
    non_torch: int = DEFAULT_NON_TORCH  # measured by vLLM; an input here
    cuda_graphs: int = 0  # subtracted by vLLM >= 0.21 only (its estimate); an input here
    kv_cache_memory: int | None = None  # --kv-cache-memory: the pool as given, no profiling
    block_size: int | None = None  # inference.engine_block


STARTUP_USED = 53 * GIB // 100
"""What the CUDA context and NCCL hold when vLLM checks its free memory at start-up: 79.19 − 78.66 = 0.53 GiB in
a published v0.10.2 H100 log ("Free memory on device (78.66/79.19 GiB) on startup").  ``Worker.init_device``
stops when free memory is below total × utilisation: --gpu-memory-utilization 1 never starts."""


def _layer_bytes(cfg: ModelConfig, tokens: int, batched: int, block: int, page: int) -> int:
    """What ``check_enough_kv_cache_memory`` needs for one request of ``tokens``: Σ over layers of each spec's
    ``max_memory_usage_bytes`` (full: ⌈tokens / block⌉ pages; windowed: ⌈min(w − 1 + T, tokens) / block⌉ + 1),
    no group padding."""
    full = -(-tokens // block)
    window = -(-min(cfg.sliding_window - 1 + batched, tokens) // block) + 1 if cfg.sliding_window else 0
    return page * ((cfg.num_layers - cfg.windowed_layers) * full + cfg.windowed_layers * window)


def _problem(cfg, g: GPU, requested, weights, activations, available, given, max_model_len, T, block, page):
    """Why vLLM would not start (None: it starts): the start-up memory check, no memory left, a given cache
    that does not fit beside the weights, or one request of --max-model-len that does not fit the cache."""
    free = g.cuda_total - STARTUP_USED
    if not given and requested > free:
        return (
            f"the free memory at start-up (about {free / GIB:,.2f} GiB: the CUDA context and NCCL hold about 0.53 "
            f"GiB) is below --gpu-memory-utilization × total ({requested / GIB:,.2f} GiB): vLLM stops ('Free "
            "memory on device ... is less than desired GPU memory utilization')"
        )
    if available <= 0:
        return "no memory is left for the cache: vLLM stops ('No available memory for the cache blocks')"
    if given and weights + activations + available > free:
        return (
            f"the weights ({weights / GIB:,.2f} GiB), the activations and the given cache ({available / GIB:,.2f} "
            f"GiB) exceed the {free / GIB:,.2f} GiB free at start-up: out of memory"
        )
    if _layer_bytes(cfg, max_model_len, T, block, page) > available:
        lo, hi = 0, max_model_len  # the longest length that fits (monotone: bisection), estimate_max_model_len
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if _layer_bytes(cfg, mid, T, block, page) <= available else (lo, mid - 1)
        longest = f"the longest that fits is about {lo:,} tokens" if lo else "not one block fits"
        return (
            f"one request of --max-model-len {max_model_len:,} needs "
            f"{_layer_bytes(cfg, max_model_len, T, block, page) / GIB:,.2f} GiB of cache and "
            f"{available / GIB:,.2f} GiB is available: vLLM stops at start-up; {longest}"
        )
    return None


def check_no_hybrid(cfg: ModelConfig, engine: str) -> None:
    """A Gated DeltaNet hybrid is refused: the engines keep its linear layers' states in a separate pool (vLLM's
    hybrid KV-cache manager, SGLang's mamba pool), which this arithmetic does not model; so is a DeepSeek Sparse
    Attention model, whose indexer keys the engines also keep apart."""
    if cfg.hybrid:
        raise AccountingError(
            f"--engine {engine}: {cfg.name}'s Gated DeltaNet layers keep their states in the engine's separate "
            "pool, which lm-accounting does not model; without --engine, infer gives the cache transformers holds"
        )
    if cfg.mamba_layers or cfg.ssm_layers:  # vLLM's and SGLang's mamba state pools
        raise AccountingError(
            f"--engine {engine}: {cfg.name}'s Mamba layers keep their states in the engine's separate pool, which "
            "lm-accounting does not model; without --engine, infer gives the cache transformers holds"
        )
    if cfg.short_conv_layers:  # vLLM's and SGLang's short-conv state pools (LFM2)
        raise AccountingError(
            f"--engine {engine}: {cfg.name}'s short-convolution layers keep their states in the engine's separate "
            "pool, which lm-accounting does not model; without --engine, infer gives the cache transformers holds"
        )
    if cfg.indexer:  # vLLM and SGLang keep DSA's indexer keys in a pool of their own (fp8 with scales)
        raise AccountingError(
            f"--engine {engine}: {cfg.name}'s sparse-attention indexer keeps its keys in the engine's own pool, "
            "which lm-accounting does not model; without --engine, infer gives the cache transformers holds"
        )


def vllm_sizing(
    cfg: ModelConfig, g: GPU, options: VllmOptions, *, weights: str, kv_dtype: str, tp: int, prompt: int, generate: int
) -> VllmSizing:
    """vLLM's start-up arithmetic for ``cfg`` (module docstring); refusals before any work."""
    check_no_hybrid(cfg, "vllm")
    o = options
    max_model_len, utilization = o.max_model_len, o.utilization
    max_num_seqs, max_num_batched_tokens = o.max_num_seqs, o.max_num_batched_tokens
    non_torch, cuda_graphs, kv_cache_memory, block_size = o.non_torch, o.cuda_graphs, o.kv_cache_memory, o.block_size
    max_model_len = cfg.context_length if max_model_len is None else max_model_len
    if not 0 < utilization <= 1:
        raise AccountingError(f"--gpu-memory-utilization {float(utilization)} is outside (0, 1]")
    if max_model_len > cfg.context_length:
        raise AccountingError(
            f"--max-model-len {max_model_len:,} exceeds {cfg.name}'s context of {cfg.context_length:,} tokens "
            f"(vLLM refuses it too); add --context {max_model_len} to analyse a longer one"
        )
    if prompt + generate > max_model_len:
        raise AccountingError(
            f"prompt {prompt:,} + generate {generate:,} = {prompt + generate:,} tokens exceed --max-model-len "
            f"{max_model_len:,} (vLLM rejects such a request)"
        )
    if kv_dtype not in inf.KV_DTYPES:
        raise AccountingError(f"vLLM's KV cache is fp32, bf16 or fp8, not '{kv_dtype}'")
    tokens_default, seqs_default = default_limits(g)
    T = tokens_default if max_num_batched_tokens is None else max_num_batched_tokens
    if max_num_seqs is not None and max_num_seqs > T:
        raise AccountingError(
            f"max_num_batched_tokens ({T:,}) must be greater than or equal to max_num_seqs ({max_num_seqs:,}): "
            "vLLM's own refusal (SchedulerConfig)"
        )
    seqs = min(seqs_default, T) if max_num_seqs is None else max_num_seqs  # a default never exceeds T
    R = min(T, seqs)
    e = 4 if weights == "fp32" else 2  # the model dtype: activations and the rotary cache
    rope = cfg.context_length * cfg.rope_dim * e if cfg.positions == "rope" else 0
    w = inf.weights_bytes(cfg, weights, tp) + rope
    forward = step_temporaries(cfg, 1, T, [T] * cfg.num_layers, e, prefill=True, attention="sdpa", cuda=True,
                               last_logits=True)  # fmt: skip
    sampler = R * cfg.vocab_size * (e + 4) + (T + R) * cfg.d_model * e
    total = g.cuda_total
    requested = int(total * utilization)
    given = kv_cache_memory is not None
    available = kv_cache_memory if given else requested - w - max(forward, sampler) - non_torch - cuda_graphs
    block = inf.engine_block(cfg, g.name) if block_size is None else block_size
    page = _page(cfg, block, kv_dtype, tp)
    size, groups = _groups(cfg)
    blocks = max(available, 0) // page // size
    per_request = _blocks_for(cfg, groups, max_model_len, T, block)
    need = _blocks_for(cfg, groups, prompt + generate - 1, T, block)
    problem = _problem(cfg, g, requested, w, max(forward, sampler) + non_torch + cuda_graphs, available, given,
                       max_model_len, T, block, page)  # fmt: skip
    return VllmSizing(
        total=total, utilization=utilization, requested=requested, weights=w, rope_cache=rope,
        activation_forward=forward, activation_sampler=sampler, non_torch=non_torch, cuda_graphs=cuda_graphs,
        kv_cache_memory=available, kv_cache_memory_given=given, block_size=block, page_bytes=page,
        group_size=size, groups=len(groups), kv_cache_blocks=blocks, kv_cache_tokens=blocks // len(groups) * block,
        max_model_len=max_model_len, blocks_per_request=per_request, max_concurrency=blocks / per_request,
        max_num_batched_tokens=T, max_num_seqs=seqs, request_blocks=need, requests_at_prompt=blocks // need,
        starts=problem is None, problem=problem,
    )  # fmt: skip


# -- SGLang ---------------------------------------------------------------------------------------------------------

SGLANG_SOURCE = (
    "sglang 0.5.23 srt/mem_cache/kv_cache_configurator.py _profile_available_bytes: rest_memory = "
    "available_gpu_memory - pre_model_load_memory * (1 - mem_fraction_static); the cell "
    "(srt/model_executor/pool_configurator.py _compute_cell_size): MHA kv_heads/tp · (head_dim + v_head_dim) · "
    "layers · bytes, MLA (kv_lora_rank + qk_rope_head_dim) · layers · bytes"
)


@dataclass(frozen=True)
class SglangOptions:
    """SGLang's ``--mem-fraction-static``: required, since its default depends on the version, the GPU and the CUDA
    graph settings (0.5.23 derives it from the chunked-prefill size and the graphs' batch sizes); its log prints it."""

    mem_fraction_static: Fraction


@dataclass(frozen=True)
class SglangSizing:
    """What SGLang logs when it allocates its KV pool ("KV Cache is allocated. #tokens: N, K size: x GB, V size: y
    GB"), from ``SGLANG_SOURCE``'s formula.  ``pre_load_free``: the free memory before the weights load (the CUDA
    total less the context and NCCL, ``STARTUP_USED``, assumed as for vLLM)."""

    total: int
    mem_fraction_static: Fraction
    pre_load_free: int
    weights: int
    slack: int  # pre_load_free · (1 − mem_fraction_static): left for activations and CUDA graphs
    kv_cache_memory: int
    cell_bytes: int  # one token over every layer of this rank
    kv_cache_tokens: int
    k_bytes: int
    v_bytes: int
    request_tokens: int  # P + G − 1 positions of one request (SGLang allocates token by token)
    requests_at_prompt: int
    starts: bool
    problem: str | None

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "mem_fraction_static"}
        return {"engine": "sglang", "mem_fraction_static": float(self.mem_fraction_static), **out}


def sglang_sizing(
    cfg: ModelConfig, g: GPU, options: SglangOptions, *, weights, kv_dtype: str, tp: int, prompt: int, generate: int
) -> SglangSizing:
    """SGLang's KV pool for ``cfg`` (``SglangSizing``); refusals before any work."""
    check_no_hybrid(cfg, "sglang")
    mfs = options.mem_fraction_static
    if not 0 < mfs < 1:
        raise AccountingError(f"--mem-fraction-static {float(mfs)} is outside (0, 1)")
    if kv_dtype not in inf.KV_DTYPES:
        raise AccountingError(f"SGLang's KV cache is fp32, bf16 or fp8, not '{kv_dtype}'")
    e = DTYPE_BYTES[inf.KV_DTYPES[kv_dtype]]
    if cfg.mla:
        k_width, v_width = cfg.kv_lora_rank + cfg.qk_rope_head_dim, 0
    else:
        heads = max(1, cfg.kv_heads // tp)
        k_width, v_width = heads * cfg.d_head, heads * cfg.d_head
    cell = (k_width + v_width) * cfg.num_layers * e
    pre = g.cuda_total - STARTUP_USED
    w = inf.weights_bytes(cfg, weights, tp)
    slack = int(pre * (1 - mfs))
    available = pre - w - slack
    tokens = max(available, 0) // cell
    need = prompt + generate - 1
    problem = None
    if tokens < need:
        problem = (
            f"the pool holds {tokens:,} tokens, fewer than one request's {need:,}: SGLang stops ('Not enough memory'; "
            "raise --mem-fraction-static)"
            if available > 0
            else "no memory is left for the KV pool: SGLang stops ('Not enough memory'; raise --mem-fraction-static)"
        )
    k_bytes = tokens * k_width * cfg.num_layers * e
    return SglangSizing(
        total=g.cuda_total, mem_fraction_static=mfs, pre_load_free=pre, weights=w, slack=slack,
        kv_cache_memory=available, cell_bytes=cell, kv_cache_tokens=tokens, k_bytes=k_bytes,
        v_bytes=tokens * v_width * cfg.num_layers * e, request_tokens=need, requests_at_prompt=tokens // need,
        starts=problem is None, problem=problem,
    )  # fmt: skip
