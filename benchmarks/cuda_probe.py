"""Two questions a CUDA trace of transformers' step left open, answered on the GPU at hand.

    python benchmarks/cuda_probe.py [--only snapshot,cudnn]
    python benchmarks/cuda_probe.py --only forward --model falcon --setup sdpa+none+bf16+foreach

``snapshot``: after one warm-up step of transformers' Llama (2 layers, tiny) on cuda, every live block of at most
64 requested bytes with the Python frames that allocated it (``torch.cuda.memory._record_memory_history``): what
stays allocated from one step to the next beside the parameters and AdamW's state.

``forward``: after one warm-up step of transformers' model of ``--model`` (``cuda_validation.HF_ZOO``'s) (S 2,048, B 2) under ``--setup``, every
block of at most 4 KiB requested that the next forward made and left live (what autograd saves for the backward),
with the Python frames that allocated it.

``cudnn``: ``F.scaled_dot_product_attention`` with torch's own backend choice (no ``sdpa_kernel``), as transformers
calls it (``enable_gqa``, (B, S, h, d) storage transposed to (B, h, S, d)), against (S, d_head, K/V heads): the
backend chosen (``torch._fused_sdp_choice``), and the forward's and backward's requested bytes: peak above the start,
and what each leaves allocated.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys

BACKENDS = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def requested() -> tuple[int, int]:
    import torch

    s = torch.cuda.memory_stats()
    return s["requested_bytes.all.current"], s["requested_bytes.all.peak"]


def snapshot() -> None:
    import torch

    from lm_accounting.config import load_config
    from lm_accounting.measure.hf import build_hf_step, patched_for
    from lm_accounting.measure.tracker import _train_step
    from lm_accounting.setup import TrainingSetup

    cfg = dataclasses.replace(load_config("llama-3-8b"), num_layers=2, vocab_size=512, d_model=256, d_ff=512)
    cfg = cfg.with_context(256)
    setup = TrainingSetup(attention="naive", precision="fp32", optimizer="foreach")
    torch.cuda.memory._record_memory_history(max_entries=200000, context="all", stacks="python")
    with patched_for("cuda"):
        model, inputs, labels, opt, loss_fn = build_hf_step(cfg, 256, 1, setup, "cuda")
        _train_step(model, inputs, labels, loss_fn, opt)
        gc.collect()
        torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print_blocks(snap, lambda b: b["requested_size"] <= 64)


def print_blocks(snap, keep) -> None:
    """Each active block of ``snap`` that ``keep(block)`` takes, with the Python frames that allocated it."""
    for seg in snap["segments"]:
        for block in seg["blocks"]:
            if block["state"] == "active_allocated" and keep(block):
                frames = [
                    f"{f['filename'].split('site-packages/')[-1]}:{f['line']}:{f['name']}" for f in block["frames"]
                ]
                frames = [f for f in frames if ".py" in f][:14]
                print("live", block["requested_size"], "B:", " <- ".join(frames), flush=True)


def forward(model: str, label: str, seq: int = 2048, batch: int = 2) -> None:
    import torch
    from cuda_validation import hf_config  # the sibling script: HF_ZOO's small models and the presets

    from lm_accounting.measure.hf import build_hf_step, patched_for
    from lm_accounting.measure.tracker import _train_step
    from lm_accounting.setup import TrainingSetup

    attention, checkpoint, precision, optimizer = label.split("+")
    setup = TrainingSetup(attention=attention, checkpoint=checkpoint, precision=precision, optimizer=optimizer)
    print("forward", model, label, f"S {seq} B {batch}", flush=True)
    with patched_for("cuda"):
        step, inputs, labels, opt, loss_fn = build_hf_step(
            hf_config(model, {}).with_context(seq), seq, batch, setup, "cuda"
        )
        _train_step(step, inputs, labels, loss_fn, opt)
        torch.cuda.synchronize()
        before = torch.cuda.memory._snapshot()
        live = {b["address"] for seg in before["segments"] for b in seg["blocks"] if b["state"] == "active_allocated"}
        torch.cuda.memory._record_memory_history(max_entries=200000, context="all", stacks="python")
        loss = loss_fn(step(inputs), labels)
        torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    print_blocks(snap, lambda b: b["address"] not in live and b["requested_size"] <= 4096)
    del step, opt, loss


def cudnn() -> None:
    import torch
    import torch.nn.functional as F

    b, h = 1, 32
    for seq in (1024, 2048, 4096, 8192):
        for d in (64, 128):
            for kv in (h, h // 4):
                torch.cuda.empty_cache()
                q = torch.randn(b, seq, h, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                k = torch.randn(b, seq, kv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                v = torch.randn(b, seq, kv, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
                gqa = kv < h
                choice = BACKENDS.get(int(torch._fused_sdp_choice(q, k, v, is_causal=True, enable_gqa=gqa)), "?")
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base, _ = requested()
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
                torch.cuda.synchronize()
                fwd_end, fwd_peak = requested()
                grad = torch.randn_like(out)
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base2, _ = requested()
                dq, dk, dv = torch.autograd.grad(out, (q, k, v), grad)
                torch.cuda.synchronize()
                bwd_end, bwd_peak = requested()
                row = dict(
                    seq=seq,
                    d_head=d,
                    heads=h,
                    kv_heads=kv,
                    backend=choice,
                    out_bytes=out.numel() * 2,
                    out_stride=list(out.stride()),
                    forward_peak=fwd_peak - base,
                    forward_end=fwd_end - base,
                    backward_peak=bwd_peak - base2,
                    backward_end=bwd_end - base2,
                    grads=sum(t.numel() * 2 for t in (dq, dk, dv)),
                    dq_stride=list(dq.stride()),
                    dk_stride=list(dk.stride()),
                )
                print("cudnn", json.dumps(row), flush=True)
                del q, k, v, out, grad, dq, dk, dv


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="snapshot,cudnn", help="snapshot, forward, cudnn (comma-separated)")
    ap.add_argument(
        "--model", default="llama-3-8b", help="forward: an HF_ZOO type (benchmarks/cuda_validation.py) or a preset"
    )
    ap.add_argument("--setup", action="append", default=[], help="forward: a setup label (repeatable)")
    args = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("cuda_probe: no CUDA GPU is available on this machine", file=sys.stderr)
        return 2
    print("torch", torch.__version__, "cudnn", torch.backends.cudnn.version(), torch.cuda.get_device_name())
    for name in args.only.split(","):
        if name == "forward":
            for label in args.setup or ["sdpa+none+bf16+foreach"]:
                forward(args.model, label)
        else:
            {"snapshot": snapshot, "cudnn": cudnn}[name]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
