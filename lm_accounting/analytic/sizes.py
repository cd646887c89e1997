"""The shapes of one run (config, batch, sequence length, dtype), in elements and bytes.

Every per-component formula takes a ``Sizes``: parameter formulas read only ``cfg``, FLOP
formulas add B and S, activation formulas add the element size ``e``.  Notation: T = B·S tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import ModelConfig, check_positive_int
from ..names import DTYPE_BYTES
from ..setup import TrainingSetup

DEFAULT_SETUP = TrainingSetup()


def check_batch_seq(batch: int, seq: int) -> None:
    check_positive_int("batch", batch)
    check_positive_int("context", seq)


def at_context(cfg: ModelConfig, seq: int | None) -> ModelConfig:
    """The one rule for the sequence length: the model analysed is built for the context it runs at.

    ``seq=None`` keeps ``cfg.context_length``; any other value becomes the config's context length
    (it sizes the live model's RoPE tables, so ``account(cfg, seq=S)`` and
    ``account(cfg.with_context(S))`` are the same question and give the same answer)."""
    if seq is None:
        return cfg
    check_positive_int("context", seq)
    return cfg if seq == cfg.context_length else cfg.with_context(seq)


@dataclass(frozen=True)
class Sizes:
    """Bytes of every tensor shape the live model creates, for one (cfg, B, S, dtype)."""

    cfg: ModelConfig
    batch: int = 1
    seq: int = 1
    e: int = 4  # bytes per element of the model dtype (the parameters' dtype)
    setup: TrainingSetup = DEFAULT_SETUP  # attention kernel, checkpointing, precision

    @classmethod
    def of(
        cls, cfg: ModelConfig, seq: int, batch: int = 1, dtype: str = "fp32", setup: TrainingSetup | None = None
    ) -> Sizes:
        """Sizes of one run; with ``setup`` the element size is the setup's parameter dtype."""
        check_batch_seq(batch, seq)
        if setup is not None:
            dtype = setup.param_dtype
        else:
            setup = TrainingSetup(precision="bf16" if DTYPE_BYTES[dtype] == 2 else "fp32")
        return cls(cfg, batch, seq, DTYPE_BYTES[dtype], setup)

    @property
    def amp(self) -> bool:
        """amp-bf16: fp32 parameters (``e`` = 4), matmuls and what follows them in bf16."""
        return self.setup.precision == "amp-bf16"

    @property
    def bf16(self) -> Sizes:
        """The same run with 2-byte elements: the sizes of autocast's bf16 activations."""
        return dataclasses.replace(self, e=2)

    @property
    def sdpa(self) -> bool:
        return self.setup.attention == "sdpa"

    @property
    def lse(self) -> int:
        """The fused kernel's logsumexp, (B, h, S) fp32 whatever the model dtype."""
        return self.batch * self.cfg.num_heads * self.seq * 4

    @property
    def T(self) -> int:
        """Tokens in the batch, B·S."""
        return self.batch * self.seq

    def act(self, width: int, rows: int | None = None) -> int:
        """A (rows x width) activation in the model dtype; rows default to T."""
        return (self.T if rows is None else rows) * width * self.e

    @property
    def score_count(self) -> int:
        """Elements of one (B, h, S, S) attention tensor."""
        return self.batch * self.cfg.num_heads * self.seq * self.seq

    @property
    def scores(self) -> int:
        """Bytes of one (B, h, S, S) attention tensor."""
        return self.score_count * self.e

    @property
    def score_rows(self) -> int:
        """One (B, h, S, 1) softmax row statistic."""
        return self.batch * self.cfg.num_heads * self.seq * self.e

    @property
    def rope_table(self) -> int:
        """cos or sin rows gathered for the S positions: S x d_head/2, cast to the model dtype."""
        return self.seq * (self.cfg.d_head // 2) * self.e
