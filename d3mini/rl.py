"""RL for diffusion-LLM agents: reward gating, advantages, likelihood estimators, policy losses.

One `rl_step` (DESIGN.md §3): StepSamples -> gated rewards -> group advantages -> mask draws
materialised once and shared by the old, reference and current policy (reference/rl.md §3.3)
-> old / ref estimates without grad -> mu epochs of minibatch updates (micro-batch gradient
accumulation, global token normalisation) -> metrics. `diffusion_loss` is the supervised
masked-diffusion loss the SFT stage shares.

Published settings per algorithm; `rl_config(algo)` builds an RLConfig with them (fields not
listed keep the RLConfig default, which is d3llm_v2's):

| algo     | adv  | gating  | clip lo/hi | dual | kl (beta) | estimator / masks        | mc | mu | lr   | from  |
|----------|------|---------|------------|------|-----------|--------------------------|----|----|------|-------|
| d3llm_v2 | grpo | gate    | 0.2 / 0.28 | -    | none      | family ELBO / stratified | 2  | 1  | 1e-5 | D§4.6 |
| d1       | mean | penalty | 0.5 / 0.5  | -    | k3 (0.04) | mean_field, prompt 0.15  | 1  | 12 | 3e-6 | §4.1  |
| espo     | loo  | penalty | 0.2 / 0.2  | -    | k2 (1e-3) | family ELBO / coupled    | 2  | 8  | 3e-6 | §4.2  |
| bgpo     | grpo | penalty | 0.2 / 0.2  | 3    | none      | family ELBO / stratified | 16 | 1  | 5e-7 | §4.4  |
| gdpo     | mean | penalty | 0.5 / 0.5  | -    | none      | family ELBO / sdmc (GL3) | 3  | 1  | 3e-7 | §4.3  |
| grpo     | grpo | penalty | 0.2 / 0.2  | 3    | k3 (0.01) | ar (exact log-probs)     | 1  | 1  | 1e-6 | §6.6  |

(D§ = DESIGN.md, § = reference/rl.md.) "family ELBO" = sdar_block on SDAR, llada_mc on LLaDA.
Every sequence-level likelihood is length-normalised by the valid response length |y| (stop token
included, padding excluded). `rl.score: action` (any algorithm) credits only the action: the think
text before the <action> tag joins the prompt as clean context and y is the rest (`credited`).
`rl.estimator: sdar_trace` (any algorithm, SDAR) replaces the random mask draws with the rollout's own
decode trace (TraceRL, rl.md §4.9; `trace_masks`): each token is scored in the canvas it was committed
from, so the estimate is the decoder's exact log-probability, parallel commits included, at the cost of
one noisy copy per denoising step of the longest block instead of rl.mc_samples.
`rl.step_advantage: mean | mean_std` (any algorithm) adds GiGPO's step-level advantage (§6.5): the
discounted returns of steps that acted on the same observation of the same task are compared, so a
step is credited against the other actions taken in its state, not only by its episode's outcome.
"""
from __future__ import annotations

import math
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from d3mini.config import RLConfig
from d3mini.model import bd_training_mask, noisy_positions, padding_mask

ALGO_DEFAULTS = {
    "d3llm_v2": {},
    "d1": dict(advantage="mean", gating="penalty", clip_low=0.5, clip_high=0.5, kl="k3", kl_coef=0.04,
               estimator="mean_field", mc_samples=1, epochs=12, lr=3e-6, p_mask_prompt=0.15),
    "espo": dict(advantage="loo", gating="penalty", clip_low=0.2, clip_high=0.2, kl="k2", kl_coef=1e-3,
                 mc_samples=2, epochs=8, lr=3e-6),
    "bgpo": dict(advantage="grpo", gating="penalty", clip_low=0.2, clip_high=0.2, dual_clip=3.0,
                 mc_samples=16, epochs=1, lr=5e-7),
    "gdpo": dict(advantage="mean", gating="penalty", clip_low=0.5, clip_high=0.5,
                 mc_samples=3, epochs=1, lr=3e-7),
    "grpo": dict(advantage="grpo", gating="penalty", clip_low=0.2, clip_high=0.2, dual_clip=3.0, kl="k3",
                 kl_coef=0.01, estimator="ar", epochs=1, lr=1e-6),
}
FAMILY_ESTIMATOR = {"sdar": "sdar_block", "llada": "llada_mc", "qwen3": "ar"}
_SCORING = {"ar": "ar", "sdar_block": "bd", "sdar_trace": "bd", "llada_mc": "canvas", "llada_coupled": "canvas",
            "mean_field": "canvas"}
_FITS = {"ar": ("qwen3",), "sdar_block": ("sdar",), "sdar_trace": ("sdar",), "llada_mc": ("llada",),
         "llada_coupled": ("llada",), "mean_field": ("sdar", "llada")}
SCHEMES = ("stratified", "coupled", "sdmc")
SDAR_EPS = 1e-3  # p_mask = (1 - eps) t + eps (SDAR modeling_sdar.py, LLaDA GUIDELINES.md)


def rl_config(algo: str, **overrides) -> RLConfig:
    """An RLConfig with the algorithm's published settings (table above), then `overrides`."""
    if algo not in ALGO_DEFAULTS:
        raise ValueError(f"rl.algo = {algo!r}: must be one of {list(ALGO_DEFAULTS)}")
    return RLConfig(algo=algo, **{**ALGO_DEFAULTS[algo], **overrides})


# ----------------------------------------------------------------------------- batches
@dataclass
class Batch:
    """Right-padded [prompt | response] rows; masks come from the lengths, never from pad ids."""
    ids: torch.Tensor         # [B, n]
    prompt_len: torch.Tensor  # [B]
    resp_len: torch.Tensor    # [B] response tokens, final stop token included

    @property
    def lengths(self):
        return self.prompt_len + self.resp_len

    @property
    def resp(self):  # [B, n] bool: response positions
        pos = torch.arange(self.ids.shape[1], device=self.ids.device)[None]
        return (pos >= self.prompt_len[:, None]) & (pos < self.lengths[:, None])

    def select(self, idx) -> "Batch":
        idx = torch.as_tensor(idx, device=self.ids.device)
        n = int(self.lengths[idx].max())
        return Batch(self.ids[idx, :n], self.prompt_len[idx], self.resp_len[idx])


def all_targets(b: Batch) -> torch.Tensor:
    """[B, n] bool: every real token after the first (prompt included), the targets of ar_prompt."""
    pos = torch.arange(b.ids.shape[1], device=b.ids.device)[None]
    return (pos >= 1) & (pos < b.lengths[:, None])


def prompt_targets(b: Batch, keep: torch.Tensor) -> torch.Tensor:
    """all_targets in the rows where keep [B] is True, only the response's tokens in the others (rows whose
    prompt shows an action nobody should learn: an SFT detour in the history)."""
    return all_targets(b) & (keep[:, None] | b.resp)


def per_copy_count(masked: torch.Tensor) -> torch.Tensor:
    """Masked tokens per mask copy: masked.sum() for [B, n], masked.sum() / C for [B, C, n]."""
    return masked.sum() / (masked.shape[1] if masked.dim() == 3 else 1)


def batch_tokens(prompts: list, responses: list, pad_id: int, device=None) -> Batch:
    """Token lists -> a right-padded Batch (padding = pad_id, only ever read through lengths)."""
    if len(prompts) != len(responses) or not prompts:
        raise ValueError(f"batch_tokens: {len(prompts)} prompts vs {len(responses)} responses (need >= 1 each)")
    if any(len(r) == 0 for r in responses):
        raise ValueError("batch_tokens: empty response (a response carries at least its stop token)")
    n = max(len(p) + len(r) for p, r in zip(prompts, responses))
    ids = torch.full((len(prompts), n), pad_id, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        ids[i, : len(p) + len(r)] = torch.tensor(list(p) + list(r), dtype=torch.long)
    plen = torch.tensor([len(p) for p in prompts])
    rlen = torch.tensor([len(r) for r in responses])
    return Batch(ids.to(device), plen.to(device), rlen.to(device))


# ----------------------------------------------------------------------------- scoring
def score(model, clean, canvas, lengths, kind: str, start, entropy=False, block_size: int = 0):
    """Log-probs of the clean tokens given the corrupted canvas: [R, n] (0 before `start`), and the
    predictive entropy [R, n] (None without `entropy`; differentiable only for entropy="grad").
    kind: bd = SDAR [noisy | clean] with the block-diffusion training mask (models.md §2.7);
    canvas = one copy under the family's own mask (LLaDA full attention, SDAR block-causal);
    ar = causal, row j-1 predicts token j. `start`: an int, or a [R] tensor of per-row starts (the
    prompt lengths). bd lays out each row's noisy copy from the block that holds its own start, so a
    micro-batch of prompts of different lengths costs ~|response| + K noisy rows each instead of
    n - min(start); canvas and ar score from the smallest start. The LM head runs only on noisy rows
    (bd) or rows >= start. For C mask copies [R, C, n] under bd it returns [R, C, n]. block_size > 0
    replaces the model's block size in the bd mask (SFT's block-size curriculum)."""
    R, n = clean.shape
    cfg = model.cfg
    dev = clean.device
    pos = torch.arange(n, device=dev)
    copies = canvas.dim() == 3  # bd only: C noisy copies [R, C, n] sharing one clean pass
    first = torch.as_tensor(start, device=dev)  # a shared start or one per row
    start = int(first.min())
    if kind == "bd":
        # the noisy copy of prompt-only blocks is never attended to: leave it out (exact, ~2x cheaper)
        cv = canvas if copies else canvas[:, None]  # [R, C, n]
        K = block_size or cfg.block_size
        first = first.expand(R)
        C, ns = cv.shape[1], (first // K) * K
        col, real = noisy_positions(lengths, ns, n)  # [R, m]
        m = col.shape[1]
        attn = bd_training_mask(lengths, n, K, noisy_start=ns, copies=C)  # [R, 1, Cm + n, Cm + n]
        noisy = cv.gather(2, col[:, None].expand(R, C, m)).reshape(R, C * m)
        x = torch.cat([noisy, clean], 1)                                                     # [R, Cm + n]
        logits = model(x, torch.cat([col.repeat(1, C), pos[None].expand(R, n)], 1), attn=attn,
                       logits_rows=slice(0, C * m)).view(R, C, m, -1)
        lsm = logits.float().log_softmax(-1)  # [R, C, m, V]
        keep = (real & (col >= first[:, None]))[:, None].expand(R, C, m)
        idx = col[:, None].expand(R, C, m)

        def place(v):  # [R, C, m] -> [R, C, n] (or [R, n]): 0 outside each row's scored span
            out = v.new_zeros(R, C, n).scatter_add(2, idx, torch.where(keep, v, 0.0))
            return out if copies else out[:, 0]

        tok = clean.gather(1, col)[:, None].expand(R, C, m)
        out = place(lsm.gather(-1, tok[..., None]).squeeze(-1))
        if not entropy:
            return out, None
        src = lsm if entropy == "grad" else lsm.detach()  # a graph through the entropy only when a loss uses it
        return out, place(-(src.exp() * src).sum(-1))
    if copies:
        raise ValueError(f"score: mask copies [R, C, n] need kind 'bd', got {kind!r}")
    if kind == "canvas":
        logits = model(canvas, pos, attn=padding_mask(cfg.family, cfg.block_size, lengths, n),
                       logits_rows=slice(start, n))
    elif kind == "ar":
        if start < 1:
            raise ValueError("AR scoring needs a non-empty prompt (row j-1 predicts token j)")
        logits = model(clean, pos, attn=padding_mask("qwen3", 1, lengths, n), logits_rows=slice(start - 1, n - 1))
    else:
        raise ValueError(f"unknown scoring kind {kind!r}")
    lsm = logits.float().log_softmax(-1)  # [R, n - start, V]
    out = clean.new_zeros((R, n), dtype=torch.float32)
    out[:, start:] = lsm.gather(-1, clean[:, start:, None]).squeeze(-1)
    if not entropy:
        return out, None
    ent = torch.zeros_like(out)
    src = lsm if entropy == "grad" else lsm.detach()  # a graph through the entropy only when a loss uses it
    ent[:, start:] = -(src.exp() * src).sum(-1)
    return out, ent


def corrupt_iid(batch: Batch, gen: torch.Generator, tries: int = 10, copies: int = 1):
    """SDAR's SFT corruption (models.md §2.7): one t ~ U(0,1) per sample, p = (1-eps)t + eps, response
    tokens masked iid with p; a row with no mask is redrawn up to `tries` times, then one random
    response token is forced. Returns (masked [B, n] bool, p [B]).
    copies = C > 1: C draws per sample with stratified t_c = (c + u_c) / C (lower variance than C iid
    draws, the same expectation), returned as masked [B, C, n] and p [B, C]; see bd_training_mask."""
    if copies > 1:
        B, n = batch.ids.shape
        u = torch.rand(B * copies, generator=gen, device=gen.device)
        strata = torch.arange(copies, device=gen.device).repeat(B)
        eligible = batch.resp.repeat_interleave(copies, 0)  # [B C, n] every row C times
        m, p = _corrupt(eligible, gen, ((strata + u) / copies).to(eligible.device), tries)
        return m.view(B, copies, n), p.view(B, copies)
    return _corrupt(batch.resp, gen, None, tries)


def corrupt_suffix(batch: Batch, gen: torch.Generator, block_size: int, copies: int = 1, frac: float = 1.0):
    """Block-suffix masks: in every block (aligned at absolute position 0) a cut c = floor(u K), u ~ U(0,1)
    per block, and the response tokens at block offsets >= c are masked; a block whose cut leaves none
    of its response tokens masked masks its last one. These are the states a left-to-right pass through
    a block visits (the prefix decoded, the rest masked), where copying from the prompt continues from a
    known left neighbour; the later masked tokens still train parallel prediction. With copies = C the
    cuts are stratified, u_c = (c + v) / C. Only a fraction `frac` of the draws (chosen at random) are
    suffixes; the rest are corrupt_iid's. Returns (masked [B, n] or [B, C, n], p) with p = 1 for
    suffix draws (use weight "uniform")."""
    B, n = batch.ids.shape
    K, C = block_size, copies
    m_iid, p_iid = corrupt_iid(batch, gen, copies=C)
    m_iid, p_iid = (m_iid, p_iid) if C > 1 else (m_iid[:, None], p_iid[:, None])
    nb = (n + K - 1) // K
    v = torch.rand(B, C, nb, generator=gen, device=gen.device)
    u = (torch.arange(C, device=gen.device)[None, :, None] + v) / C
    cut = (u * K).floor().long().to(batch.ids.device)                        # [B, C, nb]
    pos = torch.arange(n, device=batch.ids.device)
    off, blk = pos % K, pos // K
    resp = batch.resp[:, None].expand(B, C, n)
    m = resp & (off[None, None] >= cut.gather(2, blk[None, None].expand(B, C, n)))
    # blocks with response tokens but nothing masked: mask their last response token
    last = resp & ~torch.cat([resp[..., 1:] & (blk[1:] == blk[:-1])[None, None], torch.zeros_like(resp[..., :1])], -1)
    has = torch.zeros(B, C, nb, dtype=torch.long, device=m.device).scatter_add_(2, blk.expand(B, C, n), m.long())
    m = m | (last & (has.gather(2, blk.expand(B, C, n)) == 0))
    use = (torch.rand(B, C, generator=gen, device=gen.device) < frac).to(m.device)
    m = torch.where(use[..., None], m, m_iid)
    p = torch.where(use, torch.ones_like(p_iid), p_iid)
    return (m, p) if C > 1 else (m[:, 0], p[:, 0])


def _corrupt(eligible, gen, t, tries):
    B, n = eligible.shape

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device=gen.device).to(eligible.device)

    p = (1 - SDAR_EPS) * (rand(B) if t is None else t) + SDAR_EPS
    m = torch.zeros_like(eligible)
    todo = torch.ones(B, dtype=torch.bool, device=eligible.device)
    for _ in range(tries):
        m = torch.where(todo[:, None], (rand(B, n) < p[:, None]) & eligible, m)
        todo = ~m.any(1)
        if not todo.any():
            return m, p
    pick = (rand(B, n) + eligible).argmax(1)  # [B] a random response position
    return m | (todo[:, None] & (torch.arange(n, device=m.device)[None] == pick[:, None])), p


def masked_loss(model, b: Batch, masked, p, norm: str = "tokens", ar: bool = False, block_size: int = 0,
                ar_prompt: bool = False, weight: str = "elbo"):
    """Supervised loss on response tokens for given masks (the prompt is not noised unless ar_prompt):
    sdar  one forward over [noisy | clean], sum over masked of CE / p (SDAR modeling_sdar.py)
    llada one full-attention forward of the noisy copy, the same sum (models.md §6.3)
    qwen3 shifted AR cross-entropy on every response token (masked, p unused)
    norm "tokens": / response tokens in the batch (SDAR); "samples": / each answer length, then / B
    (LLaDA SFT). ar=True: the AR loss on any family (causal attention; the AR warm start of a model
    built from scratch, as SDAR itself starts from an AR checkpoint). block_size > 0: SDAR's mask with
    that block size instead of the model's (a block-size curriculum). ar_prompt (with ar): every token
    after the first is a target, prompt included (or those `masked` marks, when given: prompt_targets),
    and "tokens" divides by that count (language-model practice on the agent's own transcripts: ~10x
    the targets of the response alone, same forward).
    ar_prompt on a diffusion loss: `masked` may cover prompt tokens (the noisy copy starts at position 1),
    "tokens" divides by the masked count; with block_size 1 and all masked it is next-token prediction
    over the whole transcript in the unshifted parametrization.
    weight "elbo": CE / p as above (unbiased for the ELBO); "uniform": plain mean CE over the masked
    tokens (no 1/p: a sample with p ~ 0.01 and one masked token no longer weighs 100x, so small batches
    train without loss spikes; the objective is then a reweighted ELBO). Returns (loss, stats)."""
    if norm not in ("tokens", "samples"):
        raise ValueError(f"diffusion loss: norm = {norm!r}: must be tokens | samples")
    if weight not in ("elbo", "uniform") or (weight == "uniform" and norm != "tokens"):
        raise ValueError(f"diffusion loss: weight = {weight!r} with norm {norm!r}: elbo | uniform (tokens only)")
    cfg, start = model.cfg, b.prompt_len  # per-row starts: bd skips each row's own prompt blocks
    count = b.resp_len.sum()
    if weight == "uniform" and masked is not None and not (cfg.family == "qwen3" or ar):
        p, count = torch.ones_like(p), per_copy_count(masked)
    if ar_prompt and not (cfg.family == "qwen3" or ar):  # masks may cover prompt tokens: noise from position 1
        start, count = 1, per_copy_count(masked)
    if cfg.family == "qwen3" or ar:
        if ar_prompt:
            masked, start = (all_targets(b) if masked is None else masked), 1
            count = masked.sum()
        else:
            masked = b.resp
        lp, _ = score(model, b.ids, b.ids, b.lengths, "ar", start)
        per = -lp * masked
    elif masked.dim() == 3:  # C mask draws per row [B, C, n]: the loss averages the copies
        C = masked.shape[1]
        canvas = torch.where(masked, cfg.mask_id, b.ids[:, None])  # [B, C, n]
        if cfg.family == "sdar":
            lp, _ = score(model, b.ids, canvas, b.lengths, "bd", start, block_size=block_size)
        else:  # full attention: the copies are just more rows
            lp, _ = score(model, b.ids.repeat_interleave(C, 0), canvas.flatten(0, 1),
                          b.lengths.repeat_interleave(C), "canvas", start)
            lp = lp.view_as(canvas)
        per = (-lp * masked / p[:, :, None]).sum(1) / C  # [B, n]
    else:
        canvas = torch.where(masked, cfg.mask_id, b.ids)
        lp, _ = score(model, b.ids, canvas, b.lengths, "bd" if cfg.family == "sdar" else "canvas", start,
                      block_size=block_size)
        per = -lp * masked / p[:, None]
    if norm == "tokens":
        loss = per.sum() / count
    else:
        loss = (per.sum(1) / (masked.sum(1) if ar_prompt else b.resp_len)).mean()
    ce = float((-lp.detach() * masked).sum() / masked.sum())
    return loss, {"loss": float(loss.detach()), "ce_masked": ce, "tokens": float(count),
                  "masked": int(masked.sum())}


def diffusion_loss(model, prompts: list, responses: list, gen: torch.Generator, norm: str = "tokens",
                   copies: int = 1):
    """The family's supervised (SFT) loss on a right-padded batch: corrupt_iid + masked_loss.
    Responses carry their final stop token, so the model learns to stop. Returns (loss, stats)."""
    b = batch_tokens(prompts, responses, model.cfg.pad_id, next(model.parameters()).device)
    masked, p = (None, None) if model.cfg.family == "qwen3" else corrupt_iid(b, gen, copies=copies)
    return masked_loss(model, b, masked, p, norm)


# ----------------------------------------------------------------------------- mask draws
def _gen(key) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(zlib.crc32(repr(key).encode()))
    return g


def _nearest(x: float) -> int:  # round half up (Python's round() is half-to-even)
    return int(math.floor(x + 0.5))


@dataclass
class MaskDraws:
    """Corruptions materialised once, shared by old / ref / current policies (rl.md §3.3)."""
    masked: torch.Tensor  # [B, D, n] bool: positions shown as mask_id
    weight: torch.Tensor  # [B, D, n] float: per-token weight of log p (0 = not scored)

    def select(self, idx, n: int) -> "MaskDraws":
        idx = torch.as_tensor(idx, device=self.masked.device)
        return MaskDraws(self.masked[idx, :, :n], self.weight[idx, :, :n])


def draw_masks(batch: Batch, scheme: str, n_draws: int, keys: list, p_mask_prompt: float = 0.0) -> MaskDraws:
    """Response masks for every sample; each sample's draws are seeded from its key (sample id,
    inner iteration) plus the MC index, never from batch position. Schemes (rl.md §3.2):
    stratified  LLaDA grid: k ~ U{1..L}, draw d masks m_d = ((round(k + dL/D) - 1) mod L) + 1, weight L/m_d
    coupled     ESPO grid over {0..L}, t = m/(L+1), plus the complement; weights (L+1)/m, (L+1)/(L-m) -> 2D draws
    sdmc        Gauss-Legendre nodes t_d on [0,1] (GDPO), m_d = clamp(round(t_d L), 1, L), weight D w_d L/m_d
    mean_field  d1: the whole response masked, prompt tokens masked iid with p_mask_prompt, weight 1
    none        AR: nothing masked, weight 1
    The first three are unbiased for the ELBO sum_m (1/m) E_{|M|=m} sum_{k in M} log p(y_k | y_{not M})
    except sdmc (a quadrature)."""
    B, n = batch.ids.shape
    D = 2 * n_draws if scheme == "coupled" else (1 if scheme == "none" else n_draws)
    masked = torch.zeros(B, D, n, dtype=torch.bool)
    weight = torch.zeros(B, D, n)
    if scheme == "sdmc":
        import numpy as np
        x, w = np.polynomial.legendre.leggauss(n_draws)
        nodes, wts = (x + 1) / 2, w / 2  # on [0, 1], weights sum to 1
    for i in range(B):
        P, L = int(batch.prompt_len[i]), int(batch.resp_len[i])
        sets = []  # (response offsets, weight) per draw
        if scheme in ("none", "mean_field"):
            sets = [(torch.arange(L), 1.0)] * D
        elif scheme == "stratified":
            k = int(torch.randint(1, L + 1, (1,), generator=_gen(keys[i])))
            for d in range(D):
                m = (_nearest(k + d * L / D) - 1) % L + 1
                sets.append((torch.randperm(L, generator=_gen(keys[i] + (d,)))[:m], L / m))
        elif scheme == "coupled":
            k = int(torch.randint(0, L + 1, (1,), generator=_gen(keys[i])))
            for d in range(n_draws):
                m = _nearest(k + d * (L + 1) / n_draws) % (L + 1)
                perm = torch.randperm(L, generator=_gen(keys[i] + (d,)))
                sets += [(perm[:m], (L + 1) / max(m, 1)), (perm[m:], (L + 1) / max(L - m, 1))]
        elif scheme == "sdmc":
            for d in range(D):
                m = min(max(_nearest(nodes[d] * L), 1), L)
                sets.append((torch.randperm(L, generator=_gen(keys[i] + (d,)))[:m], D * float(wts[d]) * L / m))
        else:
            raise ValueError(f"mask scheme {scheme!r}: must be one of {SCHEMES + ('mean_field', 'none')}")
        for d, (off, wt) in enumerate(sets):
            weight[i, d, P + off] = wt
            if scheme != "none":
                masked[i, d, P + off] = True
            if scheme == "mean_field" and p_mask_prompt > 0:
                masked[i, d, :P] = torch.rand(P, generator=_gen(keys[i] + (d, "prompt"))) < p_mask_prompt
    dev = batch.ids.device
    return MaskDraws(masked.to(dev), weight.to(dev))


def trace_masks(batch: Batch, traces: list, block_size: int, shrink: int = 1) -> MaskDraws:
    """The policy's own decode trajectory as mask copies (TraceRL, block attention; rl.md §4.9).
    traces[i][j] = the denoising forward that committed response token j. Blocks are aligned at
    absolute position 0, as in decode.py. In each block the distinct trace values, in order, are that
    block's steps 0, 1, ...; copy d masks every response token of step >= d in its block and scores
    those of step d. Blocks do not see each other's noisy copy, so one copy serves all blocks, and
    D = the most steps any block took. Each token is scored once, with weight D, so the mean over
    copies (Est.tok) is exactly log p(y_j | the canvas it was committed from): the decoder's own
    log-probability of its commit at temperature 1 (not the draw of which positions commit). The last
    block can differ from the decode only in the tokens the decoder wrote after the stop id, which the
    sample does not keep: seq_logp shows them as masks, which is what the decoder saw unless it
    committed one of them before a response token of that block (never at tau 1 with order left).
    shrink s > 1 merges steps s*g .. s*g + s - 1 into copy g (TraceRL's shrink): ~s x fewer copies, and
    a merged step's later tokens are scored with less context than the decoder had (no longer exact)."""
    if shrink < 1:
        raise ValueError(f"rl.trace_shrink = {shrink} must be >= 1")
    B, n = batch.ids.shape
    steps = []  # per sample: [L] step index of each response token within its block
    for i in range(B):
        P, L = int(batch.prompt_len[i]), int(batch.resp_len[i])
        tr = list(traces[i]) if traces[i] is not None else []
        if len(tr) != L:
            raise ValueError(f"sample {i}: decode trace of {len(tr)} entries for a response of {L} tokens "
                             "(expert samples have no trace; the sdar_trace estimator needs decoded ones)")
        rank, blocks = [0] * L, defaultdict(list)
        for j in range(L):
            blocks[(P + j) // block_size].append(j)
        for js in blocks.values():
            order = {v: r // shrink for r, v in enumerate(sorted({tr[j] for j in js}))}
            for j in js:
                rank[j] = order[tr[j]]
        steps.append(rank)
    D = max((max(r) + 1 for r in steps if r), default=1)
    masked = torch.zeros(B, D, n, dtype=torch.bool)
    weight = torch.zeros(B, D, n)
    d = torch.arange(D)[:, None]
    for i, rank in enumerate(steps):
        P, L = int(batch.prompt_len[i]), len(rank)
        r = torch.tensor(rank, dtype=torch.long)[None]  # [1, L]
        masked[i, :, P:P + L] = r >= d
        weight[i, :, P:P + L] = (r == d).float() * D
    dev = batch.ids.device
    return MaskDraws(masked.to(dev), weight.to(dev))


# ----------------------------------------------------------------------------- estimates
@dataclass
class Est:
    """A likelihood estimate of B sequences under one set of draws."""
    tok: torch.Tensor   # [B, n] per-token terms averaged over draws (0 off the response)
    draw: torch.Tensor  # [B, D] per-draw estimate of log p(y|q) / |y|
    ent: torch.Tensor   # [B] mean predictive entropy at the scored positions
    resp: torch.Tensor  # [B, n] bool response positions

    @property
    def seq(self):  # [B] length-normalised log-likelihood estimate
        return self.draw.mean(1)

    @property
    def count(self):  # [B] |y|
        return self.resp.sum(1)

    def select(self, idx, n: int) -> "Est":
        idx = torch.as_tensor(idx, device=self.tok.device)
        return Est(self.tok[idx, :n], self.draw[idx], self.ent[idx], self.resp[idx, :n])


def seq_logp(model, batch: Batch, estimator: str, draws: MaskDraws, entropy=True) -> Est:
    """One batched forward over all B x D corrupted copies -> Est. estimator: ar | sdar_block |
    llada_mc | llada_coupled | mean_field (the scheme lives in `draws`)."""
    B, D, n = draws.masked.shape
    if batch.ids.shape != (B, n):
        raise ValueError(f"draws {tuple(draws.masked.shape)} do not match batch ids {tuple(batch.ids.shape)}")
    if model.cfg.family not in _FITS[estimator]:
        raise ValueError(f"rl.estimator = {estimator!r} does not fit model.family = {model.cfg.family!r}")
    canvas = torch.where(draws.masked, model.cfg.mask_id, batch.ids[:, None])  # [B, D, n]
    ids, lengths = batch.ids, batch.lengths
    if estimator == "sdar_trace":  # the decoder saw its last block whole, the tokens after the response as masks
        K = model.cfg.block_size
        lengths = -(-batch.lengths // K) * K  # [B] block ends
        w = max(n, int(lengths.max()))
        pos = torch.arange(w, device=canvas.device)
        tail = (pos >= batch.lengths[:, None]) & (pos < lengths[:, None])  # [B, w]
        canvas = F.pad(canvas, (0, w - n), value=model.cfg.pad_id).masked_fill(tail[:, None], model.cfg.mask_id)
        ids = F.pad(ids, (0, w - n), value=model.cfg.pad_id)
    if _SCORING[estimator] == "bd":  # the D noisy copies share one pass over the clean sequence
        lp, ent = score(model, ids, canvas, lengths, "bd", batch.prompt_len, entropy)
        lp, ent = lp[..., :n], None if ent is None else ent[..., :n]
    else:
        lp, ent = score(model, batch.ids.repeat_interleave(D, 0), canvas.reshape(B * D, n),
                        batch.lengths.repeat_interleave(D), _SCORING[estimator],
                        batch.prompt_len.repeat_interleave(D), entropy)
    terms = draws.weight * lp.view(B, D, n)  # [B, D, n]
    scored = draws.weight != 0
    ent = terms.new_zeros(B) if ent is None else \
        (ent.view(B, D, n) * scored).sum((1, 2)) / scored.sum((1, 2)).clamp(min=1)  # [B]
    return Est(terms.mean(1), terms.sum(-1) / batch.resp_len[:, None], ent, batch.resp)


def resolve_estimator(cfg: RLConfig, family: str):
    """(estimator, mask scheme, MC draws) for this algorithm and model family."""
    est = cfg.estimator
    if est == "sdar_trace":
        if family not in _FITS[est]:
            raise ValueError(f"rl.estimator = 'sdar_trace' needs an SDAR model (block attention), not {family!r}")
        if cfg.mask_scheme not in ("auto", "trace"):
            raise ValueError(f"rl.mask_scheme = {cfg.mask_scheme!r}: the sdar_trace estimator takes its masks "
                             "from the decode trace (set auto)")
        return est, "trace", 0  # copies: the most denoising steps any block took (trace_masks)
    if est == "auto":
        est = {"grpo": "ar", "d1": "mean_field"}.get(cfg.algo, FAMILY_ESTIMATOR[family])
        est = "llada_coupled" if est == "llada_mc" and cfg.algo == "espo" else est
    if family not in _FITS[est]:
        raise ValueError(f"rl.estimator = {est!r} does not fit model.family = {family!r} (fits {list(_FITS[est])})")
    if est in ("ar", "mean_field"):
        if cfg.mask_scheme != "auto":
            raise ValueError(f"rl.mask_scheme = {cfg.mask_scheme!r} applies to ELBO estimators, not {est!r}")
        return est, ("none" if est == "ar" else "mean_field"), (1 if est == "ar" else cfg.mc_samples)
    scheme = cfg.mask_scheme
    if scheme == "auto":
        scheme = "coupled" if est == "llada_coupled" else "stratified"
        scheme = {"espo": "coupled", "gdpo": "sdmc"}.get(cfg.algo, scheme)
    if scheme not in SCHEMES:
        raise ValueError(f"rl.mask_scheme = {scheme!r}: must be auto | {' | '.join(SCHEMES)}")
    return est, scheme, cfg.mc_samples


# ----------------------------------------------------------------------------- rewards, advantages
def gate_rewards(rewards, valid, mode: str = "gate", penalty: float = 0.1) -> torch.Tensor:
    """Per step sample: gate (DESIGN.md §4.6) = episode reward if the action is valid else 0;
    penalty (verl-agent apply_invalid_action_penalty) = reward - penalty * (1 - valid); none = reward."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    v = torch.as_tensor(valid, dtype=torch.bool)
    if not torch.isfinite(r).all():
        raise ValueError(f"non-finite rewards: {r.tolist()}")
    if mode == "gate":
        return torch.where(v, r, torch.zeros_like(r))
    if mode == "penalty":
        return r - penalty * (~v).double()
    if mode == "none":
        return r
    raise ValueError(f"rl.gating = {mode!r}: must be gate | penalty | none")


def advantages(rewards, group_ids: list, mode: str = "grpo", eps: float = 1e-6):
    """Group-relative advantages over all step samples of a group (verl-agent cross-step statistics):
    grpo (r - mean) / (std + eps) with unbiased std; mean r - mean; loo r - mean of the others.
    A singleton group uses baseline 0, scale 1 (verl-agent). Returns (A [B], frac groups with std 0)."""
    r = torch.as_tensor(rewards, dtype=torch.float64)
    groups = defaultdict(list)
    for i, g in enumerate(group_ids):
        groups[g].append(i)
    adv, zero = torch.zeros_like(r), 0
    for idx in groups.values():
        x = r[idx]
        zero += int(len(idx) > 1 and bool((x == x[0]).all()))
        if len(idx) == 1:
            adv[idx] = x
        elif mode == "grpo":
            adv[idx] = (x - x.mean()) / (x.std() + eps)
        elif mode == "mean":
            adv[idx] = x - x.mean()
        elif mode == "loo":
            adv[idx] = x - (x.sum() - x) / (len(idx) - 1)
        else:
            raise ValueError(f"rl.advantage = {mode!r}: must be grpo | mean | loo")
    return adv.float(), zero / len(groups)


def step_returns(samples, gamma: float) -> torch.Tensor:
    """GiGPO step returns: G_t = sum_{k >= t} gamma^(k - t) r_k over each episode's own step rewards
    (sample.env_reward; WebShop and ALFWorld pay only on the last step), in the order of `samples`."""
    episodes = defaultdict(list)
    for i, s in enumerate(samples):
        episodes[s.episode_id].append(i)
    g = torch.zeros(len(samples), dtype=torch.float64)
    for idx in episodes.values():
        run = 0.0
        for i in sorted(idx, key=lambda i: samples[i].step, reverse=True):
            run = float(samples[i].env_reward) + gamma * run
            g[i] = run
    return g


def anchor_advantages(returns, keys: list, mode: str = "mean", eps: float = 1e-6) -> tuple:
    """GiGPO step advantages: step samples with the same key (task group, anchor observation) form a
    group; A_step = G - group mean (mode "mean") or / (unbiased std + eps) ("mean_std"). A singleton
    group gets 0: no other step acted on that state. Returns (A_step [B], fraction of samples grouped)."""
    if mode not in ("mean", "mean_std"):
        raise ValueError(f"rl.step_advantage = {mode!r}: must be none | mean | mean_std")
    g = torch.as_tensor(returns, dtype=torch.float64)
    groups = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    adv, grouped = torch.zeros_like(g), 0
    for idx in groups.values():
        if len(idx) < 2:
            continue
        grouped += len(idx)
        x = g[idx]
        adv[idx] = x - x.mean() if mode == "mean" else (x - x.mean()) / (x.std() + eps)
    return adv, grouped / max(len(keys), 1)


def sample_advantages(samples, cfg: RLConfig) -> tuple:
    """Per step sample: (raw episode rewards, shaped rewards, advantages [B] float32, extra metrics).
    The episode advantage is group-relative over the gated episode rewards (cfg.gating, cfg.advantage);
    with cfg.step_advantage != "none" GiGPO's anchor-state step advantage of the gated step returns is
    added with weight cfg.step_weight (the gate or penalty applies to a step's return as to its reward).
    Last, negative advantages are multiplied by cfg.neg_weight (1 = symmetric, as computed)."""
    raw = [float(s.reward) for s in samples]
    valid = [bool(s.valid) for s in samples]
    r = gate_rewards(raw, valid, cfg.gating, cfg.penalty)
    adv, zero_std = advantages(r, [s.group_id for s in samples], cfg.advantage)
    extra = {"frac_reward_zero_std": zero_std}
    if cfg.step_advantage != "none":
        missing = [n for n in ("env_reward", "anchor") if not hasattr(samples[0], n)]
        if missing:
            raise ValueError(f"rl.step_advantage = {cfg.step_advantage!r} needs step samples with {missing}")
        g = gate_rewards(step_returns(samples, cfg.gamma), valid, cfg.gating, cfg.penalty)
        a_step, grouped = anchor_advantages(g, [(s.group_id, s.anchor) for s in samples], cfg.step_advantage)
        adv = adv + cfg.step_weight * a_step.float()
        extra.update({"adv/step_abs_mean": float(a_step.abs().mean()), "anchor/frac_grouped": grouped})
    if cfg.neg_weight != 1.0:  # asymmetric credit: negative advantages scaled by rl.neg_weight
        adv = torch.where(adv < 0, cfg.neg_weight * adv, adv)
    return raw, r, adv.float(), extra


# ----------------------------------------------------------------------------- losses
def kl_penalty(d, kind: str):
    """Schulman's KL(cur || ref) estimators from d = logp_cur - logp_ref (rl.md §3.5); k3 capped at 10 as verl."""
    if kind == "k2":
        return 0.5 * d * d
    if kind == "k3":
        return (torch.exp(-d) + d - 1).clamp(max=10.0)
    return torch.zeros_like(d)


def ppo_clip(ratio, adv, lo: float, hi: float, dual: float = 0.0):
    """PPO's pessimistic clipped surrogate as a loss per unit; verl's dual clip caps it at -A c for A < 0."""
    loss = torch.maximum(-adv * ratio, -adv * ratio.clamp(1 - lo, 1 + hi))
    return torch.where(adv < 0, torch.minimum(loss, -adv * dual), loss) if dual > 0 else loss


def _kl_seq(cur, ref, cfg):  # [B] on length-normalised sequence estimates
    return kl_penalty(cur.seq - ref.seq, cfg.kl) if ref is not None else torch.zeros_like(cur.seq)


# Each loss: (cur, old, ref, adv [B], cfg) -> (loss per sample [B], ratio per unit (flat), kl [B]).
# Token-level losses return per-sample token sums (AGG "token": / minibatch tokens), the rest
# per-sample values (AGG "seq": / minibatch samples).
def loss_d3llm_v2(cur, old, ref, adv, cfg):
    ratio = torch.exp(cur.seq - old.seq)
    # bounded ratio: clipped against the rollout policy whatever the sign of A (no gradient outside)
    loss = -adv * ratio.clamp(1 - cfg.clip_low, 1 + cfg.clip_high)
    if cfg.entropy_coef > 0:  # entropy floor: penalise only when the mean entropy falls below it
        loss = loss + cfg.entropy_coef * F.relu(cfg.entropy_floor - cur.ent)
    kl = _kl_seq(cur, ref, cfg)
    return loss + cfg.kl_coef * kl, ratio, kl


def _token_ppo(cur, old, ref, adv, cfg, dual):
    ratio = torch.exp(cur.tok - old.tok)  # [B, n], same corrupted input for both
    tok = ppo_clip(ratio, adv[:, None], cfg.clip_low, cfg.clip_high, dual)
    kl = kl_penalty(cur.tok - ref.tok, cfg.kl) if ref is not None else torch.zeros_like(tok)
    m = cur.resp.float()
    return ((tok + cfg.kl_coef * kl) * m).sum(1), ratio[cur.resp], (kl * m).sum(1) / m.sum(1)


def loss_d1(cur, old, ref, adv, cfg):  # d1 diffu-GRPO: token ratios of the one-step mean-field estimate
    return _token_ppo(cur, old, ref, adv, cfg, dual=0.0)


def loss_grpo(cur, old, ref, adv, cfg):  # verl-agent GRPO: the same token loss, exact AR log-probs, dual clip
    return _token_ppo(cur, old, ref, adv, cfg, dual=cfg.dual_clip)


def loss_espo(cur, old, ref, adv, cfg):
    ratio = torch.exp(cur.seq - old.seq)
    loss = ppo_clip(ratio, adv, cfg.clip_low, cfg.clip_high)
    kl = torch.zeros_like(loss)
    if ref is not None:  # ESPO compute_approx_kl: on the raw sequence ELBO, then divided by the length
        n = cur.count.float()
        kl = kl_penalty(n * (cur.seq - ref.seq), cfg.kl) / n
    return loss + cfg.kl_coef * kl, ratio, kl


def loss_bgpo(cur, old, ref, adv, cfg):
    d = cur.draw - old.draw  # [B, D] per-draw change of the length-normalised ELBO
    a = adv[:, None]
    # BGPO's linear bound: 1 + d (exp(x) >= 1 + x) for A > 0, exp(d) (Jensen) for A <= 0
    ratio = torch.where(a > 0, 1 + d, torch.exp(d))
    loss = ppo_clip(ratio, a, cfg.clip_low, cfg.clip_high, cfg.dual_clip).mean(1)
    kl = _kl_seq(cur, ref, cfg)
    return loss + cfg.kl_coef * kl, ratio.flatten(), kl


def loss_gdpo(cur, old, ref, adv, cfg):  # GSPO-shaped sequence ratio on the SDMC ELBO (NeMo-RL port)
    ratio = torch.exp(cur.seq - old.seq)
    kl = _kl_seq(cur, ref, cfg)
    return ppo_clip(ratio, adv, cfg.clip_low, cfg.clip_high) + cfg.kl_coef * kl, ratio, kl


LOSSES = {"d3llm_v2": loss_d3llm_v2, "d1": loss_d1, "espo": loss_espo, "bgpo": loss_bgpo,
          "gdpo": loss_gdpo, "grpo": loss_grpo}
AGG = {"d1": "token", "grpo": "token"}  # the rest: "seq"


# ----------------------------------------------------------------------------- the update
def _plan(B: int, cfg: RLConfig, step: int, rank: int, world: int, lengths=None) -> list:
    """Per epoch: minibatches as (all their indices, this rank's micro-batch index lists); the
    shuffle is seeded and the same on every rank, each rank takes every world-th row. With
    `lengths`, each minibatch is ordered by length before it is cut into micro-batches: the update
    (a sum over the minibatch) is the same, the padding much smaller."""
    if world > 1 and (B % world or cfg.minibatch % world):
        raise ValueError(f"{B} step samples / rl.minibatch = {cfg.minibatch} must be divisible by the "
                         f"world size {world} (every rank runs the same number of micro-batches)")
    plan = []
    for j in range(cfg.epochs):
        perm = torch.randperm(B, generator=_gen((cfg.seed, step, j, "order"))).tolist()
        mbs = [perm[s: s + cfg.minibatch] for s in range(0, B, cfg.minibatch)]
        if lengths is not None:
            mbs = [sorted(mb, key=lambda i: (-int(lengths[i]), i)) for mb in mbs]
        mine = [mb[rank::world] for mb in mbs]
        plan.append([(mb, [m[s: s + cfg.micro_batch] for s in range(0, len(m), cfg.micro_batch)])
                     for mb, m in zip(mbs, mine)])
    return plan


def _rollout_old(batch: Batch, old_logp: list) -> Est:
    """Rollout token log-probs (AR, same policy at temperature 1) as an Est over the whole batch."""
    tok = torch.zeros(batch.ids.shape, device=batch.ids.device)
    for i, lp in enumerate(old_logp):
        P, L = int(batch.prompt_len[i]), int(batch.resp_len[i])
        if len(lp) != L:
            raise ValueError(f"old_logp[{i}] has {len(lp)} entries for a response of {L} tokens")
        tok[i, P: P + L] = torch.as_tensor(lp, dtype=torch.float32, device=tok.device)
    draw = (tok.sum(1) / batch.resp_len)[:, None]
    return Est(tok, draw, torch.zeros_like(draw[:, 0]), batch.resp)


def credited(samples: list, score: str = "all") -> list:
    """Per sample, how many leading response tokens move to the prompt before estimating: 0 for score
    "all"; for "action" the think text before the <action> tag (sample.think_len), which then is clean
    context like the prompt, so the estimate is of log p(action | prompt, think). A response without
    the tag stays whole."""
    if score == "all":
        return [0] * len(samples)
    if score != "action":
        raise ValueError(f"rl.score = {score!r}: must be all | action")
    return [s.think_len if 0 < s.think_len < len(s.response_ids) else 0 for s in samples]


def rl_step(model, optimizer, samples: list, cfg: RLConfig, *, ref_model=None, old_logp: Optional[list] = None,
            rollout_metrics: Optional[dict] = None, step: int = 0, grad_clip: float = 1.0,
            rank: int = 0, world: int = 1, clip_fn: Optional[Callable] = None) -> dict:
    """One RL update on collected step samples (objects with prompt_ids, response_ids, valid, reward,
    group_id, episode_id, step). `step` (the trainer's RL step) enters the mask seeds. `old_logp`:
    per-sample rollout token log-probs (AR only); else the old policy is re-estimated without grad
    under the same draws before any update. Data parallel: `samples` is the global batch, the same
    on every rank; rank r trains every world-th row of each minibatch with the global normaliser,
    so gradients summed over ranks equal one process (dist.py reduces with SUM). `clip_fn(params,
    max_norm) -> float` clips (dist.clip_grad_norm under FSDP). Run it under torch.autocast for
    bf16; scores are fp32. Ratio/entropy metrics are this rank's, reward metrics global."""
    if not samples:
        raise ValueError("rl_step: no step samples")
    if cfg.algo not in LOSSES:
        raise ValueError(f"rl.algo = {cfg.algo!r}: must be one of {list(LOSSES)}")
    if cfg.kl != "none" and ref_model is None:
        raise ValueError(f"rl.kl = {cfg.kl!r} needs ref_model (or set rl.kl = none)")
    clip_fn = clip_fn or (lambda ps, mx: float(torch.nn.utils.clip_grad_norm_(ps, mx)))
    T, t0 = {}, time.perf_counter()
    dev = next(model.parameters()).device
    raw, r, adv, extra = sample_advantages(samples, cfg)
    valid = [bool(s.valid) for s in samples]
    adv = adv.to(dev)
    moved = credited(samples, cfg.score)
    batch = batch_tokens([list(s.prompt_ids) + list(s.response_ids[:c]) for s, c in zip(samples, moved)],
                         [list(s.response_ids[c:]) for s, c in zip(samples, moved)], model.cfg.pad_id, dev)
    est, scheme, D = resolve_estimator(cfg, model.cfg.family)
    if old_logp is not None and est != "ar":
        raise ValueError(f"old_logp from the rollout is only usable with the ar estimator, not {est!r}")
    keys = [(cfg.seed, step, s.episode_id, s.step) for s in samples]
    plan = _plan(len(samples), cfg, step, rank, world, batch.lengths.tolist())
    if scheme == "trace":  # the same, deterministic copies in every epoch
        if any(moved):
            raise ValueError("rl.estimator = 'sdar_trace' scores the whole decoded response: set rl.score = all")
        draws = [trace_masks(batch, [s.trace for s in samples], model.cfg.block_size, cfg.trace_shrink)] * cfg.epochs
        D = draws[0].masked.shape[1]
    else:
        draws = [draw_masks(batch, scheme, D, [k + (j,) for k in keys], cfg.p_mask_prompt)
                 for j in range(cfg.epochs)]
    parts = [(j, mi) for j, mbs in enumerate(plan) for _, micros in mbs for mi in micros]

    def micro(j, mi):
        b = batch.select(mi)
        return b, draws[j].select(mi, b.ids.shape[1])

    T["prep"] = time.perf_counter() - t0
    fwd = defaultdict(int)
    old, ref = {}, {}
    for name, net, store in (("old", model, old), ("ref", ref_model, ref)):
        t = time.perf_counter()
        if net is None or (name == "old" and old_logp is not None):
            continue
        with torch.no_grad():
            for k, (j, mi) in enumerate(parts):
                b, dr = micro(j, mi)
                store[k] = seq_logp(net, b, est, dr, entropy=False)
                fwd[name] += dr.masked.shape[0] * dr.masked.shape[1]
        T[name] = time.perf_counter() - t
    if old_logp is not None:
        full = _rollout_old(batch, [lp[c:] for lp, c in zip(old_logp, moved)])
        old = {k: full.select(mi, batch.select(mi).ids.shape[1]) for k, (j, mi) in enumerate(parts)}

    t = time.perf_counter()
    agg = AGG.get(cfg.algo, "seq")
    params = [p for p in model.parameters() if p.requires_grad]
    log = defaultdict(list)
    k, noise0 = 0, 0.0
    for j, mbs in enumerate(plan):
        for n_mb, (mb, micros) in enumerate(mbs):
            optimizer.zero_grad(set_to_none=True)
            denom = float(batch.resp_len[mb].sum()) if agg == "token" else float(len(mb))  # global
            for mi in micros:
                b, dr = micro(j, mi)
                cur = seq_logp(model, b, est, dr, entropy="grad" if cfg.entropy_coef > 0 else True)
                fwd["update"] += dr.masked.shape[0] * dr.masked.shape[1]
                o, rf = old[k], ref.get(k)
                per, ratio, kl = LOSSES[cfg.algo](cur, o, rf, adv[torch.as_tensor(mi, device=dev)], cfg)
                (per.sum() / denom).backward()
                if j == 0 and n_mb == 0:  # zero update: re-estimates under shared draws must agree
                    noise0 = max(noise0, float((cur.draw.detach() - o.draw).abs().max()),
                                 float((cur.tok.detach() - o.tok).abs().max()))
                for key, v in (("ratio", ratio), ("kl", kl), ("entropy", cur.ent), ("logp", cur.seq)):
                    log[key].append(v.detach().float().cpu())
                log["loss"].append(float(per.detach().sum()) / denom)
                k += 1
            log["grad_norm"].append(clip_fn(params, grad_clip if grad_clip else float("inf")))
            optimizer.step()
    T["update"] = time.perf_counter() - t
    return _metrics(samples, raw, r, valid, adv, extra, batch, log, noise0, old, D, cfg, T, fwd, rollout_metrics)


def _metrics(samples, raw, r, valid, adv, extra, batch, log, noise0, old, D, cfg, T, fwd, rollout) -> dict:
    """The §7.4 diagnostic set as plain floats."""
    ratio = torch.cat(log["ratio"]).double()
    q = torch.quantile(ratio, torch.tensor([0.01, 0.5, 0.99], dtype=torch.float64)).tolist()
    # success: the episode reached full reward (or the sample says it was won)
    episodes = {s.episode_id: bool(getattr(s, "won", x >= 1.0)) for s, x in zip(samples, raw)}
    draws = torch.cat([e.draw for e in old.values()]) if old else None
    m = {
        "reward/mean": float(torch.tensor(raw).mean()), "reward/std": float(torch.tensor(raw).std(unbiased=False)),
        "reward/shaped_mean": float(r.mean()), "success": sum(episodes.values()) / len(episodes),
        "valid_ratio": sum(valid) / len(valid), **extra,
        "adv/mean": float(adv.mean()), "adv/abs_max": float(adv.abs().max()),
        "clip/low": float((ratio < 1 - cfg.clip_low).double().mean()),
        "clip/high": float((ratio > 1 + cfg.clip_high).double().mean()),
        "ratio/p1": q[0], "ratio/p50": q[1], "ratio/p99": q[2], "ratio/max": float(ratio.max()),
        "noise0": noise0,  # max |log ratio| at the first inner step (0 up to float error)
        "est/draw_std": float(draws.std(1).mean())  # (trace copies are parts of one exact sum, not draws)
        if draws is not None and draws.shape[1] > 1 and cfg.estimator != "sdar_trace" else 0.0,
        "logp_per_token": float(torch.cat(log["logp"]).mean()),
        "entropy": float(torch.cat(log["entropy"]).mean()), "loss": sum(log["loss"]) / len(log["grad_norm"]),
        "grad_norm": sum(log["grad_norm"]) / len(log["grad_norm"]), "grad_norm_max": max(log["grad_norm"]),
        "resp_len": float(batch.resp_len.float().mean()), "updates": len(log["grad_norm"]), "mc_draws": D,
    }
    if cfg.kl != "none":
        m[f"kl_{cfg.kl}_ref"] = float(torch.cat(log["kl"]).mean())
    m.update({f"time/{k}": v for k, v in T.items()})
    m.update({f"fwd_rows/{k}": v for k, v in fwd.items()})
    m.update({f"rollout/{k}": v for k, v in (rollout or {}).items()})
    return m
