"""Where does the decoder hesitate? Tokens committed below tau ("forced picks": the decoder's one
forced commit per forward when nothing is confident) split by response region, think text vs action.

    python bench/forced_picks.py runs/tiny/ckpt/step_00100020 [--tasks 60] [--tau 0.95] [--rule prefix] [--show 8]

The checkpoint is a training checkpoint (its run's config.yaml and tokenizer are used); held-out
test tasks, greedy. Region of a token: "think" before the token that opens the response's `<action>` tag
(StepSample.think_len, the cut distill.score / rl.score use), "action" up to `</action>`, "after" past it.
Then the first invalid action of each episode, by the env's action kind. `--show N` prints the first N
responses token by token, each token followed by the index of the forward that committed it (`*`: a forced
pick) and `||` where a decode block starts, i.e. where a step's forwards go.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from dataclasses import replace

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import eval as ev  # noqa: E402
from d3mini.config import load_config  # noqa: E402
from d3mini.envs import env_module  # noqa: E402
from d3mini.rollout import rollout  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    ap.add_argument("--tasks", type=int, default=60)
    ap.add_argument("--tau", type=float, default=0.95)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rule", default=None, help="decode.rule (default: the run's)")
    ap.add_argument("--show", type=int, default=0, help="print this many responses with their forwards")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(os.path.join(ev.run_dir_of(args.ckpt), "config.yaml"))
    model, tok = ev.load_training_checkpoint(args.ckpt, cfg)
    ids = env_module(cfg.env.name).task_ids(cfg.env, "test")[:args.tasks]
    with torch.no_grad():
        dcfg = replace(cfg.decode, threshold=args.tau, temperature=0.0, rule=args.rule or cfg.decode.rule)
        samples, m = rollout(model, tok, cfg.env, dcfg, ids, seed=0, batch_size=args.tasks)
    tokens, forced = collections.Counter(), collections.Counter()
    for s in samples:
        text = ""
        for i, (t, c) in enumerate(zip(s.response_ids, s.confidence)):
            region = "think" if i < s.think_len else "after" if "</action>" in text else "action"
            text += tok.decode([t])
            tokens[region] += 1
            forced[region] += c < args.tau
    fwd = sum(len(set(s.trace)) for s in samples) / max(len(samples), 1)
    print(f"# {args.ckpt}: {len(ids)} test tasks, tau {args.tau}, rule {dcfg.rule}, success {m['success']:.3f}, "
          f"TPF {m['tpf_denoise']:.2f}; per step {sum(tokens.values()) / max(len(samples), 1):.1f} tokens "
          f"in {fwd:.2f} forwards")
    K = dcfg.block_size  # SDAR blocks are aligned at absolute position 0 of prompt + response
    for s in samples[:args.show]:
        P = len(s.prompt_ids)
        print("".join((" ||" if (P + i) % K == 0 else "") + f" {tok.decode([t])!r}{f}{'*' if c < args.tau else ''}"
                      for i, (t, f, c) in enumerate(zip(s.response_ids, s.trace, s.confidence))))
    print("| region | tokens | forced picks | share of the region | share of all forced |")
    print("|---|---|---|---|---|")
    for r in ("think", "action", "after"):
        print(f"| {r} | {tokens[r]} | {forced[r]} | {forced[r] / max(tokens[r], 1):.2f} | "
              f"{forced[r] / max(sum(forced.values()), 1):.2f} |")
    kind = getattr(env_module(cfg.env.name), "action_kind", lambda a: a.split("[", 1)[0].strip())
    by = collections.defaultdict(lambda: [0, 0, 0])  # action kind -> [steps, forwards, tokens]
    for s in samples:
        k = by[kind(s.action)]
        k[0], k[1], k[2] = k[0] + 1, k[1] + len(set(s.trace)), k[2] + len(s.response_ids)
    nf = max(sum(v[1] for v in by.values()), 1)
    print("\n| action kind | steps | forwards per step | tokens per step | share of all forwards |")
    print("|---|---|---|---|---|")
    for k, (n, f, t) in sorted(by.items(), key=lambda kv: -kv[1][1]):
        print(f"| {k} | {n} | {f / n:.2f} | {t / n:.1f} | {f / nf:.2f} |")
    # an invalid action leaves the page as it was, so the greedy policy repeats it: count each episode once
    first = {}
    for s in samples:
        if not s.valid:
            first.setdefault(s.episode_id, s)
    kinds = collections.Counter(kind(s.action) for s in first.values())
    print(f"\n{len(first)} of {len(ids)} episodes take an invalid action; the first one per episode, by kind: "
          + ", ".join(f"{k} {v}" for k, v in kinds.most_common()))


if __name__ == "__main__":
    main()
