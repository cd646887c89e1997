"""The one model description shared by the analytic calculator and the live model.

A ``ModelConfig`` is a frozen dataclass.  ``num_kv_heads`` and ``head_dim`` may be
left as ``None``; the resolved values are the properties ``kv_heads`` and
``d_head`` (defaults: ``num_heads`` and ``d_model // num_heads``).  Keeping the
raw ``None`` means ``dataclasses.replace(cfg, d_model=...)`` re-derives the head
size instead of silently keeping a stale one.

Presets are TOML files in the top-level ``presets/`` folder; a user's own TOML file has
the same flat keys.  This module imports nothing heavy (no torch, no pandas).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Mapping

def _preset_dir() -> Path:
    """The shipped presets: top-level ``presets/`` in a checkout, ``lm_accounting/presets`` in a wheel.

    pyproject.toml maps the data package ``lm_accounting.presets`` onto ``presets/``, so the import
    system knows where it is in both cases (editable or not)."""
    spec = importlib.util.find_spec("lm_accounting.presets")
    if spec is not None and spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    return Path(__file__).resolve().parent.parent / "presets"  # a bare checkout on sys.path


PRESET_DIR = _preset_dir()
MAX_SIZE = 10**18
"""Largest accepted dimension, context, batch or step count: far beyond any real model, and small
enough that every derived figure (up to ~10^90) still converts to a float for printing."""


class AccountingError(ValueError):
    """Bad input from the user.  The CLI prints ``str(err)`` on one line and exits 2."""


class ConfigError(AccountingError):
    """An impossible or malformed model description."""


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a pre-norm decoder-only Transformer LM (the CS336 course architecture).

    Field names follow the course's ``TransformerLM`` constructor; ``num_kv_heads``
    (grouped-query attention), ``head_dim`` (Qwen3-style explicit head size),
    ``tie_embeddings`` and ``qk_norm`` cover the Llama-3 and Qwen3 variants.
    """

    vocab_size: int
    context_length: int
    num_layers: int
    d_model: int
    num_heads: int
    d_ff: int
    num_kv_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    qk_norm: bool = False
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ("vocab_size", "context_length", "num_layers", "d_model", "num_heads", "d_ff"):
            check_positive_int(key, getattr(self, key), ConfigError)
        for key in ("num_kv_heads", "head_dim"):
            if getattr(self, key) is not None:
                check_positive_int(key, getattr(self, key), ConfigError)
        for key in ("rope_theta", "norm_eps"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
                raise ConfigError(f"{key} must be a positive finite number, got {value!r}")
        for key in ("tie_embeddings", "qk_norm"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"name must be a non-empty string, got {self.name!r}")
        if self.head_dim is None and self.d_model % self.num_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                "give head_dim explicitly"
            )
        if self.num_heads % self.kv_heads:
            raise ConfigError(
                f"num_heads={self.num_heads} is not divisible by num_kv_heads={self.kv_heads}"
            )
        if self.d_head % 2:
            raise ConfigError(f"head_dim={self.d_head} is odd; RoPE rotates pairs of dimensions")

    # -- resolved dimensions -------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads (``num_kv_heads``, default ``num_heads``: plain MHA)."""
        return self.num_heads if self.num_kv_heads is None else self.num_kv_heads

    @property
    def d_head(self) -> int:
        """Size of one attention head (``head_dim``, default ``d_model // num_heads``)."""
        return self.d_model // self.num_heads if self.head_dim is None else self.head_dim

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads, ``num_heads * d_head``."""
        return self.num_heads * self.d_head

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads, ``kv_heads * d_head``."""
        return self.kv_heads * self.d_head

    @property
    def group_size(self) -> int:
        """Query heads sharing one key/value head (1 for plain MHA)."""
        return self.num_heads // self.kv_heads

    def resolved(self) -> dict[str, Any]:
        """All fields with ``num_kv_heads``/``head_dim`` filled in (for printing and JSON)."""
        out = dataclasses.asdict(self)
        out["num_kv_heads"] = self.kv_heads
        out["head_dim"] = self.d_head
        return out

    def with_context(self, context_length: int) -> "ModelConfig":
        return dataclasses.replace(self, context_length=context_length)


FIELD_TYPES: dict[str, type] = {
    "vocab_size": int, "context_length": int, "num_layers": int, "d_model": int,
    "num_heads": int, "d_ff": int, "num_kv_heads": int, "head_dim": int,
    "rope_theta": float, "norm_eps": float, "tie_embeddings": bool, "qk_norm": bool,
    "name": str,
}
"""Type of each ``ModelConfig`` field as written in TOML or ``--set`` (one entry per field)."""


def check_positive_int(name: str, value: Any, error: type[AccountingError] = AccountingError,
                       limit: int | None = MAX_SIZE) -> None:
    """The one check for every count the user gives: an int, >= 1 and (by default) <= 10^18."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise error(f"{name} must be an integer, got {value!r}")
    if value <= 0:
        raise error(f"{name} must be positive, got {value}")
    if limit is not None and value > limit:
        raise error(f"{name} = {value:.3e} is beyond the supported 10^18")


# -- building configs from TOML and overrides --------------------------------
def config_from_mapping(data: Mapping[str, Any], source: str) -> ModelConfig:
    """Build a config from flat ``key = value`` pairs; ``source`` names the file in errors."""
    unknown = [k for k in data if k not in FIELD_TYPES]
    if unknown:
        valid = ", ".join(FIELD_TYPES)
        raise ConfigError(f"{source}: unknown key '{unknown[0]}' (valid keys: {valid})")
    missing = [f.name for f in fields(ModelConfig) if f.default is dataclasses.MISSING and f.name not in data]
    if missing:
        raise ConfigError(f"{source}: missing key '{missing[0]}'")
    clean = {}
    for key, value in data.items():
        want = FIELD_TYPES[key]
        ok = isinstance(value, want) and not (want is not bool and isinstance(value, bool))
        if want is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{source}: key '{key}' must be {want.__name__}, got {value!r}")
        clean[key] = value
    try:
        return ModelConfig(**clean)
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: malformed TOML: {err}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a UTF-8 text file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a TOML file") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def load_config(name_or_path: str) -> ModelConfig:
    """A preset by name (``gpt2-xl``) or a user's TOML file (any path ending in ``.toml``)."""
    path = Path(name_or_path)
    if name_or_path.endswith(".toml") or path.is_file() or path.is_dir():
        data = read_toml(path)
        data.setdefault("name", path.stem)
        return config_from_mapping(data, str(path))
    if name_or_path not in preset_names():
        names = preset_names()
        close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.4)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(
            f"unknown preset '{name_or_path}'{hint} (valid presets: {', '.join(names)}; "
            "or give a path to a .toml file)"
        )
    preset = PRESET_DIR / f"{name_or_path}.toml"
    data = read_toml(preset)
    data.setdefault("name", name_or_path)
    return config_from_mapping(data, str(preset))


def parse_override(text: str) -> tuple[str, Any]:
    """``key=value`` from the command line, typed by the field it sets."""
    key, sep, raw = text.partition("=")
    key, raw = key.strip(), raw.strip()
    if not sep or not key:
        raise ConfigError(f"--set expects key=value, got '{text}'")
    if key not in FIELD_TYPES:
        raise ConfigError(f"--set: unknown key '{key}' (valid keys: {', '.join(FIELD_TYPES)})")
    want = FIELD_TYPES[key]
    try:
        if want is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError
            return key, raw.lower() in ("true", "1", "yes")
        if want is int:
            return key, int(raw.replace("_", ""))
        if want is float:
            return key, float(raw)
        return key, raw
    except ValueError:
        raise ConfigError(f"--set: key '{key}' must be {want.__name__}, got '{raw}'") from None


def apply_overrides(cfg: ModelConfig, overrides: Mapping[str, Any]) -> ModelConfig:
    """Replace fields; re-runs validation so an override cannot produce an impossible shape."""
    if not overrides:
        return cfg
    data = {f.name: getattr(cfg, f.name) for f in fields(ModelConfig)}
    data.update(overrides)
    try:
        return ModelConfig(**data)
    except ConfigError as err:
        raise ConfigError(f"after overrides {dict(overrides)}: {err}") from None
