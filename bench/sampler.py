"""What does drawing one token per masked position cost, and how much of a decode step is it?

    python bench/sampler.py [--threads 2] [--vocab 2048] [--block 8] [--batches 64 150] [--reps 30]

Rows, at the tiny config's shapes (block 8, vocabulary 2048; RL decodes 64 episodes a batch, evaluation
150): the Exponential race (draw Exponential(1) noise [B, K, V], take argmax of softmax / noise: exact
sampling, B x K x V random numbers) against decode._propose's inverse CDF (one uniform per token, the
first token whose cumulative mass reaches it). Both read the confidence the same way. The ratio column
is against the race in the same process. A chi-square-free check follows: over 200 000 draws from one
fixed distribution the two samplers' token frequencies and the softmax must agree to 0.005.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from d3mini.decode import _propose  # noqa: E402


def race(logits, gen):
    """The baseline: Exponential race (Gumbel-max in another form), B x K x V random numbers."""
    noise = torch.empty(logits.shape).exponential_(generator=gen)
    x0 = (logits.float().softmax(-1) / noise).argmax(-1)
    p = torch.exp(logits.gather(-1, x0[..., None])[..., 0] - logits.logsumexp(-1))
    return x0, p


def inverse_cdf(logits, gen):
    u = torch.rand(logits.shape[:2], generator=gen)
    return _propose(logits, 1.0, 0, 1.0, u)


def timed(fn, logits, reps: int) -> float:
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        fn(logits, gen)
    t = time.perf_counter()
    for _ in range(reps):
        fn(logits, gen)
    return (time.perf_counter() - t) / reps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 150])
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} threads, block {args.block}, vocabulary {args.vocab}\n")
    print("| batch | sampler | ms / call | vs race |")
    print("|---|---|---|---|")
    for B in args.batches:
        logits = torch.randn(B, args.block, args.vocab, generator=torch.Generator().manual_seed(B)) * 3
        base = timed(race, logits, args.reps)
        for name, fn in (("Exponential race", race), ("inverse CDF (decode._propose)", inverse_cdf)):
            t = base if fn is race else timed(fn, logits, args.reps)
            print(f"| {B} | {name} | {t * 1e3:.2f} | {base / t:.2f}x |")
    logits = torch.tensor([1.5, 0.0, -0.5, 1.0, -2.0, 0.7]).expand(1, 200_000, 6).contiguous()
    want = logits[0, 0].softmax(-1)
    for name, fn in (("Exponential race", race), ("inverse CDF", inverse_cdf)):
        x0, _ = fn(logits, torch.Generator().manual_seed(1))
        freq = torch.bincount(x0.flatten(), minlength=6).double() / x0.numel()
        err = float((freq - want.double()).abs().max())
        print(f"\n{name}: max |frequency - softmax| over 200 000 draws = {err:.4f}", end="")
        assert err < 0.005, f"{name} does not sample the softmax"
    print()


if __name__ == "__main__":
    main()
