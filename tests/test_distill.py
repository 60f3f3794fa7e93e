"""Online self-distillation: curricula, trace-ordered masks, complement, prompt safety, the loss
against hand-computed values and against independent per-block reference forwards."""
import copy
import dataclasses
import math
import random

import pytest
import torch

from d3mini.config import DistillConfig, LoRAConfig, ModelConfig
from d3mini.distill import (block_size_at, build_batch, cap_samples, distill_logits, distill_loss, distill_step,
                            distill_terms, kl_sum, mask_order, n_masked, r_floor, select_samples)
from d3mini.lora import apply_lora
from d3mini.model import DiffusionLM
from d3mini.rollout import StepSample

torch.set_num_threads(1)
MASK, EOS, PAD = 3, 2, 0


def tiny(family="sdar", K=4, seed=0):
    torch.manual_seed(seed)
    mc = ModelConfig(family=family, vocab_size=24, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2,
                     num_kv_heads=1, head_dim=16, block_size=K, mask_id=MASK, eos_ids=[EOS], pad_id=PAD, init_std=0.3)
    return DiffusionLM.from_config(mc)


def sample(prompt, resp, trace, conf=None, valid=True, won=True, ep=0):
    return StepSample(prompt_ids=prompt, response_ids=resp, trace=trace, confidence=conf, action="a", valid=valid,
                      reward=10.0 * won, group_id=0, episode_id=ep, step=0, won=won)


def random_sample(rng, ep=0):
    """A decode-like sample: non-decreasing trace, several tokens per forward, random confidences."""
    P, R = rng.randint(1, 9), rng.randint(1, 14)
    trace, t = [], 0
    for _ in range(R):
        t += rng.random() < 0.5
        trace.append(t)
    return sample([rng.randint(4, 23) for _ in range(P)], [rng.randint(4, 23) for _ in range(R - 1)] + [EOS],
                  trace, [round(rng.random(), 2) for _ in range(R)], ep=ep)


# ----------------------------------------------------------------------------- curricula
def test_curriculum_schedule():
    assert [r_floor(t, 0.8) for t in (0.0, 0.25, 0.5, 1.0)] == pytest.approx([0.0, 0.2, 0.4, 0.8])
    assert r_floor(-1.0, 0.8) == 0.0 and r_floor(2.0, 0.8) == pytest.approx(0.8)
    # d3LLM LLaDA window schedule over 6 "epochs", interpolated inside each
    sizes = [16, 16, 24, 24, 32, 32]
    assert block_size_at(0.0, sizes, 8) == 16 and block_size_at(1.0, sizes, 8) == 32
    assert block_size_at(2.5 / 6, sizes, 8) == 24 and block_size_at(1.5 / 6, sizes, 8) == 20
    assert block_size_at(0.7, [], 8) == 8
    # masked tokens per block: m - floor((1 - r) m), >= 1 (metrics.md §3.8 table for BL = 4)
    assert [n_masked(r, 4) for r in (0.01, 0.25, 0.3, 0.5, 0.6, 0.75, 0.8)] == [1, 1, 2, 2, 3, 3, 4]
    assert n_masked(0.0, 4) == 1 and n_masked(0.8, 8) == 7 and n_masked(0.9, 10) == 9


def test_ratio_draws_follow_the_floor():
    rng = random.Random(0)
    samples = [random_sample(rng, i) for i in range(40)]
    for t in (0.0, 0.5, 1.0):
        lo = r_floor(t, 0.8)
        b = build_batch(samples, "sdar", 4, lo, 0.8, "confidence", PAD, torch.Generator().manual_seed(1))
        for i, s in enumerate(samples):
            P = len(s.prompt_ids)
            for blk in range(P // 4, (P + len(s.response_ids) - 1) // 4 + 1):
                cols = slice(blk * 4, (blk + 1) * 4)
                m = int((b.masked[i, cols] | b.comp[i, cols]).sum())
                k = int(b.masked[i, cols].sum())
                assert n_masked(lo, m) <= k <= n_masked(0.8, m)


# ----------------------------------------------------------------------------- masks
def test_masks_follow_the_trace_by_hand():
    # prompt of 5, K = 4: block 1 = [prompt 4 | r0 r1 r2], block 2 = [r3 r4 r5 r6]; r = 0.5 fixed
    s = sample([5, 6, 7, 8, 9], [10, 11, 12, 13, 14, 15, EOS], [0, 1, 1, 2, 3, 3, 3], [.9, .5, .7, .9, .4, .6, .99])
    b = build_batch([s], "sdar", 4, 0.5, 0.5, "confidence", PAD)
    # block 1: 3 tokens -> 2 masked: r1, r2 (trace 1; r1 less confident); block 2: r4, r5 (trace 3, lowest p)
    assert b.masked[0].nonzero().flatten().tolist() == [6, 7, 9, 10]
    assert b.comp[0].nonzero().flatten().tolist() == [5, 8, 11]
    assert mask_order(s.trace, s.confidence, "confidence") == [4, 5, 6, 3, 1, 2, 0]
    b = build_batch([s], "sdar", 4, 0.8, 0.8, "confidence", PAD)  # 3 of 3 and 4 - floor(0.8) = 4 of 4
    assert b.masked[0].nonzero().flatten().tolist() == [5, 6, 7, 8, 9, 10, 11] and not b.comp.any()


@pytest.mark.parametrize("tie_break", ["confidence", "random"])
def test_later_commits_masked_first(tie_break):
    rng = random.Random(1)
    samples = [random_sample(rng, i) for i in range(60)]
    b = build_batch(samples, "sdar", 4, 0.0, 0.8, tie_break, PAD, torch.Generator().manual_seed(2))
    for i, s in enumerate(samples):
        P = len(s.prompt_ids)
        for blk in range(P // 4, (P + len(s.response_ids) - 1) // 4 + 1):
            js = [j for j in range(len(s.trace)) if blk * 4 <= P + j < blk * 4 + 4]
            hid = [j for j in js if b.masked[i, P + j]]
            shown = [j for j in js if b.comp[i, P + j]]
            assert hid and sorted(hid + shown) == js  # >= 1 masked; masked + complement = the block
            assert min(s.trace[j] for j in hid) >= max((s.trace[j] for j in shown), default=-1)
            if tie_break == "confidence":  # ties: the less confident token is masked
                for h in hid:
                    for v in shown:
                        if s.trace[h] == s.trace[v]:
                            assert s.confidence[h] <= s.confidence[v]


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_complement_and_prompt_never_masked(family):
    rng = random.Random(2)
    samples = [random_sample(rng, i) for i in range(50)]
    b = build_batch(samples, family, 4, 0.0, 0.8, "confidence", PAD, torch.Generator().manual_seed(3))
    assert not (b.masked & b.comp).any() and not ((b.masked | b.comp) & b.hidden).any()
    for i, s in enumerate(samples):
        P, R = len(s.prompt_ids), len(s.response_ids)
        touched = b.masked[i] | b.comp[i] | b.hidden[i]
        assert not touched[:P].any() and not touched[P + R:].any()  # prompt and padding untouched
        if family == "sdar":  # every response token is in exactly one of the two copies
            assert (b.masked[i] | b.comp[i])[P:P + R].all()
        else:  # one block of the response (aligned at its start), later response tokens hidden
            cols = (b.masked[i] | b.comp[i]).nonzero().flatten()
            lo, hi = int(cols.min()) - P, int(cols.max()) - P + 1
            assert lo % 4 == 0 and hi == min(lo + 4, R) and len(cols) == hi - lo
            assert b.hidden[i, P + hi:P + R].all() and not b.hidden[i, :P + hi].any()


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_score_think_hides_the_action(family):
    """score "think": the masks drawn for the think text are those of score "all" (same generator); from
    think_len on every response token is masked in both copies and unscored."""
    rng = random.Random(4)
    samples = [random_sample(rng, i) for i in range(40)]
    for s in samples:
        s.think_len = rng.randint(0, len(s.response_ids))
    a, t = (build_batch(samples, family, 4, 0.0, 0.8, "confidence", PAD, torch.Generator().manual_seed(3),
                        score=sc) for sc in ("all", "think"))
    for i, s in enumerate(samples):
        cut = len(s.prompt_ids) + s.think_len
        for x, y in ((a.masked, t.masked), (a.comp, t.comp), (a.hidden, t.hidden)):
            assert torch.equal(x[i, :cut], y[i, :cut])
        assert not (t.masked[i, cut:] | t.comp[i, cut:]).any()
        assert t.hidden[i, cut:len(s.prompt_ids) + len(s.response_ids)].all()
    with pytest.raises(ValueError, match="distill.score"):
        build_batch(samples, family, 4, 0.0, 0.8, "confidence", PAD, score="action")


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_score_think_loss_ignores_the_action_tokens(family):
    """The action comes after the think text, so with score "think" no scored position sees the action's
    tokens: rewriting them leaves the loss unchanged (with "all" it changes)."""
    rng = random.Random(5)
    samples = [random_sample(rng, i) for i in range(8)]
    for s in samples:
        s.think_len = len(s.response_ids) // 2
    other = [sample(s.prompt_ids, s.response_ids[:s.think_len] + [(t + 7) % 20 + 4 for t in s.response_ids[s.think_len:]],
                    s.trace, s.confidence, ep=s.episode_id) for s in samples]
    for s, o in zip(samples, other):
        o.think_len = s.think_len
    model = tiny(family)
    loss = {}
    for sc in ("all", "think"):
        for name, batch in (("orig", samples), ("other", other)):
            b = build_batch(batch, family, 4, 0.2, 0.8, "confidence", PAD, torch.Generator().manual_seed(1), score=sc)
            loss[sc, name] = float(distill_loss(model, b, DistillConfig(score=sc))[0].detach())
    assert loss["think", "orig"] == pytest.approx(loss["think", "other"], rel=1e-6)
    assert loss["all", "orig"] != pytest.approx(loss["all", "other"], rel=1e-3)


def test_select_samples_filters():
    s = [sample([5], [6, EOS], [0, 0]), sample([5], [6, EOS], [0, 0], valid=False),
         sample([5], [6, EOS], [0, 1], won=False), sample([5], [6, EOS], None, None)]
    assert select_samples(s, DistillConfig(only_valid=True, only_success=False)) == [s[0], s[2]]
    assert select_samples(s, DistillConfig(only_valid=True, only_success=True)) == [s[0]]
    assert select_samples(s, DistillConfig(only_valid=False, only_success=False)) == s[:3]


def test_select_samples_relabel():
    """rollouts "relabel": the policy's sample where the teacher took the same action, else the teacher's;
    the episode filter reads the policy's episode, the validity filter the sample chosen."""
    def pair(action, t_action, t_valid=True, won=True, valid=True):
        own = dataclasses.replace(sample([5], [6, EOS], [0, 0], valid=valid, won=won), action=action)
        own.relabel = dataclasses.replace(sample([5], [7, EOS], [0, 1], valid=t_valid, won=won), action=t_action)
        return own
    s = [pair("a", "a"), pair("a", "b"), pair("a", "b", t_valid=False), pair("a", "b", won=False),
         pair("x", "a", valid=False), pair("a", "a", valid=False)]
    cfg = DistillConfig(rollouts="relabel", only_valid=True, only_success=True)
    assert select_samples(s, cfg) == [s[0], s[1].relabel, s[4].relabel]
    cfg = DistillConfig(rollouts="relabel", only_valid=False, only_success=False)
    assert select_samples(s, cfg) == [s[0], s[1].relabel, s[2].relabel, s[3].relabel, s[4].relabel, s[5]]
    assert select_samples(s, DistillConfig(only_valid=False, only_success=False)) == s  # policy: no relabel


def test_relabel_first_puts_every_correction_in_the_batch():
    """The batch_size cap draws at random; relabel_first takes the teacher's corrections first."""
    pol = []
    for i in range(12):
        own = dataclasses.replace(sample([5], [6, EOS], [0, 0], ep=i), action="a")
        own.relabel = dataclasses.replace(sample([5], [7, EOS], [0, 1], ep=i), action="b" if i % 4 == 0 else "a")
        pol.append(own)
    on = DistillConfig(rollouts="relabel", only_success=False, relabel_first=True)
    kept = select_samples(pol, on)
    fixes = [s for s in kept if s.response_ids == [7, EOS]]
    own_ids = {id(s) for s in pol}
    assert len(kept) == 12 and len(fixes) == 3
    for seed in range(5):
        got = cap_samples(kept, own_ids, on, 4, torch.Generator().manual_seed(seed))
        assert len(got) == 4 and all(any(g is f for g in got) for f in fixes)
    off = dataclasses.replace(on, relabel_first=False)  # by chance: some draws leave a correction out
    assert any(sum(any(g is f for g in cap_samples(kept, own_ids, off, 4, torch.Generator().manual_seed(seed)))
                   for f in fixes) < 3 for seed in range(5))
    assert cap_samples(kept, own_ids, on, 20) == kept


# ----------------------------------------------------------------------------- loss
def test_loss_hand_computed():
    L = torch.log
    lg = L(torch.tensor([[[1., 2, 1], [1, 1, 8], [1, 1, 1], [1, 98, 1]]]))   # noisy copy, [1, 4, 3]
    lgc = L(torch.tensor([[[1., 1, 1], [1, 1, 1], [1, 3, 1], [1, 1, 1]]]))  # complementary copy
    target = torch.tensor([[1, 0, 1, 1]])
    masked = torch.tensor([[True, True, False, True]])
    comp = ~masked
    loss, st = distill_terms(lg, lgc, target, masked, comp, DistillConfig(entropy_coef=2.0, entropy_temp=0.5))
    ce = (math.log(2) + math.log(10) + math.log(100 / 98)) / 3
    ce_c = math.log(5 / 3)
    # entropy at T = 0.5 squares the probabilities: [1, 4, 1] / 6 and [1, 98^2, 1] / (98^2 + 2)
    h0 = math.log(6) - (4 / 6) * math.log(4)
    z = 98 ** 2 + 2
    h3 = math.log(z) - (98 ** 2 / z) * math.log(98 ** 2)
    h = (h0 + h3) / 2  # only positions 0 and 3 are predicted correctly
    assert float(loss) == pytest.approx((ce + ce_c + 2 * h) / 4, rel=1e-5)
    assert st["ce"] == pytest.approx(ce, rel=1e-5) and st["entropy"] == pytest.approx(h, rel=1e-5)
    assert (st["correct"], st["confident"], st["masked"]) == (2, 1, 3)  # p = 0.98 > 0.95 only at position 3


def _ref_logits_sdar(model, s, canvas):
    """Independent reference: for every response block b, run the clean prefix [0, bK) followed by the
    noisy block b under the plain block-causal inference mask; keep block b's rows."""
    K, P, R = model.cfg.block_size, len(s.prompt_ids), len(s.response_ids)
    clean = torch.tensor(s.prompt_ids + s.response_ids)
    rows = []
    for blk in range(P // K, (P + R - 1) // K + 1):
        hi = min((blk + 1) * K, P + R)
        x = torch.cat([clean[:blk * K], canvas[blk * K:hi]])[None]
        rows.append(model(x)[0, blk * K:hi])
    return torch.cat(rows)[P - (P // K) * K:]  # response rows


@pytest.mark.parametrize("family", ["sdar", "llada"])
@torch.no_grad()
def test_loss_matches_reference_forwards(family):
    model = tiny(family)
    rng = random.Random(4)
    samples = [random_sample(rng, i) for i in range(5)]
    cfg = DistillConfig()
    b = build_batch(samples, family, 4, 0.2, 0.8, "confidence", PAD, torch.Generator().manual_seed(5))
    lg, lgc = distill_logits(model, b)
    s0 = b.start
    ce = ce_c = 0.0
    ents, nm, nc = [], 0, 0
    for i, s in enumerate(samples):
        P, R = len(s.prompt_ids), len(s.response_ids)
        canv = [torch.where(b.masked[i] | b.hidden[i], MASK, b.ids[i]),
                torch.where(b.comp[i] | b.hidden[i], MASK, b.ids[i])]
        if family == "sdar":
            ref = [_ref_logits_sdar(model, s, c) for c in canv]
        else:  # one bidirectional forward of each canvas alone
            ref = [model(c[None, :P + R])[0, P:] for c in canv]
        for got, want in zip((lg[i, P - s0:P - s0 + R], lgc[i, P - s0:P - s0 + R]), ref):
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)
        tgt = torch.tensor(s.response_ids)
        for j in range(R):
            lp0, lp1 = ref[0][j].log_softmax(-1), ref[1][j].log_softmax(-1)
            if b.masked[i, P + j]:
                ce, nm = ce - float(lp0[tgt[j]]), nm + 1
                if int(ref[0][j].argmax()) == int(tgt[j]):
                    q = (ref[0][j] / 0.5).softmax(-1)
                    ents.append(float(-(q * q.log()).sum()))
            if b.comp[i, P + j]:
                ce_c, nc = ce_c - float(lp1[tgt[j]]), nc + 1
    h = sum(ents) / max(len(ents), 1)
    loss, st = distill_loss(model, b, cfg)
    assert float(loss) == pytest.approx((ce / nm + ce_c / max(nc, 1) + 2.0 * h) / 4, rel=1e-4)


# ----------------------------------------------------------------------------- step
def test_micro_batching_gives_the_same_gradient():
    rng = random.Random(6)
    samples = [random_sample(rng, i) for i in range(6)]
    grads = []
    for mb in (6, 2):
        model = tiny("sdar")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        cfg = DistillConfig(micro_batch=mb, entropy_coef=0.0, batch_size=6)
        distill_step(model, opt, samples, cfg, 0.3, gen=torch.Generator().manual_seed(7), grad_clip=0.0)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_regularizer_gradient_joins_the_update():
    """The gradient of distill_step's regularizer is added to the distillation gradient before the
    update: with SGD (lr 1, no clipping) and a regularizer c * sum(w), w moves by c more."""
    rng = random.Random(9)
    samples = [random_sample(rng, i) for i in range(4)]
    after, stats = [], []
    for c in (None, 0.25):
        model = tiny("sdar")
        w = model.lm_head.weight
        w0 = float(w.detach().sum())
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        reg = None if c is None else (lambda: c * w.sum())
        stats.append(distill_step(model, opt, samples, DistillConfig(batch_size=4), 0.3,
                                  gen=torch.Generator().manual_seed(7), grad_clip=0.0, regularizer=reg))
        after.append(w.detach().clone())
    torch.testing.assert_close(after[0] - after[1], torch.full_like(after[0], 0.25), atol=1e-6, rtol=0)
    assert "expert_loss" not in stats[0] and stats[1]["expert_loss"] == pytest.approx(0.25 * w0, rel=1e-5)
    assert stats[0]["loss"] == pytest.approx(stats[1]["loss"])  # the distillation loss itself is unchanged


def test_step_lowers_loss_and_only_trains_lora():
    rng = random.Random(8)
    samples = [random_sample(rng, i) for i in range(8)]
    model = apply_lora(tiny("sdar"), LoRAConfig(rank=4, alpha=8.0))
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    lora = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-2)
    cfg = DistillConfig(micro_batch=4)
    first = [distill_step(model, opt, samples, cfg, 0.5, gen=torch.Generator().manual_seed(0))]
    for _ in range(25):
        last = distill_step(model, opt, samples, cfg, 0.5, gen=torch.Generator().manual_seed(0))
    assert last["loss"] < 0.7 * first[0]["loss"]
    assert first[0]["r_floor"] == pytest.approx(0.4) and last["samples_used"] == 8
    assert all(torch.equal(p, base[n]) for n, p in model.named_parameters() if n in base)
    assert any(not torch.equal(p, lora[n]) for n, p in model.named_parameters() if n in lora)


def test_step_without_usable_samples_and_bad_family():
    model = tiny("sdar")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    m = distill_step(model, opt, [sample([5], [6, EOS], None, None)], DistillConfig(), 0.0)
    assert m["skipped"] == 1.0 and m["samples_kept"] == 0
    with pytest.raises(ValueError, match="qwen3"):
        build_batch([sample([5], [6, EOS], [0, 1])], "qwen3", 1, 0.0, 0.8, "confidence", PAD)
    with pytest.raises(ValueError, match="tie_break"):
        mask_order([0, 1], None, "lexical")


# ----------------------------------------------------------------------------- teacher
def test_kl_sum_by_hand():
    t = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])  # teacher: (1/4, 3/4), (1/2, 1/2)
    s = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0]]])  # policy: (1/2, 1/2), (3/4, 1/4)
    kl0 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    kl1 = 0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25)
    assert float(kl_sum(t, s, torch.tensor([[True, False]]))) == pytest.approx(kl0, rel=1e-6)
    assert float(kl_sum(t, s, torch.tensor([[True, True]]))) == pytest.approx(kl0 + kl1, rel=1e-6)


def think_samples(seed=4, n=4):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        s = random_sample(rng, i)
        s.think_len = rng.randint(0, len(s.response_ids))
        out.append(s)
    return out


@pytest.mark.parametrize("score,on", [("think", "action"), ("all", "action"), ("think", "response")])
def test_teacher_term_is_the_kl_on_masked_action_tokens(score, on):
    """distill_loss with a teacher adds teacher_weight / 4 x the mean KL(teacher || policy) over the action
    tokens (from think_len on; teacher_on "response": all response tokens) masked in each copy, counted
    here from the masks and per position."""
    samples = think_samples()
    model, teacher = tiny("sdar", seed=0), tiny("sdar", seed=1)
    cfg = DistillConfig(score=score, teacher_weight=0.7, teacher_on=on)
    b = build_batch(samples, "sdar", 4, 0.0, 0.8, "confidence", PAD, torch.Generator().manual_seed(3), score=score)
    base, _ = distill_loss(model, b, cfg)
    loss, st = distill_loss(model, b, cfg, teacher=teacher)
    lg, lgc = distill_logits(model, b)
    tg, tgc = distill_logits(teacher, b)
    s0, tot, cnt = b.start, 0.0, 0
    for i, smp in enumerate(samples):
        p = len(smp.prompt_ids)
        first = p if on == "response" else p + min(smp.think_len, len(smp.response_ids))
        for j in range(first, p + len(smp.response_ids)):
            for pol, tea, where in ((lg, tg, b.masked | b.hidden), (lgc, tgc, b.comp | b.hidden)):
                if where[i, j]:
                    pt, ps = tea[i, j - s0].softmax(-1), pol[i, j - s0].softmax(-1)
                    tot, cnt = tot + float((pt * (pt / ps).log()).sum().detach()), cnt + 1
    assert cnt > 0 and st["teacher_tokens"] == cnt
    if on == "response":  # every response token is masked in one copy, the action (hidden) in both
        assert cnt == sum(2 * len(s.response_ids) - min(s.think_len, len(s.response_ids)) for s in samples)
    if (score, on) == ("think", "action"):  # the action is masked in both copies
        assert cnt == 2 * sum(len(s.response_ids) - min(s.think_len, len(s.response_ids)) for s in samples)
    assert st["teacher_kl"] == pytest.approx(tot / cnt, rel=1e-4)
    assert float((loss - base).detach()) == pytest.approx(0.7 * tot / cnt / 4, rel=1e-4)
    same, st_same = distill_loss(model, b, cfg, teacher=copy.deepcopy(model))
    assert st_same["teacher_kl"] == pytest.approx(0.0, abs=1e-6) and float(same.detach()) == pytest.approx(float(base.detach()))


def test_teacher_step_micro_batching_and_off_switch():
    """With a teacher the micro-batched gradient equals the one-batch gradient (global token count; H off, as
    it is a per-micro-batch mean), and
    teacher_weight 0 ignores a given teacher."""
    samples = think_samples(5, 6)
    teacher = tiny("sdar", seed=2)
    grads, stats = [], []
    for mb, w in ((6, 1.0), (2, 1.0), (6, 0.0)):
        model = tiny("sdar")
        opt = torch.optim.SGD(model.parameters(), lr=0.0)
        cfg = DistillConfig(micro_batch=mb, batch_size=6, score="think", teacher_weight=w, entropy_coef=0.0)
        stats.append(distill_step(model, opt, samples, cfg, 0.3, gen=torch.Generator().manual_seed(7), grad_clip=0.0,
                                  teacher=teacher))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], atol=1e-6, rtol=1e-4)
    assert stats[0]["teacher_kl"] == pytest.approx(stats[1]["teacher_kl"], rel=1e-5) and stats[0]["teacher_kl"] > 0
    assert "teacher_kl" not in stats[2] and not torch.allclose(grads[0], grads[2])


def _gate_case(score: str):
    """Samples, policy, teacher, a batch scored as `score` says, and both models' logits on it."""
    samples = think_samples(6, 5)
    model, teacher = tiny("sdar", seed=0), tiny("sdar", seed=3)
    b = build_batch(samples, "sdar", 4, 0.0, 0.8, "confidence", PAD, torch.Generator().manual_seed(2), score=score)
    return samples, model, teacher, b, distill_logits(model, b), distill_logits(teacher, b)


def _gated_terms(samples, b, logits, teacher_logits, m, c, cfg):
    """By hand: the sharpening terms on the gated masks m / c and the teacher's KL over the response tokens
    masked in each copy that the gate left out, normalised by all of them (teacher_on "response")."""
    (lg, lgc), (tg, tgc), s0 = logits, teacher_logits, b.start
    sharp, _ = distill_terms(lg, lgc, b.ids[:, s0:], m, c, cfg, float(b.masked.sum()), float(b.comp.sum()))
    resp = torch.zeros_like(b.masked)
    for i, smp in enumerate(samples):
        resp[i, len(smp.prompt_ids):len(smp.prompt_ids) + len(smp.response_ids)] = True
    wn, wc = (resp & (b.masked | b.hidden))[:, s0:], (resp & (b.comp | b.hidden))[:, s0:]
    kl = (kl_sum(tg, lg, wn & ~m) + kl_sum(tgc, lgc, wc & ~c)) / float(wn.sum() + wc.sum())
    return sharp, kl


def test_teacher_gate_sharpens_only_what_the_teacher_is_sure_of():
    """teacher_gate g: scored tokens whose teacher top probability is below g leave the CE / entropy terms
    (still counted in their means) and join the KL; the others are sharpened and not KL'd. Checked per position
    from the teacher's probabilities against distill_terms on hand-gated masks."""
    samples, model, teacher, b, (lg, lgc), (tg, tgc) = _gate_case("think")
    s0 = b.start
    top, top_c = tg.softmax(-1).amax(-1), tgc.softmax(-1).amax(-1)
    g = float(torch.cat([top[b.masked[:, s0:]], top_c[b.comp[:, s0:]]]).median().detach())  # gates about half
    cfg = DistillConfig(score="think", teacher_weight=0.5, teacher_on="response", teacher_gate=g)
    loss, st = distill_loss(model, b, cfg, teacher=teacher)
    m, c = b.masked[:, s0:] & (top >= g), b.comp[:, s0:] & (top_c >= g)
    assert 0 < int(m.sum() + c.sum()) < int(b.masked.sum() + b.comp.sum())
    assert st["teacher_unsure"] == float((b.masked[:, s0:] & (top < g)).sum() + (b.comp[:, s0:] & (top_c < g)).sum())
    sharp, kl = _gated_terms(samples, b, (lg, lgc), (tg, tgc), m, c, cfg)
    assert float(loss.detach()) == pytest.approx(float((sharp + 0.5 * kl / 4).detach()), rel=1e-5)
    assert st["teacher_kl"] == pytest.approx(float(kl.detach()), rel=1e-5)
    everything, _ = distill_loss(model, b, DistillConfig(score="think", teacher_gate=1.0), teacher=teacher)
    assert float(everything.detach()) == pytest.approx(0.0, abs=1e-7)  # no teacher is ever sure at 1.0: no CE, no KL


def test_gate_on_action_leaves_the_think_text_to_the_ce():
    """gate_on "action" (score all): every masked think token is sharpened, an action token only where the
    teacher's top probability reaches the gate; the loss equals distill_terms on those hand-gated masks plus
    the KL on the rest."""
    samples, model, teacher, b, (lg, lgc), (tg, tgc) = _gate_case("all")
    s0 = b.start
    act = b.action[:, s0:]
    top, top_c = tg.softmax(-1).amax(-1), tgc.softmax(-1).amax(-1)
    g = float(torch.cat([top[b.masked[:, s0:] & act], top_c[b.comp[:, s0:] & act]]).median().detach())
    cfg = DistillConfig(score="all", teacher_weight=0.5, teacher_on="response", teacher_gate=g, gate_on="action")
    loss, st = distill_loss(model, b, cfg, teacher=teacher)
    m, c = b.masked[:, s0:] & ((top >= g) | ~act), b.comp[:, s0:] & ((top_c >= g) | ~act)
    think_scored = (b.masked[:, s0:] | b.comp[:, s0:]) & ~act
    assert int(think_scored.sum()) > 0 and bool(((m | c) >= think_scored).all())  # no think token gated
    unsure = (b.masked[:, s0:] & act & (top < g)).sum() + (b.comp[:, s0:] & act & (top_c < g)).sum()
    assert st["teacher_unsure"] == float(unsure) > 0
    sharp, kl = _gated_terms(samples, b, (lg, lgc), (tg, tgc), m, c, cfg)
    assert float(loss.detach()) == pytest.approx(float((sharp + 0.5 * kl / 4).detach()), rel=1e-5)
    with pytest.raises(ValueError, match="gate_on"):
        distill_loss(model, b, DistillConfig(teacher_gate=0.5, gate_on="think"), teacher=teacher)
