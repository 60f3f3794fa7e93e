"""DiffusionLM against transformers: logits parity, checkpoint round trips, loader errors."""
import copy
import json
import os

import pytest
import torch

from d3mini.config import ModelConfig
from d3mini.model import (CheckpointError, DiffusionLM, KVCache, bd_training_mask, family_mask,
                          padding_mask)

transformers = pytest.importorskip("transformers")
torch.set_num_threads(2)


def tiny_cfg(family="sdar", tie=False, kv=2, block=4):
    return ModelConfig(family=family, vocab_size=128, hidden_size=64, intermediate_size=96, num_layers=2,
                       num_heads=4, num_kv_heads=kv if family != "llada" else 4, head_dim=16,
                       rope_theta=5e5 if family == "llada" else 1e6,
                       rms_norm_eps=1e-5 if family == "llada" else 1e-6, qk_norm=family != "llada",
                       tie_embeddings=tie, block_size=block, mask_id=3, eos_ids=[2, 0], pad_id=0)


def ours(cfg, seed=0):
    torch.manual_seed(seed)
    m = DiffusionLM.from_config(cfg)
    with torch.no_grad():  # norms away from 1 so the qk-norm-before-RoPE order matters
        for n, p in m.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    return m.eval()


def hf_model(cfg, impl="sdpa"):
    if cfg.family == "llada":
        hc = transformers.LlamaConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                                      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                                      head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
                                      tie_word_embeddings=cfg.tie_embeddings, attention_bias=False, mlp_bias=False)
        cls = transformers.LlamaForCausalLM
    else:
        hc = transformers.Qwen3Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                                      intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
                                      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
                                      head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_norm_eps=cfg.rms_norm_eps,
                                      tie_word_embeddings=cfg.tie_embeddings, attention_bias=False)
        cls = transformers.Qwen3ForCausalLM
    return cls._from_config(copy.deepcopy(hc), attn_implementation=impl).eval()


def synced(cfg):
    m = ours(cfg)
    h = hf_model(cfg)
    missing, unexpected = h.load_state_dict(m.state_dict(), strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing) and (not missing or cfg.tie_embeddings)
    return m, h


def block_causal(T, K):
    p = torch.arange(T)
    return (p[None, :] // K <= p[:, None] // K)


@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("kv", [2, 4])
@pytest.mark.parametrize("block,T", [(1, 7), (4, 10), (8, 13), (4, 16)])
def test_sdar_matches_qwen3_with_block_causal_mask(tie, kv, block, T):
    cfg = tiny_cfg("sdar", tie=tie, kv=kv, block=block)
    m, h = synced(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, T))
    pos = torch.arange(T)[None].expand(2, T)
    with torch.no_grad():
        ref = h(ids, attention_mask=block_causal(T, block)[None, None].expand(2, 1, T, T), position_ids=pos).logits
        out = m(ids)
        causal = h(ids, position_ids=pos).logits
    assert (out - ref).abs().max() <= 1e-5
    if block > 1:  # negative control: the mask is really exercised
        assert (out - causal).abs().max() > 1e-2


def test_sdar_eager_additive_mask():
    cfg = tiny_cfg("sdar")
    m = ours(cfg)
    h = hf_model(cfg, "eager")
    h.load_state_dict(m.state_dict())
    T = 10
    add = torch.zeros(T, T).masked_fill(~block_causal(T, 4), torch.finfo(torch.float32).min)
    ids = torch.randint(0, 128, (1, T))
    with torch.no_grad():
        ref = h(ids, attention_mask=add[None, None], position_ids=torch.arange(T)[None]).logits
        assert (m(ids) - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("tie", [False, True])
def test_qwen3_matches_causal(tie):
    cfg = tiny_cfg("qwen3", tie=tie, block=1)
    m, h = synced(cfg)
    ids = torch.randint(0, 128, (2, 11))
    with torch.no_grad():
        assert (m(ids) - h(ids).logits).abs().max() <= 1e-5


def test_llada_matches_llama_all_visible():
    cfg = tiny_cfg("llada")
    m, h = synced(cfg)
    T = 9
    ids = torch.randint(0, 128, (2, T))
    with torch.no_grad():
        ref = h(ids, attention_mask=torch.ones(2, 1, T, T, dtype=torch.bool), position_ids=torch.arange(T)[None]).logits
        out = m(ids)
        assert (out - ref).abs().max() <= 1e-5
        assert (out - h(ids).logits).abs().max() > 1e-2  # causal differs
        # right padding: key-padding mask on the real rows equals the unpadded forward
        lengths = torch.tensor([6, 9])
        pm = padding_mask("llada", 32, lengths, T)
        padded = m(ids, attn=pm)
        alone = m(ids[:1, :6])
        assert (padded[0, :6] - alone[0]).abs().max() <= 1e-5


def test_cached_block_decode_equals_full_forward():
    cfg = tiny_cfg("sdar", block=4)
    m = ours(cfg)
    ids = torch.randint(0, 128, (2, 12))
    cache = KVCache(cfg, 2, 16)
    with torch.no_grad():
        full = m(ids)
        m(ids[:, :8], cache=cache, cache_pos=torch.arange(8))  # prefill two blocks
        step = m(ids[:, 8:12], position_ids=torch.arange(8, 12), cache=cache, cache_pos=torch.arange(8, 12))
    assert (step - full[:, 8:12]).abs().max() <= 1e-5
    # per-row slots (ragged batches) give the same
    cache2 = KVCache(cfg, 2, 16)
    with torch.no_grad():
        m(ids[:, :8], cache=cache2, cache_pos=torch.arange(8)[None].expand(2, 8))
        step2 = m(ids[:, 8:12], position_ids=torch.arange(8, 12), cache=cache2,
                  cache_pos=torch.arange(8, 12)[None].expand(2, 4))
    assert (step2 - step).abs().max() <= 1e-6


def test_bd_training_mask_noisy_rows_equal_cached_decode():
    """The noisy copy's logits under the [noisy | clean] mask equal block-by-block decoding."""
    cfg = tiny_cfg("sdar", block=4)
    m = ours(cfg)
    n = 12
    clean = torch.randint(4, 128, (1, n))
    noisy = clean.clone()
    noisy[0, [1, 5, 6, 9, 11]] = cfg.mask_id
    mask = bd_training_mask(torch.tensor([n]), n, 4)
    pos = torch.cat([torch.arange(n), torch.arange(n)])
    with torch.no_grad():
        out = m(torch.cat([noisy, clean], 1), position_ids=pos, attn=mask)
        for b in range(3):
            seq = torch.cat([clean[:, : 4 * b], noisy[:, 4 * b: 4 * b + 4]], 1)
            ref = m(seq)[:, 4 * b:]
            assert (out[:, 4 * b: 4 * b + 4] - ref).abs().max() <= 1e-5
        assert (out[:, n:] - m(clean)).abs().max() <= 1e-5  # clean half = plain block-causal forward
    # padded rows: a shorter sample padded to n gives the same noisy logits on its real tokens
    lens = torch.tensor([n, 7])
    mask2 = bd_training_mask(lens, n, 4)
    x = torch.cat([noisy, clean], 1).repeat(2, 1)
    with torch.no_grad():
        out2 = m(x, position_ids=pos, attn=mask2)
        short = bd_training_mask(torch.tensor([7]), 7, 4)
        ref7 = m(torch.cat([noisy[:, :7], clean[:, :7]], 1), position_ids=torch.cat([torch.arange(7)] * 2), attn=short)
    assert torch.isfinite(out2).all()
    assert (out2[1, :7] - ref7[0, :7]).abs().max() <= 1e-5


def test_family_mask_kinds():
    p = torch.arange(6)[None]
    assert family_mask("llada", 4, p, p) is None
    assert torch.equal(family_mask("qwen3", 4, p, p)[0, 0], torch.tril(torch.ones(6, 6, dtype=torch.bool)))
    assert torch.equal(family_mask("sdar", 2, p, p)[0, 0], block_causal(6, 2))


# ----------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("family", ["sdar", "qwen3", "llada"])
def test_save_load_roundtrip_and_transformers(tmp_path, family):
    cfg = tiny_cfg(family, block=4 if family == "sdar" else 1)
    m = ours(cfg)
    ids = torch.randint(0, 128, (1, 10))
    m.save_pretrained(tmp_path / "native")
    m2 = DiffusionLM.from_pretrained(str(tmp_path / "native"))
    assert m2.cfg.family == family and m2.cfg.block_size == cfg.block_size
    with torch.no_grad():
        assert torch.equal(m(ids), m2(ids))
    # the "hf" layout loads in transformers with equal logits under the family's mask
    m.save_pretrained(tmp_path / "hf", layout="hf")
    cls = transformers.LlamaForCausalLM if family == "llada" else transformers.Qwen3ForCausalLM
    h = cls.from_pretrained(str(tmp_path / "hf"), attn_implementation="sdpa").eval()
    T = ids.shape[1]
    mask = {"sdar": block_causal(T, 4), "qwen3": torch.tril(torch.ones(T, T, dtype=torch.bool)),
            "llada": torch.ones(T, T, dtype=torch.bool)}[family]
    with torch.no_grad():
        ref = h(ids, attention_mask=mask[None, None], position_ids=torch.arange(T)[None]).logits
        assert (m(ids) - ref).abs().max() <= 1e-5
    # the native llada layout uses LLaDA's names
    if family == "llada":
        from safetensors import safe_open
        with safe_open(str(tmp_path / "native" / "model.safetensors"), "pt") as f:
            keys = set(f.keys())
        assert "model.transformer.wte.weight" in keys and "model.transformer.blocks.0.ff_out.weight" in keys
        assert "model.transformer.ff_out.weight" in keys


def test_transformers_checkpoint_loads_in_ours(tmp_path):
    cfg = tiny_cfg("qwen3", block=1, tie=True)
    torch.manual_seed(1)
    h = hf_model(cfg)
    h.save_pretrained(str(tmp_path))
    m = DiffusionLM.from_pretrained(str(tmp_path))
    assert m.cfg.family == "qwen3" and m.cfg.tie_embeddings
    ids = torch.randint(0, 128, (2, 9))
    with torch.no_grad():
        assert (m(ids) - h(ids).logits).abs().max() <= 1e-5


def test_sharded_checkpoint_loads(tmp_path):
    cfg = tiny_cfg("sdar")
    m = ours(cfg)
    m.save_pretrained(str(tmp_path), max_shard_bytes=60_000)
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 2
    m2 = DiffusionLM.from_pretrained(str(tmp_path))
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        assert torch.equal(m(ids), m2(ids))


def test_bf16_load(tmp_path):
    m = ours(tiny_cfg("sdar"))
    m.save_pretrained(str(tmp_path))
    mb = DiffusionLM.from_pretrained(str(tmp_path), dtype=torch.bfloat16)
    assert mb.lm_head.weight.dtype == torch.bfloat16
    ids = torch.randint(0, 128, (1, 8))
    with torch.no_grad():
        agree = (mb(ids).float().argmax(-1) == m(ids).argmax(-1)).float().mean()
    assert agree > 0.8


def test_loader_errors(tmp_path):
    cfg = tiny_cfg("sdar")
    m = ours(cfg)
    with pytest.raises(CheckpointError, match="not found"):
        DiffusionLM.from_pretrained(str(tmp_path / "nope"))
    m.save_pretrained(str(tmp_path))
    from safetensors.torch import load_file, save_file
    state = load_file(str(tmp_path / "model.safetensors"))
    # wrong shape
    bad = dict(state)
    bad["model.layers.0.mlp.up_proj.weight"] = torch.zeros(5, 5)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.0\.mlp\.up_proj\.weight: checkpoint \(5, 5\)"):
        DiffusionLM.from_pretrained(str(tmp_path))
    # missing + unexpected tensor
    bad = dict(state)
    bad.pop("model.layers.1.self_attn.k_norm.weight")
    bad["model.layers.9.extra.weight"] = torch.zeros(1)
    save_file(bad, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="missing tensors.*k_norm.*unexpected tensors.*extra"):
        DiffusionLM.from_pretrained(str(tmp_path))
    # truncated file
    save_file(state, str(tmp_path / "model.safetensors"))
    raw = open(tmp_path / "model.safetensors", "rb").read()
    open(tmp_path / "model.safetensors", "wb").write(raw[: len(raw) // 2])
    with pytest.raises(CheckpointError, match="cannot read safetensors"):
        DiffusionLM.from_pretrained(str(tmp_path))
    # unknown model_type, bad config values
    c = json.load(open(tmp_path / "config.json"))
    json.dump({**c, "model_type": "gpt9"}, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match="unknown model_type 'gpt9'"):
        DiffusionLM.from_pretrained(str(tmp_path))
    json.dump({**c, "num_key_value_heads": 3}, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match="num_kv_heads"):
        DiffusionLM.from_pretrained(str(tmp_path))
    json.dump({**c, "hidden_size": -4}, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match="hidden_size"):
        DiffusionLM.from_pretrained(str(tmp_path))
    del c["num_hidden_layers"]
    json.dump(c, open(tmp_path / "config.json", "w"))
    with pytest.raises(CheckpointError, match="num_hidden_layers"):
        DiffusionLM.from_pretrained(str(tmp_path))


def test_meta_init_and_tying():
    cfg = tiny_cfg("sdar", tie=True)
    m = DiffusionLM.from_config(cfg)
    assert m.lm_head.weight is m.model.embed_tokens.weight
    assert all(torch.isfinite(p).all() for p in m.parameters())
    assert not any(p.is_meta for p in m.parameters())


def test_bd_mask_trimmed_noisy_copy_is_exact():
    """Leaving out the noisy copy of prompt-only blocks changes no scored logit."""
    cfg = tiny_cfg("sdar", block=4)
    m = ours(cfg)
    n = 14
    clean = torch.randint(4, 128, (2, n))
    noisy = clean.clone()
    noisy[:, [9, 10, 12]] = cfg.mask_id
    lens = torch.tensor([n, 13])
    pos = torch.arange(n)
    with torch.no_grad():
        full = m(torch.cat([noisy, clean], 1), torch.cat([pos, pos]), attn=bd_training_mask(lens, n, 4))
        trim = m(torch.cat([noisy[:, 8:], clean], 1), torch.cat([pos[8:], pos]),
                 attn=bd_training_mask(lens, n, 4, noisy_start=8))
    assert (full[:, 8:n] - trim[:, : n - 8]).abs().max() <= 1e-5
    with pytest.raises(ValueError, match="multiple of block_size"):
        bd_training_mask(lens, n, 4, noisy_start=6)
