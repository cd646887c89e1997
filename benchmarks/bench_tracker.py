"""Time StorageTracker on a GPT-2-XL-shaped forward+backward on the meta device.

48 pre-norm blocks (d_model 1600, 25 heads, d_ff 6400, GELU MLP, causal softmax
attention written with matmul), vocab 50257, seq 16384, batch 1, fp32.  Prints
wall time, the peak found, peak process RSS and the machine.

    /work/venv/bin/python benchmarks/bench_tracker.py [--layers N] [--seq S] [--memtracker]

``--memtracker`` also times torch's private MemTracker on the same workload.
"""
import argparse
import os
import platform
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from lm_accounting.measure.tracker import StorageTracker  # noqa: E402


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, causal):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
        att = att.masked_fill(~causal[:s, :s], float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class LM(nn.Module):
    def __init__(self, layers, d, heads, vocab, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)
        self.register_buffer("causal", torch.ones(seq, seq, dtype=torch.bool).tril())

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x, self.causal)
        return self.head(self.ln_f(x))


def step(model, idx, tgt):
    loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
    loss.backward()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--d-model", type=int, default=1600)
    ap.add_argument("--heads", type=int, default=25)
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--memtracker", action="store_true", help="also time torch's MemTracker")
    a = ap.parse_args()

    with torch.device("meta"):
        model = LM(a.layers, a.d_model, a.heads, a.vocab, a.seq)
        idx = torch.randint(0, a.vocab, (a.batch, a.seq))
        tgt = torch.randint(0, a.vocab, (a.batch, a.seq))
    n_params = sum(p.numel() for p in model.parameters())
    print(f"machine: {platform.platform()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, python {platform.python_version()}, torch {torch.__version__}")
    print(f"workload: {a.layers} layers, d_model {a.d_model}, {a.heads} heads, seq {a.seq}, "
          f"batch {a.batch}, vocab {a.vocab}, {n_params:,} params, fp32, meta device")

    step(model, idx, tgt)  # warm-up: loads meta kernels / decompositions (untimed)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    step(model, idx, tgt)
    print(f"untracked forward+backward on meta: {time.perf_counter() - t0:.2f} s wall")
    model.zero_grad(set_to_none=True)

    tr = StorageTracker().track_module(model).track(idx, tgt)
    t0 = time.perf_counter()
    with tr:
        with tr.phase("forward"):
            loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        with tr.phase("backward"):
            loss.backward()
            del loss
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    print(f"StorageTracker forward+backward: {wall:.2f} s wall")
    for name, (peak, end) in tr.phase_table("meta").items():
        print(f"  {name:9s} peak {peak:,} B = {peak / 2**30:.2f} GiB = {peak / 1e9:.2f} GB;"
              f" end {end:,} B")
    print(f"  live storages tracked at the end: {len(tr._live):,}")
    print(f"peak process RSS: {rss / 2**20:.0f} MiB")

    if a.memtracker:
        from torch.distributed._tools.mem_tracker import MemTracker
        model.zero_grad(set_to_none=True)
        mt = MemTracker()
        mt.track_external(model, idx, tgt)
        t0 = time.perf_counter()
        with mt:
            step(model, idx, tgt)
        wall = time.perf_counter() - t0
        peak = mt.get_tracker_snapshot("peak")[torch.device("meta")]["Total"]
        print(f"torch MemTracker forward+backward: {wall:.2f} s wall, peak {peak:,} B")


if __name__ == "__main__":
    main()
