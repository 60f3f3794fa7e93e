"""What does the sdar_trace update cost, and what does grouping micro-batches by step count save?

    python bench/rl_trace.py --run RUN_DIR [--steps 2] [--threads 2] [--repeat 2] [KEY=VALUE ...]

Loads a run folder's config, tokenizer and latest checkpoint (an SFT one, say), collects the rollouts of
`--steps` RL steps the way train.py does (rl.threshold, rl.temperature, rl.tasks_per_step x rl.group_size),
and times one pass of the update's scoring (seq_logp forward + backward over every micro-batch of
rl.minibatch / rl.micro_batch) on the same samples in three ways:
  length order, all copies    every micro-batch runs the batch's largest step count as its copy count
  length order, trimmed       each micro-batch keeps only the copies its own rows use (rl.trim_trace)
  step-count order, trimmed   minibatches sorted by (copies, length) before they are cut (rl_step's way)
The per-token terms, hence the update, are the same in all three (checked here); the table gives forward
rows (sum of micro-batch rows x copies), scored tokens (rows x copies x padded width) and seconds, with the
ratio against the first way measured in this process.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import train  # noqa: E402
from d3mini import dist, rl  # noqa: E402
from d3mini.config import load_config  # noqa: E402


def micro_batches(cfg, batch, draws, order_keys):
    plan = rl._plan(batch.ids.shape[0], cfg.rl, 0, 0, 1, order_keys)
    return [mi for _, micros in plan[0] for mi in micros]


def run_way(model, batch, draws, micros, trim: bool):
    rows = toks = 0
    tok = torch.zeros(batch.ids.shape)
    model.zero_grad(set_to_none=True)
    t = time.perf_counter()
    for mi in micros:
        b = batch.select(mi)
        dr = draws.select(mi, b.ids.shape[1])
        dr = rl.trim_trace(dr) if trim else dr
        est = rl.seq_logp(model, b, "sdar_trace", dr, entropy=True)
        est.seq.sum().backward()
        rows += dr.masked.shape[0] * dr.masked.shape[1]
        toks += dr.masked.numel()
        tok[torch.as_tensor(mi), : b.ids.shape[1]] = est.tok.detach()
    return time.perf_counter() - t, rows, toks, tok


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="run folder with config.yaml, tokenizer.json and ckpt/")
    ap.add_argument("--steps", type=int, default=2, help="RL steps of rollouts to time on")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2, help="timed passes per way (the fastest is kept)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(os.path.join(args.run, "config.yaml"),
                      [f"train.out_dir={args.run}", "rl.estimator=sdar_trace", *args.overrides])
    info = dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    tok = train.build_tokenizer(cfg, info)
    model = train.build_model(cfg, tok, info)
    ck, _ = train.peek_checkpoint(cfg)
    if ck is None:
        sys.exit(f"{args.run}: no checkpoint under ckpt/")
    dist.load(ck, model)
    ids = train.policy_task_ids(cfg, cfg.rl.goals, "rl.goals")
    dcfg = train.rl_decode(cfg)
    print(f"{ck}; rollouts at threshold {dcfg.threshold}, temperature {dcfg.temperature}; minibatch "
          f"{cfg.rl.minibatch}, micro-batch {cfg.rl.micro_batch}; {args.threads} threads, torch {torch.__version__}")
    totals = {}
    for step in range(args.steps):
        samples, _ = train.policy_rollout(cfg, model, tok, dcfg, ids, cfg.rl.tasks_per_step, cfg.rl.group_size,
                                          7919, step)
        batch = rl.batch_tokens([s.prompt_ids for s in samples], [s.response_ids for s in samples],
                                model.cfg.pad_id, torch.device("cpu"))
        draws = rl.trace_masks(batch, [s.trace for s in samples], model.cfg.block_size, cfg.rl.trace_shrink)
        copies = (draws.weight != 0).any(-1).sum(1)
        by_len = [(int(x),) for x in batch.lengths]
        by_steps = [(int(c),) + o for c, o in zip(copies.tolist(), by_len)]
        print(f"step {step}: {len(samples)} samples, copies per row {torch.bincount(copies).tolist()} "
              f"(count of rows with 0, 1, ... copies), batch copy count {draws.masked.shape[1]}")
        ways = [("length order, all copies", by_len, False), ("length order, trimmed", by_len, True),
                ("step-count order, trimmed", by_steps, True)]
        ref = None
        for name, keys, trim in ways:
            micros = micro_batches(cfg, batch, draws, keys)
            best = None
            for _ in range(args.repeat):
                t, rows, toks, tok_terms = run_way(model, batch, draws, micros, trim)
                best = t if best is None else min(best, t)
            if ref is None:
                ref = tok_terms
            err = float((tok_terms - ref).abs().max())
            if err > 1e-4:
                raise AssertionError(f"{name}: per-token terms differ from the first way by {err:.2e}")
            acc = totals.setdefault(name, [0.0, 0, 0])
            acc[0] += best
            acc[1] += rows
            acc[2] += toks
    base = totals["length order, all copies"]
    print("\n| micro-batches | forward rows | scored tokens (M) | s (forward + backward) | vs all copies |")
    print("|---|---|---|---|---|")
    for name, (t, rows, toks) in totals.items():
        print(f"| {name} | {rows} | {toks / 1e6:.2f} | {t:.2f} | {base[0] / t:.2f}x |")


if __name__ == "__main__":
    main()
