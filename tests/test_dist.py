"""dist.py: 2 processes (torchrun, gloo, FSDP2) against 1 process; kill-and-resume; corrupt
checkpoints; HF export loaded by DiffusionLM and transformers."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _dist_worker as w  # noqa: E402
from _launch import torchrun  # noqa: E402

from d3mini import dist  # noqa: E402
from d3mini.config import TrainConfig  # noqa: E402
from d3mini.lora import merged_state_dict  # noqa: E402
from d3mini.model import DiffusionLM, read_safetensors  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "_dist_worker.py")
SCENARIOS = ["fsdp", "fsdp_ac", "replicate", "lora", "tied"]


def _env():
    env = {k: v for k, v in os.environ.items()
           if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=ROOT + os.pathsep + env.get("PYTHONPATH", ""))
    return env


def _check(r, expect_rc=0):
    assert r.returncode == expect_rc, f"rc {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def _run(args, expect_rc=0):
    return _check(subprocess.run([sys.executable, *args], env=_env(), capture_output=True, text=True,
                                 timeout=300), expect_rc)


def _read(out, name):
    with open(os.path.join(out, f"{name}.json")) as f:
        return json.load(f), load_file(os.path.join(out, f"{name}.safetensors"))


@pytest.fixture(scope="module")
def one_proc():
    """The same scenarios in this process, world size 1, one thread as each worker rank."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    info = dist.setup(threads=1)
    assert (info.world, info.rank, info.is_main, info.device.type) == (1, 0, True, "cpu")
    res = w.scenarios(info)
    torch.set_num_threads(threads)
    return res


@pytest.fixture(scope="module")
def two_proc(tmp_path_factory):
    out = tmp_path_factory.mktemp("two_proc")
    _check(torchrun(["--nproc_per_node", "2", WORKER, "parity", str(out)], env=_env(), timeout=300))
    return str(out)


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b)
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


@pytest.mark.parametrize("name", SCENARIOS)
def test_two_processes_equal_one_process(name, one_proc, two_proc):
    ref_metrics, ref = one_proc[name]
    metrics, got = _read(two_proc, name)
    assert len(metrics) == len(ref_metrics) == 3
    for a, b in zip(metrics, ref_metrics):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and abs(a["grad_norm"] - b["grad_norm"]) <= 1e-5
        assert a["lr"] == b["lr"]
    assert _max_diff(got, ref) <= 1e-6  # gradients of step 0 and parameters after 3 steps
    # the check has teeth: gradients are not zero and the parameters moved
    assert max(v.abs().max().item() for k, v in ref.items() if k.startswith("grad/")) > 1e-2
    init = w.build(**({"lora": 4} if name == "lora" else {"tie": True} if name == "tied" else {}))
    moved = {k: (ref["param/" + k] - v).abs().max().item() for k, v in init.state_dict().items()}
    assert max(moved.values()) > 1e-4
    if name == "lora":  # only adapters train
        assert all(d == 0.0 for k, d in moved.items() if "lora_" not in k)
        assert set(k for k in ref if k.startswith("grad/")) == {f"grad/{k}" for k in moved if "lora_" in k}


def test_process_group_helpers(two_proc):
    with open(os.path.join(two_proc, "helpers.json")) as f:
        h = json.load(f)
    assert h["world"] == 2 and h["ranks"] == [0, 1]
    assert h["mean_rank"] == 0.5 and h["sum_int"] == 3 and isinstance(h["sum_int"], int)
    assert h["dict_mean"] == {"a": 1.5, "b": -1.0} and h["tensor_sum"] == [1.0, 3.0]
    assert h["threads"] == [max(1, h["cores"] // 2)] * 2  # cores // local world size


def test_two_process_resume_is_exact(one_proc, two_proc):
    ref_m, ref_p = _read(two_proc, "resume_ref")
    got_m, got_p = _read(two_proc, "resume")
    assert got_m == ref_m and [m["step"] for m in got_m] == [1, 2, 3, 4, 5]
    assert all(torch.equal(got_p[k], ref_p[k]) for k in ref_p)
    # and the FSDP run equals the single-process run of the same loop
    info = dist.setup(threads=1)
    model = w.build(7)
    _, _, m1 = w.train(model, info, steps=5)
    assert max(abs(a["loss"] - b["loss"]) for a, b in zip(m1, ref_m)) <= 1e-6
    assert _max_diff(dict(model.state_dict()), ref_p) <= 1e-6


def test_fsdp_lora_export_is_merged(one_proc, two_proc):
    _, ref = one_proc["lora"]
    params = {k[len("param/"):]: v for k, v in ref.items() if k.startswith("param/")}
    scales = {k[: -len(".lora_A.weight")]: 8.0 / 4 for k in params if k.endswith(".lora_A.weight")}
    expect = merged_state_dict(params, scales)
    path = os.path.join(two_proc, "export_lora")
    assert _max_diff(read_safetensors(path), expect) <= 1e-6
    m = DiffusionLM.from_pretrained(path)
    assert not any("lora" in k for k in m.state_dict())


def test_kill_and_resume_matches_uninterrupted(tmp_path):
    out = str(tmp_path)
    _run([WORKER, "loop", out, "--steps", "6", "--stop-at", "4", "--threads", "1"], expect_rc=-9)
    assert not os.path.exists(os.path.join(out, "loop.json"))  # really died before finishing
    assert sorted(os.listdir(os.path.join(out, "ckpt"))) == ["step_00000002", "step_00000003", "step_00000004"]
    _run([WORKER, "loop", out, "--steps", "6", "--threads", "1"])
    metrics, params = _read(out, "loop")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = w.build(7)
    _, _, ref_metrics = w.train(model, dist.setup(threads=1), steps=6)
    torch.set_num_threads(threads)
    assert metrics == ref_metrics
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())


def test_corrupt_checkpoint_falls_back(tmp_path):
    info = dist.setup(threads=0)
    ckpt = str(tmp_path / "ckpt")
    model = w.build(7)
    opt, sched, full = w.train(model, info, steps=4, ckpt=ckpt)
    final = {k: v.clone() for k, v in model.state_dict().items()}
    assert sorted(os.listdir(ckpt)) == [f"step_0000000{i}" for i in (2, 3, 4)]  # keep=3
    os.makedirs(os.path.join(ckpt, ".tmp_step_00000005"))  # a save that crashed: never a candidate
    with open(os.path.join(ckpt, ".tmp_step_00000005", "model.safetensors"), "wb") as f:
        f.write(b"partial")
    assert dist.latest_checkpoint(ckpt) == os.path.join(ckpt, "step_00000004")
    # truncate the newest checkpoint's weights: detected, previous one used, with a warning
    fp = os.path.join(ckpt, "step_00000004", "model.safetensors")
    with open(fp, "r+b") as f:
        f.truncate(os.path.getsize(fp) // 2)
    with pytest.warns(UserWarning, match="step_00000004 is corrupt"):
        assert dist.latest_checkpoint(ckpt) == os.path.join(ckpt, "step_00000003")
    # same size, one byte flipped: only the hash sees it
    fp3 = os.path.join(ckpt, "step_00000003", "optimizer.safetensors")
    shutil.copyfile(fp3, fp3 + ".bak")
    with open(fp3, "r+b") as f:
        f.seek(os.path.getsize(fp3) - 3)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0xFF]))
    with pytest.warns(UserWarning, match="sha256"):
        assert dist.latest_checkpoint(ckpt) == os.path.join(ckpt, "step_00000002")
    assert dist.latest_checkpoint(ckpt, hashes=False) == os.path.join(ckpt, "step_00000003")
    os.replace(fp3 + ".bak", fp3)
    # resume from step 3 in fresh objects: reaches the same step-4 parameters and metrics
    model2 = w.build(99)
    opt2, sched2 = w.make_opt(model2)
    with pytest.warns(UserWarning, match="corrupt"):
        extra = dist.load(ckpt, model2, opt2, sched2)
    assert extra["step"] == 3 and extra["cursor"] == 3 and extra["metrics"] == full[:3]
    _, _, m2 = w.train(model2, info, steps=4, opt=opt2, sched=sched2, start=3, metrics=extra["metrics"])
    assert m2 == full
    assert all(torch.equal(final[k], v) for k, v in model2.state_dict().items())
    # a checkpoint folder given directly is checked too
    with pytest.raises(Exception, match="model.safetensors has"):
        dist.load(os.path.join(ckpt, "step_00000004"), model2)
    dist.save(ckpt, 5, model2, opt2, sched2, {})  # the next save clears the crashed one's leftovers
    assert sorted(os.listdir(ckpt)) == [f"step_0000000{i}" for i in (3, 4, 5)]


def test_checkpoint_extra_tensors_and_errors(tmp_path):
    model = w.build(0, tie=True)
    g = torch.Generator().manual_seed(5)
    torch.rand(3, generator=g)
    path = dist.save(str(tmp_path), 7, model, None, None, {"stage": "rl", "gen": g.get_state()})
    expect = torch.rand(4, generator=g)
    model2 = w.build(1, tie=True)
    extra = dist.load(path, model2)
    assert extra["step"] == 7 and extra["stage"] == "rl"
    assert torch.equal(torch.rand(4, generator=torch.Generator().set_state(extra["gen"])), expect)
    assert model2.lm_head.weight is model2.model.embed_tokens.weight  # tying survives
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values()))
    with pytest.raises(TypeError, match="JSON"):
        dist.save(str(tmp_path), 8, model, None, None, {"bad": object()})
    assert dist.latest_checkpoint(str(tmp_path)) == path  # the failed save left the good one alone
    with pytest.raises(Exception, match="optimizer"):
        dist.load(path, model2, torch.optim.SGD(model2.parameters(), lr=0.1))
    with pytest.raises(Exception, match="no intact checkpoint"):
        dist.load(str(tmp_path / "empty"), model2)


def test_shard_single_process_and_activation_checkpointing():
    info = dist.setup(threads=0)
    ref = w.build(3)
    g_ref = w.grads_after_one_step(ref, info)
    m = dist.shard(w.build(3), TrainConfig(activation_checkpointing=True), info)
    assert not any(isinstance(p, torch.distributed.tensor.DTensor) for p in m.parameters())
    assert list(dict(m.named_parameters())) == list(dict(ref.named_parameters()))
    g = w.grads_after_one_step(m, info)
    assert _max_diff(g, g_ref) <= 1e-6
    with torch.no_grad():  # decoding path unaffected
        ids = torch.randint(0, 64, (2, 8))
        assert torch.equal(m(ids), ref(ids))


# ----------------------------------------------------------------------------- HF export
def tiny_tokenizer(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"t{i}": i for i in range(64)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="t1"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return tok


@pytest.mark.parametrize("family", ["sdar", "qwen3", "llada"])
def test_export_hf_loads_in_ours_and_transformers(tmp_path, family):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = DiffusionLM.from_config(w.tiny_cfg(family)).eval()
    with torch.no_grad():  # norms away from 1
        for n, p in model.named_parameters():
            if "norm" in n:
                p.add_(0.3 * torch.randn_like(p))
    tok = tiny_tokenizer(tmp_path)
    path = str(tmp_path / "hf")
    dist.export_hf(model, tok, path, layout="hf")
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(os.listdir(path))
    assert type(tok).from_file(os.path.join(path, "tokenizer.json")).encode("t5 t9").ids == [5, 9]
    ids = torch.randint(0, 64, (2, 12))
    T = ids.shape[1]
    pos = torch.arange(T)
    with torch.no_grad():
        ref = model(ids)
        ours = DiffusionLM.from_pretrained(path).eval()(ids)
        cls = transformers.LlamaForCausalLM if family == "llada" else transformers.Qwen3ForCausalLM
        h = cls.from_pretrained(path, attn_implementation="sdpa").eval()
        if family == "llada":
            mask = torch.ones(T, T, dtype=torch.bool)
        elif family == "sdar":
            mask = pos[None, :] // 4 <= pos[:, None] // 4  # the family's block-causal mask
        else:
            mask = pos[None, :] <= pos[:, None]
        theirs = h(ids, attention_mask=mask[None, None].expand(2, 1, T, T), position_ids=pos[None].expand(2, T)).logits
    assert torch.equal(ours, ref)
    assert (theirs - ref).abs().max() <= 1e-5
    if family == "llada":  # native LLaDA names load in ours too
        dist.export_hf(model, os.path.join(path, "tokenizer.json"), str(tmp_path / "native"), layout="native")
        assert any(k.startswith("model.transformer.") for k in read_safetensors(str(tmp_path / "native")))
        with torch.no_grad():
            assert torch.equal(DiffusionLM.from_pretrained(str(tmp_path / "native"))(ids), ref)
    # exporting again over the same folder replaces it
    dist.export_hf(model, None, path)
    assert "tokenizer.json" not in os.listdir(path)
    with pytest.raises(ValueError, match="layout"):
        dist.export_hf(model, None, path, layout="gguf")
