"""d3mini.rl against references: exact enumeration on a toy model for the estimators, naive
unpadded forwards for the SFT loss and AR scoring, hand-computed values for rewards, advantages
and losses, and a few real updates on a tiny DiffusionLM."""
import copy
import math
import os
import sys
from dataclasses import dataclass, field

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from estimators import Toy, estimates, toy_model  # noqa: E402

from d3mini import rl  # noqa: E402
from d3mini.config import ModelConfig, RLConfig  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402

torch.set_num_threads(2)


@dataclass
class StepSample:  # the fields rl_step reads (DESIGN.md §3)
    prompt_ids: list
    response_ids: list
    reward: float
    group_id: int = 0
    episode_id: int = 0
    step: int = 0
    valid: bool = True
    action: str = ""
    trace: list = field(default_factory=list)
    think_len: int = 0
    anchor: str = ""
    env_reward: float = 0.0


def tiny(family="sdar", seed=0, block=4):
    cfg = ModelConfig(family=family, vocab_size=16, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=2, num_kv_heads=1, head_dim=16, qk_norm=family != "llada", block_size=block,
                      mask_id=3, eos_ids=[2], pad_id=0, init_std=0.1)
    torch.manual_seed(seed)
    return DiffusionLM.from_config(cfg)


@torch.no_grad()
def ar_logp_naive(model, prompt, resp):
    """Sum of log p(y_k | prompt, y_<k), one unpadded prefix forward per token."""
    total = 0.0
    for k, t in enumerate(resp):
        x = torch.tensor([prompt + resp[:k]])
        total += float(model(x)[0, -1].float().log_softmax(-1)[t])
    return total


# ----------------------------------------------------------------------------- batches, SFT loss
def test_batch_tokens_right_padded():
    b = rl.batch_tokens([[5, 6], [7]], [[8, 2], [9, 10, 2]], pad_id=0)
    assert b.ids.tolist() == [[5, 6, 8, 2], [7, 9, 10, 2]]
    b = rl.batch_tokens([[5, 6, 7], [7]], [[8, 2], [9, 2]], pad_id=0)
    assert b.ids.tolist() == [[5, 6, 7, 8, 2], [7, 9, 2, 0, 0]]
    assert b.resp.tolist() == [[False, False, False, True, True], [False, True, True, False, False]]
    with pytest.raises(ValueError, match="empty response"):
        rl.batch_tokens([[1]], [[]], 0)


def test_corrupt_iid_masks_only_responses_and_at_least_one():
    b = rl.batch_tokens([[5, 6, 7]] * 64, [[8, 2]] * 64, 0)
    masked, p = rl.corrupt_iid(b, torch.Generator().manual_seed(0))
    assert (masked <= b.resp).all() and masked.any(1).all()
    assert ((p >= rl.SDAR_EPS) & (p <= 1)).all()


@pytest.mark.parametrize("family", ["sdar", "llada", "qwen3"])
@pytest.mark.parametrize("norm", ["tokens", "samples"])
def test_diffusion_loss_matches_unpadded_reference(family, norm):
    model = tiny(family, block=2)
    prompts, resps = [[5, 6, 7], [8], [9, 10]], [[11, 12, 2], [13, 14, 15, 2], [12, 2]]
    gen = torch.Generator().manual_seed(3)
    b = rl.batch_tokens(prompts, resps, 0)
    masked, p = (None, None) if family == "qwen3" else rl.corrupt_iid(b, torch.Generator().manual_seed(3))
    loss, stats = rl.diffusion_loss(model, prompts, resps, gen, norm=norm)
    per = []
    for i, (q, y) in enumerate(zip(prompts, resps)):
        if family == "qwen3":
            per.append(-ar_logp_naive(model, q, y))
        else:  # inference-style conditionals of the masked tokens, one sequence, no padding
            M = frozenset(k for k in range(len(y)) if masked[i, len(q) + k])
            per.append(-sum(Toy(model, q, y).cond(M).values()) / float(p[i]))
    n = [len(y) for y in resps]
    ref = sum(per) / sum(n) if norm == "tokens" else sum(x / m for x, m in zip(per, n)) / len(n)
    assert abs(float(loss.detach()) - ref) < 1e-4 * max(1.0, abs(ref))
    loss.backward()
    assert stats["tokens"] == sum(n)


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_mask_copies_equal_the_mean_of_single_copy_losses(family):
    """C stratified mask draws in one [noisy_1 | ... | noisy_C | clean] pass = the mean of C ordinary
    single-copy losses with the same masks, and the draws are stratified over t."""
    model = tiny(family, block=2)
    prompts, resps = [[5, 6, 7], [8], [9, 10, 11, 12, 5]], [[11, 12, 2], [13, 14, 15, 2], [12, 2]]
    b = rl.batch_tokens(prompts, resps, 0)
    C = 3
    masked, p = rl.corrupt_iid(b, torch.Generator().manual_seed(5), copies=C)
    assert masked.shape == (3, C, b.ids.shape[1]) and p.shape == (3, C)
    assert (masked <= b.resp[:, None]).all() and masked.any(2).all()
    t = (p - rl.SDAR_EPS) / (1 - rl.SDAR_EPS)
    assert ((t >= torch.arange(C) / C - 1e-6) & (t <= (torch.arange(C) + 1) / C + 1e-6)).all()  # one per stratum
    for norm in ("tokens", "samples"):
        loss, _ = rl.masked_loss(model, b, masked, p, norm)
        ref = sum(rl.masked_loss(model, b, masked[:, c], p[:, c], norm)[0] for c in range(C)) / C
        assert torch.allclose(loss, ref, atol=1e-5), (norm, float(loss), float(ref))
    loss.backward()


def test_ar_warmup_loss_on_a_diffusion_model_is_the_ar_loss():
    """masked_loss(ar=True) on SDAR weights = the qwen3 (causal) loss of the same weights."""
    sdar = tiny("sdar", block=2)
    ar = tiny("qwen3", block=1)
    ar.load_state_dict(sdar.state_dict())
    b = rl.batch_tokens([[5, 6, 7], [8]], [[11, 12, 2], [13, 14, 15, 2]], 0)
    got, _ = rl.masked_loss(sdar, b, None, None, "tokens", ar=True)
    want, _ = rl.masked_loss(ar, b, None, None, "tokens")
    assert torch.allclose(got, want, atol=1e-6)


def test_ar_prompt_loss_predicts_every_token_after_the_first():
    """ar_prompt: the causal loss over prompt and response tokens, mean over len - 1 targets per row."""
    sdar = tiny("sdar", block=2)
    ar = tiny("qwen3", block=1)
    ar.load_state_dict(sdar.state_dict())
    rows = [[5, 6, 7, 11, 12, 2], [8, 13, 14, 15, 2]]
    b = rl.batch_tokens([r[:3] for r in rows[:1]] + [rows[1][:1]], [rows[0][3:], rows[1][1:]], 0)
    got, stats = rl.masked_loss(sdar, b, None, None, "tokens", ar=True, ar_prompt=True)
    nll, n = 0.0, 0
    with torch.no_grad():
        for r in rows:
            x = torch.tensor([r])
            lsm = ar(x).float().log_softmax(-1)[0]
            nll -= float(lsm[:-1].gather(-1, x[0, 1:, None]).sum())
            n += len(r) - 1
    assert stats["tokens"] == n and abs(float(got) - nll / n) < 1e-5


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_uniform_weight_is_the_mean_ce_over_masked_tokens(family):
    """weight='uniform': no 1/p, divided by the masked count (per copy) = the plain masked-token CE."""
    m = tiny(family, block=2)
    b = rl.batch_tokens([[5, 6, 7], [8]], [[11, 12, 2, 9, 10], [13, 14, 15, 2]], 0)
    for C in (1, 3):
        masked, p = rl.corrupt_iid(b, torch.Generator().manual_seed(3), copies=C)
        loss, st = rl.masked_loss(m, b, masked, p, weight="uniform")
        assert abs(float(loss) - st["ce_masked"]) < 1e-5
        elbo, _ = rl.masked_loss(m, b, masked, p)
        assert abs(float(elbo) - float(loss)) > 1e-3
    with pytest.raises(ValueError, match="weight"):
        rl.masked_loss(m, b, masked, p, norm="samples", weight="uniform")


def test_suffix_masks_are_block_suffixes_of_the_response():
    """corrupt_suffix: inside every block the masked response tokens are a suffix of the block's
    response tokens, every block holding response tokens has one masked, offset o of a full block is
    masked with probability (o + 1) / K, and frac = 0 gives corrupt_iid's draw."""
    K = 4
    b = rl.batch_tokens([[5, 6, 7], [5, 6, 7, 8, 9, 10]], [[11] * 12 + [2], [12, 13, 2]], 0)
    n = b.ids.shape[1]
    blk = torch.arange(n) // K
    hits, full = torch.zeros(K), 0
    for seed in range(200):
        for C in (1, 3):
            m, p = rl.corrupt_suffix(b, torch.Generator().manual_seed(seed), K, copies=C)
            m = m if C > 1 else m[:, None]
            assert not (m & ~b.resp[:, None]).any() and (p == 1).all()
            for r in range(2):
                for c in range(C):
                    for k in range(int(blk.max()) + 1):
                        idx = [i for i in range(n) if blk[i] == k and b.resp[r, i]]
                        if not idx:
                            continue
                        got = m[r, c, idx].tolist()
                        assert any(got) and got == sorted(got), (r, k, got)  # False... then True...
                        if r == 0 and len(idx) == K:
                            hits += m[r, c, idx].float()
                            full += 1
    assert torch.allclose(hits / full, torch.arange(1, K + 1) / K, atol=0.05)
    want, _ = rl.corrupt_iid(b, torch.Generator().manual_seed(7), copies=2)
    got, _ = rl.corrupt_suffix(b, torch.Generator().manual_seed(7), K, copies=2, frac=0.0)
    assert torch.equal(got, want)


def test_one_token_blocks_over_the_prompt_are_unshifted_next_token_prediction():
    """Block size 1, every token after the first masked, ar_prompt: each row j (fed a mask) is scored on
    token j given the clean tokens before it, prompt included; the mean over len - 1 targets."""
    m1 = tiny("sdar", block=1)
    m4 = tiny("sdar", block=4)
    m4.load_state_dict(m1.state_dict())
    b = rl.batch_tokens([[5, 6, 7], [8]], [[11, 12, 2], [13, 14, 15, 2]], 0)
    pos = torch.arange(b.ids.shape[1])[None]
    masked = (pos >= 1) & (pos < b.lengths[:, None])
    got, st = rl.masked_loss(m4, b, masked, torch.ones(2), block_size=1, ar_prompt=True, weight="uniform")
    nll = 0.0
    with torch.no_grad():
        for r in range(2):
            L = int(b.lengths[r])
            for j in range(1, L):
                row = b.ids[r:r + 1, :L]
                canvas = row.clone()
                canvas[0, j] = 3
                lp, _ = rl.score(m1, row, canvas, b.lengths[r:r + 1], "canvas", j)
                nll -= float(lp[0, j])
    assert st["tokens"] == int(masked.sum()) and abs(float(got) - nll / int(masked.sum())) < 1e-5


def test_block_size_override_equals_a_model_with_that_block_size():
    """masked_loss(block_size=k) on a block-4 SDAR model = the loss of the same weights built with block k."""
    big, small = tiny("sdar", block=4), tiny("sdar", block=2)
    small.load_state_dict(big.state_dict())
    b = rl.batch_tokens([[5, 6, 7], [8]], [[11, 12, 2, 9, 10], [13, 14, 15, 2]], 0)
    for C in (1, 3):
        masked, p = rl.corrupt_iid(b, torch.Generator().manual_seed(1), copies=C)
        got, _ = rl.masked_loss(big, b, masked, p, block_size=2)
        want, _ = rl.masked_loss(small, b, masked, p)
        other, _ = rl.masked_loss(big, b, masked, p)
        assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, other, atol=1e-4)


def test_ar_scoring_matches_prefix_forwards():
    model = tiny("qwen3")
    prompts, resps = [[5, 6, 7], [8]], [[11, 2], [13, 14, 2]]
    b = rl.batch_tokens(prompts, resps, 0)
    md = rl.draw_masks(b, "none", 1, [(0,), (1,)])
    with torch.no_grad():
        est = rl.seq_logp(model, b, "ar", md)
    for i, (q, y) in enumerate(zip(prompts, resps)):
        assert abs(float(est.seq[i]) * len(y) - ar_logp_naive(model, q, y)) < 1e-5


# ----------------------------------------------------------------------------- estimators (exact enumeration)
PROMPT, RESP = [1, 0, 2], [1, 2, 0, 2]


@pytest.mark.parametrize("family", ["llada", "sdar"])
def test_elbo_below_exact_loglik(family):
    for seed in range(3):
        for resp in ([1, 2, 0, 2], [0, 0, 1], [2, 1]):
            toy = Toy(toy_model(family, seed), PROMPT, resp)
            assert toy.elbo() <= toy.exact() + 1e-9


@pytest.mark.parametrize("family", ["llada", "sdar"])
@pytest.mark.parametrize("scheme,draws,p_prompt", [("stratified", 1, 0.0), ("stratified", 2, 0.0),
                                                    ("coupled", 1, 0.0), ("sdmc", 3, 0.0),
                                                    ("mean_field", 1, 0.0), ("mean_field", 1, 0.15)])
def test_estimator_mean_matches_analytic(family, scheme, draws, p_prompt):
    model = toy_model(family, 0)
    toy = Toy(model, PROMPT, RESP)
    est = "mean_field" if scheme == "mean_field" else rl.FAMILY_ESTIMATOR[family]
    x = estimates(model, PROMPT, RESP, est, scheme, draws, 3000, p_prompt)
    target = {"sdmc": lambda: toy.sdmc_expectation(draws), "mean_field": lambda: toy.mean_field(p_prompt)}.get(
        scheme, toy.elbo)()
    se = float(x.std()) / math.sqrt(len(x))
    assert abs(float(x.mean()) - target) <= 4 * se + 1e-6, (float(x.mean()), target, se)


def test_mask_draws_are_keyed_and_schemes_are_well_formed():
    b = rl.batch_tokens([[5, 6]] * 3, [[7, 8, 9, 2], [7, 2], [9, 9, 9, 9, 2]], 0)
    keys = [(0, 0, e, 0, 0) for e in range(3)]
    a, a2 = rl.draw_masks(b, "stratified", 4, keys), rl.draw_masks(b, "stratified", 4, keys)
    assert torch.equal(a.masked, a2.masked) and torch.equal(a.weight, a2.weight)
    sub = rl.draw_masks(b.select([2]), "stratified", 4, keys[2:])  # a sample's draws ignore its batch position
    assert torch.equal(sub.masked[0], a.masked[2, :, : sub.masked.shape[2]])
    other = rl.draw_masks(b, "stratified", 4, [k[:-1] + (1,) for k in keys])
    assert not torch.equal(a.masked, other.masked)
    assert (a.masked <= b.resp[:, None]).all() and a.masked.any(-1).all()
    c = rl.draw_masks(b, "coupled", 2, keys)
    pair = c.masked.view(3, 2, 2, -1)  # [B, D, 2, n]: each draw and its complement cover the response once
    assert torch.equal(pair[:, :, 0] ^ pair[:, :, 1], b.resp[:, None].expand(-1, 2, -1))
    assert ((c.weight > 0) == c.masked).all()


# ----------------------------------------------------------------------------- rewards, advantages
def test_gating_modes():
    r, v = [1.0, 1.0, 0.0, 0.5], [True, False, False, True]
    assert rl.gate_rewards(r, v, "gate").tolist() == [1.0, 0.0, 0.0, 0.5]
    assert rl.gate_rewards(r, v, "penalty", 0.1).tolist() == pytest.approx([1.0, 0.9, -0.1, 0.5])
    assert rl.gate_rewards(r, v, "none").tolist() == r
    with pytest.raises(ValueError, match="non-finite"):
        rl.gate_rewards([float("nan")], [True])


def test_group_advantages_by_hand():
    r, g = [1.0, 0.0, 0.0, 1.0, 0.5, 2.0, 2.0], ["a", "a", "a", "a", "s", "b", "b"]
    adv, zero = rl.advantages(r, g, "grpo")
    std = math.sqrt(4 * 0.25 / 3)  # unbiased std of [1, 0, 0, 1]
    assert adv.tolist() == pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6)] * 1 + [-0.5 / (std + 1e-6),
                                         0.5 / (std + 1e-6), 0.5, 0.0, 0.0], rel=1e-6)
    assert zero == pytest.approx(1 / 3)
    assert rl.advantages(r, g, "mean")[0].tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0.5, 0, 0])
    assert rl.advantages(r, g, "loo")[0].tolist() == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.5, 0, 0])


def test_step_returns_by_hand():
    # episode 7: rewards 0, 0, 10 (listed out of step order); episode 3: a single step paying 1
    ss = [StepSample([1], [2], 10.0, episode_id=7, step=2, env_reward=10.0),
          StepSample([1], [2], 10.0, episode_id=7, step=0),
          StepSample([1], [2], 1.0, episode_id=3, step=0, env_reward=1.0),
          StepSample([1], [2], 10.0, episode_id=7, step=1)]
    assert rl.step_returns(ss, 0.5).tolist() == [10.0, 2.5, 1.0, 5.0]
    assert rl.step_returns(ss, 1.0).tolist() == [10.0, 10.0, 1.0, 10.0]


def test_anchor_advantages_by_hand():
    g = [1.0, 3.0, 0.0, 4.0, 2.0]
    keys = [(0, "a"), (0, "a"), (0, "b"), (1, "a"), (0, "a")]  # (1, "a") is another task: its own group
    a, frac = rl.anchor_advantages(g, keys, "mean")
    assert a.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0]) and frac == pytest.approx(3 / 5)
    a, _ = rl.anchor_advantages(g, keys, "mean_std")  # std of [1, 3, 2] = 1
    assert a.tolist() == pytest.approx([-1.0, 1.0, 0.0, 0.0, 0.0], rel=1e-5)
    with pytest.raises(ValueError, match="step_advantage"):
        rl.anchor_advantages(g, keys, "gigpo")


def test_step_advantage_adds_gated_anchor_term_by_hand():
    """Task 0, two episodes. Episode 0: search, an invalid click on the results page, a valid click that
    wins (env reward 10 at its last step). Episode 1: search, a valid click on the same page, lost."""
    ss = [StepSample([1], [2], 10.0, episode_id=0, step=0, anchor="search"),
          StepSample([1], [2], 10.0, episode_id=0, step=1, anchor="results", valid=False),
          StepSample([1], [2], 10.0, episode_id=0, step=2, anchor="results", env_reward=10.0),
          StepSample([1], [2], 0.0, episode_id=1, step=0, anchor="search"),
          StepSample([1], [2], 0.0, episode_id=1, step=1, anchor="results")]
    cfg = RLConfig(advantage="mean", gating="gate")
    _, r, a0, m0 = rl.sample_advantages(ss, cfg)
    assert r.tolist() == [10.0, 0.0, 10.0, 0.0, 0.0]
    assert a0.tolist() == pytest.approx([6.0, -4.0, 6.0, -4.0, -4.0]) and "adv/step_abs_mean" not in m0
    # gated step returns (gamma 0.5): 2.5, 0 (invalid: gated), 10, 0, 0. Anchor groups: "search" {2.5, 0},
    # "results" {0, 10, 0}; A_step = G - group mean; weight 0.5.
    cfg = RLConfig(advantage="mean", gating="gate", step_advantage="mean", gamma=0.5, step_weight=0.5)
    _, _, a, m = rl.sample_advantages(ss, cfg)
    step = [1.25, -10 / 3, 20 / 3, -1.25, -10 / 3]
    assert a.tolist() == pytest.approx([x + 0.5 * y for x, y in zip(a0.tolist(), step)], rel=1e-6)
    assert m["anchor/frac_grouped"] == 1.0 and m["adv/step_abs_mean"] == pytest.approx(sum(map(abs, step)) / 5)
    # penalty mode: the invalid step's return is 5 - 0.1 instead of 0
    cfg = RLConfig(advantage="mean", gating="penalty", step_advantage="mean", gamma=0.5, step_weight=1.0)
    _, _, a, _ = rl.sample_advantages(ss, cfg)
    _, _, ap, _ = rl.sample_advantages(ss, RLConfig(advantage="mean", gating="penalty"))
    m = (4.9 + 10.0 + 0.0) / 3
    assert (a - ap).tolist() == pytest.approx([1.25, 4.9 - m, 10.0 - m, -1.25, -m], rel=1e-6)


def test_neg_weight_scales_only_negative_advantages():
    """rl.neg_weight: gated rewards [10, 0 (invalid), 10, 0, 0] give mean advantages [6, -4, 6, -4, -4];
    the weight w scales only the negative ones: [6, -4w, 6, -4w, -4w]."""
    ss = [StepSample([1], [2], 10.0, group_id=0, valid=True), StepSample([1], [2], 10.0, group_id=0, valid=False),
          StepSample([1], [2], 10.0, group_id=0, valid=True), StepSample([1], [2], 0.0, group_id=0, valid=True),
          StepSample([1], [2], 0.0, group_id=0, valid=True)]
    _, _, a, _ = rl.sample_advantages(ss, RLConfig(advantage="mean", gating="gate", neg_weight=0.25))
    assert a.tolist() == pytest.approx([6.0, -1.0, 6.0, -1.0, -1.0])
    _, _, a, _ = rl.sample_advantages(ss, RLConfig(advantage="mean", gating="gate", neg_weight=0.0))
    assert a.tolist() == pytest.approx([6.0, 0.0, 6.0, 0.0, 0.0])
    # grpo: (r - mean) / std with r = [10, 0, 10, 0, 0]: std = sqrt(30) (unbiased), negatives halved
    _, _, a, _ = rl.sample_advantages(ss, RLConfig(advantage="grpo", gating="gate", neg_weight=0.5))
    sd = 30 ** 0.5
    assert a.tolist() == pytest.approx([6 / sd, -2 / sd, 6 / sd, -2 / sd, -2 / sd], rel=1e-5)


# ----------------------------------------------------------------------------- losses by hand
def _est(tok, draw, ent):
    tok = torch.tensor(tok)
    return rl.Est(tok, torch.tensor(draw), torch.tensor(ent), torch.ones_like(tok, dtype=torch.bool))


CUR = _est([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], [[-1.2, -1.0], [-0.7, -0.9]], [0.5, 0.2])
OLD = _est([[-1.1, -0.5, -1.2], [-0.3, -1.0, -1.9]], [[-1.0, -1.0], [-1.2, -1.1]], [0.0, 0.0])
REF = _est([[-0.9, -0.6, -2.0], [-0.5, -1.2, -0.6]], [[-1.1, -1.3], [-0.7, -0.7]], [0.0, 0.0])
ADV = [1.0, -0.5]


def _ppo(r, a, lo, hi, dual=0.0):
    loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    return min(loss, -a * dual) if dual and a < 0 else loss


def _hand(algo, cfg):
    seq = lambda e, i: sum(e.draw[i].tolist()) / 2
    out = []
    for i, a in enumerate(ADV):
        cs, os_, rs = seq(CUR, i), seq(OLD, i), seq(REF, i)
        r = math.exp(cs - os_)
        if algo == "d3llm_v2":
            v = -a * min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
            v += cfg.entropy_coef * max(0.0, cfg.entropy_floor - float(CUR.ent[i])) + cfg.kl_coef * 0.5 * (cs - rs) ** 2
        elif algo in ("d1", "grpo"):
            v = 0.0
            for c, o, f in zip(CUR.tok[i].tolist(), OLD.tok[i].tolist(), REF.tok[i].tolist()):
                dual = cfg.dual_clip if algo == "grpo" else 0.0
                v += _ppo(math.exp(c - o), a, cfg.clip_low, cfg.clip_high, dual)
                v += cfg.kl_coef * (math.exp(f - c) - (f - c) - 1)
        elif algo == "espo":
            v = _ppo(r, a, cfg.clip_low, cfg.clip_high) + cfg.kl_coef * 0.5 * (3 * (cs - rs)) ** 2 / 3
        elif algo == "bgpo":
            ds = [c - o for c, o in zip(CUR.draw[i].tolist(), OLD.draw[i].tolist())]
            v = sum(_ppo(1 + d if a > 0 else math.exp(d), a, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
                    for d in ds) / len(ds)
        elif algo == "gdpo":
            v = _ppo(r, a, cfg.clip_low, cfg.clip_high)
        out.append(v)
    return out


@pytest.mark.parametrize("algo", list(rl.LOSSES))
def test_losses_match_hand_computed(algo):
    over = dict(entropy_coef=0.5, entropy_floor=0.4, kl="k2", kl_coef=0.1) if algo == "d3llm_v2" else {}
    cfg = rl.rl_config(algo, **over)
    ref = REF if cfg.kl != "none" else None
    per, ratio, kl = rl.LOSSES[algo](CUR, OLD, ref, torch.tensor(ADV), cfg)
    assert per.tolist() == pytest.approx(_hand(algo, cfg), rel=1e-5)
    lo, hi = 1 - cfg.clip_low, 1 + cfg.clip_high
    if algo in ("d3llm_v2", "grpo"):  # these toy values hit the bound / the dual clip
        assert bool(((ratio < lo) | (ratio > hi)).any())


# ----------------------------------------------------------------------------- rl_step on a tiny model
def group(prompt=(5, 6, 7), n=4, rewarded=0):
    resps = [[8, 9, 2], [9, 8, 2], [10, 11, 2], [11, 10, 2]][:n]
    return [StepSample(list(prompt), r, float(i == rewarded), group_id=0, episode_id=i) for i, r in enumerate(resps)]


def exact_logp(model, prompt, resp):
    if model.cfg.family == "qwen3":
        return ar_logp_naive(model, prompt, resp)
    return Toy(model, prompt, resp).exact()


FAST = dict(epochs=2, minibatch=4, micro_batch=2)


@pytest.mark.parametrize("algo", list(rl.LOSSES))
def test_rl_step_raises_rewarded_response(algo):
    family = "qwen3" if algo == "grpo" else "sdar"
    model = tiny(family)
    ref_model = copy.deepcopy(model)
    over = dict(FAST, mc_samples=min(rl.rl_config(algo).mc_samples, 4))
    cfg = rl.rl_config(algo, **over)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    samples = group()
    before = [exact_logp(model, s.prompt_ids, s.response_ids) for s in samples]
    for it in range(3):
        m = rl.rl_step(model, opt, samples, cfg, ref_model=ref_model if cfg.kl != "none" else None, step=it)
        assert m["noise0"] < 1e-5 and math.isfinite(m["loss"])
    after = [exact_logp(model, s.prompt_ids, s.response_ids) for s in samples]
    assert after[0] > before[0] + 0.05, (before, after)
    assert after[0] - before[0] > max(a - b for a, b in zip(after[1:], before[1:]))
    for key in ("reward/mean", "success", "valid_ratio", "frac_reward_zero_std", "clip/low", "clip/high",
                "ratio/p1", "ratio/p50", "ratio/p99", "entropy", "grad_norm", "resp_len", "time/update"):
        assert key in m


@pytest.mark.parametrize("algo", list(rl.LOSSES))
def test_zero_advantage_zero_gradient(algo):
    model = tiny("qwen3" if algo == "grpo" else "sdar")
    before = copy.deepcopy(model.state_dict())
    cfg = rl.rl_config(algo, kl="none", **FAST)
    resps = [[8, 2], [9, 9, 2], [10, 2]]
    samples = [StepSample([5, 6, 7], r, 1.0, episode_id=i) for i, r in enumerate(resps)]
    m = rl.rl_step(model, torch.optim.Adam(model.parameters(), lr=1e-2), samples, cfg)
    assert m["grad_norm_max"] == 0.0 and m["frac_reward_zero_std"] == 1.0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())


def test_step_advantage_reaches_the_update():
    """Every episode won (zero episode advantage), but one reached the goal a step later: only GiGPO's
    step term, comparing the two steps taken on the same first observation, moves the weights."""
    samples = [StepSample([5, 6, 7], [8, 2], 10.0, episode_id=0, step=0, anchor="s", env_reward=10.0),
               StepSample([5, 6, 7], [9, 9, 2], 10.0, episode_id=1, step=0, anchor="s"),
               StepSample([5, 6, 7, 4], [10, 2], 10.0, episode_id=1, step=1, anchor="t", env_reward=10.0)]
    norms = {}
    for mode in ("none", "mean_std"):
        cfg = rl.rl_config("d3llm_v2", step_advantage=mode, **FAST)
        model = tiny("sdar")
        m = rl.rl_step(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, cfg)
        norms[mode] = m["grad_norm_max"]
        assert m["frac_reward_zero_std"] == 1.0
    assert norms["none"] == 0.0 and norms["mean_std"] > 0.0
    assert m["anchor/frac_grouped"] == pytest.approx(2 / 3) and m["adv/step_abs_mean"] > 0


def test_old_and_current_share_draws_ratio_exactly_one():
    model = tiny("sdar")
    b = rl.batch_tokens([[5, 6, 7], [5]], [[8, 9, 2], [10, 11, 12, 2]], 0)
    for est, scheme in (("sdar_block", "stratified"), ("sdar_block", "coupled"), ("mean_field", "mean_field")):
        md = rl.draw_masks(b, scheme, 2, [(0, 0, 0, 0, 0), (0, 0, 1, 0, 0)], 0.15)
        with torch.no_grad():
            old = rl.seq_logp(model, b, est, md)
        cur = rl.seq_logp(model, b, est, md)
        assert torch.equal(cur.draw.detach(), old.draw) and torch.equal(cur.tok.detach(), old.tok)


@pytest.mark.parametrize("algo", ["d3llm_v2", "d1"])
def test_micro_batching_keeps_the_global_normalisation(algo):
    grads = []
    for micro in (1, 4):
        model = tiny("sdar")
        cfg = rl.rl_config(algo, kl="none", epochs=1, minibatch=4, micro_batch=micro)
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        before = [p.detach().clone() for p in model.parameters()]
        rl.rl_step(model, opt, group(), cfg, grad_clip=0.0)
        grads.append(torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())]))
    assert grads[0].abs().max() > 0
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("algo", ["d3llm_v2", "grpo"])
def test_rank_split_gradients_sum_to_one_process(algo):
    family = "qwen3" if algo == "grpo" else "sdar"
    deltas = []
    for rank, world in ((0, 1), (0, 2), (1, 2)):
        model = tiny(family)
        cfg = rl.rl_config(algo, kl="none", epochs=1, minibatch=4, micro_batch=1)
        before = [p.detach().clone() for p in model.parameters()]
        rl.rl_step(model, torch.optim.SGD(model.parameters(), lr=1.0), group(), cfg, grad_clip=0.0,
                   rank=rank, world=world)
        deltas.append(torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())]))
    assert torch.allclose(deltas[1] + deltas[2], deltas[0], atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="divisible by the world size"):
        rl.rl_step(tiny(family), torch.optim.SGD(tiny(family).parameters(), lr=1.0), group(n=3), cfg, world=2)


@pytest.mark.parametrize("algo", ["d3llm_v2", "d1", "grpo"])
def test_score_action_credits_the_action_given_the_think_text(algo):
    """rl.score "action" is rl.score "all" on samples whose think text (think_len tokens) was moved into
    the prompt: the same update, exactly. A response without an action (think_len = its length) or
    without think text stays whole."""
    family = "qwen3" if algo == "grpo" else "sdar"
    resps = [[8, 9, 10, 11, 2], [9, 8, 12, 2], [10, 11, 2], [11, 10, 13, 14, 2]]
    think = [2, 1, 3, 0]  # sample 2: no action tag (think_len = len), sample 3: no think text
    deltas = []
    for score, moved in (("action", False), ("all", True)):
        samples = []
        for i, (r, t) in enumerate(zip(resps, think)):
            c = t if 0 < t < len(r) else 0
            samples.append(StepSample([5, 6, 7] + r[:c], r[c:], float(i == 1), episode_id=i) if moved else
                           StepSample([5, 6, 7], r, float(i == 1), episode_id=i, think_len=t))
        model = tiny(family)
        cfg = rl.rl_config(algo, kl="none", epochs=1, minibatch=4, micro_batch=2, score=score)
        before = [p.detach().clone() for p in model.parameters()]
        m = rl.rl_step(model, torch.optim.SGD(model.parameters(), lr=1.0), samples, cfg, grad_clip=0.0)
        deltas.append(torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters())]))
        assert m["resp_len"] == pytest.approx((3 + 3 + 3 + 5) / 4)
    assert deltas[0].abs().max() > 0
    torch.testing.assert_close(deltas[0], deltas[1], atol=1e-7, rtol=1e-5)
    with pytest.raises(ValueError, match="rl.score"):
        rl.credited(samples, "think")


def test_rollout_old_logp_and_config_errors():
    model = tiny("qwen3")
    samples = group()
    old = []
    with torch.no_grad():
        for s in samples:
            x = torch.tensor([s.prompt_ids + s.response_ids])
            lsm = model(x)[0].log_softmax(-1)
            P = len(s.prompt_ids)
            old.append([float(lsm[P + k - 1, t]) for k, t in enumerate(s.response_ids)])
    cfg = rl.rl_config("grpo", kl="none", **FAST)
    m = rl.rl_step(model, torch.optim.Adam(model.parameters(), lr=1e-3), samples, cfg, old_logp=old)
    assert m["noise0"] < 1e-5 and "fwd_rows/old" not in m
    for s in samples:  # rl.score "action": the rollout's log-probs of the action tokens are the ones kept
        s.think_len = 1
    fresh = tiny("qwen3")  # the model old was computed with (the update above moved `model`)
    m = rl.rl_step(fresh, torch.optim.Adam(fresh.parameters(), lr=1e-3), samples,
                   rl.rl_config("grpo", kl="none", score="action", **FAST), old_logp=old)
    assert m["noise0"] < 1e-5 and m["resp_len"] == 2
    with pytest.raises(ValueError, match="needs ref_model"):
        rl.rl_step(model, torch.optim.Adam(model.parameters()), samples, rl.rl_config("grpo"))
    with pytest.raises(ValueError, match="does not fit model.family"):
        rl.rl_step(tiny("sdar"), torch.optim.Adam(model.parameters()), samples, rl.rl_config("grpo", kl="none"))


def test_bd_per_row_start_scores_each_row_as_if_alone():
    """bd scoring with one noisy start per row (the prompt lengths differ by several blocks) gives
    every response token the log-prob and entropy it gets when its row is scored alone, for one
    canvas and for C mask copies, and 0 before each row's start."""
    model = tiny("sdar", block=4)
    g = torch.Generator().manual_seed(3)
    prompts = [list(torch.randint(4, 16, (k,), generator=g)) for k in (3, 13, 22)]
    resps = [[11, 12, 2], [13, 14, 15, 10, 12, 2], [9, 2]]
    b = rl.batch_tokens([[int(t) for t in q] for q in prompts], resps, 0)
    masked, _ = rl.corrupt_iid(b, torch.Generator().manual_seed(1), copies=2)
    canvas = torch.where(masked, 3, b.ids[:, None])  # [B, 2, n]
    with torch.no_grad():
        for cv in (canvas, canvas[:, 1]):
            lp, ent = rl.score(model, b.ids, cv, b.lengths, "bd", b.prompt_len, entropy=True)
            for r in range(3):
                L, P = int(b.lengths[r]), int(b.prompt_len[r])
                one, e1 = rl.score(model, b.ids[r:r + 1, :L], cv[r:r + 1, ..., :L], b.lengths[r:r + 1], "bd", P,
                                   entropy=True)
                assert torch.allclose(lp[r, ..., :L], one[0], atol=1e-5)
                assert torch.allclose(ent[r, ..., :L], e1[0], atol=1e-5)
                assert (lp[r, ..., :P] == 0).all() and (lp[r, ..., P:L] != 0).all()


# ----------------------------------------------------------------------------- the trace estimator
@pytest.mark.parametrize("tau, order, lengths, new", [
    (0.6, "confidence", (5, 9, 1, 13), 11),  # parallel commits; every last block ends with the response
    (0.3, "left", (5, 9, 1, 13), 11),
    (1.0, "left", (5, 8, 3, 6), 12),         # one token a forward: the rest of the last block is masks
])
def test_trace_estimator_is_the_decoders_own_logp(tau, order, lengths, new):
    """sdar_trace scores each token in the canvas the decoder committed it from: at temperature 1 its
    per-token terms equal log(confidence at commit) from generate(), prompts of ragged lengths whose
    first response block is shared with the prompt, parallel commits included."""
    from d3mini.config import DecodeConfig
    from d3mini.decode import generate
    model = tiny(block=4, seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)  # peaked predictions: some tokens commit in parallel
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(4, 16, (n,), generator=g).tolist() for n in lengths]
    res = generate(model, prompts, DecodeConfig(block_size=4, threshold=tau, order=order, temperature=1.0,
                                                max_new_tokens=new, stop_ids=[], seed=1))
    if tau < 1.0:
        assert any(len(set(t)) < len(t) for t in res.trace)  # some forward committed several tokens
    batch = rl.batch_tokens(prompts, res.tokens, pad_id=0)
    draws = rl.trace_masks(batch, res.trace, block_size=4)
    assert ((draws.weight > 0).sum(1) == batch.resp).all()  # every response token scored exactly once
    with torch.no_grad():
        est = rl.seq_logp(model, batch, "sdar_trace", draws, entropy=False)
    for i, conf in enumerate(res.confidence):
        P = len(prompts[i])
        got = est.tok[i, P:P + len(conf)]
        torch.testing.assert_close(got, torch.tensor(conf).log(), atol=1e-4, rtol=1e-4)
        assert float(est.seq[i]) == pytest.approx(float(torch.tensor(conf).log().mean()), abs=1e-4)


def test_trace_estimator_copies_and_errors():
    b = rl.batch_tokens([[5, 6, 7], [5]], [[8, 9, 10, 11, 12], [8, 9]], pad_id=0)
    # sample 0: positions 3..7, block 4 -> block 0 holds position 3 (step 0), block 1 positions 4..7
    dr = rl.trace_masks(b, [[0, 1, 2, 3, 1], [4, 4]], block_size=4)  # block 1 steps: 1 -> 0, 2 -> 1, 3 -> 2
    assert dr.masked.shape == (2, 3, 8)
    assert dr.masked[0, :, 3:8].int().tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 0, 1, 0]]
    assert dr.weight[0, :, 3:8].tolist() == [[3, 3, 0, 0, 3], [0, 0, 3, 0, 0], [0, 0, 0, 3, 0]]
    assert dr.masked[1, :, 1:3].int().tolist() == [[1, 1], [0, 0], [0, 0]]
    dr = rl.trace_masks(b, [[0, 1, 2, 3, 1], [4, 4]], block_size=4, shrink=2)  # steps {0, 1} -> copy 0, {2} -> 1
    assert dr.masked[0, :, 3:8].int().tolist() == [[1, 1, 1, 1, 1], [0, 0, 0, 1, 0]]
    assert dr.weight[0, :, 3:8].tolist() == [[2, 2, 2, 0, 2], [0, 0, 0, 2, 0]]
    with pytest.raises(ValueError, match="trace_shrink = 0"):
        rl.trace_masks(b, [[0, 1, 2, 3, 1], [4, 4]], block_size=4, shrink=0)
    with pytest.raises(ValueError, match="decode trace of 1 entries"):
        rl.trace_masks(b, [[0, 1, 2, 3, 1], [4]], block_size=4)
    with pytest.raises(ValueError, match="needs an SDAR model"):
        rl.resolve_estimator(RLConfig(estimator="sdar_trace"), "llada")
    with pytest.raises(ValueError, match="from the decode trace"):
        rl.resolve_estimator(RLConfig(estimator="sdar_trace", mask_scheme="stratified"), "sdar")


def test_rl_step_with_the_trace_estimator():
    """A d3llm_v2 update scored on the rollout's trace: old and current agree before the update (noise0 0),
    the rewarded response gains log-likelihood, micro-batching leaves the update unchanged, and samples
    without a trace (expert ones) or with the think text credited apart are refused."""
    samples = group()
    for s, tr in zip(samples, ([0, 1, 2], [0, 0, 1], [1, 1, 1], [0, 1, 1])):  # block 1 (positions 4, 5): 2 steps at most
        s.trace = tr
    deltas = []
    for micro in (1, 4):
        model = tiny("sdar")
        cfg = rl.rl_config("d3llm_v2", estimator="sdar_trace", epochs=1, minibatch=4, micro_batch=micro)
        prompts, resps = [s.prompt_ids for s in samples], [s.response_ids for s in samples]
        b = rl.batch_tokens(prompts, resps, 0)
        dr = rl.trace_masks(b, [s.trace for s in samples], model.cfg.block_size)
        with torch.no_grad():
            before = rl.seq_logp(model, b, "sdar_trace", dr).seq
        params0 = [p.detach().clone() for p in model.parameters()]
        m = rl.rl_step(model, torch.optim.SGD(model.parameters(), lr=0.5), samples, cfg, grad_clip=0.0)
        with torch.no_grad():
            after = rl.seq_logp(model, b, "sdar_trace", dr).seq
        assert m["noise0"] < 1e-5 and m["mc_draws"] == 2 and m["est/draw_std"] == 0.0
        assert after[0] - before[0] > 0.01 and (after[1:] - before[1:]).max() < after[0] - before[0]
        deltas.append(torch.cat([(a - p.detach()).flatten() for a, p in zip(params0, model.parameters())]))
    assert torch.allclose(deltas[0], deltas[1], atol=1e-6, rtol=1e-4)
    model = tiny("sdar")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    samples[1].trace = None
    with pytest.raises(ValueError, match="expert samples have no trace"):
        rl.rl_step(model, opt, samples, cfg)
    samples[1].trace = [0, 0, 1]
    for s in samples:
        s.think_len = 1
    with pytest.raises(ValueError, match="set rl.score = all"):
        rl.rl_step(model, opt, samples, rl.rl_config("d3llm_v2", estimator="sdar_trace", score="action"))
