"""DiffusionLM: the Qwen3 / SDAR / LLaDA transformer family in one module.

One pre-norm decoder stack (RMSNorm, RoPE "rotate-half", GQA attention, SwiGLU MLP, no biases)
serves three families that differ only in attention and a few config fields:

    sdar   Qwen3 weights, qk-norm before RoPE, block-causal attention: query i sees key j iff
           floor(j / K) <= floor(i / K), blocks aligned at absolute position 0 (prompt included)
    qwen3  the same weights with causal attention (the AR baseline; logits row j predicts j+1)
    llada  LLaDA weights (renamed to Llama names on load), no qk-norm, bidirectional attention

Parameter names are exactly transformers' `Qwen3ForCausalLM` / `LlamaForCausalLM` names, so a
strict load of SDAR / Qwen3 safetensors needs no renaming and LLaDA needs one name map
(reference/models.md §2.3, §5.3). Diffusion logits are not shifted: row j predicts token j.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import fields as dc_fields
from typing import Optional, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from d3mini.config import ModelConfig

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(ValueError):
    """A checkpoint folder is missing files or tensors, or they do not match the config."""


# ----------------------------------------------------------------------------- layers
class RMSNorm(nn.Module):
    """y = w * x / sqrt(mean(x^2) + eps); statistics in fp32, rounded to the input dtype before
    the weight multiply (transformers' Qwen3/Llama variant, so fp32 and bf16 match HF bitwise)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


def rope_cos_sin(pos: torch.Tensor, head_dim: int, theta: float):
    """pos [B, L] absolute positions -> cos, sin [B, 1, L, D] in fp32 (frequencies repeated twice)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=pos.device, dtype=torch.float32) / head_dim)
    ang = pos.float()[..., None] * inv_freq  # [B, L, D/2]
    ang = torch.cat([ang, ang], dim=-1)[:, None]  # [B, 1, L, D]
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin, full_precision: bool):
    """Rotate-half RoPE. Qwen3 rotates in the activation dtype; LLaDA (rope_full_precision) in fp32."""
    dtype = x.dtype
    if full_precision:
        x = x.float()
    else:
        cos, sin = cos.to(dtype), sin.to(dtype)
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat([-x2, x1], dim=-1)
    return (x * cos + rot * sin).to(dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.qk_norm = cfg.qk_norm
        if cfg.qk_norm:
            self.q_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(self.hd, cfg.rms_norm_eps)
        self.rope_fp32 = cfg.family == "llada"

    def forward(self, x, cos, sin, mask, cache=None, layer: int = 0, cache_pos=None):
        B, L, _ = x.shape
        q = self.q_proj(x).view(B, L, self.nh, self.hd)  # [B, L, H, D]
        k = self.k_proj(x).view(B, L, self.nkv, self.hd)
        v = self.v_proj(x).view(B, L, self.nkv, self.hd)
        if self.qk_norm:  # Qwen3: per-head norm *before* RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, L, D]
        q = apply_rope(q, cos, sin, self.rope_fp32)
        k = apply_rope(k, cos, sin, self.rope_fp32)
        if cache is not None:  # keys are cached after RoPE: positions are absolute and never shift
            k, v = cache.write(layer, k, v, cache_pos)  # [B, Hkv, S, D] whole static buffers
        out = sdpa(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, L, self.nh * self.hd))


def sdpa(q, k, v, mask):
    """Scaled dot-product attention with GQA; `mask` is bool [B|1, 1, Lq, Lk] (True = attend) or None
    (all visible). flash-attn is used on CUDA for the all-visible case when installed."""
    if mask is None and q.is_cuda and _flash is not None and q.dtype in (torch.float16, torch.bfloat16):
        return _flash(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False).transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1])


try:  # optional, CUDA only
    from flash_attn import flash_attn_func as _flash  # type: ignore
except Exception:  # pragma: no cover - not installed on CPU machines
    _flash = None


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, cache=None, layer=0, cache_pos=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, layer, cache_pos)
        return x + self.mlp(self.post_attention_layernorm(x))


class KVCache:
    """Static K/V buffers, one pair per layer, [B, Hkv, S, D], sized once (gpt-fast style).
    Slot s normally holds absolute position s. One buffer per layer (a view into a shared buffer
    made compiled steps copy the whole cache)."""

    def __init__(self, cfg: ModelConfig, batch: int, max_len: int, dtype=torch.float32, device=None):
        shape = (batch, cfg.num_kv_heads, max_len, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(cfg.num_layers)]
        self.max_len = max_len

    def write(self, layer: int, k, v, pos):
        """k, v [B, Hkv, L, D] into slots pos ([L] shared or [B, L] per row); returns whole buffers."""
        kb, vb = self.k[layer], self.v[layer]
        if pos.dim() == 1:
            kb.index_copy_(2, pos, k.to(kb.dtype))
            vb.index_copy_(2, pos, v.to(vb.dtype))
        else:  # per-row slots: scatter along the sequence axis
            idx = pos[:, None, :, None].expand(-1, kb.shape[1], -1, kb.shape[3])  # [B, Hkv, L, D]
            kb.scatter_(2, idx, k.to(kb.dtype))
            vb.scatter_(2, idx, v.to(vb.dtype))
        return kb, vb


# ----------------------------------------------------------------------------- masks
def family_mask(family: str, block_size: int, q_pos, k_pos):
    """Default attention of a family from absolute positions: q_pos [B, Lq], k_pos [B, Lk] ->
    bool [B, 1, Lq, Lk] (True = attend), or None for llada (all visible)."""
    if family == "llada":
        return None
    qp, kp = q_pos[:, :, None], k_pos[:, None, :]
    if family == "qwen3" or block_size == 1:
        return (kp <= qp)[:, None]
    return (kp // block_size <= qp // block_size)[:, None]


def bd_training_mask(lengths: torch.Tensor, n: int, block_size: int, noisy_start=0, copies: int = 1):
    """SDAR's [noisy | clean] training mask (reference/models.md §2.7) for rows padded to n.

    lengths [B] valid tokens per row -> bool [B, 1, C m + n, C m + n], C = copies.
    Noisy block b sees noisy block b of its own copy and clean blocks < b; clean block b sees clean
    blocks <= b; clean never sees noisy. The noisy copy may start at a block boundary `noisy_start`
    (positions noisy_start..): nothing attends to the noisy copy of earlier blocks, so when those
    hold only prompt tokens they can be left out exactly, which roughly halves a long-prompt forward.
    noisy_start is an int shared by all rows (m = n - noisy_start) or a [B] tensor, one start per row
    (m = max(lengths - noisy_start)): row r's noisy copy then holds positions noisy_start[r] .. + m - 1,
    so rows whose prompts differ in length no longer pay for each other's prompt (noisy_positions).
    copies > 1 lays out C independently masked noisy copies [noisy_1 | ... | noisy_C | clean] that
    never see each other, so one pass over the (long) clean prompt supervises C mask draws.
    Padded keys are hidden; every query sees itself so padded rows never produce NaN.
    """
    dev = lengths.device
    ns = torch.as_tensor(noisy_start, device=dev).expand(len(lengths))
    if (ns % block_size).any():
        raise ValueError(f"noisy_start = {noisy_start} must be a multiple of block_size = {block_size}")
    m = n - int(noisy_start) if isinstance(noisy_start, int) else noisy_positions(lengths, ns, n)[0].shape[1]
    i = torch.arange(copies * m + n, device=dev)
    noisy = i < copies * m
    copy = torch.where(noisy, i // max(m, 1), -1)  # which noisy copy a row belongs to (-1 = clean)
    pos = torch.where(noisy, i % max(m, 1) + ns[:, None], i - copies * m)  # [B, Cm + n] absolute positions
    blk = pos // block_size
    qn, kn = noisy[:, None], noisy[None, :]
    qb, kb = blk[:, :, None], blk[:, None, :]
    same_copy = copy[:, None] == copy[None, :]
    mask = ((qb == kb) & same_copy) | (qn & ~kn & (kb < qb)) | (~qn & ~kn & (kb <= qb))
    valid = pos < lengths[:, None]  # [B, C m + n] key is a real token
    mask = mask & valid[:, None, :]
    mask = mask | torch.eye(copies * m + n, dtype=torch.bool, device=dev)[None]
    return mask[:, None]


def noisy_positions(lengths: torch.Tensor, noisy_start: torch.Tensor, n: int):
    """Per-row noisy span of `bd_training_mask`: positions [B, m] (clamped into 0..n-1 so they can
    index a [B, n] tensor) and a bool [B, m] that is True where the position is a real token."""
    m = int((lengths - noisy_start).clamp(min=0).max())
    col = noisy_start[:, None] + torch.arange(m, device=lengths.device)
    return col.clamp(max=n - 1), col < lengths[:, None]


def padding_mask(family: str, block_size: int, lengths: torch.Tensor, n: int):
    """The family's mask for right-padded rows: bool [B, 1, n, n]; padded keys hidden, diagonal kept."""
    pos = torch.arange(n, device=lengths.device)[None].expand(len(lengths), n)
    m = family_mask(family, block_size, pos, pos)
    valid = (pos < lengths[:, None])[:, None, None, :]  # [B, 1, 1, n]
    m = valid if m is None else m & valid
    return m | torch.eye(n, dtype=torch.bool, device=lengths.device)


# ----------------------------------------------------------------------------- model
class _Trunk(nn.Module):  # named `model` inside DiffusionLM so parameter names match transformers
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class DiffusionLM(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.model = _Trunk(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie()

    def tie(self):
        if self.cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def init_weights(self):
        """Initialise every parameter (also after `to_empty` from the meta device)."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or "layernorm" in name:
                p.fill_(1.0)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):  # GPT-2 style depth scaling
                p.normal_(0.0, std / math.sqrt(2 * self.cfg.num_layers))
            else:
                p.normal_(0.0, std)
        self.tie()
        return self

    @classmethod
    def from_config(cls, cfg: ModelConfig, device=None, dtype=None) -> "DiffusionLM":
        """A fresh model: built on the meta device, materialised on `device`, one init_weights()."""
        with torch.device("meta"):
            m = cls(cfg)
        m.to_empty(device=device or "cpu")
        m.init_weights()
        return m.to(dtype or DTYPES[cfg.dtype])

    def forward(self, input_ids, position_ids=None, attn=None, cache: Optional[KVCache] = None,
                cache_pos=None, logits_rows=None, return_hidden=False):
        """input_ids [B, L] -> logits [B, L, V] (or [B, L', V] for `logits_rows`).

        position_ids: [B, L] or [L] absolute positions (default 0..L-1).
        attn:  None = the family's default mask over these positions; or a bool [B|1, 1, L, Lk] mask
               (True = attend; Lk = L, or the cache length when a cache is given); or "full".
        cache: write this call's K/V into `cache` at slots `cache_pos` ([L] or [B, L]; default =
               position_ids) and attend over the whole static buffer. With a cache and attn=None the
               family rule is applied to slot indices (slot s = position s).
        logits_rows: slice / index of rows that need logits (skip the LM head for the rest).
        """
        B, L = input_ids.shape
        if position_ids is None:
            position_ids = torch.arange(L, device=input_ids.device)
        if position_ids.dim() == 1:
            position_ids = position_ids[None].expand(B, L)
        cfg = self.cfg
        if isinstance(attn, str):
            if attn != "full":
                raise ValueError(f"attn must be None, a bool mask or 'full', got {attn!r}")
            mask = None
        elif attn is not None:
            if attn.dtype != torch.bool or attn.dim() != 4:
                raise ValueError(f"attn mask must be bool [B, 1, Lq, Lk], got {attn.dtype} {tuple(attn.shape)}")
            mask = attn
        elif cache is not None:
            slots = torch.arange(cache.max_len, device=input_ids.device)[None].expand(B, -1)
            mask = family_mask(cfg.family, cfg.block_size, position_ids, slots)
            if mask is None:
                raise ValueError("llada with a KV cache needs an explicit attn mask (unfilled slots)")
        else:
            mask = family_mask(cfg.family, cfg.block_size, position_ids, position_ids)
        if cache is not None and cache_pos is None:
            cache_pos = position_ids if (position_ids != position_ids[:1]).any() else position_ids[0]
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta)
        x = self.model.embed_tokens(input_ids)
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, mask, cache, i, cache_pos)
        if logits_rows is not None:
            x = x[:, logits_rows]
        x = self.model.norm(x)
        return x if return_hidden else self.lm_head(x)

    # ------------------------------------------------------------------------- checkpoints
    @classmethod
    def from_pretrained(cls, path: str, dtype=None, device=None) -> "DiffusionLM":
        """Load `config.json` + `model.safetensors` (or a sharded index) from a folder."""
        cfg = load_model_config(path)
        if dtype is not None:
            cfg.dtype = next(k for k, v in DTYPES.items() if v == dtype) if isinstance(dtype, torch.dtype) else dtype
        tdtype = DTYPES[cfg.dtype]
        with torch.device("meta"):
            model = cls(cfg)
        state = read_safetensors(path, device or "cpu")
        if cfg.family == "llada" and any(k.startswith("model.transformer.") for k in state):
            state = {_llada_to_hf(k): v for k, v in state.items()}
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if cfg.tie_embeddings:
            expected.pop("lm_head.weight", None)
            state.pop("lm_head.weight", None)
        missing = sorted(set(expected) - set(state))
        unexpected = sorted(set(state) - set(expected))
        shapes = [f"{k}: checkpoint {tuple(state[k].shape)} vs model {expected[k]}"
                  for k in sorted(set(expected) & set(state)) if tuple(state[k].shape) != expected[k]]
        problems = []
        if missing:
            problems.append(f"missing tensors ({len(missing)}): {', '.join(missing[:8])}")
        if unexpected:
            problems.append(f"unexpected tensors ({len(unexpected)}): {', '.join(unexpected[:8])}")
        if shapes:
            problems.append(f"shape mismatches ({len(shapes)}): {'; '.join(shapes[:8])}")
        if problems:
            raise CheckpointError(f"{path}: " + " | ".join(problems))
        state = {k: v.to(tdtype) for k, v in state.items()}
        model.load_state_dict(state, strict=False, assign=True)
        model.tie()
        return model.to(device or "cpu")

    def save_pretrained(self, path: str, max_shard_bytes: Optional[int] = None, layout: str = "native"):
        """Write config.json + model.safetensors (sharded with an index when `max_shard_bytes` is set).

        layout "native": the family's own names/config (LLaDA: model.transformer.*); "hf": the names and
        config transformers loads directly (Qwen3 for sdar/qwen3, Llama for llada)."""
        from safetensors.torch import save_file

        os.makedirs(path, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()}
        if self.cfg.tie_embeddings:
            state.pop("lm_head.weight", None)
        llada_native = self.cfg.family == "llada" and layout == "native"
        if llada_native:
            state = {_hf_to_llada(k): v for k, v in state.items()}
        _atomic_json(os.path.join(path, "config.json"), model_config_to_hf(self.cfg, layout))
        total = sum(v.numel() * v.element_size() for v in state.values())
        if not max_shard_bytes or total <= max_shard_bytes:
            _atomic(lambda p: save_file(state, p, metadata={"format": "pt"}), os.path.join(path, "model.safetensors"))
            return
        shards, cur, size = [], {}, 0
        for k, v in state.items():
            nb = v.numel() * v.element_size()
            if cur and size + nb > max_shard_bytes:
                shards.append(cur)
                cur, size = {}, 0
            cur[k], size = v, size + nb
        shards.append(cur)
        weight_map = {}
        for i, sh in enumerate(shards):
            name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _atomic(lambda p, sh=sh: save_file(sh, p, metadata={"format": "pt"}), os.path.join(path, name))
            weight_map.update({k: name for k in sh})
        _atomic_json(os.path.join(path, "model.safetensors.index.json"),
                     {"metadata": {"total_size": total}, "weight_map": weight_map})

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


# ----------------------------------------------------------------------------- config & names
_LLADA_NAMES = [  # LLaDA name fragment -> HF Llama fragment (reference/models.md §5.3)
    ("attn_norm", "input_layernorm"), ("q_proj", "self_attn.q_proj"), ("k_proj", "self_attn.k_proj"),
    ("v_proj", "self_attn.v_proj"), ("attn_out", "self_attn.o_proj"), ("ff_norm", "post_attention_layernorm"),
    ("ff_proj", "mlp.gate_proj"), ("up_proj", "mlp.up_proj"), ("ff_out", "mlp.down_proj"),
]


def _llada_to_hf(name: str) -> str:
    n = name[len("model.transformer."):] if name.startswith("model.transformer.") else name
    if n == "wte.weight":
        return "model.embed_tokens.weight"
    if n == "ln_f.weight":
        return "model.norm.weight"
    if n == "ff_out.weight":  # the LM head (not blocks.i.ff_out, the MLP down projection)
        return "lm_head.weight"
    if n.startswith("blocks."):
        _, i, rest = n.split(".", 2)
        frag = rest[: -len(".weight")]
        for a, b in _LLADA_NAMES:
            if frag == a:
                return f"model.layers.{i}.{b}.weight"
    return name  # unknown: reported as unexpected


def _hf_to_llada(name: str) -> str:
    if name == "model.embed_tokens.weight":
        return "model.transformer.wte.weight"
    if name == "model.norm.weight":
        return "model.transformer.ln_f.weight"
    if name == "lm_head.weight":
        return "model.transformer.ff_out.weight"
    _, _, i, rest = name.split(".", 3)
    frag = rest[: -len(".weight")]
    for a, b in _LLADA_NAMES:
        if frag == b:
            return f"model.transformer.blocks.{i}.{a}.weight"
    raise KeyError(name)


def _eos_list(x) -> list:
    if x is None:
        return []
    return list(x) if isinstance(x, (list, tuple)) else [x]


def model_config_from_hf(hf: dict, src: str = "config.json", generation: Optional[dict] = None) -> ModelConfig:
    """Map a checkpoint's config.json (sdar / qwen3 / llada / llama) to a ModelConfig."""
    mt = hf.get("model_type")
    try:
        if mt in ("sdar", "qwen3"):
            nh = hf["num_attention_heads"]
            eos = _eos_list((generation or {}).get("eos_token_id")) or _eos_list(hf.get("eos_token_id"))
            cfg = ModelConfig(
                family=mt, vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=nh,
                num_kv_heads=hf.get("num_key_value_heads", nh), head_dim=hf.get("head_dim") or hf["hidden_size"] // nh,
                rope_theta=float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 1e6))),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), qk_norm=True,
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
                block_size=int(hf.get("block_size", 4 if mt == "sdar" else 1)),
                max_position=hf.get("max_position_embeddings", 32768),
                mask_id=int(hf.get("mask_token_id", 151669)), bos_id=None,
                eos_ids=eos or [151645, 151643], pad_id=hf.get("pad_token_id") or (eos or [0])[-1])
        elif mt == "llada":
            nh = hf["n_heads"]
            eos = _eos_list(hf.get("eos_token_id", 126081))
            cfg = ModelConfig(
                family="llada", vocab_size=hf.get("embedding_size") or hf["vocab_size"], hidden_size=hf["d_model"],
                intermediate_size=hf["mlp_hidden_size"], num_layers=hf["n_layers"], num_heads=nh,
                num_kv_heads=hf.get("n_kv_heads") or nh, head_dim=hf["d_model"] // nh,
                rope_theta=float(hf.get("rope_theta", 5e5)), rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                qk_norm=bool(hf.get("attention_layer_norm", False)), tie_embeddings=bool(hf.get("weight_tying", False)),
                block_size=int(hf.get("block_size", 32)), max_position=hf.get("max_sequence_length", 4096),
                mask_id=int(hf.get("mask_token_id", 126336)), bos_id=hf.get("bos_token_id"),
                eos_ids=list(hf.get("d3mini_eos_ids", [126348] + eos)), pad_id=hf.get("pad_token_id", eos[0]))
        elif mt == "llama":  # a Llama-layout export of a llada-family model
            nh = hf["num_attention_heads"]
            cfg = ModelConfig(
                family="llada", vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"],
                intermediate_size=hf["intermediate_size"], num_layers=hf["num_hidden_layers"], num_heads=nh,
                num_kv_heads=hf.get("num_key_value_heads", nh), head_dim=hf.get("head_dim") or hf["hidden_size"] // nh,
                rope_theta=float((hf.get("rope_parameters") or {}).get("rope_theta", hf.get("rope_theta", 5e5))),
                rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)), qk_norm=False,
                tie_embeddings=bool(hf.get("tie_word_embeddings", False)), block_size=int(hf.get("block_size", 32)),
                max_position=hf.get("max_position_embeddings", 4096), mask_id=int(hf.get("mask_token_id", 126336)),
                bos_id=hf.get("bos_token_id"), eos_ids=_eos_list(hf.get("d3mini_eos_ids", hf.get("eos_token_id"))),
                pad_id=hf.get("pad_token_id") or 0)
        else:
            raise CheckpointError(f"{src}: unknown model_type {mt!r} (expected sdar, qwen3, llada or llama)")
    except KeyError as e:
        raise CheckpointError(f"{src}: missing config field {e.args[0]!r} for model_type {mt!r}") from None
    if "d3mini_family" in hf:
        cfg.family = hf["d3mini_family"]
    if "d3mini_eos_ids" in hf:
        cfg.eos_ids = list(hf["d3mini_eos_ids"])
    cfg.dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(hf.get("torch_dtype") or hf.get("dtype"), "float32")
    from d3mini.config import ConfigError, Config, _check_values
    try:
        _check_values(Config(model=cfg, decode=_decode_for(cfg)), src)
    except ConfigError as e:
        raise CheckpointError(str(e)) from None
    return cfg


def _decode_for(cfg: ModelConfig):
    from d3mini.config import DecodeConfig
    return DecodeConfig(block_size=cfg.block_size)


def model_config_to_hf(cfg: ModelConfig, layout: str = "native") -> dict:
    """ModelConfig -> config.json dict. sdar/qwen3 use Qwen3 field names (transformers reads them);
    llada native uses LLaDA's fields; llada "hf" uses Llama's."""
    dtype = cfg.dtype
    common = {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
              "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
              "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
              "head_dim": cfg.head_dim, "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps,
              "tie_word_embeddings": cfg.tie_embeddings, "max_position_embeddings": cfg.max_position,
              "attention_bias": False, "hidden_act": "silu", "torch_dtype": dtype,
              "bos_token_id": cfg.bos_id, "eos_token_id": cfg.eos_ids[-1] if len(cfg.eos_ids) > 1 else cfg.eos_ids[0],
              "pad_token_id": cfg.pad_id, "mask_token_id": cfg.mask_id, "block_size": cfg.block_size,
              "d3mini_eos_ids": list(cfg.eos_ids), "d3mini_family": cfg.family}
    if cfg.family in ("sdar", "qwen3"):
        mt = "qwen3" if layout == "hf" else cfg.family
        arch = {"sdar": "SDARForCausalLM", "qwen3": "Qwen3ForCausalLM"}[mt]
        return {"architectures": [arch], "model_type": mt, **common}
    if layout == "hf":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "mlp_bias": False, **common}
    return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": cfg.hidden_size,
            "n_layers": cfg.num_layers, "n_heads": cfg.num_heads, "n_kv_heads": cfg.num_kv_heads,
            "mlp_hidden_size": cfg.intermediate_size, "vocab_size": cfg.vocab_size, "embedding_size": cfg.vocab_size,
            "rope_theta": cfg.rope_theta, "rms_norm_eps": cfg.rms_norm_eps, "rope": True,
            "rope_full_precision": True, "attention_layer_norm": cfg.qk_norm, "weight_tying": cfg.tie_embeddings,
            "include_bias": False, "activation_type": "silu", "block_type": "llama",
            "max_sequence_length": cfg.max_position, "mask_token_id": cfg.mask_id, "bos_token_id": cfg.bos_id,
            "eos_token_id": cfg.eos_ids[-1], "pad_token_id": cfg.pad_id, "block_size": cfg.block_size,
            "torch_dtype": dtype, "d3mini_eos_ids": list(cfg.eos_ids), "d3mini_family": "llada"}


def load_model_config(path: str) -> ModelConfig:
    cfile = os.path.join(path, "config.json")
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: checkpoint folder not found")
    if not os.path.exists(cfile):
        raise CheckpointError(f"{path}: no config.json")
    try:
        with open(cfile) as f:
            hf = json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfile}: not valid JSON: {e}") from None
    gen = None
    gfile = os.path.join(path, "generation_config.json")
    if os.path.exists(gfile):
        with open(gfile) as f:
            gen = json.load(f)
    return model_config_from_hf(hf, cfile, gen)


def read_safetensors(path: str, device: Union[str, torch.device] = "cpu") -> dict:
    """All tensors of a folder's model.safetensors or sharded model.safetensors.index.json."""
    from safetensors.torch import load_file

    single = os.path.join(path, "model.safetensors")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        with open(index) as f:
            weight_map = json.load(f).get("weight_map", {})
        files = [os.path.join(path, n) for n in sorted(set(weight_map.values()))]
        for fp in files:
            if not os.path.exists(fp):
                raise CheckpointError(f"{path}: shard {os.path.basename(fp)} named in the index is missing")
    else:
        raise CheckpointError(f"{path}: neither model.safetensors nor model.safetensors.index.json found")
    state = {}
    for fp in files:
        try:
            state.update(load_file(fp, device=str(device)))
        except Exception as e:  # truncated or not a safetensors file
            raise CheckpointError(f"{fp}: cannot read safetensors: {e}") from None
    return state


def _atomic(write, final: str):
    tmp = final + ".tmp"
    write(tmp)
    os.replace(tmp, final)


def _atomic_json(final: str, obj):
    def w(p):
        with open(p, "w") as f:
            json.dump(obj, f, indent=2)
    _atomic(w, final)


def model_config_fields() -> list:
    return [f.name for f in dc_fields(ModelConfig)]
