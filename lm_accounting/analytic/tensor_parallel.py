"""What a tensor-parallel rank allocates beyond the TP-local single-GPU replay.  No torch.

``analytic.parallel.rank_step`` predicts one rank from the single-GPU replay R of the TP-local model
(``local_config``), shifted by the rank's model states and saved activations.  Measured against the
real job on the fake process group (torch 2.13, ``parallelize_module``; ``measure.distributed``),
that is byte-exact for TP in every setup; the functions here are what it misses.

Embedding backward under sequence parallel (``embedding_backward_peak``).  R's backward peak is
shifted down by the whole sequence-parallel saving (rule 5 of ``analytic.parallel``: the residual
stream and the norms' tensors ÷M), which is right while those tensors are live.  They are gone by the
embedding's backward, the last allocations of the phase, where a sequence-parallel rank holds exactly
what a TP rank holds: the sequence-split gradient of the embedding output is all-gathered back to the
whole (B, S, d) tensor (``PrepareModuleOutput``'s Replicate -> Shard(1), whose backward is an
all-gather), and the embedding itself is replicated.  With checkpointing the block inputs are the only
saved activations, so that point often sets the phase's peak (the tiny grid of
``tests/test_parallel_measured.py``: every fp32 and amp-bf16 setup).
"""

from __future__ import annotations

from ..config import ModelConfig
from ..layout import ParallelLayout
from ..names import DTYPE_BYTES
from ..setup import TrainingSetup


def embedding_backward_peak(
    cfg: ModelConfig, seq: int, batch: int, setup: TrainingSetup, layout: ParallelLayout, end: int, mode: str
) -> int:
    """Live bytes at the embedding's backward on a TP rank whose backward ends at ``end`` (its
    baseline + gradients); 0 where the point is not modelled here (vocab parallel: a split table).

    Derivation (the replay's last backward lines, ``analytic.replay``; T = B·S, e = bytes of the
    parameter dtype, which is also the residual stream's and the loss's: amp-bf16 keeps both fp32):

    1. Before the embedding's backward the rank holds X = every gradient but the embedding's, the
       gradient of the embedding output (T·d·e, whole under sequence parallel: see the module
       docstring), the loss and its gradient seed (e each).
    2. ``index_backward``: zeros (V·d·e), then ``index_put_`` into them: in place in a plain run, an
       out-of-place copy (V·d·e more, for one op) under a dispatch mode (``mode="traced"``).  The
       output gradient is released.  Untied, the zeros are the embedding's gradient, so
       end = X + V·d·e − T·d·e − 2e.
    3. Tied, the embedding's gradient then joins the LM head's (a transposed view: out of place in
       both runs): +V·d·e, −V·d·e, −V·d·e, so end = X − T·d·e − 2e.
    4. Highest point: X + V·d·e (+ V·d·e traced); tied and plain, X + 2·V·d·e − T·d·e at step 3 can be
       higher.  So, with emb = V·d·e and td = T·d·e:
       untied: end + td + 2e + emb·[traced];
       tied: end + td + 2e + emb + max(emb·[traced], emb − td).
    """
    if layout.vocab_parallel:
        return 0
    e = DTYPE_BYTES[setup.param_dtype]
    emb, td = cfg.vocab_size * cfg.d_model * e, batch * seq * cfg.d_model * e
    traced = emb if mode == "traced" else 0
    if cfg.tie_embeddings:
        return end + td + 2 * e + emb + max(traced, emb - td)
    return end + td + 2 * e + traced
