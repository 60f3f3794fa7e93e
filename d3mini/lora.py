"""LoRA adapters on the attention and MLP projections (Hu et al. 2021, arXiv 2106.09685).

Each targeted `nn.Linear` (matched by the last part of its module name, e.g. `q_proj`) becomes a
`LoRALinear`: the frozen base weight keeps its name, and two small matrices are added as
sub-modules, so state-dict names are

    model.layers.0.self_attn.q_proj.weight         base W  [out, in]   (frozen)
    model.layers.0.self_attn.q_proj.lora_A.weight  A       [r, in]     (kaiming-uniform, as PEFT)
    model.layers.0.self_attn.q_proj.lora_B.weight  B       [out, r]    (zeros)

(PEFT's saved adapter names without its `base_model.model.` prefix). y = W x + (alpha / r) B A x;
B = 0 at the start, so a fresh adapter leaves the model's outputs unchanged. Apply LoRA before
`dist.shard`: FSDP2 then shards the adapters with their block, and only they carry gradients.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from d3mini.config import LoRAConfig

LORA_A, LORA_B = ".lora_A.weight", ".lora_B.weight"


class LoRALinear(nn.Linear):
    """An nn.Linear with a low-rank update; shares (does not copy) the base weight."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float):
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.scale = rank, alpha / rank
        kw = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **kw)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **kw)
        self.reset_lora()

    @torch.no_grad()
    def reset_lora(self):
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))  # nn.Linear's / PEFT's default init
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        return super().forward(x) + self.scale * self.lora_B(self.lora_A(x))

    def extra_repr(self):
        return f"{self.in_features}, {self.out_features}, rank={self.rank}, scale={self.scale:g}"


def apply_lora(model: nn.Module, cfg: LoRAConfig) -> nn.Module:
    """Replace every target projection by a LoRALinear and freeze everything else (in place).
    rank 0 = full fine-tuning: the model is returned unchanged."""
    if cfg.rank <= 0:
        return model
    if any(isinstance(m, LoRALinear) for m in model.modules()):
        raise ValueError("apply_lora: the model already has LoRA adapters")
    targets = set(cfg.targets)
    hits = [(name, mod) for name, mod in model.named_modules()
            if name.rsplit(".", 1)[-1] in targets and isinstance(mod, nn.Linear)]
    if not hits:
        raise ValueError(f"lora.targets = {sorted(targets)} match no nn.Linear module of the model")
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in hits:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(mod, cfg.rank, cfg.alpha))
    return model


def lora_parameters(model: nn.Module) -> list:
    """The adapter parameters (what the optimizer should see when LoRA is on)."""
    return [p for n, p in model.named_parameters() if n.endswith((LORA_A, LORA_B))]


def lora_scales(model: nn.Module) -> dict:
    """Module name -> alpha / r, for `merged_state_dict` (read before sharding or gathering)."""
    return {n: m.scale for n, m in model.named_modules() if isinstance(m, LoRALinear)}


@torch.no_grad()
def merged_state_dict(state: dict, scales: dict) -> dict:
    """A full state dict with adapters folded in: W' = W + scale * B A, adapter keys dropped.
    Works on a gathered (unsharded) state dict, which is how export under FSDP merges."""
    out = {k: v for k, v in state.items() if not k.endswith((LORA_A, LORA_B))}
    for name, scale in scales.items():
        a, b, w = state[name + LORA_A], state[name + LORA_B], state[name + ".weight"]
        out[name + ".weight"] = (w.float() + scale * (b.float() @ a.float())).to(w.dtype)  # [out, r] @ [r, in]
    return out


@torch.no_grad()
def merge_lora(model: nn.Module) -> nn.Module:
    """Fold every adapter into its base weight and put plain nn.Linear modules back (in place).
    For an unsharded model; a sharded one is merged from its gathered state (`dist.export_hf`)."""
    for name, mod in list(model.named_modules()):
        if not isinstance(mod, LoRALinear):
            continue
        merged = merged_state_dict({"w.weight": mod.weight, "w" + LORA_A: mod.lora_A.weight,
                                    "w" + LORA_B: mod.lora_B.weight}, {"w": mod.scale})["w.weight"]
        lin = nn.Linear(mod.in_features, mod.out_features, bias=mod.bias is not None,
                        device=merged.device, dtype=merged.dtype)
        lin.weight = nn.Parameter(merged, requires_grad=mod.weight.requires_grad)
        if mod.bias is not None:
            lin.bias = mod.bias
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name) if parent_name else model, child, lin)
    return model
