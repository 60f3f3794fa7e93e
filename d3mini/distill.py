"""Online self-distillation from decode traces: the d3LLM pseudo-trajectory recipe, on-policy
(reference/metrics.md §3; DESIGN.md §4.7).

Targets are the policy's own decoded responses (StepSamples from rollouts); the decode trace
(per token: the denoising forward that committed it) says which tokens were still masked at each
forward. Per trained block, with m = its response tokens and r ~ U[r_floor(t), r_max]:

    n_mask = m - floor((1 - r) m)  (>= 1)   the tokens committed *latest* are masked, i.e. the
                                            block as the decoder saw it about r of the way back
    complement                              the block's other response tokens, masked instead
    r_floor(t) = t * r_max                  easy -> hard over the stage (progress t in [0, 1])

`score: think` trains the think text only: the tokens from the <action> tag on are masked in both copies
and never scored (the decoder's hesitation left after distillation sat in the action; bench/forced_picks.py).

Ties (tokens committed by the same forward) are ordered by `tie_break`: "confidence" masks the
lower commit confidence first (the decoder would have committed it later), then the later
position; "random" orders them uniformly at random.

SDAR: blocks are aligned at absolute position 0 of prompt + response, so the first response
block may hold prompt tokens, which are never masked. Every response block trains in one
forward over [noisy | complement | clean] (models.md §2.7 extended by a second noisy copy that
attends like the first and never sees it), and each block draws its own r: a noisy block only
sees clean earlier blocks, so "earlier clean, later masked" holds for every block at once.
LLaDA (full attention): one block per sample (blocks aligned at the response start, size from
the `block_sizes` curriculum), earlier blocks clean, that block masked by trace order, later
blocks fully masked and not scored (metrics.md §3.2); noisy and complement are two batch rows.

Loss (metrics.md §3.4): (CE + CE_comp + lambda * H) / 4 with CE, CE_comp plain means over the
masked positions of each copy (no 1/p weighting: the ratio is chosen, not a diffusion time) and
H the entropy of softmax(logits / entropy_temp) averaged over the noisy copy's masked positions
whose argmax equals the target. With a teacher (distill.teacher_weight > 0: the policy frozen as
the stage began) one more term, teacher_weight * KL(teacher || policy) / 4, averaged over the
masked tokens of both copies (the action's, or with teacher_on "response" all of them), holds the
policy's odds where the teacher had them while the CE and entropy terms sharpen it. With
distill.teacher_gate the CE and entropy terms sharpen only the tokens the teacher is already sure
of (top probability >= the gate); the KL then covers the rest.

Whose responses are the targets (distill.rollouts): the policy's own ("policy"), the frozen teacher's
("teacher"), or "relabel": the policy rolls out and the teacher answers the same prompts; a step keeps the
policy's response where the teacher's action is the same and takes the teacher's (with its decode trace)
where it differs. The policy's states and phrasing, the teacher's decisions (DAgger's relabelling): a
decision the sharpening moves is taken back on the states the policy reaches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from d3mini.config import DistillConfig
from d3mini.model import bd_training_mask, padding_mask


# ----------------------------------------------------------------------------- curricula
def r_floor(progress: float, r_max: float) -> float:
    """d3LLM's progressive noise schedule: the ratio floor rises linearly from 0 to r_max."""
    return min(max(float(progress), 0.0), 1.0) * r_max


def block_size_at(progress: float, sizes: list, default: int) -> int:
    """d3LLM's progressive window: `sizes` indexed by epoch (the stage split into len(sizes)
    equal parts), linearly interpolated towards the next entry within a part."""
    if not sizes:
        return default
    x = min(max(float(progress), 0.0), 1.0) * len(sizes)
    e = min(int(x), len(sizes) - 1)
    nxt = sizes[min(e + 1, len(sizes) - 1)]
    return int(sizes[e] + (x - e) * (nxt - sizes[e]))


def n_masked(r: float, m: int) -> int:
    """Masked tokens of a block with m tokens at ratio r: m - floor((1 - r) m), at least 1 (§3.2.4)."""
    return min(m, max(1, m - math.floor((1.0 - r) * m + 1e-9)))


def select_samples(samples: list, cfg: DistillConfig) -> list:
    """Samples usable as targets: from won episodes when the config asks; with rollouts "relabel", the
    teacher's response (StepSample.relabel) wherever its action differs from the policy's; then decoded
    (a trace; expert samples have none) and valid when the config asks."""
    out = [s for s in samples if getattr(s, "won", False)] if cfg.only_success else list(samples)
    if cfg.rollouts == "relabel":
        out = [s.relabel if s.relabel is not None and s.relabel.action != s.action else s for s in out]
    out = [s for s in out if s.trace is not None and len(s.trace) == len(s.response_ids) > 0]
    if cfg.only_valid:
        out = [s for s in out if s.valid]
    return out


def cap_samples(kept: list, own: set, cfg: DistillConfig, cap: int, gen=None) -> list:
    """At most `cap` of the selected samples, drawn at random; with rollouts "relabel" and relabel_first,
    the teacher's corrections (kept samples whose id is not in `own`, the policy's samples) go in first."""
    if len(kept) <= cap:
        return kept
    pick = torch.randperm(len(kept), generator=gen).tolist()
    if cfg.rollouts == "relabel" and cfg.relabel_first:
        pick = [i for i in pick if id(kept[i]) not in own] + [i for i in pick if id(kept[i]) in own]
    return [kept[i] for i in pick[:cap]]


def mask_order(trace: list, confidence: Optional[list], tie_break: str, gen=None) -> list:
    """Response indices, latest-committed first: the order in which tokens get masked."""
    R = len(trace)
    if tie_break == "confidence":
        conf = confidence if confidence is not None else [0.0] * R
        key = [(-trace[i], conf[i], -i) for i in range(R)]
    elif tie_break == "random":
        u = torch.rand(R, generator=gen).tolist()
        key = [(-trace[i], u[i]) for i in range(R)]
    else:
        raise ValueError(f"distill.tie_break = {tie_break!r}: must be confidence | random")
    return sorted(range(R), key=key.__getitem__)


# ----------------------------------------------------------------------------- batch
@dataclass
class DistillBatch:
    ids: torch.Tensor      # [B, n] clean prompt + response, right-padded (pad only read via lengths)
    lengths: torch.Tensor  # [B] prompt + response tokens
    masked: torch.Tensor   # [B, n] bool: masked and scored in the noisy copy
    comp: torch.Tensor     # [B, n] bool: masked and scored in the complementary copy
    hidden: torch.Tensor   # [B, n] bool: masked in both copies, never scored (LLaDA: later blocks)
    prompt_len: torch.Tensor  # [B]
    block_size: int        # K used to build the masks
    action: Optional[torch.Tensor] = None  # [B, n] bool: response tokens from the <action> tag on

    @property
    def start(self) -> int:  # shortest prompt: no copy scores a position before it
        return int(self.prompt_len.min())

    def select(self, idx: list) -> "DistillBatch":
        n = int(self.lengths[idx].max())
        cut = [t[idx, :n] for t in (self.ids, self.masked, self.comp, self.hidden)]
        act = self.action[idx, :n] if self.action is not None else None
        return DistillBatch(cut[0], self.lengths[idx], *cut[1:], self.prompt_len[idx], self.block_size, act)


def build_batch(samples: list, family: str, K: int, r_lo: float, r_hi: float, tie_break: str,
                pad_id: int, gen=None, device=None, score: str = "all") -> DistillBatch:
    """Masks from the decode traces (module docstring); r ~ U[r_lo, r_hi] per SDAR block / LLaDA sample.
    score "think": response tokens from each sample's think_len on (the action) are drawn like the others
    but then masked in both copies and never scored."""
    if family not in ("sdar", "llada"):
        raise ValueError(f"distill: family {family!r} decodes one token per forward; needs sdar or llada")
    P = [len(s.prompt_ids) for s in samples]
    n = max(p + len(s.response_ids) for p, s in zip(P, samples))
    B = len(samples)
    ids = torch.full((B, n), pad_id, dtype=torch.long)
    masked, comp, hidden, action = (torch.zeros(B, n, dtype=torch.bool) for _ in range(4))

    def uni() -> float:
        return r_lo + (r_hi - r_lo) * float(torch.rand(1, generator=gen))

    for i, s in enumerate(samples):
        p, R = P[i], len(s.response_ids)
        ids[i, :p + R] = torch.tensor(list(s.prompt_ids) + list(s.response_ids))
        order = mask_order(list(s.trace), s.confidence, tie_break, gen)
        if family == "sdar":  # every response block, aligned at absolute 0: (first pos, end) in response idx
            spans = [(max(b * K - p, 0), min((b + 1) * K - p, R)) for b in range(p // K, (p + R - 1) // K + 1)]
        else:
            nb = -(-R // K)
            b = int(torch.randint(nb, (1,), generator=gen))
            spans = [(b * K, min((b + 1) * K, R))]
            hidden[i, p + spans[0][1]:p + R] = True
        for lo, hi in spans:
            ranked = [j for j in order if lo <= j < hi]  # this block, latest-committed first
            k = n_masked(uni(), hi - lo)
            masked[i, [p + j for j in ranked[:k]]] = True
            comp[i, [p + j for j in ranked[k:]]] = True
        cut = p + min(s.think_len, R)
        action[i, cut:p + R] = True
        if score == "think":
            hidden[i, cut:p + R] = True
            masked[i, cut:], comp[i, cut:] = False, False
        elif score != "all":
            raise ValueError(f"distill.score = {score!r}: must be all | think")
    dev = device or "cpu"
    return DistillBatch(ids.to(dev), torch.tensor([p + len(s.response_ids) for p, s in zip(P, samples)], device=dev),
                        masked.to(dev), comp.to(dev), hidden.to(dev), torch.tensor(P, device=dev), K, action.to(dev))


# ----------------------------------------------------------------------------- loss
def distill_logits(model, b: DistillBatch, complementary: bool = True):
    """Logits at positions start..n-1 of the noisy and complementary copies: ([B, n - start, V], same or None)."""
    cfg, (B, n), c = model.cfg, b.ids.shape, 2 if complementary else 1
    noisy = torch.where(b.masked | b.hidden, cfg.mask_id, b.ids)
    cmp = torch.where(b.comp | b.hidden, cfg.mask_id, b.ids)
    pos = torch.arange(n, device=b.ids.device)
    if cfg.family == "sdar":
        ns = (b.start // b.block_size) * b.block_size  # noisy copies of prompt-only blocks are never attended to
        m = n - ns
        x = torch.cat([noisy[:, ns:]] + ([cmp[:, ns:]] if complementary else []) + [b.ids], 1)  # [B, c m + n]
        rows = torch.cat([torch.arange(j * m + b.start - ns, (j + 1) * m, device=pos.device) for j in range(c)])
        attn = bd_training_mask(b.lengths, n, b.block_size, ns, copies=c)  # copies never see each other
        lg = model(x, torch.cat([pos[ns:]] * c + [pos]), attn=attn,
                   logits_rows=rows)  # [B, c (n - start), V]
        parts = lg.split(n - b.start, dim=1)
    elif cfg.family == "llada":
        x = torch.cat([noisy] + ([cmp] if complementary else []), 0)  # [c B, n]
        lg = model(x, pos, attn=padding_mask("llada", b.block_size, b.lengths.repeat(c), n),
                   logits_rows=slice(b.start, n))
        parts = lg.split(B, dim=0)
    else:
        raise ValueError(f"distill: family {cfg.family!r} has no diffusion mask to distil")
    return parts[0], parts[1] if complementary else None


def distill_terms(lg, lgc, target, masked, comp, cfg: DistillConfig, n_mask: Optional[float] = None,
                  n_comp: Optional[float] = None) -> tuple:
    """Loss from logits [B, L, V] (lgc: complement or None) against target / masks [B, L].
    n_mask / n_comp: global normalisers over all micro-batches (default: this batch's counts); H is
    this batch's mean over correct positions, weighted by its share of the masked tokens."""
    lsm = lg.float().log_softmax(-1)
    nm, nc = float(masked.sum()), float(comp.sum())
    n_mask, n_comp = n_mask or max(nm, 1.0), n_comp or max(nc, 1.0)
    ce = -(lsm.gather(-1, target[..., None])[..., 0] * masked).sum() / n_mask
    ce_c = lg.new_zeros((), dtype=torch.float32)
    if lgc is not None:
        ce_c = -(lgc.float().log_softmax(-1).gather(-1, target[..., None])[..., 0] * comp).sum() / n_comp
    with torch.no_grad():
        top_lp, top = lsm.max(-1)
        right = masked & (top == target)
        sure = right & (top_lp.exp() > cfg.threshold)
    lt = (lg.float() / cfg.entropy_temp).log_softmax(-1)
    ent = -(lt.exp() * lt).sum(-1)  # [B, L]
    h = (ent * right).sum() / max(float(right.sum()), 1.0) * (nm / n_mask)
    loss = (ce + ce_c + cfg.entropy_coef * h) / 4
    st = {"masked": nm, "comp": nc, "correct": float(right.sum()), "confident": float(sure.sum()),
          "ce": float(ce.detach()), "ce_comp": float(ce_c.detach()), "entropy": float(h.detach())}
    return loss, st


def teacher_positions(b: DistillBatch, complementary: bool = True, on: str = "action") -> tuple:
    """Where the teacher term applies, masked in the noisy / complementary copy ([B, n] each): the action
    tokens (on "action") or every response token (on "response")."""
    if on == "response":
        pos = torch.arange(b.ids.shape[1], device=b.ids.device)
        sel = (pos >= b.prompt_len[:, None]) & (pos < b.lengths[:, None])
    elif on == "action":
        sel = b.action if b.action is not None else torch.zeros_like(b.masked)
    else:
        raise ValueError(f"distill.teacher_on = {on!r}: must be action | response")
    return sel & (b.masked | b.hidden), (sel & (b.comp | b.hidden)) if complementary else None


def kl_sum(teacher_lg, lg, where) -> torch.Tensor:
    """Sum over `where` of KL(softmax(teacher_lg) || softmax(lg)) (logits [B, L, V], where [B, L])."""
    lt, ls = teacher_lg.float().log_softmax(-1), lg.float().log_softmax(-1)
    return ((lt.exp() * (lt - ls)).sum(-1) * where).sum()


def distill_loss(model, b: DistillBatch, cfg: DistillConfig, n_mask=None, n_comp=None, teacher=None,
                 n_teacher=None) -> tuple:
    """Pure loss of one batch (wrap it with autocast / FSDP as needed): (loss, stats).
    teacher: a frozen model, used when distill.teacher_weight or teacher_gate is set.
    - teacher_gate g: a scored position where the teacher's top probability is below g is not sharpened
      (left out of CE, CE_comp and H): a token whose value hangs on a choice not yet made (a decision word,
      or a word after a still-masked one) keeps the teacher's odds instead of being pushed to commit early.
      gate_on "action" gates only the action's tokens: the think text is sharpened whole.
    - teacher_weight: adds teacher_weight * KL(teacher || model) / 4 over the masked tokens that teacher_on
      names (the action's or the whole response's; with a gate, less the tokens it lets the CE sharpen),
      summed and divided by the count of all of them (n_teacher: the global count), so micro-batches add up."""
    lg, lgc = distill_logits(model, b, cfg.complementary)
    s = b.start
    masked, comp = b.masked[:, s:], b.comp[:, s:]
    # a gated token counts in the CE means (as zero): the normalisers are the ungated counts
    n_mask, n_comp = n_mask or max(float(masked.sum()), 1.0), n_comp or max(float(comp.sum()), 1.0)
    extra, st_t = None, {}
    if teacher is not None and (cfg.teacher_weight > 0 or cfg.teacher_gate > 0):
        with torch.no_grad():
            tlg, tlgc = distill_logits(teacher, b, cfg.complementary)
        if cfg.teacher_gate > 0:
            free = None  # positions the gate leaves alone (gate_on "action": the think text)
            if cfg.gate_on == "action":
                free = ~b.action[:, s:] if b.action is not None else torch.ones_like(masked)
            elif cfg.gate_on != "all":
                raise ValueError(f"distill.gate_on = {cfg.gate_on!r}: must be all | action")
            sure = tlg.float().softmax(-1).amax(-1) >= cfg.teacher_gate
            sure = sure if free is None else sure | free
            st_t["teacher_unsure"] = float((masked & ~sure).sum())
            masked = masked & sure
            if lgc is not None:
                sure_c = tlgc.float().softmax(-1).amax(-1) >= cfg.teacher_gate
                sure_c = sure_c if free is None else sure_c | free
                st_t["teacher_unsure"] += float((comp & ~sure_c).sum())
                comp = comp & sure_c
        if cfg.teacher_weight > 0:
            wn, wc = teacher_positions(b, cfg.complementary, cfg.teacher_on)
            count = float(wn.sum()) + (float(wc.sum()) if wc is not None else 0.0)
            wn, wc = wn[:, s:], wc[:, s:] if wc is not None else None
            if cfg.teacher_gate > 0:  # the sharpened tokens answer to the CE alone
                wn, wc = wn & ~masked, wc & ~comp if wc is not None else None
            kl = kl_sum(tlg, lg, wn) + (kl_sum(tlgc, lgc, wc) if lgc is not None else 0.0)
            kl = kl / (n_teacher or max(count, 1.0))
            extra = cfg.teacher_weight * kl / 4
            st_t.update({"teacher_kl": float(kl.detach()), "teacher_tokens": count})
    loss, st = distill_terms(lg, lgc, b.ids[:, s:], masked, comp, cfg, n_mask, n_comp)
    if extra is not None:
        loss = loss + extra
    return loss, {**st, **st_t}


# ----------------------------------------------------------------------------- step
def distill_step(model, optimizer, samples: list, cfg: DistillConfig, progress: float, gen=None, *,
                 grad_clip: float = 1.0, clip_fn: Optional[Callable] = None, world: int = 1,
                 regularizer: Optional[Callable] = None, teacher=None) -> dict:
    """One optimizer update on (at most batch_size / world of) the usable samples, micro-batched with
    global normalisers. With data parallel each rank passes its own slice and the loss is divided by
    `world`, so summed gradients are the mean over ranks. Without usable samples nothing is updated.
    regularizer: () -> loss, this rank's share of an extra term (e.g. the SFT loss on expert samples,
    distill.expert_batch), weighted already; its gradient joins the update before clipping.
    teacher: the frozen model of distill.teacher_weight (distill_loss)."""
    gen = gen if gen is not None else torch.Generator().manual_seed(0)
    kept = select_samples(samples, cfg)
    lo = r_floor(progress, cfg.r_max)
    m = {"progress": float(progress), "r_floor": lo, "samples_in": len(samples), "samples_kept": len(kept)}
    own = {id(s) for s in samples}  # a kept sample not among them is the teacher's response (relabel)
    if cfg.rollouts == "relabel":
        m["relabeled"] = float(sum(id(s) not in own for s in kept))
    if not kept:
        return {**m, "skipped": 1.0}
    kept = cap_samples(kept, own, cfg, max(cfg.batch_size // world, 1), gen)
    mc = model.cfg
    K = mc.block_size if mc.family == "sdar" else block_size_at(progress, cfg.block_sizes, mc.block_size)
    dev = next(model.parameters()).device
    b = build_batch(kept, mc.family, K, lo, cfg.r_max, cfg.tie_break, mc.pad_id, gen, dev, cfg.score)
    n_mask, n_comp = max(float(b.masked.sum()), 1.0), max(float(b.comp.sum()), 1.0)
    n_teacher = None
    if teacher is not None and cfg.teacher_weight > 0:
        n_teacher = max(sum(float(w.sum()) for w in teacher_positions(b, cfg.complementary, cfg.teacher_on)
                            if w is not None), 1.0)
    params = [p for p in model.parameters() if p.requires_grad]  # LoRA: only the adapters
    optimizer.zero_grad(set_to_none=True)
    tot: dict = {}
    loss_sum = 0.0
    for s in range(0, len(kept), cfg.micro_batch):
        loss, st = distill_loss(model, b.select(list(range(s, min(s + cfg.micro_batch, len(kept))))), cfg,
                                n_mask, n_comp, teacher, n_teacher)
        (loss / world).backward()
        loss_sum += float(loss.detach())
        for k, v in st.items():
            tot[k] = tot.get(k, 0.0) + v
    reg = None
    if regularizer is not None:
        reg = regularizer()
        reg.backward()
    clip_fn = clip_fn or (lambda ps, mx: float(torch.nn.utils.clip_grad_norm_(ps, mx)))
    gnorm = clip_fn(params, grad_clip if grad_clip else float("inf"))
    optimizer.step()
    elig = float((b.masked | b.comp).sum())
    m.update({"skipped": 0.0, "loss": loss_sum, "ce": tot["ce"], "ce_comp": tot["ce_comp"], "entropy": tot["entropy"],
              "acc_masked": tot["correct"] / max(tot["masked"], 1.0),
              "frac_confident": tot["confident"] / max(tot["masked"], 1.0),  # argmax right and p > threshold
              "mask_ratio": tot["masked"] / max(elig, 1.0), "masked_tokens": tot["masked"],
              "block_size": K, "samples_used": len(kept), "grad_norm": gnorm,
              "resp_len": sum(len(s.response_ids) for s in kept) / len(kept)})
    m.update({k: tot[k] for k in ("teacher_kl", "teacher_tokens", "teacher_unsure") if k in tot})
    if reg is not None:
        m["expert_loss"] = float(reg.detach())
    return m
