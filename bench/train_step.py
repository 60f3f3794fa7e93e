"""Where does an SFT step of the tiny config spend its time, and what does torch.compile buy?

    python bench/train_step.py [--config configs/tiny.yaml] [--steps 8] [--threads 2] [--profile] [--compile] [KEY=VALUE ...]

Builds the config's tokenizer, model and expert data the way train.py does (in a temporary out_dir),
then times full SFT steps (loss, backward, AdamW) on the same batches in two phases of
sft.block_schedule: one-token blocks (with ar_prompt_loss, the first phases) and the model's block size.
Rows: eager fp32, eager under bf16 autocast, and with --compile the model under torch.compile(dynamic=True)
(its first two steps reported apart). The ratio column is against eager fp32 in the same process. Before
the table, one line per phase gives the matmuls' (aten::mm/addmm/bmm) achieved GFLOP/s in one profiled
eager fp32 step, to compare with the machine's matmul ceiling; --profile also prints that step's top ops.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train  # noqa: E402
from d3mini.config import load_config  # noqa: E402


def step_fn(cfg, model, opt, info, batch, step, block):
    gen = torch.Generator().manual_seed(cfg.train.seed * 100003 + step)
    loss, _ = train.sft_loss(model, batch, gen, info, cfg.sft.loss_norm, cfg.sft.mask_copies, block_size=block,
                             ar_prompt=cfg.sft.ar_prompt_loss, weight=cfg.sft.loss_weight,
                             suffix=cfg.sft.suffix_masks)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.train.grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss.detach())


def timed(cfg, model, info, batches, block, warm: int = 2):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-9)
    t_first = time.perf_counter()
    for i in range(warm):
        step_fn(cfg, model, opt, info, batches[i], i, block)
    t_first = time.perf_counter() - t_first
    t = time.perf_counter()
    for i, b in enumerate(batches):
        step_fn(cfg, model, opt, info, b, i, block)
    return (time.perf_counter() - t) / len(batches), t_first


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = tempfile.mkdtemp(prefix="d3mini_bench_")
    cfg = load_config(args.config, [f"train.out_dir={out}", *args.overrides])
    info = train.dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    tok = train.build_tokenizer(cfg, info)
    data, _ = train.expert_samples(cfg, tok)
    lengths = [len(s.prompt_ids) + len(s.response_ids) for s in data]
    order = train.length_batches(lengths, cfg.sft.batch_size, args.steps + 2, cfg.train.seed)
    batches = [[data[i] for i in idx] for idx in order]
    phases = [("one-token blocks + prompt", 1), (f"block {cfg.model.block_size}", cfg.model.block_size)]
    print(f"{len(data)} expert samples; batch {cfg.sft.batch_size}, {cfg.sft.mask_copies} mask copies, "
          f"mean padded length {sum(max(lengths[i] for i in b) for b in order) / len(order):.0f}, "
          f"{args.threads} threads, torch {torch.__version__}")
    rows = []
    for name, block in phases:
        torch.manual_seed(0)
        model = train.build_model(cfg, tok, info)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-9)
        step_fn(cfg, model, opt, info, batches[0], 0, block)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_flops=True) as prof:
            step_fn(cfg, model, opt, info, batches[1], 1, block)
        ev = [e for e in prof.key_averages() if e.key in ("aten::mm", "aten::addmm", "aten::bmm")]
        mm_s = sum(e.self_cpu_time_total for e in ev) / 1e6
        mm_gflops = sum(e.flops for e in ev) / 1e9
        total_s = sum(e.self_cpu_time_total for e in prof.key_averages()) / 1e6
        if args.profile:
            print(f"\n== {name}: top ops of one eager fp32 step")
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=18))
        print(f"{name}: matmuls {mm_gflops:.1f} GFLOP in {mm_s:.3f} s ({mm_gflops / mm_s:.0f} GFLOP/s), "
              f"{100 * mm_s / total_s:.0f} % of the step's op time")
        eager, _ = timed(cfg, model, info, batches[2:], block)
        rows.append((name, "eager fp32", eager, eager, 0.0))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bf, first = timed(cfg, model, info, batches[2:], block)
        rows.append((name, "eager bf16 autocast", bf, eager, first))
        if args.compile:
            torch._dynamo.reset()
            model = train.build_model(cfg, tok, info)
            model.compile(dynamic=True)
            comp, first = timed(cfg, model, info, batches[2:], block)
            rows.append((name, "compile(dynamic)", comp, eager, first))
    print("\n| phase | mode | s / step | speed-up vs eager fp32 | first 2 steps (s) |")
    print("|---|---|---|---|---|")
    for name, mode, t, base, first in rows:
        print(f"| {name} | {mode} | {t:.3f} | {base / t:.2f}x | {first:.1f} |")


if __name__ == "__main__":
    main()
