"""What does drawing one token per masked position cost, and how much of a decode step is it?

    python bench/sampler.py [--threads 2] [--vocab 2048] [--block 8] [--batches 64 150] [--reps 30]
    python bench/sampler.py --ckpt runs/tiny/ckpt/step_00003000 [--steps 2]   # + whole RL rollouts

Rows, at the tiny config's shapes (block 8, vocabulary 2048; RL decodes 64 episodes a batch, evaluation
150): the Exponential race (draw Exponential(1) noise [B, K, V], take argmax of softmax / noise: exact
sampling, B x K x V random numbers) against decode._propose's inverse CDF (one uniform per token, the
first token whose cumulative mass reaches it). Both read the confidence the same way. The ratio column
is against the race in the same process. A check follows: over 200 000 draws from one fixed
distribution the two samplers' token frequencies and the softmax must agree to 0.005.

With --ckpt (a train.py checkpoint), it also times whole RL rollouts as train.py's RL stage runs them (the
run's config: rl.tasks_per_step x rl.group_size episodes, sampled at rl.temperature and rl.threshold, the
tasks of RL steps 0..--steps-1), once with decode as it is and once with the race swapped into the decoder,
alternating so that both see the same machine load. The two samplers draw different tokens, so the
episodes differ; the table gives decode seconds per rollout and per generated token.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from d3mini.decode import _propose  # noqa: E402


def race_propose(logits, temperature: float, noise):
    """The baseline: an Exponential race (Gumbel-max in another form) on Exponential(1) noise [B, K, V]."""
    scaled = logits.float() / temperature
    x0 = (scaled.softmax(-1) / noise).argmax(-1)
    return x0, torch.exp(scaled.gather(-1, x0[..., None])[..., 0] - scaled.logsumexp(-1))


def race(logits, gen):
    return race_propose(logits, 1.0, torch.empty(logits.shape).exponential_(generator=gen))


def inverse_cdf(logits, gen):
    return _propose(logits, 1.0, 0, 1.0, torch.rand(logits.shape[:2], generator=gen))


class RaceDecoder:
    """Swaps the Exponential race into d3mini.decode for the duration of a `with` block."""

    def __init__(self, vocab_size: int):
        self.V = vocab_size

    def __enter__(self):
        from d3mini import decode
        self.saved = decode._propose, decode._noise

        def noise(st, batch, K, cfg, gen):
            if cfg.temperature == 0:
                return None
            return torch.empty(batch, K, self.V, device=st["x"].device).exponential_(generator=gen)[st["row"]]

        def propose(logits, temperature, top_k, top_p, noise):
            if temperature == 0 or top_k or top_p < 1.0:
                raise ValueError("the race baseline here covers plain sampling only")
            return race_propose(logits, temperature, noise)

        decode._propose, decode._noise = propose, noise
        return self

    def __exit__(self, *exc):
        from d3mini import decode
        decode._propose, decode._noise = self.saved


def rollout_table(ckpt: str, steps: int):
    import train
    from eval import load_training_checkpoint, run_dir_of
    from d3mini.config import load_config
    cfg = load_config(os.path.join(run_dir_of(ckpt), "config.yaml"))
    model, tok = load_training_checkpoint(ckpt, cfg)
    ids = train.policy_task_ids(cfg, cfg.rl.goals, "rl.goals")
    dcfg = train.rl_decode(cfg)
    tot = {"race": [0.0, 0, 0.0], "icdf": [0.0, 0, 0.0]}  # decode seconds, generated tokens, mean success
    for step in range(steps):
        for name in ("race", "icdf"):
            with RaceDecoder(model.cfg.vocab_size) if name == "race" else contextlib.nullcontext():
                _, m = train.policy_rollout(cfg, model, tok, dcfg, ids, cfg.rl.tasks_per_step, cfg.rl.group_size,
                                            7919, step)
            t = tot[name]
            t[0] += m["time_decode"]
            t[1] += m["gen_tokens"]
            t[2] += m["success"] / steps
    print(f"\nRL rollouts of {ckpt} ({steps} steps x {cfg.rl.tasks_per_step} tasks x {cfg.rl.group_size}, "
          f"temperature {dcfg.temperature}, tau {dcfg.threshold}):\n")
    print("| sampler | decode s / rollout | ms / token | rollout success | vs race (s / token) |")
    print("|---|---|---|---|---|")
    base = tot["race"][0] / tot["race"][1]
    for name, label in (("race", "Exponential race"), ("icdf", "inverse CDF (decode._propose)")):
        s, n, acc = tot[name]
        print(f"| {label} | {s / steps:.1f} | {s / n * 1e3:.2f} | {acc:.2f} | "
              f"{base / (s / n):.2f}x |")


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
    ap.add_argument("--ckpt", default=None, help="a train.py checkpoint: also time whole RL rollouts")
    ap.add_argument("--steps", type=int, default=2, help="RL steps' rollouts per sampler with --ckpt")
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
    if args.ckpt:
        rollout_table(args.ckpt, args.steps)


if __name__ == "__main__":
    main()
