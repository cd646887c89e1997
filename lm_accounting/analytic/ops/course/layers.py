"""Our model's building blocks (``lm_accounting/model/layers.py``) on symbolic tensors, line by line.

Each class or function follows the one of the same name in ``model/layers.py`` (the line it transliterates is
quoted in its comment), with the same Python locals, so that the tensors die where the live model's die.
Under amp-bf16 the ops go through ``autocast``: the emulation of CUDA's bf16 autocast that the live model runs
(``model/autocast.py``: ``CudaAutocast``), whose casts are per call (no cache: every weight reaches a matmul as
a ``.t()`` view, which autocast's cache never holds).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

from .. import aten as A
from .. import cuda
from ..aten_activation import gelu, relu
from ..aten_flash import flash_attention_for_cpu
from ..aten_index import gather, index, stack, strided_slice
from ..aten_pointwise import amax, divide, exp, log, mean_all, sigmoid, where
from ..tensors import Tensor, empty, parameter
from .sac import mode_wrapped_number, saved_op

_AUTOCAST: list[bool] = [False]


@contextmanager
def autocast(on: bool):
    """``TransformerLM._autocast``: ``CudaAutocast(torch.bfloat16)`` for amp-bf16, else nothing."""
    _AUTOCAST.append(on)
    try:
        yield
    finally:
        _AUTOCAST.pop()


def _cast(dtype: str, *args: Tensor) -> tuple:
    """``CudaAutocast._cast_args``: floating arguments of another dtype cast, the last one first."""
    if not _AUTOCAST[-1]:
        return args
    return tuple(reversed([a if a.dtype == dtype else A.to(a, dtype) for a in reversed(args)]))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``torch.matmul`` (on autocast's lower-precision list: bf16 copies of fp32 arguments)."""
    a, b = _cast("bf16", a, b)
    return A.matmul(a, b, saved_op)


def bmm(a: Tensor, b: Tensor) -> Tensor:
    """``torch.bmm`` (on autocast's lower-precision list)."""
    a, b = _cast("bf16", a, b)
    return saved_op(A.bmm, a, b)


def with_number(op, x: Tensor, number: float) -> Tensor:
    """``x + eps``, ``x * scale``: an op with a Python number (inside selective checkpointing, wrapped once more
    for torch's dispatch mode on a plain CPU run: ``sac.mode_wrapped_number``)."""
    extra = mode_wrapped_number()
    out = op(x, number)
    del extra
    return out


def fp32_op(op, x: Tensor) -> Tensor:
    """An op on autocast's fp32 list (``exp``, ``rsqrt``, ``pow``): an fp32 copy of a 16-bit argument."""
    (x,) = _cast("fp32", x)
    return op(x)


class Bias:
    """``Bias.forward`` (layers.py:34): ``y + b``."""

    def __init__(self, features: int, dtype: str, name: str):
        self.bias = parameter((features,), dtype, name + ".bias")

    def __call__(self, y: Tensor) -> Tensor:
        return A.add(y, self.bias)


class Linear:
    """``Linear.forward`` (layers.py:54): ``y = torch.matmul(x, self.weight.t())``, then the ``Bias`` if any."""

    def __init__(self, d_in: int, d_out: int, dtype: str, name: str, bias: bool = False):
        self.weight = parameter((d_out, d_in), dtype, name + ".weight")
        self.bias = Bias(d_out, dtype, name + ".bias") if bias else None

    def params(self) -> list[Tensor]:
        return [self.weight] + ([self.bias.bias] if self.bias is not None else [])

    def __call__(self, x: Tensor) -> Tensor:
        y = matmul(x, A.t_(self.weight))
        return y if self.bias is None else self.bias(y)


class Embedding:
    """``Embedding.forward`` (layers.py:71): ``self.weight[token_ids]``."""

    def __init__(self, rows: int, width: int, dtype: str, name: str):
        self.weight = parameter((rows, width), dtype, name + ".weight")

    def __call__(self, token_ids: Tensor) -> Tensor:
        return index(self.weight, token_ids)


class RMSNorm:
    """``RMSNorm.forward`` (layers.py:90): in fp32, cast back to the input dtype."""

    def __init__(self, d: int, eps: float, dtype: str, name: str):
        self.eps = eps
        self.weight = parameter((d,), dtype, name + ".weight")

    def params(self) -> list[Tensor]:
        return [self.weight]

    def __call__(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = A.to(x, "fp32")
        # y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        y = A.mul(x32, fp32_op(A.rsqrt, with_number(A.add, A.mean(fp32_op(_square, x32), -1, keepdim=True), self.eps)))
        return A.to(A.mul(y, A.to(self.weight, "fp32")), in_dtype)


class LayerNorm:
    """``LayerNorm.forward`` (layers.py:113): mean, centre, biased variance, rsqrt; in fp32, cast back; ``bias``
    False: the gain only (Cohere's ``CohereLayerNorm``, ``make_norm(bias=False)``)."""

    def __init__(self, d: int, eps: float, dtype: str, name: str, bias: bool = True):
        self.eps = eps
        self.weight = parameter((d,), dtype, name + ".weight")
        self.bias = parameter((d,), dtype, name + ".bias") if bias else None

    def params(self) -> list[Tensor]:
        return [self.weight] + ([self.bias] if self.bias is not None else [])

    def __call__(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x32 = A.to(x, "fp32")
        centred = A.sub(x32, A.mean(x32, -1, keepdim=True))
        y = A.mul(
            centred, fp32_op(A.rsqrt, with_number(A.add, A.mean(fp32_op(_square, centred), -1, keepdim=True), self.eps))
        )
        if self.bias is None:
            return A.to(A.mul(y, A.to(self.weight, "fp32")), in_dtype)
        return A.to(A.add(A.mul(y, A.to(self.weight, "fp32")), A.to(self.bias, "fp32")), in_dtype)


def _square(x: Tensor) -> Tensor:
    return A.pow_(x, 2)


def make_norm(kind: str, d: int, eps: float, dtype: str, name: str, bias: bool = True):
    if kind == "layernorm":
        return LayerNorm(d, eps, dtype, name, bias)
    return RMSNorm(d, eps, dtype, name)


def silu(x: Tensor) -> Tensor:
    """``silu`` (layers.py:134): ``x * torch.sigmoid(x)``."""
    return A.mul(x, sigmoid(x))


class SwiGLU:
    """``SwiGLU.forward`` (layers.py:148): ``self.w2(silu(self.w1(x)) * self.w3(x))``; ``GeGLU`` (:156) with GELU (tanh)."""

    def __init__(self, d_model: int, d_ff: int, dtype: str, name: str, bias: bool, act=silu):
        self.w1 = Linear(d_model, d_ff, dtype, name + ".w1", bias)
        self.w2 = Linear(d_ff, d_model, dtype, name + ".w2", bias)
        self.w3 = Linear(d_model, d_ff, dtype, name + ".w3", bias)
        self.act = act

    def params(self) -> list[Tensor]:
        return self.w1.params() + self.w2.params() + self.w3.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.w2(A.mul(self.act(self.w1(x)), self.w3(x)))


def relu2(x: Tensor) -> Tensor:
    """``Relu2MLP``'s activation: ``torch.pow(F.relu(x), 2)``; pow saves its input (the ReLU's result, or under
    amp-bf16 its fp32 copy: pow is on autocast's fp32 list)."""
    return fp32_op(_square, relu(x))


class GeluMLP:
    """``GeluMLP.forward`` (layers.py:168): ``self.proj(gelu_tanh(self.fc(x)))``; ``ReluMLP``'s and
    ``Relu2MLP``'s with ``act`` = ``relu``, ``relu2``."""

    def __init__(self, d_model: int, d_ff: int, dtype: str, name: str, bias: bool, act=gelu):
        self.fc = Linear(d_model, d_ff, dtype, name + ".fc", bias)
        self.proj = Linear(d_ff, d_model, dtype, name + ".proj", bias)
        self.act = act

    def params(self) -> list[Tensor]:
        return self.fc.params() + self.proj.params()

    def __call__(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


def make_ffn(kind: str, d_model: int, d_ff: int, dtype: str, name: str, bias: bool):
    if kind in ("gelu", "relu", "relu2"):
        return GeluMLP(d_model, d_ff, dtype, name, bias, {"gelu": gelu, "relu": relu, "relu2": relu2}[kind])
    return SwiGLU(d_model, d_ff, dtype, name, bias, gelu if kind == "geglu" else silu)


class RotaryPositionalEmbedding:
    """``RotaryPositionalEmbedding`` (layers.py:172; forward :196): fp32 cos/sin tables (max_seq_len, d_k/2), buffers."""

    def __init__(self, d_k: int, max_seq_len: int):
        self.cos = empty((max_seq_len, d_k // 2), "fp32", "rope.cos")
        self.sin = empty((max_seq_len, d_k // 2), "fp32", "rope.sin")

    def __call__(self, x: Tensor, token_positions: Tensor) -> Tensor:
        cos = A.to(index(self.cos, token_positions), x.dtype)  # self.cos[token_positions].to(x.dtype)
        sin = A.to(index(self.sin, token_positions), x.dtype)
        x_even, x_odd = strided_slice(x, 0, 2), strided_slice(x, 1, 2)  # x[..., 0::2], x[..., 1::2]
        out_even = A.sub(A.mul(x_even, cos), A.mul(x_odd, sin))
        out_odd = A.add(A.mul(x_even, sin), A.mul(x_odd, cos))
        stacked = stack((out_even, out_odd), -1)  # torch.stack((out_even, out_odd), dim=-1).flatten(-2)
        return A.view(stacked, *stacked.shape[:-2], stacked.shape[-2] * stacked.shape[-1])


def softmax(x: Tensor, dim: int) -> Tensor:
    """``softmax`` (layers.py:210): ``z = x - x.detach().amax(dim, keepdim=True)``; ``e = z.exp()``; ``e / e.sum(dim, keepdim=True)``."""
    z = A.sub(x, amax(x.detach(), dim))
    e = fp32_op(exp, z)
    return divide(e, A.sum_(e, dim, keepdim=True))


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> Tensor:
    """``scaled_dot_product_attention`` (layers.py:228; naive, GQA by stacking a group's query heads along the rows)."""
    *lead, h, s_q, d_k = query.shape
    kv, s_k = key.shape[-3], key.shape[-2]
    q = A.reshape(query, *lead, kv, (h // kv) * s_q, d_k)
    scores = with_number(A.mul, matmul(q, A.transpose(key, -2, -1)), 1.0 / math.sqrt(d_k))
    scores = A.reshape(scores, *scores.shape[:-3], h, s_q, s_k)
    if mask is not None:
        scores = where(mask, scores, float("-inf"))
    probs = softmax(scores, -1)
    out = matmul(A.reshape(probs, *probs.shape[:-3], kv, (h // kv) * s_q, s_k), value)
    return A.reshape(out, *out.shape[:-3], h, s_q, out.shape[-1])


def fused_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``FusedAttention.forward`` (layers.py:284) on meta/cpu: ``aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0,
    causal)`` (a stand-in on autocast's lower-precision list); its logsumexp dies on return.  On cuda (:291-297): CUDA's
    flash or memory-efficient kernel (``ops.cuda.scaled_dot_product_attention``)."""
    q, k, v = _cast("bf16", q, k, v)
    if cuda.on_cuda():  # F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv < h)
        return saved_op(cuda.scaled_dot_product_attention(q, k, v), q, k, v)[0]
    out, _logsumexp = saved_op(flash_attention_for_cpu, q, k, v)
    return out


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """``cross_entropy`` (layers.py:301): mean of ``log Σ exp(z) - z[target]``, z = logits - max."""
    z = A.sub(logits, amax(logits.detach(), -1))
    log_sum_exp = log(A.sum_(exp(z), -1))
    picked = A.squeeze(gather(z, -1, A.unsqueeze(targets, -1)), -1)
    return mean_all(A.sub(log_sum_exp, picked))
