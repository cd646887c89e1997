"""Attention of the zoo (gemma2, gemma3_text, olmo2, phi3) as transformers 5.24 runs it in training mode.

``eager_attention_forward`` follows ``modeling_gemma2.py``:145-176 (= llama's, plus Gemma 2's logit
soft-capping) and returns ``(attn_output, attn_weights)`` as transformers does: the decoder layer's
``hidden_states, _ = self.self_attn(...)`` keeps the weights until the layer returns, which matters where
autograd does not keep them (a checkpointed layer's first forward).  ``sdpa_attention_forward`` is
``integrations/sdpa_attention.py``: without a mask K and V keep their kv heads (``enable_gqa``), with one (a
sliding window the sequence reaches) they are repeated first; the kernel is the CPU's flash kernel
(``llama.flash_attention_cpu``), which ``measure.hf.meta_as_cpu`` makes the meta run take too.  No torch.
"""

from __future__ import annotations

from .. import aten as A
from ..aten_activation import tanh
from ..tensors import Tensor
from .llama import repeat_kv
from .llama import sdpa_attention_forward as llama_sdpa


def eager_attention_forward(module, query, key, value, attention_mask, softcap=None) -> tuple[Tensor, Tensor]:
    """``module`` gives ``groups`` (kv groups) and ``scaling``; dropout 0 (``F.dropout`` returns its input)."""
    key_states = repeat_kv(key, module.groups)
    value_states = repeat_kv(value, module.groups)
    attn_weights = A.mul(A.matmul(query, A.transpose(key_states, 2, 3)), module.scaling)
    if softcap is not None:
        attn_weights = A.div(attn_weights, softcap)
        attn_weights = tanh(attn_weights)
        attn_weights = A.mul(attn_weights, softcap)
    if attention_mask is not None:
        attn_weights = A.add(attn_weights, attention_mask)
    attn_weights = A.to(A.softmax(attn_weights, -1, "fp32"), query.dtype)
    attn_output = A.matmul(attn_weights, value_states)
    attn_output = A.contiguous(A.transpose(attn_output, 1, 2))
    return attn_output, attn_weights


def sdpa_attention_forward(module, query, key, value, attention_mask) -> tuple[Tensor, None]:
    """``llama.sdpa_attention_forward``: the output and the weights it returns, None."""
    return llama_sdpa(module, query, key, value, attention_mask)
