"""Words the views and figures share: a count with its noun in the right number, a largest fitting value
that may be none, and a training setup in words.  No torch, pandas or matplotlib."""

from __future__ import annotations

from ..setup import TrainingSetup

NONE_FITS = "none fits"
CHECKPOINT_WORDS = {"none": "no checkpointing", "full": "full checkpointing", "selective": "selective checkpointing"}


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """'1 step', '2 steps', '1,024 sequences' (``nouns``: an irregular plural)."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def fits_words(n: int | None, noun: str = "token") -> str:
    """A largest value that fits a budget: '7,214 tokens', '1 token', or 'none fits' for 0 (or None)."""
    return plural(n, noun) if n else NONE_FITS


def setup_parts(setup: TrainingSetup) -> tuple[str, str, str, str]:
    """('sdpa attention', 'full checkpointing', 'amp-bf16', 'AdamW foreach'): the four choices of a setup."""
    return (
        f"{setup.attention} attention",
        CHECKPOINT_WORDS[setup.checkpoint],
        setup.precision,
        f"AdamW {setup.optimizer}",
    )


def setup_words(setup: TrainingSetup) -> str:
    """'sdpa attention, full checkpointing, amp-bf16, AdamW foreach'."""
    return ", ".join(setup_parts(setup))


def setup_from_label(label: str) -> TrainingSetup:
    """The setup of a ``TrainingSetup.label`` ('sdpa+full+amp-bf16+foreach')."""
    attention, checkpoint, precision, optimizer = label.split("+")
    return TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision, optimizer=optimizer)
