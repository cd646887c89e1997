"""The view of a ``PresetList``: one row per preset."""

from __future__ import annotations

from ..catalog import PresetList
from .tables import Column, Table, View

DIMENSIONS = (
    ("layers", "num_layers"),
    ("d_model", "d_model"),
    ("heads", "num_heads"),
    ("kv_heads", "kv_heads"),
    ("head_dim", "d_head"),
    ("d_ff", "d_ff"),
    ("vocab", "vocab_size"),
    ("context", "context_length"),
)


def presets_view(p: PresetList) -> View:
    columns = [
        Column("preset"),
        Column("family"),
        *[Column(name, "int") for name, _ in DIMENSIONS],
        Column("tied"),
        Column("qk_norm"),
        Column("parameters", "int"),
        Column("active", "int"),
    ]
    rows = [
        (
            c.name,
            c.family,
            *[getattr(c, attr) for _, attr in DIMENSIONS],
            "yes" if c.tie_embeddings else "no",
            "yes" if c.qk_norm else "no",
            n,
            active,
        )
        for c, n, active in p.presets
    ]
    notes = [
        (
            "family: the architecture options (norm, MLP, positions, biases, extra norms, windows); "
            "course = pre-RMSNorm, SwiGLU, RoPE, no biases (CS336 A1). active: the parameters one token uses "
            "(a mixture of experts: all but the routed experts it is not sent to). `--format json` gives each preset's full "
            "architecture line."
        )
    ]
    return View([], [Table("Presets (presets/*.toml; pass a name to any command)", columns, rows, notes)])
