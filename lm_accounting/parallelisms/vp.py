"""Vocab parallel (``vocab_parallel``, beside TP): the embedding split row-wise and the LM head column-wise over
the vocabulary, the loss under ``loss_parallel`` (``analytic.collectives`` rule 7;
``measure.parallelize.apply_vocab_parallel``)."""

from __future__ import annotations

from ..config import AccountingError


class VocabParallel:
    name = "vocab parallel"
    fields = ("vocab_parallel", "tp")

    def validate(self, layout) -> None:
        if layout.vocab_parallel and layout.tp == 1:
            raise AccountingError("vocab parallel needs tp > 1")

    def check(self, layout, cfg, seq) -> None:
        if layout.vocab_parallel and cfg.tie_embeddings:
            raise AccountingError("vocab parallel with tied embeddings is not accounted (untie them or drop it)")

    def label(self, layout) -> str:
        return "+vp" if layout.vocab_parallel else ""

    def groups(self, layout) -> dict[str, tuple[int, int]]:
        return {}  # TP's group


VP = VocabParallel()
