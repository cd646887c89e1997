"""Context parallel (issue 27), what can be proven today: torch 2.13's ``context_parallel`` runs one rank of a CP job
on the fake process group once ``measure.context_parallel.install()`` gives its ring attention the CPU flash kernel,
and the collectives it issues per attention layer are these, written out by hand from
``torch/distributed/tensor/experimental/_context_parallel/_attention.py`` (s = S/cp tokens a rank, KV = its local
K and V, 2·B·h_kv·s·d_head·e bytes; the recorder keeps a collective's largest tensor):

* rotate "allgather" (torch's default): the forward all-gathers K and V once (cp·KV); the backward all-gathers them
  again (they are not saved) and passes the fp32 dK, dV around the ring cp times (each shift sends the whole
  2·B·h_kv·s·d_head·4 bytes: an ``all_to_all_single`` of one buffer);
* rotate "alltoall": K and V pass around the ring cp − 1 times in the forward and again in the backward, then the
  fp32 dK, dV cp times.

Not yet a parallelism: no ``--cp`` layout, no memory or time prediction (docs/limits.md, "Context parallel")."""

import pytest

torch = pytest.importorskip("torch")

from lm_accounting.measure.context_parallel import install
from lm_accounting.measure.distributed import CollectiveRecorder, init_fake_group


class Attention(torch.nn.Module):
    """One causal attention layer of ``heads`` query heads over ``kv_heads`` K/V heads (GQA when fewer)."""

    def __init__(self, d: int, heads: int, kv_heads: int):
        super().__init__()
        self.h, self.h_kv, self.d_head = heads, kv_heads, d // heads
        self.q = torch.nn.Linear(d, d, bias=False)
        self.kv = torch.nn.Linear(d, 2 * kv_heads * self.d_head, bias=False)
        self.o = torch.nn.Linear(d, d, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q = self.q(x).view(b, s, self.h, self.d_head).transpose(1, 2)  # (B, h, s, d_head)
        k, v = self.kv(x).view(b, s, 2, self.h_kv, self.d_head).unbind(2)  # (B, s, h_kv, d_head) each
        y = torch.nn.functional.scaled_dot_product_attention(
            q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=self.h != self.h_kv
        )
        return self.o(y.transpose(1, 2).reshape(b, s, d))


def run_rank(cp: int, rank: int, seq: int, rotate: str, dtype, heads: int = 2, kv_heads: int = 2, d: int = 16):
    """One forward and backward of the layer on rank ``rank`` of a cp-rank job: (the recorded collectives, the
    local shard's sequence length)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import set_rotate_method

    install()
    set_rotate_method(rotate)
    init_fake_group(cp, rank)
    mesh = init_device_mesh("cpu", (cp,), mesh_dim_names=("cp",))
    torch.manual_seed(0)
    layer = Attention(d, heads, kv_heads).to(dtype)
    x, target = torch.randn(1, seq, d, dtype=dtype), torch.randn(1, seq, d, dtype=dtype)
    rec = CollectiveRecorder()
    try:
        with context_parallel(mesh, buffers=[x, target], buffer_seq_dims=[1, 1]):
            local = x.shape[1]
            with rec:
                loss = torch.nn.functional.mse_loss(layer(x), target)
                rec.phase = "backward"
                loss.backward()
    finally:
        set_rotate_method("allgather")
    return rec.calls, local


@pytest.mark.parametrize(
    ("cp", "rank", "seq", "rotate", "dtype", "kv_heads"),
    [
        (2, 0, 16, "allgather", torch.float32, 2),
        (2, 1, 16, "alltoall", torch.float32, 2),
        (4, 3, 32, "allgather", torch.bfloat16, 2),
        (4, 0, 32, "alltoall", torch.bfloat16, 2),
        (2, 1, 16, "allgather", torch.float32, 1),  # two query heads on one K/V head
    ],
)
def test_a_cp_rank_runs_and_its_collectives_are_written_out_by_hand(cp, rank, seq, rotate, dtype, kv_heads):
    calls, local = run_rank(cp, rank, seq, rotate, dtype, kv_heads=kv_heads)
    s, d_head, e = seq // cp, 16 // 2, torch.tensor([], dtype=dtype).element_size()
    assert local == s  # the buffers' sequence, sharded (load balanced: S divides by 2·cp)
    kv = 2 * 1 * kv_heads * s * d_head * e  # the rank's K and V
    dkv = 2 * 1 * kv_heads * s * d_head * 4  # their gradients, accumulated in fp32
    if rotate == "allgather":
        want = [("all_gather", cp * kv, "forward"), ("all_gather", cp * kv, "backward")]
        want += [("all_to_all", dkv, "backward")] * cp
    else:
        want = [("all_to_all", kv, "forward")] * (cp - 1) + [("all_to_all", kv, "backward")] * (cp - 1)
        want += [("all_to_all", dkv, "backward")] * cp
    assert sorted(calls) == sorted(want)


def test_without_the_cpu_kernel_cp_fails_as_documented():
    """The failure docs/limits.md quotes: CP's table lists CUDA's kernels only."""
    from torch.distributed.tensor.experimental._context_parallel import _attention as cp_attention

    from lm_accounting.measure.context_parallel import FLASH_CPU

    saved = dict(cp_attention.custom_ops)
    for op in [k for k in cp_attention.custom_ops if FLASH_CPU in str(k)]:
        del cp_attention.custom_ops[op]
    try:
        with pytest.raises(NotImplementedError, match="does not have a sharding strategy registered"):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor.experimental import context_parallel

            init_fake_group(2, 0)
            mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
            layer, x = Attention(16, 2, 2), torch.randn(1, 16, 16)
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                layer(x).sum().backward()
    finally:
        cp_attention.custom_ops.clear()
        cp_attention.custom_ops.update(saved)
