"""generate() against naive full-recompute decoders, transformers' AR generate, and rule invariants."""
import copy
import inspect
import math
import os
from collections import Counter
from dataclasses import replace

import pytest
import torch

import d3mini.decode as decode
from d3mini.config import DecodeConfig, ModelConfig
from d3mini.decode import _propose, _schedule, _select, generate
from d3mini.model import DiffusionLM

transformers = pytest.importorskip("transformers")
torch.set_num_threads(2)
MASK, STOP = 3, [2, 0]


def cache_kw(h) -> str:
    """The keyword transformers' forward takes the cache under: `cache` in recent 5.x, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(h.forward).parameters else "past_key_values"


def tiny_cfg(family="sdar", block=4):
    return ModelConfig(init_std=0.3, family=family, vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
                       num_heads=4, num_kv_heads=4 if family == "llada" else 2, head_dim=16,
                       rope_theta=5e5 if family == "llada" else 1e6, rms_norm_eps=1e-5 if family == "llada" else 1e-6,
                       qk_norm=family != "llada", block_size=block, mask_id=MASK, eos_ids=STOP, pad_id=0)


def tiny_model(family="sdar", block=4, seed=0, scale=3.0, eos_bias=0.0):
    """A random model whose predictions depend on the context (init std 0.3) and are peaked (LM head
    x3): confidences spread over (0, 1], median ~0.85, so thresholds 0.5..0.95 commit differently."""
    torch.manual_seed(seed)
    m = DiffusionLM.from_config(tiny_cfg(family, block))
    with torch.no_grad():
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
        m.lm_head.weight.mul_(scale)
        m.lm_head.weight[STOP[0]].mul_(1.0 + eos_bias)  # make stops happen now and then
    return m.eval()


def rand_prompts(lengths, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(4, 128, (n,), generator=g).tolist() for n in lengths]


def cut(seq, stop):
    for i, t in enumerate(seq):
        if t in stop:
            return seq[:i + 1]
    return seq


# ----------------------------------------------------------------------------- naive references
@torch.no_grad()
def naive_sdar(model, prompt, K, steps, tau, rule, G, stop, order="confidence"):
    """Official block_diffusion_generate (models.md §3.2) without any cache: the whole canvas is
    recomputed with the block-causal mask every step; k clamped to the masks left (§10 fix).
    order "left": the k forced picks are the leftmost masks, plus (threshold rule) every p > tau.
    rule "prefix": the k leftmost masks, then the masks after them, left to right, while p > tau."""
    P = len(prompt)
    L = math.ceil((P + G) / K) * K
    x = torch.full((1, L), MASK)
    x[0, :P] = torch.tensor(prompt)
    todo = torch.zeros(L, dtype=torch.bool)
    todo[P:] = True
    trace, conf, nfe = [-1] * L, [0.0] * L, 0
    sched = [K // steps + (s < K % steps) for s in range(steps)]
    for b in range(P // K, L // K):
        lo, hi = b * K, (b + 1) * K
        for s in range(steps):
            m = todo[lo:hi]
            if not m.any():
                break
            probs = torch.softmax(model(x)[0, lo:hi].double(), -1)
            p, x0 = probs.max(-1)
            k = min(sched[s], int(m.sum()))
            c = torch.where(m, p, torch.tensor(-math.inf, dtype=p.dtype))
            sel = torch.zeros(K, dtype=torch.bool)
            above = m & (p > tau)
            if rule == "prefix":  # the k leftmost masks, then each next mask while it is above tau
                sel[m.nonzero()[:k, 0]] = True
                for j in range(K):
                    if m[j] and not sel[j]:
                        if not above[j]:
                            break
                        sel[j] = True
            elif order == "left":
                sel[m.nonzero()[:k, 0]] = True
                sel |= above if rule == "threshold" else sel
            elif rule == "threshold" and int(above.sum()) >= k:
                sel = above
            else:
                sel[torch.topk(c, k).indices] = True
            for j in sel.nonzero()[:, 0].tolist():
                x[0, lo + j], todo[lo + j], trace[lo + j], conf[lo + j] = x0[j], False, nfe, float(p[j])
            nfe += 1
        if any(t in stop for t in x[0, P:hi].tolist()):
            break
    toks = cut(x[0, P:P + G].tolist(), stop)
    return toks, trace[P:P + len(toks)], conf[P:P + len(toks)], nfe


@torch.no_grad()
def naive_llada(model, prompt, K, steps, tau, rule, G, stop):
    """LLaDA generate.py (models.md §6.1): full forward over the whole canvas every step, low-confidence
    remasking inside the current block; threshold = Fast-dLLM (top-1 + every p > tau, §7.1)."""
    P = len(prompt)
    x = torch.full((1, P + G), MASK)
    x[0, :P] = torch.tensor(prompt)
    todo = torch.zeros(P + G, dtype=torch.bool)
    todo[P:] = True
    trace, nfe = [-1] * (P + G), 0
    for b in range(G // K):
        lo, hi = P + b * K, P + (b + 1) * K
        sched = [1] * K if rule in ("threshold", "prefix") else [K // steps + (s < K % steps) for s in range(steps)]
        for k in sched:
            if not todo[lo:hi].any():
                break
            probs = torch.softmax(model(x, attn="full")[0].double(), -1)
            p, x0 = probs.max(-1)
            c = torch.where(todo, p, torch.tensor(-math.inf, dtype=p.dtype))
            c[:lo], c[hi:] = -math.inf, -math.inf
            sel = torch.zeros(P + G, dtype=torch.bool)
            if rule == "prefix":  # the leftmost mask, then the next ones while above tau
                for j in todo[lo:hi].nonzero()[:, 0].tolist():
                    if sel[lo:hi].any() and not c[lo + j] > tau:
                        break
                    sel[lo + j] = True
            else:
                sel[torch.topk(c, min(k, int(todo[lo:hi].sum()))).indices] = True
            if rule == "threshold":
                sel |= c > tau
            for j in sel.nonzero()[:, 0].tolist():
                x[0, j], todo[j], trace[j] = x0[j], False, nfe
            nfe += 1
        if any(t in stop for t in x[0, P:hi].tolist()):
            break
    toks = cut(x[0, P:].tolist(), stop)
    return toks, trace[P:P + len(toks)], nfe


def hf_twin(model):
    """transformers model with the same weights (Qwen3 for sdar/qwen3, Llama for llada)."""
    c = model.cfg
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size, intermediate_size=c.intermediate_size,
              num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              head_dim=c.head_dim, rope_theta=c.rope_theta, rms_norm_eps=c.rms_norm_eps,
              tie_word_embeddings=False, attention_bias=False, eos_token_id=STOP, pad_token_id=1)
    if c.family == "llada":
        hc, cls = transformers.LlamaConfig(mlp_bias=False, **kw), transformers.LlamaForCausalLM
    else:
        hc, cls = transformers.Qwen3Config(**kw), transformers.Qwen3ForCausalLM
    h = cls._from_config(copy.deepcopy(hc), attn_implementation="sdpa").eval()
    h.load_state_dict(model.state_dict())
    return h


@torch.no_grad()
def naive_llada_prefix_cache(h, prompt, K, tau, rule, steps, G, stop):
    """Fast-dLLM generate_with_prefix_cache (models.md §7.1) on transformers' Llama with a
    DynamicCache: a full forward per block, cache cropped to the block start, then suffix forwards."""
    P = len(prompt)
    L = P + G
    x = torch.full((1, L), MASK)
    x[0, :P] = torch.tensor(prompt)
    todo = torch.zeros(L, dtype=torch.bool)
    todo[P:] = True
    nfe = 0
    for b in range(G // K):
        lo, hi = P + b * K, P + (b + 1) * K
        sched = [1] * K if rule == "threshold" else [K // steps + (s < K % steps) for s in range(steps)]
        prefix = None
        for s, k in enumerate(sched):
            if not todo[lo:hi].any():
                break
            if s == 0:
                cache = transformers.DynamicCache(config=h.config)
                out = h(x, attention_mask=torch.ones(1, 1, L, L, dtype=torch.bool), position_ids=torch.arange(L)[None],
                        **{cache_kw(h): cache}, use_cache=True)
                logits = out.logits[0, lo:hi]
                cache.crop(-(L - lo))
                prefix = cache
            else:
                c = copy.deepcopy(prefix)
                out = h(x[:, lo:], attention_mask=torch.ones(1, 1, L - lo, L, dtype=torch.bool),
                        position_ids=torch.arange(lo, L)[None], cache=c, use_cache=True)
                logits = out.logits[0, :K]
            p, x0 = torch.softmax(logits.double(), -1).max(-1)
            m = todo[lo:hi]
            cc = torch.where(m, p, torch.tensor(-math.inf, dtype=p.dtype))
            sel = torch.zeros(K, dtype=torch.bool)
            sel[torch.topk(cc, min(k, int(m.sum()))).indices] = True
            if rule == "threshold":
                sel |= m & (p > tau)
            for j in sel.nonzero()[:, 0].tolist():
                x[0, lo + j], todo[lo + j] = x0[j], False
            nfe += 1
        if any(t in stop for t in x[0, P:hi].tolist()):
            break
    return cut(x[0, P:].tolist(), stop), nfe


# ----------------------------------------------------------------------------- SDAR
@pytest.mark.parametrize("K", [1, 4, 8])
@pytest.mark.parametrize("tau", [0.5, 0.9, 0.95, 1.0])
def test_sdar_matches_naive_single_and_ragged_batch(K, tau):
    m = tiny_model("sdar", K, eos_bias=0.3)
    G = 12 if K == 1 else 20
    prompts = rand_prompts([5, 11, 3, 16], seed=K)
    cfg = DecodeConfig(block_size=K, threshold=tau, max_new_tokens=G)
    batch = generate(m, prompts, cfg)
    for i, pr in enumerate(prompts):
        toks, trace, conf, nfe = naive_sdar(m, pr, K, K, tau, "threshold", G, STOP)
        alone = generate(m, [pr], cfg)
        for r, j in ((alone, 0), (batch, i)):
            assert r.tokens[j] == toks and r.trace[j] == trace and r.nfe_denoise[j] == nfe
            assert r.nfe_total[j] == nfe + (len(pr) >= K)
            assert r.confidence[j] == pytest.approx(conf, abs=1e-5)
            assert r.n_generated[j] == len(toks) and r.stopped[j] == (toks[-1] in STOP)


def test_sdar_non_trivial_setting():
    """The tiny model really exercises the rule: stops happen, and tau changes what is committed."""
    m = tiny_model("sdar", 4, eos_bias=0.3)
    prompts = rand_prompts([5, 11, 3, 16], seed=4)
    rs = {t: generate(m, prompts, DecodeConfig(block_size=4, threshold=t, max_new_tokens=20)) for t in (0.5, 1.0)}
    assert any(rs[1.0].stopped) and not all(rs[1.0].stopped)
    assert rs[0.5].totals()["tpf_denoise"] > 1.5 * rs[1.0].totals()["tpf_denoise"]


@pytest.mark.parametrize("steps", [2, 3])
def test_sdar_fewer_steps_and_static_rule(steps):
    m = tiny_model("sdar", 4)
    prompts = rand_prompts([6, 9], seed=7)
    for rule, tau in (("static", 0.9), ("threshold", 0.9)):
        r = generate(m, prompts, DecodeConfig(block_size=4, steps_per_block=steps, rule=rule, threshold=tau,
                                              max_new_tokens=16))
        for i, pr in enumerate(prompts):
            toks, trace, _, nfe = naive_sdar(m, pr, 4, steps, tau, rule, 16, STOP)
            assert r.tokens[i] == toks and r.trace[i] == trace and r.nfe_denoise[i] == nfe


@pytest.mark.parametrize("tau", [1.0, 0.9])
def test_left_order_matches_naive_and_decodes_left_to_right_at_tau_one(tau):
    m = tiny_model("sdar", 4, eos_bias=0.3)
    prompts = rand_prompts([5, 11, 3, 16], seed=2)
    cfg = DecodeConfig(block_size=4, threshold=tau, max_new_tokens=20, order="left")
    r = generate(m, prompts, cfg)
    conf_order = generate(m, prompts, DecodeConfig(block_size=4, threshold=tau, max_new_tokens=20))
    assert r.tokens != conf_order.tokens or r.trace != conf_order.trace  # the order changes the decode
    for i, pr in enumerate(prompts):
        toks, trace, conf, nfe = naive_sdar(m, pr, 4, 4, tau, "threshold", 20, STOP, order="left")
        assert r.tokens[i] == toks and r.trace[i] == trace and r.nfe_denoise[i] == nfe
        if tau == 1.0:  # one token per forward, in position order
            assert r.trace[i] == sorted(r.trace[i]) and len(set(r.trace[i])) == len(r.trace[i])
    with pytest.raises(ValueError, match="decode.order"):
        generate(m, prompts, DecodeConfig(block_size=4, order="random"))


@pytest.mark.parametrize("family", ["sdar", "llada"])
def test_prefix_rule_matches_naive_and_commits_left_to_right(family):
    """rule "prefix": the committed part of a block is always a prefix of it (a token never commits
    while a mask is left before it), so within a block the trace never decreases along positions."""
    m = tiny_model(family, 4, eos_bias=0.3)
    prompts = rand_prompts([5, 11, 3, 16], seed=2)
    naive = naive_sdar if family == "sdar" else naive_llada
    differs = False
    for tau in (0.9, 0.5, 0.2):
        cfg = DecodeConfig(block_size=4, threshold=tau, max_new_tokens=20 if family == "sdar" else 16,
                           rule="prefix")
        r = generate(m, prompts, cfg)
        thr = generate(m, prompts, replace(cfg, rule="threshold", order="left"))
        differs |= r.trace != thr.trace  # the rule changes the decode
        if tau == 0.2:
            assert r.totals()["tpf_denoise"] > 1.5  # still parallel: runs of confident tokens commit together
        for i, pr in enumerate(prompts):
            toks, trace = naive(m, pr, 4, 4, tau, "prefix", cfg.max_new_tokens, STOP)[:2]
            assert r.tokens[i] == toks and r.trace[i] == trace
            off = (-len(pr)) % 4 if family == "sdar" else 0  # where the first full response block starts
            blocks = [r.trace[i][:off]] + [r.trace[i][j:j + 4] for j in range(off, len(trace), 4)]
            assert all(b == sorted(b) for b in blocks)
    assert differs
    at_one = dict(block_size=4, threshold=1.0, max_new_tokens=16)  # tau 1: both decode left to right
    assert (generate(m, prompts, DecodeConfig(rule="prefix", **at_one)).tokens
            == generate(m, prompts, DecodeConfig(order="left", **at_one)).tokens)


def test_tau_one_commits_one_token_per_forward_and_trace_consistency():
    m = tiny_model("sdar", 4)
    prompts = rand_prompts([4, 7, 12], seed=3)  # P + G multiple of K for row 0: every token is kept
    for tau in (1.0, 0.9, 0.5):
        r = generate(m, prompts, DecodeConfig(block_size=4, threshold=tau, max_new_tokens=16, stop_ids=[]))
        for i in range(len(prompts)):
            counts = Counter(r.trace[i])
            assert all(0 <= f < r.nfe_denoise[i] for f in counts)
            if len(prompts[i]) % 4 == 0:  # no decoded-but-dropped tokens: every forward shows up
                assert sorted(counts) == list(range(r.nfe_denoise[i]))
                assert sum(counts.values()) == 16
            if tau == 1.0:
                assert set(counts.values()) == {1}
            for f, n in counts.items():  # beyond the schedule's one token, only tokens above tau
                low = sum(1 for t, c in zip(r.trace[i], r.confidence[i]) if t == f and c <= tau)
                assert low <= 1 and n >= 1
            blocks = [r.trace[i][j:j + 4] for j in range(4 - len(prompts[i]) % 4, 16, 4)]
            assert all(max(a) < min(b) for a, b in zip(blocks, blocks[1:]))  # blocks decode in order
        if tau == 1.0:
            assert r.nfe_denoise[0] == 16 and r.tpf_denoise[0] == 1.0


def test_select_rule_equals_official_and_is_monotone_in_tau():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        K = int(torch.randint(1, 9, (1,), generator=g))
        masked = torch.rand(1, K, generator=g) < 0.7
        p = torch.rand(1, K, generator=g)
        k = int(torch.randint(1, K + 1, (1,), generator=g))
        prev = None
        for tau in (1.0, 0.9, 0.7, 0.3):
            sel = _select(masked, p, torch.tensor(k), torch.tensor(tau), "threshold")[0]
            n = min(k, int(masked.sum()))
            hi = masked[0] & (p[0] > tau)
            if int(hi.sum()) >= n:
                ref = hi
            else:
                ref = torch.zeros(K, dtype=torch.bool)
                ref[torch.topk(p[0].masked_fill(~masked[0], -1), n).indices] = True
            assert torch.equal(sel, ref) and not (sel & ~masked[0]).any()
            if prev is not None:
                assert (prev <= sel).all()  # lower tau never commits fewer tokens
            prev = sel
        for tau in (0.9, 0.3):  # prefix: the k leftmost masks, then each next mask while p > tau
            ref = torch.zeros(K, dtype=torch.bool)
            for n_sel, j in enumerate(masked[0].nonzero()[:, 0].tolist()):
                if n_sel >= k and not p[0, j] > tau:
                    break
                ref[j] = True
            assert torch.equal(_select(masked, p, torch.tensor(k), torch.tensor(tau), "prefix")[0], ref)
        static = _select(masked, p, torch.tensor(k), torch.tensor(0.0), "static")[0]
        assert int(static.sum()) == min(k, int(masked.sum()))
    assert _schedule(4, 4) == [1, 1, 1, 1] and _schedule(8, 3) == [3, 3, 2]


def test_finished_rows_parked_like_compiled_mode(monkeypatch):
    """Compiled mode keeps finished rows in the batch until half are done; same tokens."""
    m = tiny_model("sdar", 4, eos_bias=0.3)
    prompts = rand_prompts([5, 11, 3, 16, 2, 9], seed=4)
    ref = generate(m, prompts, DecodeConfig(block_size=4, threshold=0.9, max_new_tokens=20))
    monkeypatch.setattr(decode, "_step_fn", lambda compile: decode._block_step)
    r = generate(m, prompts, DecodeConfig(block_size=4, threshold=0.9, max_new_tokens=20, compile=True))
    assert r.tokens == ref.tokens and r.trace == ref.trace and r.nfe_denoise == ref.nfe_denoise
    assert any(ref.stopped) and not all(ref.stopped)
    c = dict(block_size=4, threshold=0.9, max_new_tokens=20, temperature=1.0, seed=1)
    monkeypatch.undo()
    sampled = generate(m, prompts, DecodeConfig(**c))
    monkeypatch.setattr(decode, "_step_fn", lambda compile: decode._block_step)
    assert generate(m, prompts, DecodeConfig(compile=True, **c)).tokens == sampled.tokens  # same noise per row


# ----------------------------------------------------------------------------- AR
def test_block_size_one_causal_equals_transformers_greedy_generate():
    m = tiny_model("qwen3", 1, eos_bias=0.3)
    h = hf_twin(m)
    prompts = rand_prompts([1, 6, 13], seed=5)
    G = 24
    r = generate(m, prompts, DecodeConfig(block_size=1, max_new_tokens=G))
    for i, pr in enumerate(prompts):
        out = h.generate(torch.tensor([pr]), max_new_tokens=G, do_sample=False, eos_token_id=STOP, pad_token_id=1)
        ref = cut(out[0, len(pr):].tolist(), STOP)
        assert r.tokens[i] == ref
        assert r.trace[i] == list(range(len(ref))) and r.nfe_denoise[i] == len(ref)
        assert r.nfe_total[i] == len(ref) + (len(pr) > 1)
    assert any(r.stopped)


# ----------------------------------------------------------------------------- LLaDA
@pytest.mark.parametrize("rule,tau,steps", [("static", 0.9, 4), ("static", 0.9, 2), ("threshold", 0.5, 4),
                                            ("threshold", 0.9, 4)])
def test_llada_matches_naive_and_ragged_batch(rule, tau, steps):
    m = tiny_model("llada", 4)
    prompts = rand_prompts([5, 9, 2], seed=1)
    cfg = DecodeConfig(block_size=4, steps_per_block=steps, rule=rule, threshold=tau, max_new_tokens=16)
    batch = generate(m, prompts, cfg)
    for i, pr in enumerate(prompts):
        toks, trace, nfe = naive_llada(m, pr, 4, steps, tau, rule, 16, STOP)
        alone = generate(m, [pr], cfg)
        for r, j in ((alone, 0), (batch, i)):
            assert r.tokens[j] == toks and r.trace[j] == trace and r.nfe_denoise[j] == r.nfe_total[j] == nfe


@pytest.mark.parametrize("rule,tau", [("static", 0.9), ("threshold", 0.7)])
def test_llada_prefix_cache_matches_fast_dllm_on_transformers(rule, tau):
    m = tiny_model("llada", 4)
    h = hf_twin(m)
    prompts = rand_prompts([6, 3], seed=2)
    cfg = DecodeConfig(block_size=4, rule=rule, threshold=tau, max_new_tokens=16, llada_prefix_cache=True)
    batch = generate(m, prompts, cfg)
    no_cache = generate(m, prompts, DecodeConfig(block_size=4, rule=rule, threshold=tau, max_new_tokens=16))
    for i, pr in enumerate(prompts):
        toks, nfe = naive_llada_prefix_cache(h, pr, 4, tau, rule, 4, 16, STOP)
        alone = generate(m, [pr], cfg)
        assert alone.tokens[0] == batch.tokens[i] == toks and batch.nfe_denoise[i] == nfe
    assert batch.tokens != no_cache.tokens  # the approximate cache is really in use


# ----------------------------------------------------------------------------- sampling, errors, compile
def test_sampler_distribution_and_filters():
    logits = torch.tensor([[[2.0, 1.0, 0.5, 0.0, -1.0]]]).expand(1, 20000, 5)
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(1, 20000, generator=g)
    x0, p = _propose(logits, 1.0, 0, 1.0, noise)
    freq = torch.bincount(x0.flatten(), minlength=5).float() / 20000
    assert (freq - logits[0, 0].softmax(-1)).abs().max() < 0.015
    assert torch.allclose(p, logits[0, 0].softmax(-1)[x0])  # p is read from the unfiltered softmax
    x0, p = _propose(logits, 0.5, 2, 1.0, noise)  # top-k = 2 at T = 0.5
    freq = torch.bincount(x0.flatten(), minlength=5).float() / 20000
    ref = torch.zeros(5)
    ref[:2] = (logits[0, 0, :2] / 0.5).softmax(-1)
    assert (freq - ref).abs().max() < 0.015
    assert torch.allclose(p, (logits[0, 0] / 0.5).softmax(-1)[x0])
    x0, _ = _propose(logits, 1.0, 0, 0.7, noise)  # top-p 0.7: {0, 1} hold 0.78 of the mass
    assert set(x0.flatten().tolist()) == {0, 1}
    ends = torch.tensor([[0.0, 1.0 - 2 ** -24]])  # the extreme uniforms never reach a filtered-out token
    x0, _ = _propose(torch.tensor([[[-1.0, 2.0, 0.0, 1.0, -3.0]]]).expand(1, 2, 5), 1.0, 2, 1.0, ends)
    assert x0.tolist() == [[3, 1]]  # u = 0: the last token with mass; u -> 1: the first


def test_seeded_sampling_reproducible_and_top1_equals_greedy():
    m = tiny_model("sdar", 4)
    prompts = rand_prompts([5, 9], seed=9)
    c = dict(block_size=4, threshold=0.9, max_new_tokens=16)
    a = generate(m, prompts, DecodeConfig(temperature=1.0, top_k=20, seed=3, **c))
    b = generate(m, prompts, DecodeConfig(temperature=1.0, top_k=20, seed=3, **c))
    other = generate(m, prompts, DecodeConfig(temperature=1.0, top_k=20, seed=4, **c))
    assert a.tokens == b.tokens and a.trace == b.trace and a.tokens != other.tokens
    greedy = generate(m, prompts, DecodeConfig(**c))
    top1 = generate(m, prompts, DecodeConfig(temperature=1.0, top_k=1, seed=5, **c))
    assert top1.tokens == greedy.tokens and top1.trace == greedy.trace  # confidence not from the filtered dist
    ll = tiny_model("llada", 4)
    la = generate(ll, prompts, DecodeConfig(temperature=0.8, top_p=0.9, seed=1, **c))
    lb = generate(ll, prompts, DecodeConfig(temperature=0.8, top_p=0.9, seed=1, **c))
    assert la.tokens == lb.tokens


def test_result_text_totals_and_errors():
    m = tiny_model("sdar", 4, eos_bias=0.3)
    prompts = rand_prompts([5, 8], seed=4)

    class Tok:
        def decode(self, ids):
            return " ".join(map(str, ids))

    r = generate(m, prompts, DecodeConfig(block_size=4, max_new_tokens=20), tokenizer=Tok())
    counted = [n - s for n, s in zip(r.n_generated, r.stopped)]
    assert r.text == [" ".join(map(str, t[:c])) for t, c in zip(r.tokens, counted)]
    tot = r.totals()
    assert tot["tpf_denoise"] == sum(counted) / sum(r.nfe_denoise)
    assert tot["tpf_total"] == sum(counted) / sum(r.nfe_total)
    fixed = generate(m, prompts, DecodeConfig(block_size=4, max_new_tokens=20, cache_len=64))
    assert fixed.tokens == r.tokens and fixed.trace == r.trace
    with pytest.raises(ValueError, match="cache_len = 16 < 28"):
        generate(m, prompts, DecodeConfig(block_size=4, max_new_tokens=20, cache_len=16))
    with pytest.raises(ValueError, match="block_size = 8 must equal"):
        generate(m, prompts, DecodeConfig(block_size=8))
    with pytest.raises(ValueError, match="non-empty"):
        generate(m, [[]], DecodeConfig(block_size=4))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        generate(m, [[500]], DecodeConfig(block_size=4))
    with pytest.raises(ValueError, match="set it to 1"):
        generate(tiny_model("qwen3", 1), prompts, DecodeConfig(block_size=4))
    with pytest.raises(ValueError, match="multiple of decode.block_size"):
        generate(tiny_model("llada", 4), prompts, DecodeConfig(block_size=4, max_new_tokens=10))


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("D3MINI_SLOW"), reason="torch.compile on CPU takes minutes; set D3MINI_SLOW=1")
def test_compiled_step_equals_eager():
    m = tiny_model("sdar", 4, eos_bias=0.3)
    prompts = rand_prompts([5, 11], seed=4)
    c = dict(block_size=4, threshold=0.9, max_new_tokens=12)
    eager = generate(m, prompts, DecodeConfig(**c))
    comp = generate(m, prompts, DecodeConfig(compile=True, **c))
    assert comp.tokens == eager.tokens and comp.trace == eager.trace
    sampled = [generate(m, prompts, DecodeConfig(temperature=1.0, seed=2, compile=cc, **c)).tokens for cc in (0, 1)]
    assert sampled[0] == sampled[1]
