"""Selective activation checkpointing (``torch.utils.checkpoint`` with ``context_fn=
create_selective_checkpoint_contexts(selective_policy)``, ``model/transformer.py``): placeholder."""

from __future__ import annotations

from ..tensors import checkpoint


def selective_checkpoint(fn, *args):
    raise NotImplementedError("selective checkpointing")
    return checkpoint(fn, *args)
