"""lm-accounting: parameters, FLOPs and memory of a Transformer LM, proven against a live model.

The analytic API imports no heavy library (no torch, pandas or matplotlib)::

    from lm_accounting import load_config, account, memory_account, sweep
    acc = account(load_config("gpt2-xl"), seq=16384)
    acc.forward.total, acc.forward.to_frame()        # pandas only when asked for a frame

The live side imports torch when first used: ``crosscheck`` (fvcore and FlopCounterMode
against the analytic counts), ``measure_step`` (peak memory of a training step) and
``build_model`` (the from-scratch TransformerLM).
"""

from .account import Account, account
from .analytic import forward_flops, nonmatmul_flops, parameter_breakdown, training_flops
from .analytic.activations import saved_activation_breakdown
from .breakdown import Breakdown, Item
from .config import AccountingError, ConfigError, ModelConfig, apply_overrides, load_config, preset_names
from .phases import PhaseBytes, StepMemory
from .sweep import Sweep, sweep  # eager (a lazy ``sweep`` is shadowed by its submodule once that is imported)

__version__ = "0.1.0"

_LAZY = {  # name -> module, imported on first use: the live side needs torch; the step replay and the memory
    # report are imported by what asks for them, so reading a config.json (the account command) does not pay for them
    "crosscheck": "lm_accounting.measure.crosscheck",
    "CrossCheck": "lm_accounting.measure.crosscheck",
    "measure_step": "lm_accounting.measure.memory",
    "build_model": "lm_accounting.model",
    "MemoryAccount": "lm_accounting.analytic.memory_report",
    "memory_account": "lm_accounting.analytic.memory_report",
    "predict_training_step": "lm_accounting.analytic.replay",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lm_accounting' has no attribute {name!r}")


__all__ = [
    "Account",
    "AccountingError",
    "Breakdown",
    "ConfigError",
    "CrossCheck",
    "Item",
    "MemoryAccount",
    "ModelConfig",
    "PhaseBytes",
    "StepMemory",
    "Sweep",
    "account",
    "apply_overrides",
    "build_model",
    "crosscheck",
    "forward_flops",
    "load_config",
    "measure_step",
    "memory_account",
    "nonmatmul_flops",
    "parameter_breakdown",
    "predict_training_step",
    "preset_names",
    "saved_activation_breakdown",
    "sweep",
    "training_flops",
]
