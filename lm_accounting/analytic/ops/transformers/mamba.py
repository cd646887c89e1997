"""transformers 5.24's ``MambaForCausalLM`` and ``FalconMambaForCausalLM`` training steps, transliterated
(``models/mamba/modeling_mamba.py``; ``models/falcon_mamba/modeling_falcon_mamba.py``, whose mixer adds weightless
RMSNorms on dt, B and C; line numbers of transformers 5.24's modeling_mamba.py).

One ``MambaBlock`` (:507-532) per layer: ``residual + mixer(norm(x))``, the norm ``MambaRMSNorm`` (:487-504: Llama's),
the residual cast to fp32 with ``residual_in_fp32`` (the class default, true),
so after the first block a 16-bit model's hidden states are fp32.  The mixer ``MambaMixer.forward`` (:360-484) on
the path training takes without the CUDA kernels (``mamba_inner_fn`` returns None, after its ``D.float()`` and
``dt_proj.bias.float()`` arguments are made and dropped): ``in_proj`` then a transpose; ``A = -exp(A_log.float())``;
the chunk into x and the gate; ``causal_conv1d_fn`` (:82-102: a depthwise ``F.conv1d`` padded by K − 1, cut to S,
SiLU); ``x_proj`` and the split into dt, B and C (Falcon-Mamba: each through ``FalconMambaWeightlessRMSNorm``);
``dt_proj.weight @ dt.transpose(1, 2)`` (torch's ``matmul`` folds the 3-d operand, ``mm``, and copies the
transposed product contiguous); ``mamba_selective_scan`` (:175-281) on its sequential branch (no mambapy, no
associative scan outside torch.compile): dt + bias, softplus, ``discrete_A = exp(A · dt)``, ``deltaB_u = dt · B ·
x`` in fp32, then ``for index in range(seq_len)``: ``ssm_state = discrete_A[:, :, i] * ssm_state + deltaB_u[:, :,
i]`` and ``matmul(ssm_state.to(input_dtype), C[:, i, :].unsqueeze(-1))[:, :, 0]`` appended to a list, stacked;
the D residual and the SiLU gate; ``out_proj``.  The loop's middle steps are alike and replayed once
(``tensors.repeated``), two steps alone at each end (the first reads a zero state without grad; the last ones fill
the gradient buffers of ``discrete_A`` and ``C`` that the middle ones add to), as ``qwen3_next``'s chunk loop.

The model (:643-709): the embedding, the blocks, ``norm_f``; ``MambaForCausalLM`` (:756-809): ``lm_head`` (tied to
the embedding by default) on ``hidden_states.to(lm_head.weight.dtype)``, ``.float()``, ``ForCausalLMLoss``.

amp-bf16 (``llama.LlamaForCausalLM.loss``'s autocast region, CUDA's lists as ``model.autocast`` emulates them):
the projections, ``dt_proj``'s ``@`` (cast before its fold), the conv1d and each step's read-out ``matmul`` run in
bf16, so the scan's input dtype is bf16; ``softplus`` is an fp32 op; the discretisation promotes to fp32.  Not
transliterated (``unsupported``): selective checkpointing (transformers has none).  No torch.
"""

from __future__ import annotations

from ....config import ModelConfig
from ....setup import TrainingSetup
from .. import aten as A
from ..aten_index import split_with_sizes
from ..aten_pointwise import exp
from ..aten_scan import causal_conv1d, softplus
from ..aten_split import chunk
from ..tensors import Tensor, current, empty, no_grad, parameter, record, repeated, runs_of
from . import llama
from .llama import B, Linear, weightless_rms_norm


def stack_steps(outputs: list[Tensor], steps: int) -> Tensor:
    """``torch.stack(scan_outputs, dim=-1)`` of ``steps`` (B, E) outputs, ``outputs`` those replayed (the middle
    steps' one standing for all of them): one new contiguous tensor; the backward unbinds the gradient (views,
    ``stack_tensors_backward``)."""
    first = outputs[0]
    out = empty((*first.shape, steps), first.dtype, "stack")
    shape, n = first.shape, len(outputs)

    def back(ctx, g):
        return tuple(g[0].alias(shape) for _ in range(n))

    record("StackBackward0", tuple(outputs), (out,), back)
    return out


def matmul_into_3d(weight: Tensor, x: Tensor) -> Tensor:
    """``weight @ x`` of a 2-d weight that requires grad and a 3-d x (LinearAlgebra.cpp ``_matmul_impl``,
    ``should_fold``): x.mT folded to 2-d (a view or a copy: ``reshape``), ``mm`` by weight.t(), an
    ``_unsafe_view``, and ``.mT().contiguous()``: the product copied, then dropped."""
    weight, x = A.lower(weight, x)  # a lower-precision op under autocast: cast before the fold
    t1 = A.transpose(x, -1, -2)
    folded = A.reshape(t1, -1, t1.shape[-1])
    output = A.unsafe_view(A.mm(folded, A.t_(weight)), *t1.shape[:-1], weight.shape[0])
    return A.contiguous(A.transpose(output, -1, -2))


def selective_scan(hidden_states, dt, A_, B_, C_, D, z, delta_bias) -> Tensor:
    """``mamba_selective_scan`` (:175-281) with ``delta_softplus``, no last state, the recurrent branch."""
    batch_size, intermediate_size, seq_len = hidden_states.shape
    input_dtype = hidden_states.dtype
    dt = A.add(dt, A.unsqueeze(A.to(delta_bias, dt.dtype), -1))  # :205
    dt = softplus(dt)
    B_ = A.transpose(B_, 1, 2)  # :210
    C_ = A.transpose(C_, 1, 2)
    discrete_A = exp(A.mul(A.unsqueeze(A.unsqueeze(A_, 0), 2), A.unsqueeze(dt, -1)))  # :214
    discrete_B = A.mul(A.unsqueeze(dt, -1), A.unsqueeze(A.to(B_, "fp32"), 1))
    deltaB_u = A.mul(discrete_B, A.unsqueeze(A.to(hidden_states, "fp32"), -1))
    with no_grad():  # :252-258
        state = [empty((batch_size, intermediate_size, A_.shape[-1]), input_dtype, "zeros")]
    scan_outputs: list[Tensor] = []

    def step(index: int) -> None:  # :261-267
        new = A.add(A.mul(A.select(discrete_A, 2, index), state[0]), A.select(deltaB_u, 2, index))
        state[0] = new
        del new
        product = A.matmul(A.to(state[0], input_dtype), A.unsqueeze(A.select(C_, 1, index), -1))
        scan_outputs.append(A.select(product, 2, 0))

    middle = seq_len - 4
    run = current()  # inside a repeated block or a checkpointed one (its recomputation packs every step): literal
    if middle < 2 or run.segment is not None or run.hooks:
        for index in range(seq_len):
            step(index)
    else:
        step(0)
        step(1)
        with repeated(middle):
            step(2)
        # the replayed step's output stands for the ``middle`` ones the list holds: their bytes die with the list
        storage = scan_outputs[-1].storage
        storage.nbytes = storage.nbytes * middle
        step(seq_len - 2)
        step(seq_len - 1)
    scan_output = stack_steps(scan_outputs, seq_len)  # :268
    scan_output = A.add(scan_output, A.mul(hidden_states, A.unsqueeze(A.unsqueeze(D, 0), -1)))  # :271
    scan_output = A.mul(scan_output, A.silu(z))  # :274
    return scan_output  # the locals die: ``deltaB_u`` and the steps' products (the list) with them


def one_by_one(layers: int) -> list[tuple[int, int]]:
    """Every layer replayed alone: a layer replayed for a run of alike ones (``tensors.repeated``) runs its scan step
    by step (repeats do not nest), a layer alone replays the scan's middle steps once, so without checkpointing
    (whose recomputation runs every step anyway) a step costs O(layers), not O(S)."""
    return [(i, 1) for i in range(layers)]


class Mixer:
    """``MambaMixer`` (:285-484) in training, without a cache or a padding mask; ``norms``: Falcon-Mamba's
    weightless RMSNorms on dt, B and C (a subclass's own: Jamba's, ``normed``)."""

    calls_mamba_inner_fn = True
    """Whether the forward first calls ``mamba_inner_fn`` (Mamba's, Falcon-Mamba's; Jamba's does not)."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, buffer_dtype: str | None = None):
        d, e, n, r = cfg.d_model, cfg.ssm_inner, cfg.ssm_state_size, cfg.ssm_dt_rank
        self.intermediate_size, self.ssm_state_size, self.time_step_rank = e, n, r
        self.kernel, self.norms = cfg.ssm_conv_kernel, cfg.ssm_norms == "weightless"
        # model.parameters() order: the mixer's own (A_log, D), then its children in registration order
        self.A_log = parameter((e, n), dtype, name + ".A_log")
        self.D = parameter((e,), dtype, name + ".D")
        self.conv_weight = parameter((e, 1, self.kernel), dtype, name + ".conv1d.weight")
        self.conv_bias = parameter((e,), dtype, name + ".conv1d.bias")
        self.in_proj = Linear(d, 2 * e, False, dtype, name + ".in_proj")
        self.x_proj = Linear(e, r + 2 * n, False, dtype, name + ".x_proj")
        self.dt_proj = Linear(r, e, True, dtype, name + ".dt_proj")
        self.out_proj = Linear(e, d, False, dtype, name + ".out_proj")
        # Falcon-Mamba's norms' weights: non-persistent buffers of ones, unused (modeling_falcon_mamba.py:47-52);
        # fp32 under FSDP2's bf16 policy, which casts parameters, not buffers (``buffer_dtype``)
        widths = (e, n, n) if self.norms else ()
        self.buffers = [empty((w,), buffer_dtype or dtype, name + ".norm_buffer") for w in widths]

    def params(self) -> list[Tensor]:
        own = [self.A_log, self.D, self.conv_weight, self.conv_bias]
        return own + self.in_proj.params() + self.x_proj.params() + self.dt_proj.params() + self.out_proj.params()

    def normed(self, time_step: Tensor, B_: Tensor, C_: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """dt, B and C after ``x_proj``: Falcon-Mamba's weightless norms (modeling_falcon_mamba.py:469-471)."""
        if not self.norms:
            return time_step, B_, C_
        return weightless_rms_norm(time_step), weightless_rms_norm(B_), weightless_rms_norm(C_)

    def causal_conv1d_fn(self, hidden_states: Tensor) -> Tensor:
        """:82-102 (activation "silu"), on ``conv1d.weight.squeeze(1)``."""
        return causal_conv1d(hidden_states, A.squeeze(self.conv_weight, 1), self.conv_bias, activation=True)

    def __call__(self, hidden_states: Tensor) -> Tensor:
        dtype = hidden_states.dtype  # :368
        projected_states = A.transpose(self.in_proj(hidden_states), 1, 2)  # :378
        A_ = A.neg(exp(A.to(self.A_log, "fp32")))  # :380
        if self.calls_mamba_inner_fn:  # its arguments (:382-396), made and dropped when it returns None
            args = [A.to(self.D, "fp32"), A.to(self.dt_proj.bias, "fp32")]
            del args
        hidden_states_B_C, gate = chunk(projected_states, 2, 1)  # :402
        hidden_states_B_C = self.causal_conv1d_fn(hidden_states_B_C)  # :422-428
        hidden_states_B_C = A.transpose(hidden_states_B_C, 1, 2)  # :433
        r, n = self.time_step_rank, self.ssm_state_size
        time_step, B_, C_ = split_with_sizes(self.x_proj(hidden_states_B_C), [r, n, n], -1)  # :434-438
        time_step, B_, C_ = self.normed(time_step, B_, C_)
        time_step = matmul_into_3d(self.dt_proj.weight, A.transpose(time_step, 1, 2))  # :440
        time_proj_bias = A.to(self.dt_proj.bias, "fp32")  # :441
        D = A.to(self.D, "fp32")  # :467 (the argument lives until the call returns)
        scan_output = selective_scan(
            A.transpose(hidden_states_B_C, 1, 2),
            time_step,
            A_,
            A.transpose(B_, 1, 2),
            A.transpose(C_, 1, 2),
            D,
            gate,
            time_proj_bias,
        )  # :461-474
        del D
        return self.out_proj(A.to(A.transpose(scan_output, 1, 2), dtype))  # :483


class Block(llama.GradientCheckpointingLayer):
    """``MambaBlock`` (:507-532), ``residual_in_fp32``."""

    def __init__(self, cfg: ModelConfig, dtype: str, name: str, buffer_dtype: str | None = None):
        self.residual_in_fp32 = cfg.residual_in_fp32
        self.norm = llama.RMSNorm(cfg.d_model, dtype, name + ".norm")
        self.mixer = Mixer(cfg, dtype, name + ".mixer", buffer_dtype)

    def params(self) -> list[Tensor]:
        return [self.norm.weight] + self.mixer.params()

    def forward(self, hidden_states: Tensor) -> Tensor:
        residual = hidden_states  # :524
        hidden_states = self.norm(A.to(hidden_states, self.norm.weight.dtype))
        if self.residual_in_fp32:
            residual = A.to(residual, "fp32")  # :526-527
        hidden_states = self.mixer(hidden_states)
        return A.add(residual, hidden_states)  # :530


class MambaForCausalLM:
    """``MambaForCausalLM`` with ``MambaModel`` (:616-809), labels given."""

    def __init__(self, cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, buffer_dtype: str | None = None):
        dtype = llama.DTYPES[setup.precision]
        self.cfg, self.seq, self.batch, self.setup, self.dtype = cfg, seq, batch, setup, dtype
        self.embeddings = parameter((cfg.vocab_size, cfg.d_model), dtype, "embeddings.weight")
        self.layers = [Block(cfg, dtype, f"layers.{i}", buffer_dtype) for i in range(cfg.num_layers)]
        for layer in self.layers:
            layer.gradient_checkpointing = setup.checkpoint == "full"
        self.norm_f = llama.RMSNorm(cfg.d_model, dtype, "norm_f")
        tied = cfg.tie_embeddings
        self.lm_head = self.embeddings if tied else parameter((cfg.vocab_size, cfg.d_model), dtype, "lm_head.weight")
        self.input_ids = empty((batch, seq), "int64", "input_ids")
        self.labels = empty((batch, seq), "int64", "labels")

    def parameters(self) -> list[Tensor]:
        out = [self.embeddings]
        for layer in self.layers:
            out += layer.params()
        out.append(self.norm_f.weight)
        return out if self.cfg.tie_embeddings else out + [self.lm_head]

    def model(self) -> Tensor:
        """``MambaModel.forward`` (:643-709)."""
        inputs_embeds = A.embedding(self.embeddings, self.input_ids)  # :671 (a local until the return)
        hidden_states = inputs_embeds
        n = self.cfg.num_layers
        runs = runs_of([0] * n)  # every layer alike: the first, the middle ones as one run, the last
        for first, times in runs if self.setup.checkpoint == "full" else one_by_one(n):
            with repeated(times):
                hidden_states = self.layers[first](hidden_states)
        hidden_states = self.norm_f(hidden_states)  # :691
        del inputs_embeds
        return hidden_states

    def forward(self) -> tuple[Tensor, Tensor]:
        """:781-799: the head on ``hidden_states.to(lm_head.weight.dtype)``, ``.float()``, ``ForCausalLMLoss``."""
        mamba_outputs = self.model()  # the model's output holds the normed states until the return
        hidden_states = A.view(mamba_outputs, *mamba_outputs.shape)
        logits = A.to(A.linear(A.to(hidden_states, self.lm_head.dtype), self.lm_head), "fp32")
        loss = llama.for_causal_lm_loss(logits, self.labels, self.cfg.vocab_size)
        del hidden_states, mamba_outputs
        return logits, loss

    loss = llama.fp32_logits_loss


def causal_lm(cfg: ModelConfig, seq: int, setup: TrainingSetup, batch=B, buffer_dtype=None) -> MambaForCausalLM:
    """The program of ``ops.transformers.predict_step`` (``buffer_dtype``: Falcon-Mamba's norm buffers' dtype where
    it is not the model's, under FSDP2's bf16 policy: ``ops.fsdp``)."""
    return MambaForCausalLM(cfg, seq, setup, batch, buffer_dtype)


def unsupported(cfg: ModelConfig, setup: TrainingSetup) -> list[str]:
    """What this transliteration does not cover for ``cfg`` under ``setup``."""
    out = []
    if setup.checkpoint == "selective":
        out.append("transformers has no selective activation checkpointing")
    return out
