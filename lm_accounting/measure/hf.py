"""transformers' own model, one training step measured: the measured side of ``--impl transformers``.

``build_hf_step`` builds the library's class for ``cfg.hf_model_type``, ``AutoModelForCausalLM.from_config(
AutoConfig.for_model(**hf_config.to_hf_dict(cfg)), attn_implementation=...)``, on meta, cpu or cuda, and
runs it as transformers' ``Trainer`` does (transformers 5.x, ``trainer.py``):

* ``use_cache = False``: the Trainer sets ``model.config.use_cache = args.use_cache`` (default False,
  ``training_args.py``) at the end of ``__init__``; no KV cache is built in training.
* the loss is the model's own, ``model(input_ids=..., labels=...).loss`` (``ForCausalLMLoss``: the logits
  upcast to fp32 before the cross-entropy), the output object dropped before ``backward()`` as
  ``Trainer.compute_loss`` returns only the loss.  No ``attention_mask``: one unpadded sequence per row.
* attention: ``setup.attention`` "naive" -> ``attn_implementation="eager"``, "sdpa" -> ``"sdpa"``; a model
  without attention layers (Mamba, Falcon-Mamba: ``attention_layers`` 0) is built "eager" under either, as
  transformers builds it by default (its classes refuse "sdpa", and no module reads the setting).
* ``setup.checkpoint`` "full" -> ``model.activation_checkpointing_enable()`` with transformers' defaults
  (``{"use_reentrant": False}``, ``modeling_utils._activation_checkpointing_enable``; every decoder layer,
  ``GradientCheckpointingLayer``; ``enable_input_require_grads`` on the embeddings).  "selective" is refused:
  transformers has no selective checkpointing.
* precision: "fp32" and "bf16" build the model in that dtype (``from_config(..., dtype=...)``); "amp-bf16"
  keeps fp32 parameters and runs the forward as ``accelerate.Accelerator.prepare_model`` wraps it for
  ``Trainer(bf16=True)``: ``model.forward = convert_outputs_to_fp32(torch.autocast(device, bf16)(forward))``
  (accelerate 1.x ``accelerator.py``): autocast over the model's forward *and its loss* (the labels go in),
  then every bf16 tensor of the output (the logits) copied to fp32 after autocast exits.  On cuda that is
  ``torch.autocast("cuda")``; on meta and cpu, where torch's autocast casts nothing of CUDA's,
  ``HFAutocast``: our emulation of CUDA's op lists (``model.autocast.CudaAutocast``) plus autocast's weight
  cache (``cached_cast``: an fp32 leaf that requires grad and is not a view, i.e. every ``nn.Linear`` weight
  transformers passes to ``F.linear``, is cast once and its bf16 copy kept until the outermost autocast
  exits).  With checkpointing, ``torch.utils.checkpoint`` re-enters a real autocast for the recompute by
  itself; the emulation is re-entered through the checkpoint's ``context_fn`` (meta and cpu only).
* AdamW of ``setup.optimizer`` (``names.ADAMW_KWARGS``), its state created before the measured step.

Traps (DESIGN.md §8, §11): transformers' packed-sequence detection (``masking_utils.
find_packed_sequence_indices``) branches on a tensor's value, ``.item()`` on meta; on meta it is replaced, for
the build and the step only, by the same ops without the branch (its answer for unpacked rows, None).
A mixture of experts runs transformers' default ``grouped_mm`` experts, whose meta kernel
(``torch._meta_registrations._meta_grouped_mm_common``) takes bf16 operands only: in fp32 or under amp-bf16 (fp32
weights) it is refused on meta and measured on cpu.  transformers is optional (``pip install "lm-accounting[hf]"``); without it every entry point here
raises a one-line ``AccountingError`` naming the extra.
"""

from __future__ import annotations

import contextlib
import gc
import sys

import torch
from torch.overrides import handle_torch_function, has_torch_function

from ..config import AccountingError, ModelConfig
from ..hf_config import to_hf_dict
from ..model.autocast import CudaAutocast
from ..names import ADAMW_KWARGS
from ..setup import TrainingSetup

HF_EXTRA = 'pip install "lm-accounting[hf]"'
ATTN_IMPLEMENTATIONS = {"naive": "eager", "sdpa": "sdpa"}
"""``TrainingSetup.attention`` -> transformers' ``attn_implementation``."""
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "amp-bf16": torch.float32}


def require_transformers():
    """The ``transformers`` module, or a one-line ``AccountingError`` naming the extra to install."""
    try:
        import transformers
    except ImportError:
        raise AccountingError(
            f"--impl transformers needs the transformers library, which is not installed: {HF_EXTRA}"
        ) from None
    return transformers


def check_hf_setup(cfg: ModelConfig, setup: TrainingSetup, device: str) -> None:
    """Refuse, before anything is built, what transformers' model cannot run here (one line each)."""
    if setup.checkpoint in ("selective", "op"):
        raise AccountingError(
            f"transformers has no {setup.checkpoint} activation checkpointing (activation_checkpointing_enable "
            "recomputes whole decoder layers): use --checkpoint full or none"
        )


def check_autocast(cfg: ModelConfig, setup: TrainingSetup, device: str) -> None:
    """Refuse, before building, a single-device amp-bf16 step whose own code cannot run under the emulation on
    meta (a layout runs no autocast: FSDP2's bf16 policy)."""
    if setup.autocast and device == "meta" and cfg.hf_model_type == "nemotron":
        raise AccountingError(
            "Nemotron's LayerNorm1P asks torch for the autocast dtype of its input's device "
            "(torch.get_autocast_dtype), which meta has none of: measure amp-bf16 on cpu (--measure cpu)"
        )


def check_grouped_mm(cfg: ModelConfig, compute_dtype: str, device: str) -> None:
    """Refuse a forward of transformers' experts (``torch._grouped_mm``) on meta with weights that are not bf16:
    the meta kernel (``_meta_grouped_mm_common``) takes bf16 only.  Llama 4's experts (``all_experts_run``) run
    ``torch.bmm`` instead (``Llama4TextExperts``), on meta in any dtype."""
    if cfg.moe and not cfg.all_experts_run and device == "meta" and compute_dtype != "bf16":
        raise AccountingError(
            f"transformers' experts run torch._grouped_mm, whose meta kernel takes bf16 weights only, not "
            f"{compute_dtype}: measure it on cpu at a small shape (--measure cpu), or in bf16"
        )


class HFAutocast(CudaAutocast):
    """CUDA's bf16 autocast on meta/cpu tensors, with autocast's weight cache and CUDA's autocast state.

    ``cached_cast`` (aten/src/ATen/autocast_mode.cpp, torch 2.13) caches the lower-precision copy of an
    argument that is fp32, requires grad, is a leaf and not a view, when the op casts to bf16; the cache
    holds the copy until the outermost autocast region exits (``clear_cache``).  transformers passes each
    ``nn.Linear`` weight itself to ``F.linear``, so every weight is cast once per region and kept.

    While the region is open, CUDA's autocast state says what it would on the GPU: ``torch.is_autocast_enabled()``
    (CUDA's flag, a thread-local one that casts nothing on meta or cpu tensors) is true, at bf16, so code that asks
    (``NemotronLayerNorm1P``'s ``_cast_if_autocast_enabled``) sees autocast on; a region that turns it off (transformers'
    ``maybe_autocast(enabled=False)``, routed to CUDA by ``cuda_regions``: ERNIE 4.5-MoE's router, Nemotron's norm)
    clears the flag, and the emulation casts nothing until it is set again."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, **lists):
        super().__init__(dtype, **lists)
        self.cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __enter__(self):
        self.outer = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
        torch.set_autocast_enabled("cuda", True)
        torch.set_autocast_dtype("cuda", self.dtype)
        return super().__enter__()

    def __exit__(self, *exc):
        self.cache.clear()
        torch.set_autocast_enabled("cuda", self.outer[0])
        torch.set_autocast_dtype("cuda", self.outer[1])
        return super().__exit__(*exc)

    def _cached(self, value):
        if isinstance(value, (list, tuple)):
            return type(value)(self._cached(v) for v in value)
        if (
            isinstance(value, torch.Tensor)
            and value.dtype == torch.float32
            and value.requires_grad
            and value.is_leaf
            and not value._is_view()
        ):
            hit = self.cache.get(id(value))
            if hit is None:
                hit = self.cache[id(value)] = (value, value.to(self.dtype))
            return hit[1]
        return value

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not torch.is_autocast_enabled("cuda"):  # inside a region that turned autocast off
            return func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        if name in self.lower:
            args = tuple(reversed([self._cached(a) for a in reversed(args)]))  # autocast's order: last first
            kwargs = {k: self._cached(v) for k, v in (kwargs or {}).items()}
        return super().__torch_function__(func, types, args, kwargs)


def cuda_regions(module) -> None:
    """Route ``module``'s ``maybe_autocast`` (transformers' ``utils.generic``) to CUDA while ``HFAutocast`` emulates
    it: ``maybe_autocast(device_type, enabled=False)`` on meta or cpu tensors is a no-op (meta: ``nullcontext``;
    cpu: CPU autocast is off), where on the GPU it is ``torch.autocast("cuda", enabled=False)``, which clears the
    flag the emulation reads.  Outside the emulation (CUDA's flag off) the call is transformers' own."""
    from transformers.utils import generic

    if getattr(module, "maybe_autocast", None) is not generic.maybe_autocast:
        return

    def maybe_autocast(device_type: str, dtype=None, enabled: bool = True, cache_enabled=None):
        if not enabled and torch.is_autocast_enabled("cuda"):
            return torch.autocast("cuda", enabled=False)
        return generic.maybe_autocast(device_type, dtype, enabled, cache_enabled)

    module.maybe_autocast = maybe_autocast


def _autocast(device: str):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else HFAutocast(torch.bfloat16)


def _fp32_outputs(output):
    """accelerate's ``convert_outputs_to_fp32``: every fp16/bf16 tensor of the output -> ``.float()``."""
    for key, value in output.items():
        if isinstance(value, torch.Tensor) and value.dtype in (torch.float16, torch.bfloat16):
            output[key] = value.float()
    return output


class HFTrainingStep(torch.nn.Module):
    """``forward(input_ids)`` -> the loss, as ``Trainer.compute_loss`` gets it from transformers' model
    ``hf`` (the labels are fixed at construction; ``loss_fn(loss, labels)`` returns the loss)."""

    def __init__(self, hf: torch.nn.Module, labels: torch.Tensor, amp_device: str | None):
        super().__init__()
        self.hf, self.labels, self.amp_device = hf, labels, amp_device

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.amp_device is None:
            return self.hf(input_ids=input_ids, labels=self.labels).loss
        with _autocast(self.amp_device):
            output = self.hf(input_ids=input_ids, labels=self.labels)
        return _fp32_outputs(output).loss


def model_loss(loss: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The loss function of an ``HFTrainingStep``: the model computed its loss already."""
    return loss


def _unpacked_rows(position_ids: torch.Tensor) -> None:
    """``masking_utils.find_packed_sequence_indices`` for meta: its ops and its locals' lifetimes (transformers
    5.x, line for line), not its branch on the result's value (``.item()``); the answer for rows of one
    sequence each, None (no packing)."""
    first_dummy_value = position_ids[:, :1] - 1
    position_diff = torch.diff(position_ids, prepend=first_dummy_value, dim=-1)
    packed_sequence_mask = (position_diff != 1).cumsum(-1)
    (packed_sequence_mask[:, -1] == 0).all()  # the branch's condition, computed and dropped unread


def _sdpa_as_cpu(sdpa):
    """``F.scaled_dot_product_attention`` that, on meta tensors, runs the kernel the CPU picks for the call.

    On meta, torch's ``_fused_sdp_choice`` answers "math" (the composite that materialises the S×S scores);
    on cpu it picks the flash kernel, ``aten._scaled_dot_product_flash_attention_for_cpu`` (K and V keep their
    kv heads under ``enable_gqa``).  The CPU's choice is asked with stand-ins of one position (batch 1, the
    same heads, head size and dtype; a 1×1 mask of the mask's dtype if there is one); where it is flash, the
    meta call runs that kernel, else the call runs as it is.  Function modes see the call as they see torch's
    (``handle_torch_function``), so the autocast emulation casts q, k and v before the choice, as on cpu.  (A
    function, not a ``TorchFunctionMode``: a mode is off inside the ``Tensor.backward`` it handles, and the
    checkpoint recompute runs there.)"""

    def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        if has_torch_function((query, key, value)):  # a function mode (the autocast emulation) sees the call first
            args = (query, key, value, attn_mask, dropout_p, is_causal)
            return handle_torch_function(scaled_dot_product_attention, (query, key, value), *args, **kw)
        if query.device.type != "meta":
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, **kw)

        def one(t):
            return torch.empty(1, t.shape[1], 1, t.shape[-1], dtype=t.dtype)

        mask = None if attn_mask is None else torch.empty(1, 1, 1, 1, dtype=attn_mask.dtype)
        choice = torch._fused_sdp_choice(one(query), one(key), one(value), mask, dropout_p, is_causal, **kw)
        if choice != int(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
            return sdpa(query, key, value, attn_mask, dropout_p, is_causal, **kw)
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # as the cpu run converts it (traced there)
            kind = {"dtype": query.dtype, "device": attn_mask.device}
            minus_inf = torch.scalar_tensor(-float("inf"), **kind)
            attn_mask = torch.where(attn_mask, torch.scalar_tensor(0.0, **kind), minus_inf)
            del minus_inf
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        return flash(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=kw.get("scale"))[0]

    return scaled_dot_product_attention


@contextlib.contextmanager
def patched_for(device: str, fake: bool = False):
    """What transformers' model needs patched for a measured step, for the block: its logger at errors only
    (a warning such as GPT-2's "loss_type=None ... unrecognized" is noise on a successful command); on meta or
    on FakeTensors (``fake``) the packed-sequence detection without its ``.item()`` (``_unpacked_rows``); on
    meta also sdpa's kernel choice (``_sdpa_as_cpu``; a FakeTensor on cpu gets the CPU's choice itself)."""
    import transformers.masking_utils as masking
    from transformers.utils import logging

    functional = torch.nn.functional
    saved = masking.find_packed_sequence_indices, functional.scaled_dot_product_attention, logging.get_verbosity()
    logging.set_verbosity_error()
    if device == "meta" or fake:
        masking.find_packed_sequence_indices = _unpacked_rows
    if device == "meta":
        functional.scaled_dot_product_attention = _sdpa_as_cpu(saved[1])
    try:
        yield
    finally:
        masking.find_packed_sequence_indices, functional.scaled_dot_product_attention = saved[:2]
        logging.set_verbosity(saved[2])


def hf_pretrained_config(cfg: ModelConfig):
    """transformers' configuration object for ``cfg`` (``to_hf_dict``), as the Trainer runs it (no KV cache)."""
    transformers = require_transformers()
    values = to_hf_dict(cfg)
    return transformers.AutoConfig.for_model(values.pop("model_type"), **values, use_cache=False)


def attn_implementation(cfg: ModelConfig, setup: TrainingSetup) -> str:
    """transformers' ``attn_implementation`` for ``setup.attention``; "eager" for a model without attention layers
    (pure Mamba2: ``Mamba2ForCausalLM`` refuses "sdpa", and no op of it depends on the choice)."""
    return ATTN_IMPLEMENTATIONS[setup.attention] if cfg.attention_layers else "eager"


def build_hf_model(cfg: ModelConfig, setup: TrainingSetup, device: str = "meta", seed: int = 0) -> torch.nn.Module:
    """transformers' ``AutoModelForCausalLM`` for ``cfg`` on ``device`` in training mode, with ``setup``'s
    attention, dtype and checkpointing (see the module docstring); seeded weights off meta."""
    transformers = require_transformers()
    check_hf_setup(cfg, setup, device)
    config = hf_pretrained_config(cfg)
    # The model's module is imported before the device context: a module that makes a tensor when imported would
    # put it on the device (torchaudio's kaldi.py ``EPSILON``, imported through transformers' processing_utils when
    # torchaudio is installed: 4 bytes on the GPU, seen on the H100, reports/cuda-h100/traces/probe.txt).
    transformers.MODEL_FOR_CAUSAL_LM_MAPPING[type(config)]
    torch.manual_seed(seed)
    try:
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(
                config, attn_implementation=attn_implementation(cfg, setup), dtype=DTYPES[setup.precision]
            )
    except ValueError as err:  # transformers' own refusal, e.g. Gemma 2 with sdpa
        raise AccountingError(f"transformers refuses this model: {str(err).splitlines()[0]}") from None
    model.train()
    if setup.autocast and device != "cuda":
        cuda_regions(sys.modules[type(model).__module__])
    if setup.checkpoint == "full":
        kwargs = {"use_reentrant": False}  # transformers' default
        if setup.autocast and device != "cuda":  # the recompute re-enters the emulated autocast
            kwargs["context_fn"] = lambda: (contextlib.nullcontext(), _autocast(device))
        enable_checkpointing(model, kwargs)
    return model


def enable_checkpointing(model, kwargs: dict) -> None:
    """transformers' whole-layer checkpointing: ``activation_checkpointing_enable`` (5.24), or its older name
    ``gradient_checkpointing_enable`` where the library predates the rename (5.17 on the lent H200 has only that
    one); both checkpoint every decoder layer with ``kwargs``."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def build_hf_step(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, device: str = "meta", seed: int = 0):
    """(model, inputs, labels, optimizer, loss_fn) for one training step of transformers' model.

    ``model`` is an ``HFTrainingStep`` around transformers' model (``model.hf``): ``loss_fn(model(inputs),
    labels)`` is the Trainer's loss; the optimizer is AdamW of ``setup.optimizer``."""
    from ..model import random_tokens

    hf = build_hf_model(cfg, setup, device, seed)
    inputs = random_tokens(cfg, batch, seq, device=device, seed=seed)
    labels = random_tokens(cfg, batch, seq, device=device, seed=seed + 1)
    model = HFTrainingStep(hf, labels, device if setup.autocast else None)
    optimizer = torch.optim.AdamW(hf.parameters(), **ADAMW_KWARGS[setup.optimizer])
    return model, inputs, labels, optimizer, model_loss


def _checked(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup | None, device: str, method: str):
    from .devices import check_live_run

    require_transformers()
    setup = setup or TrainingSetup()
    if method not in ("tracker", "allocator"):
        raise AccountingError(f"unknown method {method!r} (tracker or allocator)")
    if method == "allocator" and device != "cpu":
        raise AccountingError("the allocator measurement reads the CPU allocator: device must be 'cpu'")
    check_hf_setup(cfg, setup, device)
    check_autocast(cfg, setup, device)
    check_grouped_mm(cfg, setup.param_dtype, device)
    to_hf_dict(cfg)  # a config transformers has no class for: one line, before torch builds anything
    check_live_run(
        cfg,
        seq,
        batch,
        device,
        "this training step",
        training=True,
        dtype=setup.param_dtype,
        optimizer=setup.optimizer,
        need=None if device == "meta" else live_bound(cfg, seq, batch, setup),
    )
    return setup


def live_bound(cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup) -> int:
    """A bound on the bytes transformers' training step holds, for the live-run guard (cpu, cuda): the model
    states of ``cfg`` (4 · N · bytes) plus 3/2 × the activations our replay predicts for its course twin at
    the same shapes (``devices.counting_run_bytes``' rule for a variant: room for eager attention's mask,
    LayerNorm's and the MLP's extra saved tensors, the experts' dispatch)."""
    from ..analytic.memory import model_state_breakdown
    from ..analytic.replay import predict_training_step

    twin = cfg.course_twin()
    peak = predict_training_step(twin, seq, batch, setup=setup, mode="traced").peak
    twin_states = model_state_breakdown(twin, setup.param_dtype).total
    return model_state_breakdown(cfg, setup.param_dtype).total + (peak - twin_states) * 3 // 2


def measure_hf_step(
    cfg: ModelConfig,
    seq: int,
    batch: int = 1,
    setup: TrainingSetup | None = None,
    device: str = "meta",
    method: str = "tracker",
    layout=None,
    find_unused: bool | None = None,
):
    """The measured ``StepMemory`` of one training step of transformers' model (``build_hf_step``), as
    ``measure.memory.measure_step`` measures ours: ``method`` "tracker" (``StorageTracker``: the traced run,
    meta or cpu) or "allocator" (cpu only: the CPU allocator's events, the plain run); cuda reads the caching
    allocator.  Refusals (one line, ``AccountingError``): transformers not installed (naming the extra), a
    config with no transformers class, selective checkpointing, a mixture of experts on meta, and every
    live-run guard of ``devices.check_live_run``.  ``layout`` (a ``ParallelLayout`` of more than one GPU): rank 0
    of its FSDP2 or DDP job over transformers' model on the fake process group (``measure.hf_parallel``),
    FakeTensors for ``device="meta"``, real CPU tensors for "cpu" (tracker only); ``find_unused``: DDP's
    ``find_unused_parameters``, None the HF Trainer's (``analytic.ops.ddp.trainer_find_unused``)."""
    if layout is not None and not layout.single:
        return _measure_rank(cfg, seq, batch, setup, device, method, layout, find_unused)
    setup = _checked(cfg, seq, batch, setup, device, method)
    from .tracker import init_optimizer_state, measure_training_step, measure_training_step_cuda

    with patched_for(device):
        model, inputs, labels, opt, loss_fn = build_hf_step(cfg, seq, batch, setup, device)
        if cfg.indexer:
            mark_unreached(model, inputs, labels, loss_fn)
        if device == "cuda":
            return measure_training_step_cuda(model, inputs, labels, loss_fn, optimizer=opt)
        if method == "allocator":
            from .allocator import measure_training_step_plain

            init_optimizer_state(opt)
            return measure_training_step_plain(model, inputs, labels, loss_fn, opt)
        return measure_training_step(model, inputs, labels, loss_fn, optimizer=opt)


def mark_unreached(model, inputs, labels, loss_fn) -> None:
    """Mark ``unreached`` the parameters no gradient reaches, found by one probe forward and backward (the
    gradients then dropped): AdamW makes its state lazily, for the parameters that have a gradient, so a real run
    never holds any for them, and ``tracker.init_optimizer_state`` makes none for them.  DSA's indexer weights are
    such (``DeepseekV32Indexer.forward`` runs under ``torch.no_grad()``, models/deepseek_v32/modeling_deepseek_v32.py);
    they still require grad (autocast caches their bf16 copies)."""
    loss = loss_fn(model(inputs), labels)
    loss.backward()
    del loss
    for p in model.parameters():
        p.unreached = p.grad is None
        p.grad = None
    gc.collect()


def _measure_rank(cfg, seq, batch, setup, device, method, layout, find_unused):
    from ..analytic.ops.ddp import trainer_find_unused
    from .hf_parallel import check_hf_layout, measure_hf_rank

    require_transformers()
    setup = setup or TrainingSetup()
    if device not in ("meta", "cpu") or method != "tracker":
        raise AccountingError("a data-parallel job over transformers' model is measured by the tracker on meta or cpu")
    check_hf_setup(cfg, setup, device)
    if layout.fsdp:
        check_grouped_mm(cfg, "bf16" if setup.autocast else setup.param_dtype, device)  # amp: the policy's bf16
    else:  # DDP runs the single-GPU program, autocast and all
        check_autocast(cfg, setup, device)
        check_grouped_mm(cfg, setup.param_dtype, device)
    find_unused = trainer_find_unused(setup) if find_unused is None else find_unused
    check_hf_layout(cfg, layout, find_unused)
    to_hf_dict(cfg)
    fake = device == "meta" and layout.tp == 1  # TP on real CPU tensors: FakeTensors change its transient peaks
    _check_rank_fits(cfg, seq, batch, setup, "meta" if fake else "cpu", layout.tp == 1)
    return measure_hf_rank(cfg, seq, batch, setup, layout, rank=0, fake=fake, find_unused=find_unused)


def _check_rank_fits(cfg, seq, batch, setup, device, fake_possible=True):
    """FakeTensors hold nothing (the meta guards); real CPU tensors are bounded as in
    ``distributed.check_rank_fits``: at most ``REAL_RUN_PARAMS`` parameters, and the single-device bound
    (``live_bound``, above any rank's) within what the CPU allows.  ``fake_possible``: the layout runs on
    FakeTensors too (not TP)."""
    from .devices import check_live_run
    from .distributed import REAL_RUN_PARAMS, parameter_count

    what = "this rank's step"
    check_live_run(cfg, seq, batch, "meta", what, training=True, dtype=setup.param_dtype)
    if device == "cpu":
        if parameter_count(cfg) > REAL_RUN_PARAMS:
            raise AccountingError(
                f"{cfg.name} has {parameter_count(cfg):,} parameters: a real-tensor run of this layout is limited "
                f"to {REAL_RUN_PARAMS:,}"
                + (" (measure on meta: FakeTensors)" if fake_possible else " (TP runs on real tensors only)")
            )
        need = live_bound(cfg, seq, batch, setup)
        check_live_run(cfg, seq, batch, "cpu", what, training=True, dtype=setup.param_dtype, need=need)


def trace_hf_step(cfg: ModelConfig, seq: int, batch: int = 1, setup: TrainingSetup | None = None, device="meta"):
    """(``StepMemory``, every allocation and free in order) of transformers' training step under the
    tracker: ``measure.trace.trace_step`` on ``build_hf_step``.  For deriving an op sequence::

        from lm_accounting.config import load_config
        from lm_accounting.measure.hf import trace_hf_step
        from lm_accounting.measure.trace import format_trace
        from lm_accounting.setup import TrainingSetup

        cfg = dataclasses.replace(load_config("qwen3-0.6b"), num_layers=1, vocab_size=1000)
        memory, events = trace_hf_step(cfg, seq=64, setup=TrainingSetup(attention="sdpa", precision="amp-bf16"))
        print(format_trace(events, device="meta"))

    Each event: phase, aten op, bytes (+ charged, − released), live bytes after it, device."""
    setup = _checked(cfg, seq, batch, setup, device, "tracker")
    from .trace import trace_step

    with patched_for(device):
        model, inputs, labels, opt, loss_fn = build_hf_step(cfg, seq, batch, setup, device)
        return trace_step(model, inputs, labels, loss_fn, opt)
