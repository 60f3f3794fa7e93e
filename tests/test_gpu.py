"""CUDA paths (skipped without a GPU): the model on CUDA against the CPU model, bf16 against fp32,
flash-attn against SDPA, cached and compiled decoding on CUDA against the CPU decoder, FSDP2's
bf16 mixed-precision policy, and the tiny pipeline end to end on CUDA in bf16.

    pytest -m gpu -q            # on a machine with CUDA
"""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_decode import rand_prompts, tiny_model  # noqa: E402
from test_train import ROOT, SMOKE  # noqa: E402

from d3mini import model as model_mod  # noqa: E402
from d3mini.config import DecodeConfig  # noqa: E402
from d3mini.decode import generate  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def exact_fp32():
    """TF32 off: fp32 on CUDA must agree with the CPU to float rounding, not to TF32's 10-bit mantissa."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def on(m, device, dtype=torch.float32):
    return copy.deepcopy(m).to(device=device, dtype=dtype)


@pytest.mark.parametrize("family,block", [("sdar", 4), ("llada", 4), ("qwen3", 1)])
def test_cuda_logits_match_cpu_fp32_and_bf16(family, block):
    m = tiny_model(family, block)
    ids = torch.randint(4, 128, (3, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = m(ids)
        f32 = on(m, CUDA)(ids.to(CUDA)).cpu()
        b16 = on(m, CUDA, torch.bfloat16)(ids.to(CUDA)).float().cpu()
    assert (f32 - ref).abs().max() <= 1e-4 * max(1.0, ref.abs().max().item())
    # bf16: 8-bit mantissa; the logits stay within a few percent of their spread and argmax mostly agrees
    assert (b16 - ref).abs().max() <= 0.05 * (ref.max() - ref.min())
    assert (b16.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


def test_flash_attn_matches_sdpa(monkeypatch):
    pytest.importorskip("flash_attn")
    assert model_mod._flash is not None
    m = on(tiny_model("llada", 4), CUDA, torch.bfloat16)  # all-visible attention: the flash path
    ids = torch.randint(4, 128, (2, 16), generator=torch.Generator().manual_seed(1)).to(CUDA)
    with torch.no_grad():
        flash = m(ids).float()
        monkeypatch.setattr(model_mod, "_flash", None)
        ref = m(ids).float()
    assert (flash - ref).abs().max() <= 0.02 * (ref.max() - ref.min())


@pytest.mark.parametrize("family,block", [("sdar", 4), ("qwen3", 1), ("llada", 4)])
def test_cuda_decode_equals_cpu_and_compiled_equals_eager(family, block):
    """fp32 greedy: the cached decoder on CUDA commits the same tokens in the same forwards as on
    the CPU; the torch.compile'd SDAR/AR step (fullgraph, CUDA) matches eager on CUDA."""
    m = tiny_model(family, block, eos_bias=0.3)
    prompts = rand_prompts([5, 11, 8], seed=4)
    c = dict(block_size=block, threshold=0.9 if block > 1 else 1.0, max_new_tokens=16)
    cpu = generate(m, prompts, DecodeConfig(**c))
    mc = on(m, CUDA)
    eager = generate(mc, prompts, DecodeConfig(**c))
    assert eager.tokens == cpu.tokens and eager.trace == cpu.trace
    if family == "llada":
        return  # LLaDA always runs eager
    comp = generate(mc, prompts, DecodeConfig(compile=True, **c))
    assert comp.tokens == eager.tokens and comp.trace == eager.trace
    # sampling: the compiled step draws from the same CUDA generator stream as eager
    s = [generate(mc, prompts, DecodeConfig(temperature=1.0, seed=2, compile=cc, **c)).tokens for cc in (False, True)]
    assert s[0] == s[1]


def test_bf16_compiled_decode_runs():
    """bf16 + torch.compile: exactness is checked in fp32 above; in bf16 one flipped near-tie changes
    everything after it, so only the first committed token of each row (same prefill, same first
    forward) is compared with eager bf16, and the decode must fill every row."""
    m = on(tiny_model("sdar", 4), CUDA, torch.bfloat16)
    prompts = rand_prompts([7, 12], seed=5)
    c = dict(block_size=4, threshold=0.9, max_new_tokens=16, stop_ids=[])
    eager = generate(m, prompts, DecodeConfig(**c))
    comp = generate(m, prompts, DecodeConfig(compile=True, **c))
    assert [len(t) for t in comp.tokens] == [16, 16] and all(0 <= x < 128 for t in comp.tokens for x in t)
    first = [min(range(16), key=lambda i: (tr[i], i)) for tr in eager.trace]  # committed by the first forward
    assert [t[i] for t, i in zip(comp.tokens, first)] == [t[i] for t, i in zip(eager.tokens, first)]
    assert 1.0 <= comp.totals()["tpf_denoise"] <= 4.0


def test_fsdp2_bf16_mixed_precision_step(monkeypatch):
    """dist.shard's CUDA policy (bf16 params in compute, fp32 gradient reduction) on a one-rank NCCL
    group: the sharded step's loss and gradients stay within bf16 rounding of the plain fp32 step,
    and the parameters and gradients the optimizer sees are fp32."""
    import torch.distributed as tdist

    from d3mini import dist
    from d3mini.config import TrainConfig

    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    tdist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        base = on(tiny_model("sdar", 4), CUDA)
        sharded = on(base, CUDA)
        # world 2 in the info only to take shard()'s FSDP branch; the group itself has one rank
        info = dist.DistInfo(rank=0, world=2, local_rank=0, device=CUDA, is_main=True)
        dist.shard(sharded, TrainConfig(mp_dtype="bfloat16"), info)
        ids = torch.randint(4, 128, (4, 16), generator=torch.Generator().manual_seed(3)).to(CUDA)
        losses = []
        for m in (base, sharded):
            loss = torch.nn.functional.cross_entropy(m(ids).float().flatten(0, 1), ids.flatten())
            loss.backward()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) <= 0.02 * losses[0]
        g_ref = base.lm_head.weight.grad
        g = sharded.lm_head.weight.grad
        g = g.full_tensor() if hasattr(g, "full_tensor") else g
        assert g.dtype == torch.float32 and sharded.lm_head.weight.dtype == torch.float32
        assert (g - g_ref).norm() <= 0.05 * g_ref.norm()
    finally:
        tdist.destroy_process_group()


def test_tiny_pipeline_on_cuda_bf16(tmp_path):
    """train.py (SFT -> RL -> distill, bf16 autocast) and eval.py end to end on the GPU."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join(x for x in (ROOT, os.environ.get("PYTHONPATH")) if x)}
    r = subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config",
                        os.path.join(ROOT, "configs/tiny.yaml"), f"train.out_dir={out}", *SMOKE,
                        "train.dtype=bfloat16"], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "device cuda" in r.stdout
    res = json.load(open(out / "results.json"))
    assert set(res) == {"sft", "rl", "distill"}
    recs = [json.loads(x) for x in open(out / "metrics.jsonl")]
    assert all(x["loss"] == x["loss"] for x in recs if isinstance(x.get("loss"), float))  # no NaN
    last = sorted(os.listdir(out / "ckpt"))[-1]
    ev = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--ckpt", str(out / "ckpt" / last),
                         "--threshold", "1.0", "--out", str(tmp_path / "ev")], capture_output=True, text=True,
                        env=env, cwd=ROOT, timeout=600)
    assert ev.returncode == 0, ev.stderr[-3000:]
    rec = json.load(open(tmp_path / "ev.json"))
    assert rec["results"][0]["num_episodes"] == 2
