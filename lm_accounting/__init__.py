"""lm-accounting: parameters, FLOPs and memory of a Transformer LM, proven against a live model.

The analytic API imports no heavy library::

    from lm_accounting import load_config, account
    acc = account(load_config("gpt2-xl"), seq=16384)
    acc.forward.total, acc.forward.to_frame()
"""

from .account import Account, account
from .analytic import forward_flops, nonmatmul_flops, parameter_breakdown, training_flops
from .breakdown import Breakdown, Item
from .config import AccountingError, ConfigError, ModelConfig, apply_overrides, load_config, preset_names

__version__ = "0.1.0"

__all__ = [
    "Account",
    "AccountingError",
    "Breakdown",
    "ConfigError",
    "Item",
    "ModelConfig",
    "account",
    "apply_overrides",
    "forward_flops",
    "load_config",
    "nonmatmul_flops",
    "parameter_breakdown",
    "preset_names",
    "training_flops",
]
