"""LoRA: a fresh adapter is the base model; merging equals the unmerged model; export merges."""
import os
import sys

import pytest
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist_worker as w  # noqa: E402

from d3mini import dist  # noqa: E402
from d3mini.config import LoRAConfig  # noqa: E402
from d3mini.lora import LoRALinear, apply_lora, lora_parameters, lora_scales, merge_lora, merged_state_dict  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402

torch.set_num_threads(2)


def perturb_b(model, seed=1):
    """Non-zero B so the adapters change the outputs (a trained adapter)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("lora_B.weight"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))


def test_fresh_lora_equals_base_and_names():
    base = w.build(0)
    lora = apply_lora(w.build(0), LoRAConfig(rank=4, alpha=8.0))
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        assert torch.equal(lora(ids), base(ids))  # B = 0 exactly
    names = [n for n, _ in lora.named_parameters()]
    per_layer = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    expect = {f"model.layers.{i}.{'self_attn' if t.endswith(('q_proj', 'k_proj', 'v_proj', 'o_proj')) else 'mlp'}"
              f".{t}.lora_{ab}.weight" for i in range(2) for t in per_layer for ab in "AB"}
    assert {n for n in names if "lora_" in n} == expect
    assert set(base.state_dict()) <= set(lora.state_dict())  # base names unchanged
    trainable = {n for n, p in lora.named_parameters() if p.requires_grad}
    assert trainable == expect == {n for n, p in lora.named_parameters() if any(p is q for q in lora_parameters(lora))}
    q = lora.model.layers[0].self_attn.q_proj
    assert isinstance(q, LoRALinear) and q.lora_A.weight.shape == (4, 32) and q.lora_B.weight.shape == (32, 4)
    assert q.scale == 2.0 and q.lora_A.weight.abs().sum() > 0 and q.lora_B.weight.abs().sum() == 0
    # kaiming-uniform(a=sqrt(5)) bound = 1/sqrt(fan_in)
    assert q.lora_A.weight.abs().max() <= 1 / 32 ** 0.5


def test_lora_forward_is_w_plus_scaled_ba():
    m = apply_lora(w.build(0), LoRAConfig(rank=2, alpha=3.0, targets=["up_proj"]))
    perturb_b(m)
    up = m.model.layers[1].mlp.up_proj
    x = torch.randn(5, 32)
    ref = x @ up.weight.T + 1.5 * (x @ up.lora_A.weight.T) @ up.lora_B.weight.T  # hand formula
    assert (up(x) - ref).abs().max() <= 1e-6
    assert set(lora_scales(m)) == {"model.layers.0.mlp.up_proj", "model.layers.1.mlp.up_proj"}


def test_merge_equals_unmerged():
    m = apply_lora(w.build(0), LoRAConfig(rank=4, alpha=8.0))
    perturb_b(m)
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        unmerged = m(ids)
        base = w.build(0)(ids)
        state = merged_state_dict(dict(m.state_dict()), lora_scales(m))
        merge_lora(m)
        merged = m(ids)
    assert (unmerged - base).abs().max() > 1e-3  # the adapters matter
    assert (merged - unmerged).abs().max() <= 1e-5
    assert not any(isinstance(x, LoRALinear) for x in m.modules())
    assert type(m.model.layers[0].self_attn.q_proj) is nn.Linear
    assert all(torch.equal(state[k], v) for k, v in m.state_dict().items())


def test_lora_export_equals_unmerged_logits(tmp_path):
    m = apply_lora(w.build(0), LoRAConfig(rank=4, alpha=8.0))
    perturb_b(m)
    ids = torch.randint(0, 64, (2, 8))
    dist.export_hf(m, None, str(tmp_path / "hf"), layout="hf")
    with torch.no_grad():
        out = DiffusionLM.from_pretrained(str(tmp_path / "hf"))(ids)
        ref = m(ids)
    assert (out - ref).abs().max() <= 1e-5
    assert isinstance(m.model.layers[0].self_attn.q_proj, LoRALinear)  # export left the model alone


def test_lora_training_step_changes_only_adapters():
    m = apply_lora(w.build(0), LoRAConfig(rank=4, alpha=8.0))
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = torch.optim.SGD(lora_parameters(m), lr=0.1)
    ids, masked = w.global_batch(0)
    w.masked_ce(m, ids, masked).backward()
    opt.step()
    after = m.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all(k.endswith("lora_B.weight") for k in changed)  # A's gradient is 0 while B = 0


def test_lora_config_edge_cases():
    m = w.build(0)
    assert apply_lora(m, LoRAConfig(rank=0)) is m and not lora_parameters(m)
    with pytest.raises(ValueError, match="match no nn.Linear"):
        apply_lora(w.build(0), LoRAConfig(rank=2, targets=["qkv"]))
    m = apply_lora(w.build(0), LoRAConfig(rank=2))
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(m, LoRAConfig(rank=2))
