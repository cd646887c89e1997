"""A pre-allocated (static) KV cache for the live model, and its prefill and decode steps.

Inference runs ``TransformerLM``'s own modules (the same matmuls, so the same FLOP counters see
them); ``prefill`` and ``decode`` below replace only ``TransformerLM.forward``'s loop, handing every
block's attention one ``LayerCache`` (the optional ``cache`` argument of ``CausalSelfAttention``).

The cache holds K and V after RoPE, per layer, as (B, kv_heads, slots, d_head) tensors allocated
once (latent attention: the normed latent (B, 1, slots, kv_lora_rank) and the rotated RoPE key
(B, 1, slots, qk_rope_head_dim), from which each step expands keys and values, transformers v5's
form): ``slots`` = the capacity C on a full-attention layer, min(C, w) on a sliding-window layer (a
ring: position p lives in slot p mod slots; attention does not care about the order of its keys).

Two semantics for which keys a step attends over (``SEMANTICS``):

* ``"filled"``: the filled positions only.  Prefill is the plain forward at S = P (full P × P
  square, causal mask); a decode step at position p attends over p + 1 keys (min(p + 1, w) on a
  windowed layer), with no mask.  With ``attention="sdpa"`` (the model's ``TrainingSetup``) the fused
  kernel runs instead: causal over the prompt's own keys in the prefill, no mask is built, and a
  decode step's one query per sequence sees every key it is given (``is_causal=False``).
* ``"static"``: every slot, masked, as transformers' ``StaticCache`` with eager attention does: a
  decode step attends over all C slots (min(C, w) windowed), so its cost grows with the capacity,
  not the position; prefill attends over the C slots too (P × C), except on a windowed layer whose
  ring is shorter than the prompt, which attends over the prompt itself (P × P, banded), as
  transformers' ``StaticSlidingWindowLayer`` returns the full states then.  Naive attention only
  (the slot mask needs a masked kernel; torch's CPU flash kernel takes no boolean mask).
"""

from __future__ import annotations

import torch

from lm_accounting.config import AccountingError, ModelConfig

Tensor = torch.Tensor
SEMANTICS = ("filled", "static")


class LayerCache:
    """One layer's K and V slots and the rule for what a step attends over (module docstring)."""

    def __init__(self, k: Tensor, v: Tensor, window: int | None, semantics: str, owner: StaticKVCache):
        self.k, self.v, self.window, self.semantics, self.owner = k, v, window, semantics, owner

    @property
    def slots(self) -> int:
        return self.k.shape[-2]

    def _write(self, k: Tensor, v: Tensor, start: int) -> None:
        """Store the step's keys and values at their positions' slots (in place: no allocation)."""
        s, n = k.shape[-2], self.slots
        if s > n:  # a prompt longer than a windowed ring: only its last n tokens stay
            k, v, start = k[..., s - n :, :], v[..., s - n :, :], start + s - n
            s = n
        first = start % n
        head = min(s, n - first)
        self.k[..., first : first + head, :].copy_(k[..., :head, :])
        self.v[..., first : first + head, :].copy_(v[..., :head, :])
        if head < s:  # wrapped around the ring
            self.k[..., : s - head, :].copy_(k[..., head:, :])
            self.v[..., : s - head, :].copy_(v[..., head:, :])

    def update(self, k: Tensor, v: Tensor, mask: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
        """Write this step's K and V; return the keys, values and mask to attend over."""
        start, s = self.owner.length, k.shape[-2]
        self._write(k, v, start)
        if self.semantics == "filled":
            if start == 0:  # prefill: the plain forward (its own keys, the model's mask)
                return k, v, mask
            if s != 1:
                raise AccountingError("a decode step takes one token per sequence")
            n = min(start + 1, self.slots)  # filled slots (a ring is full once p + 1 >= its size)
            return self.k[..., :n, :], self.v[..., :n, :], None
        if start == 0 and s > self.slots:  # static, windowed ring shorter than the prompt
            return k, v, mask
        return self.k, self.v, self.owner.slot_mask(self.slots, start, s, self.window)


class StaticKVCache:
    """K and V for every layer of ``cfg``, for ``batch`` sequences of up to ``capacity`` tokens."""

    def __init__(
        self,
        cfg: ModelConfig,
        batch: int,
        capacity: int,
        device: str | torch.device = "meta",
        dtype: torch.dtype = torch.float32,
        semantics: str = "filled",
        absorbed: bool = False,
    ):
        """``absorbed``: latent attention decodes in the absorbed form (``model.mla``), as serving engines do."""
        if semantics not in SEMANTICS:
            raise AccountingError(f"unknown cache semantics '{semantics}' (valid: {', '.join(SEMANTICS)})")
        self.cfg, self.batch, self.capacity, self.semantics = cfg, batch, capacity, semantics
        self.absorbed = absorbed
        self.length = 0  # tokens written so far (the next token's position)
        self.layers = []
        for i in range(cfg.num_layers):
            window = cfg.sliding_window if cfg.layer_windowed(i) else None
            slots = capacity if window is None else min(capacity, window)
            if cfg.mla:  # latent attention: the normed latent and the rotated shared RoPE key (one "head" each)
                k_shape, v_shape = (batch, 1, slots, cfg.kv_lora_rank), (batch, 1, slots, cfg.qk_rope_head_dim)
            else:
                k_shape = v_shape = (batch, cfg.kv_heads, slots, cfg.d_head)
            k = torch.zeros(k_shape, device=device, dtype=dtype)
            v = torch.zeros(v_shape, device=device, dtype=dtype)
            self.layers.append(LayerCache(k, v, window, semantics, self))
        self._masks: dict[tuple, Tensor] = {}

    def tensors(self) -> list[Tensor]:
        return [t for layer in self.layers for t in (layer.k, layer.v)]

    @property
    def nbytes(self) -> int:
        """Bytes of every cache tensor's storage."""
        return sum(t.untyped_storage().nbytes() for t in self.tensors())

    def slot_mask(self, slots: int, start: int, s: int, window: int | None) -> Tensor:
        """Static semantics: (s, slots) bool, True where query i (position start + i) may see the slot's
        token: a slot holds a token once written (slot j < start + i + 1, or every slot of a full
        ring), within the window (i − w < j for windows not yet wrapped: slot = position)."""
        key = (slots, start, s, window)
        if key not in self._masks:
            device = self.layers[0].k.device
            q = torch.arange(start, start + s, device=device).unsqueeze(-1)  # (s, 1) positions
            j = torch.arange(slots, device=device)  # (slots,) slot = position before the ring wraps
            seen = (j <= q) | (q >= slots)  # a full ring: every slot holds one of the last `slots` tokens
            if window is not None:
                seen = seen & ((q >= slots) | (j > q - window))
            self._masks[key] = seen  # kept for the step's other layers of this size (cleared after it)
        return self._masks[key]


def _run(
    model, token_ids: Tensor, cache: StaticKVCache, mask: Tensor | None, window_mask: Tensor | None, last: bool = False
) -> Tensor:
    """``TransformerLM.forward``'s body at positions cache.length .. + S, each block given its layer's cache.
    ``last``: the head runs on each sequence's last position only (transformers' ``logits_to_keep = 1``:
    the final norm over every position, then a slice, a view).
    Called through ``model(...)`` (the body stands in for ``forward`` for the call), so module hooks, and
    the FLOP counter's module names (``TransformerLM.layers.0.attn.qk``), see the root module."""
    cfg, start, seq = model.cfg, cache.length, token_ids.shape[-1]
    if start + seq > cache.capacity:
        raise AccountingError(f"{start + seq} tokens exceed the cache's capacity of {cache.capacity}")

    def body(token_ids: Tensor) -> Tensor:
        positions = torch.arange(start, start + seq, device=token_ids.device)
        x = model.embed(token_ids, positions)
        for i, block in enumerate(model.layers):
            layer_mask = window_mask if cfg.layer_windowed(i) else mask
            x = block(x, model.rope, positions, layer_mask, cache=cache.layers[i])
        h = model.ln_final(x)
        return model.lm_head(h[:, -1:] if last else h)  # (B, 1, d): a view of the last positions

    model.forward = body
    try:
        logits = model(token_ids)
    finally:
        del model.forward
    cache.length += seq
    cache._masks.clear()
    return logits


@torch.no_grad()
def prefill(model, token_ids: Tensor, cache: StaticKVCache, last: bool = False) -> Tensor:
    """The prompt (B, P) through the model, filling slots 0 .. P−1; returns the logits (B, P, V), or
    (B, 1, V) of the last positions with ``last``.  Inference: no autograd (``torch.no_grad``)."""
    if cache.length:
        raise AccountingError("prefill needs an empty cache")
    if model.setup.checkpoint != "none" or model.setup.autocast:
        raise AccountingError("inference runs the model with no checkpointing and no autocast")
    if model.setup.attention == "sdpa":  # the fused kernel: causal by itself, no mask is built
        if cache.semantics != "filled":
            raise AccountingError(
                "static cache semantics attend over every slot through a mask (transformers' StaticCache with "
                "eager attention): they run with naive attention only"
            )
        return _run(model, token_ids, cache, None, None, last)
    seq = token_ids.shape[-1]
    mask = torch.ones(seq, seq, dtype=torch.bool, device=token_ids.device).tril()
    window_mask = None
    if model.cfg.sliding_window is not None:  # key j visible from query i iff i - w < j <= i
        window_mask = mask & ~torch.ones_like(mask).tril(-model.cfg.sliding_window)
    return _run(model, token_ids, cache, mask, window_mask, last)


@torch.no_grad()
def decode(model, token_ids: Tensor, cache: StaticKVCache) -> Tensor:
    """One decode step: token_ids (B, 1) at position cache.length; returns the logits (B, 1, V)."""
    if token_ids.shape[-1] != 1:
        raise AccountingError("a decode step takes one token per sequence")
    if not cache.length:
        raise AccountingError("decode needs a prefilled cache")
    return _run(model, token_ids, cache, None, None)
