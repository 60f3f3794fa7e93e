"""generate(): block diffusion with a static KV cache (SDAR; Qwen3 AR = block size 1) and
semi-autoregressive masked diffusion (LLaDA), with threshold / static commit rules, NFE/TPF
counts and the decode trace (reference/models.md §3, §4, §6.1, §7.1; metrics.md §1).

SDAR / AR loop, per sequence, with blocks aligned at absolute position 0 (prompt included):
    prefill  the full prompt blocks (AR: all prompt tokens but the last), K/V stored, no LM head
    block b  1..S denoising forwards of the K block tokens against the cache; each commits
             masked ∧ ((p > tau) ∨ rank(p) < k[s]) (threshold) or masked ∧ rank(p) < k[s] (static)
    fused    the first forward of block b+1 runs [final block b ; block b+1] and keeps block b's
             K/V, so the official extra "store" forward per block disappears (models.md §3.4).
             AR is the same with K = 1 where the committed token's row predicts the next one.
Rows of a batch keep their own positions, cache slots and masks, so a ragged batch decodes to
exactly what each prompt gives alone. Rows move in lockstep rounds (one block each); a row whose
block is finished idles until the round ends and is not charged for those forwards (metrics.md
§1.4). Finished rows leave the batch between rounds (eager: at once; compiled: when half are done,
so few batch shapes are compiled).

LLaDA: left-padded canvas [pad ; prompt ; G masks] with per-row positions (each prompt starts at
0) and key-padding masks; blocks of K over the generated region; static = LLaDA's low-confidence
remasking with its linear schedule, threshold = Fast-dLLM (top-1 plus every p > tau). With
`llada_prefix_cache` each block starts with one full forward that fills the cache, and later
steps forward only the canvas from the block start on against that fixed prefix (Fast-dLLM
PrefixCache). Committed tokens are never remasked; a row stops after the block holding a stop id.

Host syncs: one bool per denoising step (are masks left in this round?) outside the step
function, and one per block for the stop check. The step itself (forward, proposal, selection,
commit) is sync-free and fixed-shape, so `compile=True` runs it under torch.compile(fullgraph).
Confidence p is read from the unfiltered temperature-scaled softmax (T = 1 when greedy), never
from the top-k/top-p filtered one (models.md §10); sampling is inverse-CDF with one uniform per token.
TPF counts tokens without the stop id (metrics.md §1.2); nfe_total adds the prefill forward.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from d3mini.config import DecodeConfig
from d3mini.model import KVCache


@dataclass
class DecodeResult:
    tokens: list        # per sequence: generated ids, cut after the first stop id (included)
    text: Optional[list]  # tokenizer.decode(tokens without the stop id) when a tokenizer is given
    n_generated: list   # len(tokens) (the stop id included)
    stopped: list       # True when the sequence ended with a stop id (else it hit max_new_tokens)
    nfe_denoise: list   # denoising forwards this sequence took part in while it had masks left
    nfe_total: list     # nfe_denoise + the prefill forward (fused commit: no store forwards)
    tpf_denoise: list   # tokens without the stop id / nfe_denoise (metrics.md convention A / C)
    tpf_total: list     # tokens without the stop id / nfe_total (all forwards, prefill included)
    trace: list         # per token: 0-based index of this sequence's denoising forward that committed it
    confidence: list    # per token: p at commit (unfiltered temperature-scaled softmax)

    def totals(self) -> dict:
        """Batch aggregates as ratios of sums (metrics.md §1.1)."""
        counted = sum(n - int(s) for n, s in zip(self.n_generated, self.stopped))
        den, tot = sum(self.nfe_denoise), sum(self.nfe_total)
        return {"tokens": sum(self.n_generated), "counted_tokens": counted, "nfe_denoise": den,
                "nfe_total": tot, "tpf_denoise": counted / max(den, 1), "tpf_total": counted / max(tot, 1)}


# ----------------------------------------------------------------------------- commit rule
def _propose(logits, temperature: float, top_k: int, top_p: float, noise):
    """logits [B, K, V] -> x0 [B, K] proposals, p [B, K] confidence of x0 under softmax(logits / T).
    noise [B, K]: uniforms in [0, 1), one per token (unused when temperature = 0)."""
    logits = logits.float()
    if temperature == 0:
        x0 = logits.argmax(-1)
        p = torch.exp(logits.max(-1).values - logits.logsumexp(-1))
        return x0, p
    scaled = logits / temperature
    f = scaled
    if top_k > 0:
        kth = torch.topk(f, min(top_k, f.shape[-1]), dim=-1).values[..., -1:]
        f = f.masked_fill(f < kth, float("-inf"))
    if top_p < 1.0:
        srt, idx = torch.sort(f, dim=-1, descending=True)
        ps = srt.softmax(-1)
        drop = (ps.cumsum(-1) - ps) > top_p  # keep the smallest prefix whose mass reaches top_p
        f = f.masked_fill(torch.zeros_like(drop).scatter(-1, idx, drop), float("-inf"))
    # inverse CDF: the first token whose cumulative mass reaches u' * total, u' = 1 - u in (0, 1], so a
    # token of zero mass (filtered out) is never drawn; fixed-shape and sync-free. One uniform per token
    # instead of an Exponential race's B x K x V draws, whose noise took longer than the model's forward
    # at the tiny config's shapes (bench/sampler.py).
    cdf = f.softmax(-1).cumsum(-1)
    x0 = torch.searchsorted(cdf, ((1 - noise) * cdf[..., -1]).unsqueeze(-1)).squeeze(-1)
    x0 = x0.clamp(max=f.shape[-1] - 1)  # (1 - u) * total <= total, so only NaN logits would give V
    p = torch.exp(scaled.gather(-1, x0[..., None])[..., 0] - scaled.logsumexp(-1))
    return x0, p


def _select(masked, p, k, tau, rule: str, order: str = "confidence"):
    """masked, p [B, K] -> bool [B, K]. rank = position in descending p among masked tokens (ties:
    lower index first), so `rank < k` picks min(k, masks left) masked tokens: SDAR's top-k with the
    clamp fix; `p > tau` on top of it is exactly the low_confidence_dynamic rule (models.md §3.5).
    order "left" ranks the masked tokens by position instead: the k forced picks are the leftmost
    masks (at tau 1 the block is decoded left to right, one token per forward). Rule "prefix" is the
    threshold rule held to the left: the k leftmost masks, then each next mask only while p > tau, so
    a token never commits while a mask is left before it in its block (the committed text of a block
    is always a prefix of it)."""
    i = torch.arange(p.shape[1], device=p.device)
    if rule == "prefix":
        order = "left"
    key = -i.to(p.dtype).expand_as(p) if order == "left" else p
    c = key.masked_fill(~masked, -float(p.shape[1] + 1))  # [B, K]; unmasked tokens rank last
    ahead = (c[:, None, :] > c[:, :, None]) | ((c[:, None, :] == c[:, :, None]) & (i[None, :] < i[:, None]))
    sel = masked & (ahead.sum(-1) < k)  # ahead [B, Kj, Ki]: token i ranks before token j
    if rule == "threshold":
        sel = sel | (masked & (p > tau))
    elif rule == "prefix":  # only the run of p > tau that starts at the forced leftmost picks
        ok = ~masked | sel | (p > tau)
        sel = masked & (ok.long().cumprod(1) > 0)
    return sel


def _commit(st: dict, cur, logits, k, tau, noise, opt: tuple):
    """Commit into the state tensors at positions cur [B, K] from logits [B, K, V]; returns whether
    any alive row still has masks there (a 0-dim bool tensor, read by the caller)."""
    rule, temperature, top_k, top_p, order = opt
    x, todo, trace, conf, n_den = st["x"], st["todo"], st["trace"], st["conf"], st["n_den"]
    masked = todo.gather(1, cur) & st["alive"][:, None]
    x0, p = _propose(logits, temperature, top_k, top_p, noise)
    sel = _select(masked, p, k, tau, rule, order)
    x.scatter_(1, cur, torch.where(sel, x0, x.gather(1, cur)))
    todo.scatter_(1, cur, masked & ~sel)
    trace.scatter_(1, cur, torch.where(sel, n_den[:, None], trace.gather(1, cur)))
    conf.scatter_(1, cur, torch.where(sel, p, conf.gather(1, cur)))
    n_den.add_(masked.any(1).to(n_den.dtype))
    return (masked & ~sel).any()


def _block_step(model, cache, st: dict, k, tau, noise, K: int, fused: bool, ar: bool, opt: tuple):
    """One fixed-shape SDAR/AR denoising forward of every row's current block (plus, when fused, the
    previous, finished block whose K/V it stores)."""
    cur = st["blk"][:, None] * K + torch.arange(K, device=st["x"].device)  # [B, K] absolute positions
    if not fused:
        win = cur
    elif ar:
        win = cur - 1  # the last committed token predicts the next (shifted AR logits)
    else:
        win = torch.cat([cur - K, cur], 1)  # [B, 2K]
    win = win.clamp(min=0)  # only parked (finished, compiled-mode) rows can go below 0
    W, S = win.shape[1], cache.max_len
    slots = torch.arange(S, device=win.device)
    limit = (win // K + 1) * K  # block-causal: a query sees every slot before its block's end
    attn = (slots < limit[..., None]) | (slots == win[..., None])  # [B, W, S]
    logits = model(st["x"].gather(1, win), position_ids=win, attn=attn[:, None], cache=cache,
                   cache_pos=win, logits_rows=slice(W - K, W))  # [B, K, V]
    return _commit(st, cur, logits, k, tau, noise, opt)


class _DecodeCache(KVCache):
    """KVCache with the per-row write as index_put_ (buffer[b, :, pos_b] = k_b). Inductor updates it
    in place, while it lowers scatter_ out of place: every layer's whole K/V buffers copied and
    copied back on each compiled forward (~190 MB per forward at batch 8, prompt 256 + 256)."""

    def write(self, layer: int, k, v, pos):
        kb, vb = self.k[layer], self.v[layer]
        if pos.dim() == 1:
            pos = pos[None].expand(k.shape[0], -1)
        rows = torch.arange(k.shape[0], device=pos.device)[:, None]  # [B, 1]
        kb[rows, :, pos] = k.transpose(1, 2).to(kb.dtype)  # advanced dims first: value [B, L, Hkv, D]
        vb[rows, :, pos] = v.transpose(1, 2).to(vb.dtype)
        return kb, vb


_compiled = {}


def _step_fn(compile: bool):
    if not compile:
        return _block_step
    if "step" not in _compiled:
        import torch._dynamo
        # fused / plain x batch buckets x prompt shapes: allow more graphs than the default 8
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        _compiled["step"] = torch.compile(_block_step, fullgraph=True, dynamic=False)
    return _compiled["step"]


# ----------------------------------------------------------------------------- shared loop parts
def _schedule(K: int, steps: int) -> list:
    """Tokens per step: floor(K / steps), one more for the first K mod steps (SDAR §3.2.5, LLaDA §6.1)."""
    return [K // steps + (s < K % steps) for s in range(steps)]


def _noise(st: dict, batch: int, K: int, cfg: DecodeConfig, gen):
    """Uniform noise [B, K] for the rows still in the batch, drawn for the whole original batch so a
    row's samples do not depend on when other rows finished (eager vs compiled)."""
    if cfg.temperature == 0:
        return None
    full = torch.rand(batch, K, device=st["x"].device, generator=gen)
    return full[st["row"]]


def _keep(st: dict, cache: Optional[KVCache], idx) -> None:
    """Drop finished rows: keep rows idx of every state tensor and cache buffer."""
    for name in st:
        st[name] = st[name][idx]
    if cache is not None:
        cache.k = [t[idx] for t in cache.k]
        cache.v = [t[idx] for t in cache.v]


def _finish(st: dict, done: list, first: list, pre: list, G: int, stop: set, out: dict) -> None:
    """Copy finished rows to host results: out[original row] = (tokens, trace, conf, nfe_denoise,
    nfe_total, stopped). first / pre: per current row, first generated column and prefill forwards."""
    rows = [j for j, d in enumerate(done) if d]
    x, tr, cf, nd, orig = (st[n][rows].tolist() for n in ("x", "trace", "conf", "n_den", "row"))
    for r, j in enumerate(rows):
        toks = x[r][first[j]:first[j] + G]
        n = next((t + 1 for t, v in enumerate(toks) if v in stop), len(toks))
        seg = slice(first[j], first[j] + n)
        out[orig[r]] = (toks[:n], tr[r][seg], cf[r][seg], nd[r], nd[r] + pre[j], n > 0 and toks[n - 1] in stop)


# ----------------------------------------------------------------------------- SDAR / AR
def _generate_blocks(model, prompts, cfg: DecodeConfig, stop: set, dev, gen) -> dict:
    mc = model.cfg
    ar, K, G = mc.family == "qwen3", cfg.block_size, cfg.max_new_tokens
    if ar and K != 1:
        raise ValueError(f"decode.block_size = {K}: family qwen3 decodes autoregressively, set it to 1")
    if not ar and K != mc.block_size:
        raise ValueError(f"decode.block_size = {K} must equal the SDAR model's block_size = {mc.block_size}")
    B, P = len(prompts), [len(p) for p in prompts]
    S = max(-(-(p + G) // K) * K for p in P)  # whole blocks; slot s = absolute position s
    if cfg.cache_len and cfg.cache_len < S:
        raise ValueError(f"decode.cache_len = {cfg.cache_len} < {S} slots needed "
                         "(prompt + max_new_tokens in whole blocks)")
    S = cfg.cache_len or -(-S // 8) * 8
    x = torch.full((B, S), mc.mask_id, dtype=torch.long)
    todo = torch.zeros(B, S, dtype=torch.bool)
    for i, p in enumerate(prompts):
        x[i, :P[i]] = torch.tensor(p)
        todo[i, P[i]:-(-(P[i] + G) // K) * K] = True  # whole last block, as the official canvas
    st = {"x": x, "todo": todo, "blk": torch.tensor([p // K for p in P]), "alive": torch.ones(B, dtype=torch.bool),
          "n_den": torch.zeros(B, dtype=torch.long), "trace": torch.full((B, S), -1, dtype=torch.long),
          "conf": torch.zeros(B, S), "row": torch.arange(B), "P": torch.tensor(P)}
    st = {n: t.to(dev) for n, t in st.items()}
    dtype = next(model.parameters()).dtype
    cache = _DecodeCache(mc, B, S, dtype=dtype, device=dev)
    # prefill the full prompt blocks (AR: all but the last prompt token), K/V only
    pre = [p - 1 if ar else (p // K) * K for p in P]
    Lp = max(pre)
    if Lp > 0:
        pos = torch.arange(Lp, device=dev)
        lim = torch.minimum((pos[None] // K + 1) * K, torch.tensor(pre, device=dev)[:, None])  # [B, Lp]
        slots = torch.arange(S, device=dev)
        attn = (slots < lim[..., None]) | (slots == pos[None, :, None])  # [B, Lp, S]; pad rows see themselves
        model(st["x"][:, :Lp], position_ids=pos, attn=attn[:, None], cache=cache, cache_pos=pos,
              logits_rows=slice(0, 0))
    pre_fwd = [int(p > 0) for p in pre]
    steps = cfg.steps_per_block or K
    ks = [torch.tensor(k, device=dev) for k in _schedule(K, steps)]
    tau = torch.tensor(cfg.threshold, device=dev)
    stop_t = torch.tensor(sorted(stop) or [-1], device=dev)
    opt = (cfg.rule, cfg.temperature, cfg.top_k, cfg.top_p, cfg.order)
    step = _step_fn(cfg.compile)
    out, rnd, alive_h = {}, 0, [True] * B
    while True:
        for s in range(steps):
            fused = s == 0 and (ar or rnd > 0)
            noise = _noise(st, B, K, cfg, gen)
            left = step(model, cache, st, ks[s], tau, noise, K=K, fused=fused, ar=ar, opt=opt)
            if s < steps - 1 and not bool(left):  # one host sync per step: is the round over?
                break
        cur = st["blk"][:, None] * K + torch.arange(K, device=dev)  # [B, K]
        gen_cols = (cur >= st["P"][:, None]) & (cur < st["P"][:, None] + G)
        hit = (torch.isin(st["x"].gather(1, cur), stop_t) & gen_cols).any(1)
        done_t = st["alive"] & (hit | ((st["blk"] + 1) * K >= st["P"] + G))
        st["alive"] &= ~done_t
        st["blk"] += st["alive"].long()
        done = done_t.tolist()  # one host sync per block
        alive_h = [a and not d for a, d in zip(alive_h, done)]
        if any(done):
            _finish(st, done, st["P"].tolist(), [pre_fwd[r] for r in st["row"].tolist()], G, stop, out)
        n_alive, rows = sum(alive_h), len(alive_h)
        if n_alive == 0:
            return out
        if n_alive < rows and (not cfg.compile or n_alive <= rows // 2):
            _keep(st, cache, torch.tensor([j for j, a in enumerate(alive_h) if a], device=dev))
            alive_h = [True] * n_alive
        rnd += 1


# ----------------------------------------------------------------------------- LLaDA
def _generate_llada(model, prompts, cfg: DecodeConfig, stop: set, dev, gen) -> dict:
    mc, K, G = model.cfg, cfg.block_size, cfg.max_new_tokens
    if G % K:
        raise ValueError(f"decode.max_new_tokens = {G} must be a multiple of decode.block_size = {K} for llada")
    B, P = len(prompts), [len(p) for p in prompts]
    Pm = max(P)
    L = Pm + G
    pad = torch.tensor([Pm - p for p in P])
    x = torch.full((B, L), mc.mask_id, dtype=torch.long)
    for i, p in enumerate(prompts):
        x[i, Pm - P[i]:Pm] = torch.tensor(p)
    todo = torch.zeros(B, L, dtype=torch.bool)
    todo[:, Pm:] = True
    cols = torch.arange(L)
    st = {"x": x, "todo": todo, "alive": torch.ones(B, dtype=torch.bool), "n_den": torch.zeros(B, dtype=torch.long),
          "trace": torch.full((B, L), -1, dtype=torch.long), "conf": torch.zeros(B, L), "row": torch.arange(B),
          "pos": (cols[None] - pad[:, None]).clamp(min=0), "keyok": cols[None] >= pad[:, None]}
    st = {n: t.to(dev) for n, t in st.items()}
    eye = torch.eye(L, dtype=torch.bool, device=dev)
    dtype = next(model.parameters()).dtype
    cache = KVCache(mc, B, L, dtype=dtype, device=dev) if cfg.llada_prefix_cache else None
    if cfg.rule in ("threshold", "prefix"):  # Fast-dLLM: top-1 plus every p > tau, until the block is done
        ks = [1] * K
    else:
        ks = _schedule(K, cfg.steps_per_block or K)
    tau = torch.tensor(cfg.threshold, device=dev)
    opt = (cfg.rule, cfg.temperature, cfg.top_k, cfg.top_p, cfg.order)
    stop_t = torch.tensor(sorted(stop) or [-1], device=dev)
    out = {}
    for b in range(G // K):
        bs = Pm + b * K
        cur = torch.arange(bs, bs + K, device=dev)[None].expand(st["x"].shape[0], K)  # [B, K]
        full_attn = (st["keyok"][:, None, :] | eye)[:, None]  # [B, 1, L, L] key padding, pad rows see self
        for s, k in enumerate(ks):
            if cache is None:
                logits = model(st["x"], position_ids=st["pos"], attn=full_attn, logits_rows=slice(bs, bs + K))
            elif s == 0:  # block start: full forward refreshes every slot of the cache
                logits = model(st["x"], position_ids=st["pos"], attn=full_attn, cache=cache,
                               cache_pos=torch.arange(L, device=dev), logits_rows=slice(bs, bs + K))
            else:  # the suffix from the block start against the prefix K/V fixed at block start
                attn = st["keyok"][:, None, None, :].expand(-1, 1, L - bs, L)
                logits = model(st["x"][:, bs:], position_ids=st["pos"][:, bs:], attn=attn, cache=cache,
                               cache_pos=torch.arange(bs, L, device=dev), logits_rows=slice(0, K))
            noise = _noise(st, B, K, cfg, gen)
            left = _commit(st, cur, logits, k, tau, noise, opt)
            if s < len(ks) - 1 and not bool(left):
                break
        hit = torch.isin(st["x"][:, Pm:bs + K], stop_t).any(1)
        done_t = st["alive"] & (hit | (b == G // K - 1))
        st["alive"] &= ~done_t
        done = done_t.tolist()  # one host sync per block
        if any(done):
            _finish(st, done, [Pm] * len(done), [0] * len(done), G, stop, out)
            if all(done):
                break
            _keep(st, cache, torch.tensor([j for j, d in enumerate(done) if not d], device=dev))
    return out


# ----------------------------------------------------------------------------- entry point
@torch.no_grad()
def generate(model, prompts: list, cfg: DecodeConfig, tokenizer=None) -> DecodeResult:
    """Decode every prompt (a list of token ids) with `model` under `cfg`.

    stop_ids: None = the model's eos_ids; [] = never stop early. Batched rows give the same tokens
    as each prompt alone at temperature 0. compile=True compiles the SDAR/AR step (LLaDA runs eager).
    """
    mc = model.cfg
    if not prompts or any(not isinstance(p, (list, tuple)) or len(p) == 0 for p in prompts):
        raise ValueError("generate: prompts must be a non-empty list of non-empty token-id lists")
    bad = [t for p in prompts for t in p if not 0 <= int(t) < mc.vocab_size]
    if bad:
        raise ValueError(f"generate: prompt token id {bad[0]} outside the vocabulary [0, {mc.vocab_size})")
    if cfg.rule not in ("threshold", "static", "prefix"):
        raise ValueError(f"decode.rule = {cfg.rule!r}: must be threshold, static or prefix")
    if cfg.order not in ("confidence", "left"):
        raise ValueError(f"decode.order = {cfg.order!r}: must be confidence or left")
    steps = cfg.steps_per_block or cfg.block_size
    if not 0 < steps <= cfg.block_size:
        raise ValueError(f"decode.steps_per_block = {cfg.steps_per_block} must be <= "
                         f"decode.block_size = {cfg.block_size}")
    stop = set(mc.eos_ids if cfg.stop_ids is None else cfg.stop_ids)
    dev = next(model.parameters()).device
    gen = torch.Generator(device=dev).manual_seed(cfg.seed)
    prompts = [[int(t) for t in p] for p in prompts]
    run = _generate_llada if mc.family == "llada" else _generate_blocks
    out = run(model, prompts, cfg, stop, dev, gen)
    cols = list(zip(*[out[i] for i in range(len(prompts))]))
    tokens, trace, conf, nfe_d, nfe_t, stopped = (list(c) for c in cols)
    counted = [len(t) - int(s) for t, s in zip(tokens, stopped)]
    text = None
    if tokenizer is not None:
        text = [tokenizer.decode(t[:c]) for t, c in zip(tokens, counted)]
    return DecodeResult(tokens=tokens, text=text, n_generated=[len(t) for t in tokens], stopped=stopped,
                        nfe_denoise=nfe_d, nfe_total=nfe_t,
                        tpf_denoise=[c / max(n, 1) for c, n in zip(counted, nfe_d)],
                        tpf_total=[c / max(n, 1) for c, n in zip(counted, nfe_t)],
                        trace=trace, confidence=conf)
