"""Measured effect of online self-distillation on a tiny SDAR model (CPU, a few minutes).

    python bench/distill_effect.py                      # SFT until solved at tau = 1.0, then distil at 0.95
    python bench/distill_effect.py --quick              # fewer steps (smoke run; targets not expected)
    python bench/distill_effect.py --sft-ckpt /tmp/s.pt --entropy-coef 0   # ablations reuse one SFT model
    python bench/distill_effect.py --sft-ckpt /tmp/s.pt --control sft_own  # SFT loss on own decodes instead

Model: SDAR-style DiffusionLM, block 8, width 64, 3 layers (0.15M parameters), fp32, one thread
(faster than two on a shared 2-core CPU; bf16 autocast is slower at these shapes).

Toy task with several phrasings (the uncertainty that limits parallel decoding): the prompt is
[BOS x1..x6 SEP] (one block of 8), the answer is the six digits reversed, written as four
half-blocks of 4 tokens: three content halves (x6 x5 | x4 x3 | x2 x1), each in one of three
phrasings drawn at random in the training data

    [c1 c2 a b]   [c1 d c2 e]   [c1 f g c2]          (a..g filler ids, c1 c2 the two digits)

and a closing half [h i j EOS] in one of three phrasings. The answer fills exactly two blocks,
so no decoded token lies after the stop id. Inside a block the second half's phrasing is
independent of the first's, and within a half every later token depends on the phrasing the
first one started, so a model that learned the data distribution is unsure in a fully masked
block and commits few tokens per forward at tau = 0.95.

Stages: (1) SDAR [noisy | clean] SFT (d3mini.rl.diffusion_loss) until greedy accuracy at
tau = 1.0 on held-out prompts is >= --solve; (2) rounds of online self-distillation: decode fresh
prompts at tau = 0.95, keep the responses + traces as StepSamples, one distill_step each round,
progress = round / (rounds - 1). Reported: accuracy and TPF (denoising forwards, metrics.md
convention C) at tau = 1.0 and 0.95 on the same held-out prompts before and after.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from d3mini.config import DecodeConfig, DistillConfig, ModelConfig  # noqa: E402
from d3mini.decode import generate  # noqa: E402
from d3mini.distill import distill_step  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402
from d3mini.rl import diffusion_loss  # noqa: E402
from d3mini.rollout import StepSample  # noqa: E402

PAD, EOS, MASK, BOS, SEP = 0, 1, 2, 3, 4
DIGIT = 10                      # digits 0..9 are ids 10..19
C1, C2 = -1, -2                 # content slots in a template
HALVES = [[C1, C2, 20, 21], [C1, 22, C2, 23], [C1, 24, 25, C2]]
CLOSE = [[26, 27, 28, EOS], [29, 30, 31, EOS], [32, 33, 34, EOS]]
VOCAB, K = 40, 8


def make_prompt(rng) -> list:
    return [BOS] + [DIGIT + rng.randrange(10) for _ in range(6)] + [SEP]


def content(prompt) -> list:
    d = prompt[1:7][::-1]
    return [d[0:2], d[2:4], d[4:6]]


def phrase(prompt, rng) -> list:
    out = []
    for c1, c2 in content(prompt):
        out += [{C1: c1, C2: c2}.get(t, t) for t in rng.choice(HALVES)]
    return out + rng.choice(CLOSE)


def correct(prompt, resp) -> bool:
    if len(resp) != 16:
        return False
    for h, (c1, c2) in enumerate(content(prompt)):
        if resp[4 * h:4 * h + 4] not in [[{C1: c1, C2: c2}.get(t, t) for t in tpl] for tpl in HALVES]:
            return False
    return resp[12:] in CLOSE


def decode_eval(model, prompts, tau) -> tuple:
    model.eval()
    res = generate(model, prompts, DecodeConfig(block_size=K, threshold=tau, max_new_tokens=16, stop_ids=[EOS]))
    model.train()
    acc = sum(correct(p, t) for p, t in zip(prompts, res.tokens)) / len(prompts)
    return acc, res.totals()["tpf_denoise"], res


def evaluate(model, prompts, tag) -> dict:
    out = {}
    for tau in (1.0, 0.95):
        acc, tpf, _ = decode_eval(model, prompts, tau)
        out[tau] = (acc, tpf)
        print(f"  [{tag}] tau={tau:.2f}  acc={100 * acc:5.1f}%  TPF={tpf:.3f}", flush=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-max", type=int, default=3000)
    ap.add_argument("--sft-batch", type=int, default=64)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--solve", type=float, default=0.98)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--rollouts", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--r-max", type=float, default=0.8)
    ap.add_argument("--eval-n", type=int, default=256)
    ap.add_argument("--entropy-coef", type=float, default=2.0)
    ap.add_argument("--no-complementary", action="store_true")
    ap.add_argument("--tie-break", default="confidence")
    ap.add_argument("--only-success", action="store_true")
    ap.add_argument("--control", default="none", choices=["none", "sft_own", "sft_data"],
                    help="replace distill_step by the SFT loss on own decodes / on fresh data (controls)")
    ap.add_argument("--sft-ckpt", default=None, help="reuse this SFT state dict (written on the first run)")
    ap.add_argument("--bf16", action="store_true", help="CPU bf16 autocast for the training forwards (slower on "
                    "small CPU shapes)")
    args = ap.parse_args()
    if args.quick:
        args.sft_max, args.rounds, args.eval_n = 200, 4, 64
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    mc = ModelConfig(family="sdar", vocab_size=VOCAB, hidden_size=64, intermediate_size=192, num_layers=3,
                     num_heads=4, num_kv_heads=2, head_dim=16, block_size=K, mask_id=MASK, eos_ids=[EOS], pad_id=PAD)
    model = DiffusionLM.from_config(mc)
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else torch.autocast("cpu", enabled=False)
    held = [make_prompt(random.Random(10_000 + i)) for i in range(args.eval_n)]
    print(f"# distill_effect: {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"threads {args.threads}, params {model.num_params() / 1e6:.2f}M, bf16 autocast {args.bf16}", flush=True)

    # ---- stage 1: SFT until the task is solved at tau = 1.0
    t0 = time.time()
    opt = torch.optim.AdamW(model.parameters(), lr=args.sft_lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    step = 0
    if args.sft_ckpt and os.path.exists(args.sft_ckpt):
        model.load_state_dict(torch.load(args.sft_ckpt, weights_only=True))
        step = args.sft_max
    while step < args.sft_max:
        prompts = [make_prompt(rng) for _ in range(args.sft_batch)]
        with amp:
            loss, _ = diffusion_loss(model, prompts, [phrase(p, rng) for p in prompts], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            acc, tpf, _ = decode_eval(model, held[:128], 1.0)
            print(f"  sft step {step:5d}  loss {float(loss.detach()):.3f}  acc@1.0 {100 * acc:5.1f}%  "
                  f"({time.time() - t0:.0f}s)",
                  flush=True)
            if acc >= args.solve:
                break
    t_sft = time.time() - t0
    if args.sft_ckpt and not os.path.exists(args.sft_ckpt):
        torch.save(model.state_dict(), args.sft_ckpt)
    before = evaluate(model, held, "after SFT")

    # ---- stage 2: online self-distillation on its own tau = 0.95 decodes
    t0 = time.time()
    cfg = DistillConfig(batch_size=args.rollouts, micro_batch=args.rollouts, lr=args.lr, r_max=args.r_max,
                        entropy_coef=args.entropy_coef, complementary=not args.no_complementary,
                        tie_break=args.tie_break, only_success=args.only_success)
    print(f"  {cfg}", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    for rnd in range(args.rounds):
        prompts = [make_prompt(rng) for _ in range(args.rollouts)]
        acc, tpf, res = decode_eval(model, prompts, cfg.threshold)
        samples = [StepSample(prompt_ids=p, response_ids=t, trace=tr, confidence=cf, action="", valid=len(t) == 16,
                              reward=10.0 * correct(p, t), group_id=i, episode_id=i, step=0, won=correct(p, t))
                   for i, (p, t, tr, cf) in enumerate(zip(prompts, res.tokens, res.trace, res.confidence))]
        with amp:
            if args.control == "none":
                m = distill_step(model, opt, samples, cfg, progress=rnd / max(args.rounds - 1, 1),
                                 gen=torch.Generator().manual_seed(args.seed * 7919 + rnd))
            else:  # the same number of updates with the plain SFT loss, on own decodes or on fresh data
                resp = res.tokens if args.control == "sft_own" else [phrase(p, rng) for p in prompts]
                loss, _ = diffusion_loss(model, prompts, resp, gen)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                m = {"loss": float(loss.detach()), "r_floor": 0.0}
        if rnd % 5 == 0 or rnd == args.rounds - 1:
            print(f"  distill {rnd:3d}  rollout acc {100 * acc:5.1f}%  TPF {tpf:.2f}  r_floor {m['r_floor']:.2f}  "
                  f"loss {m.get('loss', 0):.3f}  ce {m.get('ce', 0):.3f}  ce_comp {m.get('ce_comp', 0):.3f}  "
                  f"H {m.get('entropy', 0):.3f}  confident {m.get('frac_confident', 0):.2f}  ({time.time() - t0:.0f}s)",
                  flush=True)
    t_dis = time.time() - t0
    after = evaluate(model, held, "after distill")

    print(f"\nSFT {step} steps in {t_sft:.0f}s; distill {args.rounds} rounds x {args.rollouts} rollouts "
          f"in {t_dis:.0f}s\n")
    print("| tau | acc before | acc after | TPF before | TPF after | TPF change |")
    print("|---|---|---|---|---|---|")
    for tau in (1.0, 0.95):
        (a0, t0_), (a1, t1) = before[tau], after[tau]
        print(f"| {tau:.2f} | {100 * a0:.1f}% | {100 * a1:.1f}% | {t0_:.3f} | {t1:.3f} "
              f"| {100 * (t1 / t0_ - 1):+.1f}% |")
    (a0, t0_), (a1, t1) = before[0.95], after[0.95]
    ok = t1 >= 1.3 * t0_ and a1 >= a0 - 0.02
    print(f"\ntarget (tau 0.95: TPF +30%, accuracy within 2 points): {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
