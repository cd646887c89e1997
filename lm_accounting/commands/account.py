"""``account``: parameters, FLOPs per component, training FLOPs and the KV cache (analytic, exact)."""

from __future__ import annotations

from dataclasses import dataclass

from ..account import Account, account
from ..analytic.sizes import at_context, check_batch_seq
from ..config import ModelConfig


@dataclass(frozen=True)
class Request:
    config: ModelConfig
    context: int | None = None  # None: the config's context_length
    batch: int = 1

    def __post_init__(self) -> None:
        check_batch_seq(self.batch, at_context(self.config, self.context).context_length)


def run(request: Request) -> Account:
    return account(request.config, request.context, request.batch)
