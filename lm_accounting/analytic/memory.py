"""Analytic memory: weights, model states, AdamW temporaries and the KV cache.

Every figure is an exact int of bytes.  Sources, by section:

* bytes per element: IEEE 754 binary32/binary16 and bfloat16 storage sizes (``names.DTYPE_BYTES``);
* KV cache: one key and one value vector of ``kv_heads * d_head`` per layer per cached token:
  2 · layers · n_kv · head_dim · S · batch · bytes;
* model states and the optimizer step: torch 2.13, ``torch/optim/adamw.py`` (``AdamW`` is
  ``Adam`` with ``decoupled_weight_decay=True``) and ``torch/optim/adam.py``
  (``Adam._init_group``, ``_single_tensor_adam``, ``_multi_tensor_adam``, ``_fused_adam``), over the parameter
  tensors of the implementation that trains (ours, or transformers' fused ones: ``hf_tensors``);
* the course convention and Korthikanti et al. are in ``course.py``; the
  implementation-exact activations of our live model in ``activations.py`` and ``replay.py``.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..breakdown import Breakdown, Item
from ..config import AccountingError, ModelConfig
from ..names import ADAMW_IMPLS, DEVICES, DTYPE_BYTES, TRAINING_DTYPES
from .hf_tensors import hf_parameter_tensor_count, hf_parameter_tensor_sizes
from .kv_cache import linear_state_bytes, windowed_kv_cache_bytes
from .params import frozen_parameter_count, parameter_breakdown


def weight_bytes(n_params: int, dtype: str) -> int:
    """Bytes to hold ``n_params`` parameters in ``dtype``."""
    return n_params * DTYPE_BYTES[dtype]


def kv_cache_bytes(cfg: ModelConfig, seq: int, batch: int, dtype: str) -> int:
    """K and V for every layer and cached token: 2 · L · kv_heads · d_head · S · B · bytes, a windowed
    layer keeping only its window (``kv_cache.windowed_kv_cache_bytes``); a Gated DeltaNet hybrid's attention
    layers only, plus its linear layers' conv and recurrent states (``kv_cache.linear_state_bytes``)."""
    return windowed_kv_cache_bytes(cfg, seq, batch, dtype) + linear_state_bytes(cfg, batch, dtype)


# -- model states and the AdamW step -------------------------------------------


def _training_dtype_bytes(dtype: str) -> int:
    if dtype not in TRAINING_DTYPES:
        raise AccountingError(f"unknown training dtype '{dtype}' (valid: {', '.join(TRAINING_DTYPES)})")
    return DTYPE_BYTES[dtype]


def parameter_tensor_sizes(
    cfg: ModelConfig, layers: Iterable[int] | None = None, implementation: str = "course", trained: bool = False
) -> list[int]:
    """numel of each parameter tensor, in the live model's ``model.parameters()`` order (``implementation``
    "transformers": transformers' model's, ``hf_tensors``, with its fused projections and experts).

    ``parameter_breakdown`` lists the components in the model's registration order (token_embeddings
    [, position_embeddings]; per layer ln1, attention projections [and biases, qk norms], ln2, the FFN or
    the mixture of experts; ln_final; lm_head); each is one tensor (a LayerNorm two: gain and bias,
    ``Component.tensors``), and block ``i`` holds the components with ``Component.in_layer(cfg, i)``.
    A tied lm_head is the embedding's tensor, which ``parameters()`` yields once.  ``layers`` lists
    only those blocks (default: all; ``scan_layers`` for huge models).  ``trained``: only the tensors with a
    gradient (AdamW's; a frozen one, ``Component.frozen``, has none).
    """
    from ..components import component

    if implementation == "transformers":
        return hf_parameter_tensor_sizes(cfg, layers, trained)
    items = list(parameter_breakdown(cfg))
    entries = [(it, component(it.key)) for it in items if not (trained and component(it.key).frozen)]

    def tensors(it, c, n):
        k = c.tensors(cfg)
        return [n // k] * k

    first = next((i for i, (it, _) in enumerate(entries) if it.per_layer is not None), len(entries))
    sizes = [n for it, c in entries[:first] for n in tensors(it, c, it.total)]
    for i in range(cfg.num_layers) if layers is None else layers:
        sizes += [
            n
            for it, c in entries
            if it.per_layer is not None and c.in_layer(cfg, i)
            for n in tensors(it, c, it.per_layer)
        ]
    sizes += [n for it, c in entries[first:] if it.per_layer is None and it.total for n in tensors(it, c, it.total)]
    return sizes


def scan_layers(cfg: ModelConfig) -> list[int]:
    """Blocks that contain every adjacent pair of parameter tensors the model has (for a scan over pairs
    without listing 10^18 layers): all layers of a model of at most 256; else the first m and the last t,
    where block kinds (dense or mixture of experts) repeat with period ``moe_every`` from
    ``dense_layers_first`` on, and the last part starts in the same phase as block m, so the one false
    neighbour pair (m − 1, L − t) has the kinds of the real pair (m − 1, m)."""
    L = cfg.num_layers
    if L <= 256:
        return list(range(L))
    every = cfg.moe_every if cfg.moe else 1
    m = min(cfg.dense_layers_first, L) + 2 * every + 2
    t = 2 * every + 2
    t += (L - t - m) % every  # L − t ≡ m (mod every)
    return list(range(m)) + list(range(L - t, L))


def model_state_breakdown(cfg: ModelConfig, dtype: str = "fp32", fp32_kept: int = 0) -> Breakdown:
    """Parameters, gradients and AdamW's two moments, in bytes: 4 · N · bytes(dtype) in all.

    Assumption: pure-dtype training as ``torch.optim.AdamW`` does it.  ``p.grad`` has the
    parameter's dtype, and ``Adam._init_group`` creates ``exp_avg`` and ``exp_avg_sq`` with
    ``torch.zeros_like(p)``, so both moments have it too (no fp32 master copy: that is
    mixed precision, a different recipe).  AdamW's per-tensor ``step`` counters are not
    model states of N; they are ``adamw_step_counter_bytes``, and they count only on the
    device that holds them.  A tied weight is one parameter, with one gradient and one
    pair of moments.

    * ``parameters``        N · bytes
    * ``gradients``         N · bytes
    * ``adamw.exp_avg``     N · bytes (first moment m)
    * ``adamw.exp_avg_sq``  N · bytes (second moment v)

    ``fp32_kept``: trained parameters an implementation keeps in fp32 whatever ``dtype`` (transformers' DeepSeek
    routers, ``_keep_in_fp32_modules_strict``: ``ops.transformers.fp32_kept_parameters``); each of the four
    then holds K·4 + (N − K)·bytes."""
    nbytes = _training_dtype_bytes(dtype)
    n = parameter_breakdown(cfg).total
    kept = fp32_kept if nbytes != 4 else 0
    extra = kept * (4 - nbytes)
    per = n * nbytes + extra
    formula = f"N·{nbytes}" + (f" + {kept:,}·{4 - nbytes} (fp32 kept)" if kept else "")
    frozen = frozen_parameter_count(cfg)  # no gradient, no moments (requires_grad=False)
    trained = (n - frozen) * nbytes + extra
    trained_formula = f"(N − frozen)·{nbytes}" + (f" + {kept:,}·{4 - nbytes} (fp32 kept)" if kept else "")
    trained_formula = trained_formula if frozen else formula
    what = f"{dtype}; {kept:,} kept fp32" if kept else dtype
    items = (
        Item("parameters", f"parameters ({what})", "parameters", per, None, formula),
        Item("gradients", f"gradients ({what})", "gradients", trained, None, trained_formula),
        Item("adamw.exp_avg", f"AdamW first moment m ({what})", "optimizer", trained, None, trained_formula),
        Item("adamw.exp_avg_sq", f"AdamW second moment v ({what})", "optimizer", trained, None, trained_formula),
    )
    return Breakdown(f"model states ({dtype}, AdamW)", "bytes", items)


def parameter_tensor_count(cfg: ModelConfig, implementation: str = "course", trained: bool = False) -> int:
    """Tensors ``model.parameters()`` yields: ``len(parameter_tensor_sizes(cfg, implementation=...))``,
    without listing the layers: a per-layer component occurs in total / per_layer blocks.  ``trained``: only
    those with a gradient (AdamW's state: not a frozen one, ``Component.frozen``)."""
    from ..components import component

    if implementation == "transformers":
        return hf_parameter_tensor_count(cfg, trained)
    count = 0
    for it in parameter_breakdown(cfg):
        if trained and component(it.key).frozen:
            continue
        k = component(it.key).tensors(cfg)
        if it.per_layer is not None:
            count += k * (it.total // it.per_layer) if it.per_layer else 0
        elif it.total:  # embedding, position table, ln_final, untied lm_head
            count += k
    return count


ADAMW_STEP_COUNTER_BYTES = 4
"""One 0-dim float32 ``step`` tensor per parameter tensor.  torch 2.13 ``torch/optim/adam.py``
``Adam._init_group``: ``torch.tensor(0.0, dtype=_get_scalar_dtype(), device="cpu")``, or with
``fused``/``capturable`` ``torch.zeros((), dtype=_get_scalar_dtype(is_fused=...), device=p.device)``;
``torch/optim/optimizer.py`` ``_get_scalar_dtype`` is float32 (4 bytes) for fused and whenever
the default dtype is not float64 (we never change it)."""


def adamw_step_counter_bytes(
    cfg: ModelConfig, impl: str = "foreach", device: str = "meta", *, implementation: str = "course"
) -> int:
    """Bytes of AdamW's ``step`` counters that live on ``device`` (the device holding the model), for the
    parameter tensors of ``implementation``'s model (``--impl``: transformers' GPT-2 has 148, ours 196).

    Rule (torch 2.13 ``Adam._init_group``, "special device hosting for step"): the for-loop
    and foreach implementations keep every counter on the CPU, whatever the parameters'
    device; fused (and capturable) keeps it on the parameter's device.  So, with n =
    ``parameter_tensor_count(cfg, implementation)``:

    * ``cpu``: 4·n for every implementation (the counters sit beside the parameters);
    * ``meta`` and ``cuda``: 4·n for fused, 0 for for-loop and foreach (their counters are on
      the CPU, which the device's tracker or allocator does not see).

    The counters exist from the first step on and are only updated in place
    (``step_t += 1``; ``_foreach_add_``), so they add 4·n to the baseline and to every phase.
    Foreach on the CPU also makes a 4-byte ``torch.tensor(1.0)`` for ``_foreach_add_`` and
    drops it at once; it never sets the step's peak (the sqrt copy of v is >= 4 bytes).
    On CUDA the caching allocator rounds each counter up to 512 bytes; like every other
    tensor here, the counter is counted at its own size.
    """
    if impl not in ADAMW_IMPLS:
        raise AccountingError(f"unknown AdamW implementation '{impl}' (valid: {', '.join(ADAMW_IMPLS)})")
    if device not in DEVICES:
        raise AccountingError(f"unknown device '{device}' (valid: {', '.join(DEVICES)})")
    on_device = impl == "fused" or device == "cpu"
    return ADAMW_STEP_COUNTER_BYTES * parameter_tensor_count(cfg, implementation, trained=True) if on_device else 0


def adamw_step_temporary_bytes(
    cfg: ModelConfig, dtype: str = "fp32", impl: str = "foreach", *, implementation: str = "course", fp32_kept: int = 0
) -> int:
    """Peak extra bytes alive during ``AdamW.step()`` beyond params + grads + m + v, over the parameter
    tensors of ``implementation``'s model (``--impl``; the for-loop's figure depends on them).

    Read off torch 2.13's ``torch/optim/adam.py`` (AdamW's implementation; weight decay is
    decoupled, ``param.mul_(1 - lr·λ)`` in place, so no copy of the gradient is made)
    and confirmed with an exact allocation tracker:

    * ``foreach`` (``_multi_tensor_adam``; the default on CUDA): ``exp_avg_sq_sqrt =
      torch._foreach_sqrt(device_exp_avg_sqs)`` makes one copy of v for ALL parameters
      at once, then divides/adds/addcdivs in place: N · bytes (20 vs 16 B/param at fp32).
    * ``for-loop`` (``_single_tensor_adam``, ``foreach=False``; the default on cpu and
      meta): per tensor i, ``denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps)`` holds the
      sqrt result and the quotient together, while the previous tensor's ``denom`` is
      still referenced by the loop variable: max_i (n_{i-1} + 2·n_i) · bytes over
      ``parameter_tensor_sizes`` (n_{-1} = 0).
    * ``fused`` (``_fused_adam``, one kernel per tensor list): 0.
    """
    nbytes = _training_dtype_bytes(dtype)
    if impl not in ADAMW_IMPLS:
        raise AccountingError(f"unknown AdamW implementation '{impl}' (valid: {', '.join(ADAMW_IMPLS)})")
    if impl == "foreach":  # the trained tensors' v (a frozen parameter has none); fp32-kept ones: their own group,
        # whose sqrt is still bound when the next group's is made (``ops.step.adamw_step``)
        kept = fp32_kept if nbytes != 4 else 0
        return (parameter_breakdown(cfg).total - frozen_parameter_count(cfg)) * nbytes + kept * (4 - nbytes)
    if impl == "fused":
        return 0
    sizes = parameter_tensor_sizes(cfg, scan_layers(cfg), implementation, trained=True)  # every adjacent pair
    previous = [0] + sizes[:-1]
    return max(prev + 2 * cur for prev, cur in zip(previous, sizes, strict=True)) * nbytes
