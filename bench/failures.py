"""Why do held-out WebShop episodes fail? A checkpoint's evaluation episodes sorted by how they ended.

    python bench/failures.py runs/tiny/ckpt/step_00003000 [--tasks 300] [--tau 1.0,0.95] [--examples 5]

The checkpoint is a training checkpoint (its run's config.yaml and tokenizer are used). The episodes are
eval.py's (it runs metrics.evaluate: same held-out tasks, seed and decoding), so the won count is eval's
success. A bought item is classified by the first term of WebShop's score it misses (reference/envs.md
§1.7): product type, then attributes, then price, then options (fewer options chosen than the goal asks
for, or a wrong value). An episode without a purchase ran out of steps; it is split by whether it took an
invalid action (which leaves the page as it was, so greedy decoding repeats it until the step limit).
The loop episodes are then split by the first action the env rejected (LOOP_KINDS); --examples N prints
the goal, page and rejected action of the first N.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
from typing import NamedTuple

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import eval as ev  # noqa: E402
from d3mini.config import load_config  # noqa: E402
from d3mini.envs import make_env  # noqa: E402
from d3mini.envs.webshop import goal_option_values, offered_value  # noqa: E402
from d3mini.metrics import evaluate  # noqa: E402

KINDS = ["won", "bought: wrong product type", "bought: attribute missing", "bought: over the price limit",
         "bought: too few options chosen", "bought: wrong option value",
         "no purchase: invalid action repeated", "no purchase: all actions valid"]

LOOP_KINDS = ["item page: a goal value the item does not offer", "item page: other",
              "results page: an id not on the page", "results page: other", "search page"]


def outcome(env, n_invalid: int) -> str:
    """The row of KINDS one finished (or truncated) embedded-WebShop episode falls in."""
    if env.score >= 1.0 - 1e-9:
        return "won"
    if env.page != "done":
        return "no purchase: invalid action repeated" if n_invalid else "no purchase: all actions valid"
    info, g = env.reward_info, env.goal
    if info["r_type"] < 1.0:
        return "bought: wrong product type"
    if info["r_att"] < 1.0:
        return "bought: attribute missing"
    if info["r_price"] < 1.0:
        return "bought: over the price limit"
    wanted = len(g["goal_options"])
    return "bought: too few options chosen" if len(env.options) < wanted else "bought: wrong option value"


def loop_kind(action: str, env) -> str:
    """The row of LOOP_KINDS of an action the env rejected (a rejected action leaves the page as it was, so
    env.page and the open item are those it was taken on)."""
    arg = action[len("click["):-1] if action.startswith("click[") and action.endswith("]") else None
    page = env.page
    if page == "item":
        lacks = arg in goal_option_values(env.goal) and offered_value(arg, env.product) is None
        return LOOP_KINDS[0] if lacks else LOOP_KINDS[1]  # (a goal value the item offers under another spelling: other)
    if page == "results":
        return LOOP_KINDS[2] if arg is not None and arg.lower().startswith("b0") else LOOP_KINDS[3]
    return LOOP_KINDS[4]


class Rejected(NamedTuple):
    """An action the env rejected: the page it was taken on, the action, what was admissible there and its
    LOOP_KINDS row."""
    page: str
    action: str
    admissible: list
    kind: str


class Counting:
    """An env that also counts the steps it rejected (WebShop's is_action_valid) and keeps the first one
    as a Rejected."""

    def __init__(self, env):
        self.env, self.invalid, self.first_invalid = env, 0, None

    def reset(self, *a, **k):
        return self.env.reset(*a, **k)

    def step(self, action):
        obs, reward, done, info = self.env.step(action)
        if not info["is_action_valid"]:
            self.invalid += 1
            if self.first_invalid is None:
                self.first_invalid = Rejected(self.env.page, action, info["admissible_actions"],
                                              loop_kind(action, self.env))
        return obs, reward, done, info

    def close(self):
        self.env.close()


def classify(model, tok, cfg, tau: float, tasks: int) -> tuple:
    """(Counter over KINDS, success, the Counting envs) of eval's held-out episodes at threshold tau."""
    envs = []

    def factory(env_cfg):  # keep each episode's env to read its goal, purchase and score afterwards
        envs.append(Counting(make_env(env_cfg)))
        return envs[-1]

    row, = evaluate(model, tok, cfg, thresholds=[tau], num_tasks=tasks, env_factory=factory)
    counts = collections.Counter(outcome(e.env, e.invalid) for e in envs)
    return counts, row["success"], envs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ckpt")
    ap.add_argument("--tasks", type=int, default=300)
    ap.add_argument("--tau", default="1.0,0.95", help="comma-separated decode thresholds")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--examples", type=int, default=0, help="show the first rejected action of N loop episodes")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    taus = [ev.check_threshold(float(t)) for t in args.tau.split(",")]
    cfg = load_config(os.path.join(ev.run_dir_of(args.ckpt), "config.yaml"))
    if cfg.env.name != "webshop" or cfg.env.server_url:
        raise SystemExit(f"bench/failures.py reads the in-process WebShop env; this run has env.name = "
                         f"{cfg.env.name!r}, env.server_url = {cfg.env.server_url!r}")
    model, tok = ev.load_training_checkpoint(args.ckpt, cfg)
    cols = [classify(model, tok, cfg, t, args.tasks) for t in taus]
    print(f"# {args.ckpt}: held-out episodes by outcome, decoded as eval.py does")
    print("| outcome | " + " | ".join(f"τ {t}" for t in taus) + " |")
    print("|---|" + "---|" * len(taus))
    for k in KINDS:
        print(f"| {k} | " + " | ".join(str(c[k]) for c, _, _ in cols) + " |")
    print("| success | " + " | ".join(f"{s:.3f} ({len(e)} episodes)" for _, s, e in cols) + " |")
    loops = [[e for e in envs if outcome(e.env, e.invalid) == KINDS[6]] for _, _, envs in cols]
    kinds = [collections.Counter(e.first_invalid.kind for e in ls) for ls in loops]
    print("\n| invalid-loop episodes by the first rejected action | " + " | ".join(f"τ {t}" for t in taus) + " |")
    print("|---|" + "---|" * len(taus))
    for k in LOOP_KINDS:
        print(f"| {k} | " + " | ".join(str(c[k]) for c in kinds) + " |")
    for t, ls in zip(taus, loops):
        for i, e in enumerate(ls[: args.examples]):
            page, action, admissible, _ = e.first_invalid
            if i == 0:
                print(f"\n## τ {t}: the first rejected action of {min(args.examples, len(ls))} invalid-loop episodes")
            print(f"- goal {e.env.goal['instruction_text']!r}\n  on the {page} page: {action!r} "
                  f"(admissible: {', '.join(admissible[:8])}{' ...' if len(admissible) > 8 else ''})")

if __name__ == "__main__":
    main()
