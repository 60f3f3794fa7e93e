"""Decode benchmark: d3mini cached block diffusion vs naive recompute vs the official SDAR loop.

    python bench/decode.py                 # CPU, batch 1 and 8, prompt 256 + 256 new tokens
    python bench/decode.py --quick         # small shapes, a few seconds per row
    python bench/decode.py --device cuda --dtype bfloat16 --compile

Systems, all on the same random-weight SDAR-shaped model (~100M parameters), greedy, no stop ids
(every row decodes exactly --new tokens):
    (a) d3mini   generate(): static KV cache, fused commit, LM head only on denoised rows
    (b) naive    no cache: the whole canvas is recomputed every step (timed on the first
                 --naive-new tokens only; its per-forward cost does not depend on progress)
    (c) official the SDAR generate.py loop reproduced on transformers' Qwen3ForCausalLM with a
                 DynamicCache: full-logit prefill, per-step append + crop(-K) (store_kv=False),
                 a per-row Python commit loop, one extra KV-store forward per block. Its confidence
                 is read from the unfiltered softmax with k clamped (models.md §10), as in (a).
In float32 (a), (b) and (c) must produce the same tokens (asserted); in bf16 their numerics differ
and the share of equal tokens is printed. "fwd calls" counts batched model calls; TPF columns
are new tokens per call ("den" = denoising calls only, "all" = every call incl. prefill and
store); "TPF den per row" is (a)'s per-sequence ratio of sums (rows idle in a lockstep round are
not charged, metrics.md §1.4). A random model is almost never confident, so the bench raises the
init std (0.05) and scales the LM head (x8) until some tokens exceed tau = 0.95; the achieved
TPF is printed rather than assumed. Wall time includes the prefill; compile warm-up is excluded.
"""
from __future__ import annotations

import argparse
import copy
import inspect
import os
import platform
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from d3mini.config import DecodeConfig, ModelConfig  # noqa: E402
from d3mini.decode import generate  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402

MASK = 3


def build(args, device, dtype):
    cfg = ModelConfig(family="sdar", vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.inter,
                      num_layers=args.layers, num_heads=args.heads, num_kv_heads=args.kv_heads, head_dim=64,
                      block_size=args.block, mask_id=MASK, eos_ids=[2, 0], init_std=args.init_std)
    torch.manual_seed(0)
    m = DiffusionLM.from_config(cfg)
    with torch.no_grad():
        m.lm_head.weight.mul_(args.head_scale)
    return m.to(device=device, dtype=dtype).eval()


def cache_kw(h) -> str:
    """The keyword transformers' forward takes the cache under: `cache` in recent 5.x, `past_key_values` before."""
    return "cache" if "cache" in inspect.signature(h.forward).parameters else "past_key_values"


def hf_twin(m):
    import transformers
    c = m.cfg
    hc = transformers.Qwen3Config(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                                  intermediate_size=c.intermediate_size,
                                  num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                                  num_key_value_heads=c.num_kv_heads, head_dim=c.head_dim, rope_theta=c.rope_theta,
                                  rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=False, attention_bias=False)
    p = next(m.parameters())
    h = transformers.Qwen3ForCausalLM._from_config(copy.deepcopy(hc), attn_implementation="sdpa", dtype=p.dtype)
    h.load_state_dict(m.state_dict())
    return h.to(p.device).eval()


def sched(K, steps):
    return [K // steps + (s < K % steps) for s in range(steps)]


def commit_rows(x_blk, todo, logits, k, tau):
    """The official per-row selection loop (low_confidence_dynamic) with k clamped to masks left."""
    probs = torch.softmax(logits.float(), -1)
    p, x0 = probs.max(-1)
    conf = torch.where(todo, p, torch.full_like(p, -float("inf")))
    for j in range(x_blk.shape[0]):
        n = int(todo[j].sum())
        if n == 0:
            continue
        hi = conf[j] > tau
        sel = torch.zeros_like(hi)
        if int(hi.sum()) >= min(k, n):
            sel = hi
        else:
            sel[torch.topk(conf[j], min(k, n)).indices] = True
        x_blk[j][sel] = x0[j][sel]
        todo[j] &= ~sel


@torch.no_grad()
def official_loop(h, prompts, K, tau, G):
    """(c): SDAR generate.py structure on transformers (batched rows of equal prompt length)."""
    import transformers
    dev = next(h.parameters()).device
    B, P = len(prompts), len(prompts[0])
    nb = -(-(P + G) // K)
    x = torch.full((B, nb * K), MASK, device=dev)
    x[:, :P] = torch.tensor(prompts, device=dev)
    todo_all = torch.zeros_like(x, dtype=torch.bool)
    todo_all[:, P:] = True
    cache = transformers.DynamicCache(config=h.config)
    pos = torch.arange(nb * K, device=dev)
    fwd = 0
    Lp = (P // K) * K
    if Lp:
        bc = (pos[:Lp, None] // K >= pos[None, :Lp] // K)[None, None].expand(B, 1, Lp, Lp)
        h(x[:, :Lp], attention_mask=bc, position_ids=pos[None, :Lp].expand(B, Lp), **{cache_kw(h): cache},
          use_cache=True)
        fwd += 1
    ks = sched(K, K)
    for b in range(P // K, nb):
        lo, hi = b * K, (b + 1) * K
        blk, todo = x[:, lo:hi].clone(), todo_all[:, lo:hi].clone()
        attn = torch.ones(B, 1, K, hi, dtype=torch.bool, device=dev)
        pid = pos[None, lo:hi].expand(B, K)
        for s in range(K + 1):
            if not todo.any():  # KV-store forward of the finished block (logits unused)
                h(blk, attention_mask=attn, position_ids=pid, **{cache_kw(h): cache}, use_cache=True)
                fwd += 1
                break
            logits = h(blk, attention_mask=attn, position_ids=pid, **{cache_kw(h): cache}, use_cache=True).logits
            cache.crop(-K)  # store_kv=False: attend over cache + block, persist nothing
            fwd += 1
            commit_rows(blk, todo, logits, ks[s], tau)
        x[:, lo:hi] = blk
    return x[:, P:P + G].tolist(), fwd


@torch.no_grad()
def naive_loop(m, prompts, K, tau, G):
    """(b): no cache, the whole canvas recomputed with the block-causal mask at every step."""
    dev = next(m.parameters()).device
    B, P = len(prompts), len(prompts[0])
    nb = -(-(P + G) // K)
    x = torch.full((B, nb * K), MASK, device=dev)
    x[:, :P] = torch.tensor(prompts, device=dev)
    todo_all = torch.zeros_like(x, dtype=torch.bool)
    todo_all[:, P:] = True
    fwd, ks = 0, sched(K, K)
    for b in range(P // K, nb):
        lo, hi = b * K, (b + 1) * K
        for s in range(K):
            todo = todo_all[:, lo:hi]
            if not todo.any():
                break
            blk = x[:, lo:hi].clone()
            commit_rows(blk, todo, m(x, logits_rows=slice(lo, hi)), ks[s], tau)
            x[:, lo:hi] = blk
            fwd += 1
    return x[:, P:P + G].tolist(), fwd


def timed(fn, device):
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="prompt 32 + 32 new, 4 naive tokens")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 | bfloat16 (default: float32 on cpu, bfloat16 on cuda)")
    ap.add_argument("--compile", action="store_true", help="(a) with torch.compile (CPU: Inductor weight freezing)")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--taus", type=float, nargs="+", default=[0.95, 1.0])
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--naive-new", type=int, default=8, help="tokens decoded by (b) (0 = skip it)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs of (a) and (c), interleaved; best is kept")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--inter", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--init-std", type=float, default=0.05)
    ap.add_argument("--head-scale", type=float, default=8.0)
    args = ap.parse_args()
    if args.quick:
        args.prompt, args.new, args.naive_new = 32, 32, min(args.naive_new, 4)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    torch.set_num_threads(args.threads)
    if args.compile:
        import torch._inductor.config as ind
        ind.freezing = True  # weights become constants: prepacked GEMMs on CPU
        if device.type == "cuda":
            ind.coordinate_descent_tuning = True
    m = build(args, device, dtype)
    h = hf_twin(m)
    K, G = args.block, args.new
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, threads {args.threads}, "
          f"{device.type} {str(dtype).replace('torch.', '')}, model {m.num_params() / 1e6:.1f}M params, K={K}, "
          f"prompt {args.prompt} + {G} new, greedy, compile={args.compile}, best of {args.repeat}")
    hdr = ("| B | tau | system | tok/s | fwd calls | fwd/token | TPF den | TPF all | TPF den per row "
           "| (a)/(c) tok/s | (a)/(b) tok/s | same tokens |")
    print(hdr)
    print("|" + "---|" * (hdr.count("|") - 1))
    g = torch.Generator().manual_seed(1)
    pre = 1 if args.prompt >= K else 0
    for B in args.batch:
        prompts = torch.randint(4, args.vocab, (B, args.prompt), generator=g).tolist()
        for tau in args.taus:
            S = -(-(args.prompt + G) // K) * K
            dc = DecodeConfig(block_size=K, threshold=tau, max_new_tokens=G, stop_ids=[], compile=args.compile,
                              cache_len=S)
            # warm-up on exactly the timed shapes (same cache_len): plain and fused step graphs
            generate(m, prompts, DecodeConfig(block_size=K, threshold=tau, max_new_tokens=2 * K, stop_ids=[],
                                              compile=args.compile, cache_len=S))
            ta = t_c = float("inf")
            for _ in range(args.repeat):  # interleaved, best of N: the CPU may be shared
                ra, t = timed(lambda: generate(m, prompts, dc), device)
                ta = min(ta, t)
                (tc, fc), t = timed(lambda: official_loop(h, prompts, K, tau, G), device)
                t_c = min(t_c, t)
            agree = agreement(ra.tokens, tc)
            calls_a = pre + batched_denoise_calls(ra, args.prompt, K)
            nblocks = -(-(args.prompt + G) // K) - args.prompt // K
            rows = [("(a) d3mini", B * G / ta, calls_a, calls_a - pre, ra.totals()["tpf_denoise"]),
                    ("(c) official", B * G / t_c, fc, fc - pre - nblocks, None)]
            if args.naive_new:
                nn = min(args.naive_new, G)
                (tb, fb), t_b = timed(lambda: naive_loop(m, prompts, K, tau, nn), device)
                ref = generate(m, prompts, DecodeConfig(block_size=K, threshold=tau, max_new_tokens=nn, stop_ids=[]))
                agree_b = agreement(tb, ref.tokens)
                if dtype == torch.float32:
                    assert agree_b == 1, f"(b) naive recompute and (a) d3mini tokens differ ({agree_b:.1%})"
                rows.append((f"(b) naive, first {nn} tok", B * nn / t_b, fb, fb, None))
            for name, tps, calls, den, per_row in rows:
                n = nn if name.startswith("(b)") else G
                a = name.startswith("(a)")
                print(f"| {B} | {tau} | {name} | {tps:.1f} | {calls} | {calls / n:.3f} | {n / den:.2f} | "
                      f"{n / calls:.2f} | "
                      f"{f'{per_row:.2f}' if per_row else ''} | {f'{rows[0][1] / rows[1][1]:.2f}' if a else ''} | "
                      f"{f'{rows[0][1] / rows[2][1]:.1f}' if a and args.naive_new else ''} | "
                      f"{same(agree) if a else same(agree_b) + ' (as (a))' if name.startswith('(b)') else ''} |")
            sys.stdout.flush()
            if dtype == torch.float32:
                assert agree == 1, f"(a) and (c) tokens differ (agreement {agree:.1%})"


def agreement(xs, ys):
    pairs = [(a, b) for x, y in zip(xs, ys) for a, b in zip(x, y)]
    return sum(a == b for a, b in pairs) / max(len(pairs), 1)


def same(frac):
    return "yes" if frac == 1 else f"{frac:.1%} of tokens"


def batched_denoise_calls(r, P, K):
    """Batched denoising forwards of a lockstep decode: per block, the most steps any row needed
    (a row's steps in a block = distinct forward indices in its trace there; no stop ids)."""
    per_row = []
    for tr in r.trace:
        first = K - P % K if P % K else 0
        blocks = [tr[:first]] if first else []
        blocks += [tr[j:j + K] for j in range(first, len(tr), K)]
        per_row.append([len(set(b)) for b in blocks])
    return sum(max(col) for col in zip(*per_row))


if __name__ == "__main__":
    main()
