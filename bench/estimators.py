"""Likelihood-estimator benchmark: bias and variance of d3mini.rl's estimators on a toy model.

    python bench/estimators.py            # llada and sdar toys, a few seconds
    python bench/estimators.py --n 4000   # more sample ids per row

The toy is a DiffusionLM with a vocabulary of 4 (tokens 0..2 and the mask id 3), sharp random
weights and a response of <= 4 tokens, small enough to enumerate everything:

  exact log p(y|q)  the model's own generative process: reveal the response positions in a
                    uniformly random order, each token drawn from the model's conditional at its
                    turn; log p = log (1/L!) sum_orders prod_i p(y_order_i | revealed so far),
                    computed by a dynamic programme over revealed subsets. SDAR: the same inside
                    each block (blocks aligned at absolute position 0), earlier blocks clean,
                    p = prod_b p(block b | blocks < b).
  analytic ELBO     sum over blocks b and non-empty masked subsets S of b of
                    1/(|S| C(m_b,|S|)) sum_{k in S} log p(y_k | y with S masked, earlier blocks clean)
                    (= E_orders[log prod], so ELBO <= exact by Jensen).

Conditionals are computed the way inference does (one sequence, the family's default mask,
prefix clean), independently of the [noisy | clean] training mask the estimators use. Each
row reports the estimator's exact expectation (by enumeration), its bias against the ELBO and
against the exact log-likelihood, the Monte Carlo mean of d3mini.rl's implementation over N sample
ids (which must cover the expectation), and the standard deviation of one estimate, in nats per
sequence; "fwd" is forward passes per estimate.
"""
from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
from functools import lru_cache

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from d3mini import rl  # noqa: E402
from d3mini.config import ModelConfig  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402

MASK = 3


def toy_model(family: str = "llada", seed: int = 0, block_size: int = 2, std: float = 0.8) -> DiffusionLM:
    cfg = ModelConfig(family=family, vocab_size=4, hidden_size=16, intermediate_size=32, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=8, qk_norm=family != "llada",
                      block_size=block_size, mask_id=MASK, eos_ids=[2], pad_id=0, init_std=std)
    torch.manual_seed(seed)
    return DiffusionLM.from_config(cfg).eval()


class Toy:
    """Exact quantities of one (model, prompt, response) by enumeration."""

    def __init__(self, model, prompt: list, resp: list):
        self.m, self.p, self.y = model, list(prompt), list(resp)
        self.P, self.L, self.mask = len(prompt), len(resp), model.cfg.mask_id
        if model.cfg.family == "sdar":
            K = model.cfg.block_size
            by = {}
            for k in range(self.L):
                by.setdefault((self.P + k) // K, []).append(k)
            self.blocks = list(by.values())
        else:
            self.blocks = [list(range(self.L))]
        self.cond = lru_cache(maxsize=None)(self._cond)

    @torch.no_grad()
    def _cond(self, masked: frozenset, prompt_masked: frozenset = frozenset()) -> dict:
        """log p(y_k | y with `masked` response offsets masked) for k in masked (SDAR: per block,
        earlier blocks clean, computed with the plain block-causal forward of the prefix)."""
        out = {}
        for blk in self.blocks:
            ks = [k for k in blk if k in masked]
            if not ks:
                continue
            end = self.P + blk[-1] + 1 if self.m.cfg.family == "sdar" else self.P + self.L
            x = [self.mask if i in prompt_masked else t for i, t in enumerate(self.p)]
            x += [self.mask if (k in masked and k in blk) else t for k, t in enumerate(self.y)]
            attn = "full" if self.m.cfg.family == "llada" else None
            lsm = self.m(torch.tensor([x[:end]]), attn=attn)[0].float().log_softmax(-1)
            out.update({k: float(lsm[self.P + k, self.y[k]]) for k in ks})
        return out

    def exact(self) -> float:
        total = 0.0
        for blk in self.blocks:
            f = {frozenset(): 1.0}  # f[R] = sum over orders revealing R of the product of conditionals
            for r in range(1, len(blk) + 1):
                for R in map(frozenset, itertools.combinations(blk, r)):
                    f[R] = sum(f[R - {k}] * math.exp(self.cond(frozenset(blk) - (R - {k}))[k]) for k in R)
            total += math.log(f[frozenset(blk)] / math.factorial(len(blk)))
        return total

    def elbo(self) -> float:
        total = 0.0
        for blk in self.blocks:
            m = len(blk)
            for s in range(1, m + 1):
                for S in itertools.combinations(blk, s):
                    total += sum(self.cond(frozenset(S)).values()) / (s * math.comb(m, s))
        return total

    def count_scheme(self, counts_weights: list) -> float:
        """E of an estimator masking exactly m uniformly chosen response tokens with weight w per term."""
        total = 0.0
        for m, w in counts_weights:
            sets = list(itertools.combinations(range(self.L), m))
            total += w * sum(sum(self.cond(frozenset(S)).values()) for S in sets) / len(sets)
        return total

    def mean_field(self, p_prompt: float) -> float:
        """E of d1's one-step estimate: response fully masked in one forward, prompt masked iid."""
        total = 0.0
        for q in range(self.P + 1):
            for Q in itertools.combinations(range(self.P), q):
                x = [self.mask if i in Q else t for i, t in enumerate(self.p)] + [self.mask] * self.L
                attn = "full" if self.m.cfg.family == "llada" else None
                with torch.no_grad():
                    lsm = self.m(torch.tensor([x]), attn=attn)[0].float().log_softmax(-1)
                lp = sum(float(lsm[self.P + k, t]) for k, t in enumerate(self.y))
                total += p_prompt ** q * (1 - p_prompt) ** (self.P - q) * lp
        return total

    def sdmc_expectation(self, nodes: int) -> float:
        import numpy as np
        x, w = np.polynomial.legendre.leggauss(nodes)
        cw = []
        for t, wt in zip((x + 1) / 2, w / 2):
            m = min(max(int(math.floor(t * self.L + 0.5)), 1), self.L)
            cw.append((m, float(wt) * self.L / m))
        return self.count_scheme(cw)


def estimates(model, prompt, resp, estimator: str, scheme: str, draws: int, n: int, p_prompt: float = 0.0):
    """n independent estimates (distinct sample ids) of log p(y|q) in nats per sequence: [n]."""
    batch = rl.batch_tokens([prompt] * n, [resp] * n, model.cfg.pad_id)
    md = rl.draw_masks(batch, scheme, draws, [(0, 0, i, 0, 0) for i in range(n)], p_prompt)
    with torch.no_grad():
        est = rl.seq_logp(model, batch, estimator, md, entropy=False)
    return est.seq.double() * len(resp)


ROWS = [  # (label, estimator by family, scheme, draws, forwards per estimate)
    ("stratified D=1", "elbo", "stratified", 1, 1), ("stratified D=2", "elbo", "stratified", 2, 2),
    ("stratified D=4", "elbo", "stratified", 4, 4), ("coupled D=1", "elbo", "coupled", 1, 2),
    ("coupled D=2", "elbo", "coupled", 2, 4), ("sdmc GL-2", "elbo", "sdmc", 2, 2),
    ("sdmc GL-3", "elbo", "sdmc", 3, 3), ("mean_field p=0", "mean_field", "mean_field", 1, 1),
    ("mean_field p=0.15", "mean_field", "mean_field", 1, 1),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000, help="sample ids per row")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(2)
    prompt, resp = [1, 0, 2], [1, 2, 0, 2]
    print("| family | estimator | fwd | E[estimate] | bias vs ELBO | bias vs log p | MC mean (+-2 SE) | std of one |")
    print("|---|---|---|---|---|---|---|---|")
    for family in ("llada", "sdar"):
        model = toy_model(family, args.seed)
        toy = Toy(model, prompt, resp)
        exact, elbo = toy.exact(), toy.elbo()
        print(f"| {family} | exact log p = {exact:.4f}, ELBO = {elbo:.4f} (gap {exact - elbo:.4f}) | | | | | | |")
        for label, kind, scheme, D, fw in ROWS:
            est = rl.FAMILY_ESTIMATOR[family] if kind == "elbo" else "mean_field"
            p = 0.15 if label.endswith("0.15") else 0.0
            x = estimates(model, prompt, resp, est, scheme, D, args.n, p)
            ev = (toy.sdmc_expectation(D) if scheme == "sdmc" else toy.mean_field(p) if kind == "mean_field"
                  else elbo)  # exact expectation of the estimator, by enumeration
            se = float(x.std()) / math.sqrt(len(x))
            print(f"| {family} | {label} | {fw} | {ev:.4f} | {ev - elbo:+.4f} | {ev - exact:+.4f} "
                  f"| {x.mean():.4f} +- {2 * se:.4f} | {x.std():.4f} |")

if __name__ == "__main__":
    main()
