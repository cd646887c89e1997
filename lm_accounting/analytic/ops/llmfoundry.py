"""llm-foundry's MPT training step on a GPU, transliterated (the program of its H100 benchmark table).

The code is llm-foundry 061f2c7 (https://github.com/mosaicml/llm-foundry/tree/061f2c7ce64e655100286584a7629e2a09f827ba,
the commit whose ``scripts/train/benchmarking/README.md`` publishes the table), as ``submit_benchmarks.py`` configures
it: ``attn_impl: triton`` (its ``--attn_impl`` default), ``norm_type: low_precision_layernorm`` (set at :311), the
yamls' biases, learned positions and tied head (``configuration_mpt.py`` defaults: ``no_bias`` False,
``learned_pos_emb`` True, ``alibi`` False, every dropout 0.0), the loss ``fused_crossentropy``
(``modeling_mpt.py``:723, the default).  What it runs, per module:

* ``MPTModel.forward``: ``wte(input_ids) + wpe(pos)``, ``emb_drop`` (p = 0: its input), the blocks, ``norm_f``;
  the logits ``F.linear(x, wte.weight)`` (``logit_scale`` None);
* ``MPTBlock.forward`` (layers/blocks.py): ``x + attn(norm_1(x))``, then ``x + ffn(norm_2(x))`` (dropouts p = 0);
* ``LPLayerNorm`` (layers/norm.py): the input, weight and bias cast to the autocast dtype (copies only where they
  are fp32), then ``F.layer_norm`` with autocast off: one kernel in bf16 each way;
* ``MultiheadAttention`` (layers/attention.py:528-566): ``Wqkv`` (``nn.Linear`` with a bias: one ``addmm``),
  ``split`` into q, k, v, ``triton_flash_attn_fn`` (views ``b s (h d) -> b s h d``, ``flash_attn_func`` of
  layers/flash_attn_triton.py, a view back), ``out_proj``;
* ``MPTMLP`` (layers/ffn.py): ``up_proj``, ``nn.GELU(approximate='none')``, ``down_proj``;
* ``flash_attn.losses.cross_entropy.CrossEntropyLoss`` (flash-attn 1.x): one kernel reading the bf16 logits and
  writing fp32 losses and log-sum-exps, one backward kernel writing the bf16 gradient (``inplace_backward``
  False), no fp32 copy of the logits;
* Composer's train metrics after each micro-batch (``train_metrics``): two cross-entropies of the logits in fp32.

Its setup.py pins the kernels: ``triton-pre-mlir`` (vchiley/triton, branch ``triton_pre_mlir_sm90``),
``flash-attn==1.0.9`` and ``xentropy-cuda-lib`` (flash-attention v1.0.9), ``mosaicml>=0.16.3,<0.17`` (Composer).
The Triton kernel (``triton_flash_attention``) is priced by ``step_time`` (rule 2b) from the calibrated torch
flash kernel.  Only a GPU step is modelled (the Triton kernel has no CPU or meta path).  No torch.
"""

from __future__ import annotations

from ...config import ModelConfig
from ...setup import TrainingSetup
from . import aten as A
from .aten_activation import gelu
from .aten_layer_norm import layer_norm
from .aten_split import split
from .engine import Affine, StepInBatch
from .step import training_step
from .tensors import Storage, Tensor, autocast_off, autocast_or_not, current, empty, no_grad, record
from .transformers.gpt2 import GPT2LMHeadModel, LayerNorm
from .transformers.llama import B, GradientCheckpointingLayer, Linear

LSE_ROWS = 128
"""flash_attn_triton.py ``_flash_attn_forward``: ``seqlen_q_rounded = math.ceil(seqlen_q / 128) * 128``, the
length of the fp32 ``lse`` and ``tmp`` rows (and of the backward's ``delta``)."""


def triton_flash_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """``flash_attn_func(q, k, v, None, True, None)`` of layers/flash_attn_triton.py on (B, S, h, d) views, causal.
    Forward (``_flash_attn_forward``): ``o = empty_like(q)`` (contiguous: q is a strided view), ``lse`` and ``tmp``
    (B, h, S rounded up to 128) fp32, ``tmp`` dying at return; saves q, k, v, o, lse.  Backward
    (``_flash_attn_backward``): dq, dk, dv ``empty_like``, ``delta`` (like ``lse``) from a preprocess kernel
    reading o and do, ``dq_accum`` fp32 like q written by the backward kernel, then ``dq.copy_(dq_accum)``: a kernel
    reading 4 and writing 2 bytes per element."""
    b, s, h, d = q.shape
    rows = -(-s // LSE_ROWS) * LSE_ROWS
    out = empty((b, s, h, d), q.dtype, "flash_triton")
    lse = empty((b, h, rows), "fp32", "flash_triton_lse")
    tmp = Storage(b * h * rows * 4, "flash_triton_tmp")
    del tmp
    current().note("attention", "triton", "forward", b, h, s, d, q.dtype)

    def back(ctx, g, sq, sk, sv, so, sl):
        current().note("attention", "triton", "backward", b, h, s, d, sq.dtype)
        delta = empty(sl.shape, "fp32", "triton_bwd_preprocess")  # _bwd_preprocess_do_o_dot: reads o and do
        current().note("reads", so.nbytes + g[0].nbytes, d)
        accum = Storage(b * s * h * d * 4, "flash_triton_dq_accum")
        dk, dv = (empty(t.shape, t.dtype, "flash_triton_backward") for t in (sk, sv))
        dq = empty(sq.shape, sq.dtype, "copy")  # dq.copy_(dq_accum): reads the fp32 accumulator, writes dq
        current().note("reads", dq.nbytes, d)  # the fp32 read is twice dq's bf16 bytes: "copy" moves 2x, this 1x
        del accum, delta
        return dq, dk, dv

    record("FlashAttnFuncBackward", (q, k, v), (out,), back, (q, k, v, out, lse))
    return out


def fused_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """flash-attn 1.x ``CrossEntropyLoss(ignore_index=-100)`` on (N, V) bf16 logits (losses/cross_entropy.py,
    ``xentropy_cuda_lib``): forward reads the logits once and writes the fp32 losses and log-sum-exps (N,); saves
    the logits, the log-sum-exps and the labels; backward writes the (N, V) gradient in the logits' dtype, reading
    them again.  Then ``loss.sum() / (target != ignore_index).sum()`` (two reductions of N: ``mean_of``)."""
    n, vocab = logits.shape
    losses = empty((n,), "fp32", "xentropy")
    lse = empty((n,), "fp32", "xentropy")
    current().note("reads", logits.nbytes, vocab)

    def back(ctx, g, saved_logits, saved_lse, saved_labels):
        return (empty(saved_logits.shape, saved_logits.dtype, "xentropy_backward"),)

    record("SoftmaxCrossEntropyLossFnBackward", (logits,), (losses,), back, (logits, lse, labels))
    return A.sum_(losses, 0)


TRAIN_METRICS = 2
"""llm-foundry's ``ComposerMPTCausalLM`` train metrics (modeling_mpt.py:697-699, ``use_train_metrics`` True by
default): ``LanguageCrossEntropy`` and ``LanguagePerplexity``."""


def train_metrics(logits: Tensor, labels: Tensor) -> None:
    """Composer 0.16.4 (llm-foundry's ``mosaicml>=0.16.3,<0.17``) updates the train metrics after every
    micro-batch's backward (trainer.py:2472-2475 ``_eval_train_metrics``: under no_grad and the precision's
    autocast, on the step's own logits, ``eval_forward(batch, outputs)``); each is ``CrossEntropyLoss(
    reduction='sum')`` of the (N, V) bf16 logits (composer/metrics/nlp.py:100-121), which autocast runs in fp32
    (``cross_entropy`` is on torch's autocast-to-float32 list, docs amp.html): an fp32 copy of the logits, its
    log-softmax and the NLL.  Recorded at the forward's end: the same kernels, their transients (N·V·4 bytes
    each) a phase early."""
    with no_grad():
        for _ in range(TRAIN_METRICS):
            A.cross_entropy(A.to(logits, "fp32"), labels)


class LPLayerNorm(LayerNorm):
    """``LPLayerNorm`` (layers/norm.py): ``_cast_if_autocast_enabled`` on x, weight, bias, then ``F.layer_norm``
    under ``torch.autocast(enabled=False)``."""

    def __call__(self, x: Tensor) -> Tensor:
        amp = current().autocast
        x, w, b = (A.to(t, amp) if amp else t for t in (x, self.weight, self.bias))
        with autocast_off():
            return layer_norm(x, w, b, device=self.device)


class MPTBlock(GradientCheckpointingLayer):
    """``MPTBlock`` with ``MultiheadAttention`` (triton) and ``MPTMLP`` (module docstring)."""

    def __init__(self, cfg: ModelConfig, dtype: str, attn: str, device: str, name: str):
        d = cfg.d_model
        self.heads, self.d_head = cfg.num_heads, cfg.d_head
        self.norm_1 = LPLayerNorm(d, dtype, device, name + ".norm_1")
        self.Wqkv = Linear(d, 3 * d, True, dtype, name + ".attn.Wqkv")  # nn.Linear, fc_type 'torch': an addmm
        self.out_proj = Linear(d, d, True, dtype, name + ".attn.out_proj")
        self.norm_2 = LPLayerNorm(d, dtype, device, name + ".norm_2")
        self.up_proj = Linear(d, cfg.d_ff, True, dtype, name + ".ffn.up_proj")
        self.down_proj = Linear(cfg.d_ff, d, True, dtype, name + ".ffn.down_proj")

    def params(self) -> list[Tensor]:
        modules = (self.norm_1, self.Wqkv, self.out_proj, self.norm_2, self.up_proj, self.down_proj)
        return [p for m in modules for p in m.params()]

    def attention(self, x: Tensor) -> Tensor:
        """attention.py:528-566 and ``triton_flash_attn_fn``."""
        query, key, value = split(self.Wqkv(x), x.shape[-1], 2)  # :534 qkv.split([d, d, d], dim=2)
        heads = [A.view(t, *t.shape[:-1], self.heads, self.d_head) for t in (query, key, value)]  # b s h d
        out = triton_flash_attention(*heads)
        return self.out_proj(A.view(out, *out.shape[:2], -1))  # (B, S, d): a view of the contiguous output

    def forward(self, x: Tensor, attention_mask=None) -> Tensor:
        x = A.add(x, self.attention(self.norm_1(x)))
        return A.add(x, self.down_proj(gelu(self.up_proj(self.norm_2(x)))))


class MPTForCausalLM(GPT2LMHeadModel):
    """``ComposerMPTCausalLM`` (modeling_mpt.py): ``MPTForCausalLM`` and its ``loss`` (module docstring); GPT-2's
    skeleton (``wte``, ``wpe``, the blocks, the final norm, the tied head) with MPT's block and norm."""

    block_class = MPTBlock

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch: Affine | int = B, device="cuda"):
        super().__init__(cfg, seq, setup, batch, device)
        self.ln_f = LPLayerNorm(cfg.d_model, self.dtype, device, "norm_f")

    def transformer(self) -> Tensor:
        tokens = A.embedding(self.wte, self.input_ids)  # modeling_mpt.py:364
        positions = A.embedding(self.wpe, A.unsqueeze(empty((self.seq,), "int64", "arange"), 0))  # :401
        x = A.add(tokens, positions)  # :406, then emb_drop (p = 0)
        for block in self.h:
            x = block(x)
        return self.ln_f(x)  # :452

    def forward(self) -> tuple[Tensor, Tensor]:
        logits = A.linear(self.transformer(), self.wte)  # modeling_mpt.py:575
        flat = A.view(logits, -1, self.cfg.vocab_size)  # ComposerMPTCausalLM.loss: logits.view(-1, V)
        self.labels_flat = empty((flat.shape[0],), "int64", "targets")  # get_targets: the labels rolled by one
        return logits, fused_cross_entropy(flat, self.labels_flat)

    def loss(self) -> Tensor:
        """Composer's step: ``model(batch)`` and ``model.loss(outputs, batch)`` in its precision context (autocast
        for amp_bf16), the bf16 logits kept as they are."""
        with autocast_or_not("bf16" if self.setup.autocast else None):
            logits, loss = self.forward()
        train_metrics(A.view(logits, -1, self.cfg.vocab_size), self.labels_flat)
        del logits
        return loss


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover (empty: it covers ``cfg`` under ``setup``)."""
    out = []
    if setup.precision == "fp32":
        out.append("llm-foundry's Triton flash attention runs in 16 bits only (flash_attn_triton.py asserts it)")
    if setup.checkpoint == "selective":
        out.append("llm-foundry's MPT under Composer checkpoints whole blocks only")
    if cfg.norm != "layernorm" or cfg.mlp != "gelu" or cfg.positions != "learned" or not cfg.tie_embeddings:
        out.append("an MPT other than the benchmark's (LayerNorm, GELU MLP, learned positions, tied head)")
    if not (cfg.qkv_bias and cfg.output_bias and cfg.mlp_bias) or cfg.kv_heads != cfg.num_heads or cfg.moe:
        out.append("an MPT without biases, with grouped heads or with experts")
    if cfg.d_head * cfg.num_heads != cfg.d_model or cfg.d_head > 128:
        out.append("a head size other than d_model / heads, or over 128 (the Triton kernel's limit)")
    return out


def predict_step(
    cfg: ModelConfig,
    seq: int,
    setup: TrainingSetup,
    *,
    batch: int = 1,
    mode: str = "plain",
    device: str = "cuda",
    optimizer_step: bool = True,
    **_threads,
) -> StepInBatch:
    """The step (``ops.predict_step``), on "cuda" only: ``batch`` 1 at B = 1, else the lines in B."""
    if device != "cuda":
        raise ValueError("llm-foundry's MPT step is modelled on cuda only (its Triton kernel has no cpu or meta path)")
    b = 1 if batch == 1 else B
    return training_step(
        lambda: MPTForCausalLM(cfg, seq, setup, b, device),
        optimizer=setup.optimizer,
        device=device,
        traced=mode == "traced",
        cuda_batch=batch,
        optimizer_step=optimizer_step,
    )
