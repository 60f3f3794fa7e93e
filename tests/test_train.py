"""Smoke run of the whole pipeline (tiny config, a few steps per stage), resume, and start-up errors."""
import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _launch import torchrun  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", "model.head_dim=16",
         "model.vocab_size=320", "sft.episodes=12", "sft.steps=3", "sft.ar_warmup=1", "sft.batch_size=4",
         "sft.warmup=1", "sft.val_every=2", "sft.val_episodes=2",
         "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch=8", "rl.micro_batch=8",
         "distill.steps=1", "distill.tasks_per_step=1", "distill.group_size=2", "distill.batch_size=4",
         "distill.expert_batch=4",
         "env.max_steps=3", "env.num_products=60", "env.num_goals=80", "env.num_test_goals=20",
         "eval.num_tasks=2", "eval.sweep=[1.0,0.9]", "decode.max_new_tokens=24", "train.save_every=2"]


def run(args, out, timeout=600):
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--config",
                           os.path.join(ROOT, "configs/tiny.yaml"), f"train.out_dir={out}", *SMOKE, *args],
                          capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)


def test_tiny_pipeline_smoke_and_resume(tmp_path):
    out = tmp_path / "run"
    r = run([], out)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.load(open(out / "results.json"))
    assert set(res) == {"sft", "rl", "distill"}
    # every eval row keeps its per-task outcomes, so the table compares stages task by task
    assert all(len(r["wins"]) == 2 and set(r["wins"]) <= {0, 1} for rs in res.values() for r in rs)
    table = open(out / "results.md").read().splitlines()
    assert "Δ vs previous (paired s.e.)" in table[4] and table[6].split("|")[3].strip() == "-"  # sft: none
    assert all("±" in line.split("|")[3] for line in table[7:9])  # rl and distill: vs the stage before
    recs = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert {x["stage"] for x in recs} >= {"sft", "rl", "distill"}
    sft_recs = [x for x in recs if x["stage"] == "sft"]  # held-out action accuracy at step 2 and at the end
    assert [x["step"] for x in sft_recs if "val_acc" in x] == [2, 3] and 0 <= sft_recs[-1]["val_acc"] <= 1
    # expert replay beside distillation, where an update ran (a smoke model seldom wins; the replay's own
    # test is test_distill_expert_replay_is_the_sft_loss_on_a_seeded_draw)
    dis = [x for x in recs if x["stage"] == "distill" and "step" in x]
    assert all(x["expert_loss"] > 0 for x in dis if not x["skipped"])
    # where a step's time goes: rollouts (the relabelling teacher's decodes within them) and the update
    assert all(0 < x["rollout/time_relabel"] < x["rollout/time_rollout"] < x["time"]
               and 0 < x["time/update"] < x["time"] for x in dis)
    assert os.path.exists(out / "export" / "model.safetensors") and os.path.exists(out / "results.md")
    assert os.path.exists(out / "tokenizer.json") and os.path.exists(out / "config.yaml")
    # the accuracy-vs-TPF plot of the stages, where matplotlib is installed (the plot extra)
    assert os.path.exists(out / "results.png") == bool(importlib.util.find_spec("matplotlib"))
    meta = json.load(open(out / "run.json"))  # the code that ran and the run's wall-clock
    assert len(meta["commits"]) == 1 and meta["wall_s"] > 0 and f"commit {meta['commits'][0]}," in table[0]
    # eval.py on the last resumable checkpoint (not the export) reproduces the run's own evaluation, task by task
    last = sorted(os.listdir(out / "ckpt"))[-1]
    ev = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--ckpt", str(out / "ckpt" / last),
                         "--threshold", "1.0", "--out", str(tmp_path / "ev")], capture_output=True, text=True,
                        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=ROOT, timeout=300)
    assert ev.returncode == 0, ev.stderr[-3000:]
    eps = json.load(open(tmp_path / "ev.json"))["results"][0]["episodes"]
    assert [int(e["won"]) for e in eps] == next(r["wins"] for r in res["distill"] if r["threshold"] == 1.0)
    # without --ckpt: the finished run in train.out_dir (its export, with the run's config)
    ev = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--threshold", "1.0", f"train.out_dir={out}",
                         "--out", str(tmp_path / "ev2")], capture_output=True, text=True,
                        env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}, cwd=ROOT, timeout=300)
    assert ev.returncode == 0 and f"evaluating {out / 'export'}" in ev.stderr, ev.stderr[-3000:]
    assert [int(e["won"]) for e in json.load(open(tmp_path / "ev2.json"))["results"][0]["episodes"]] == \
        next(r["wins"] for r in res["distill"] if r["threshold"] == 1.0)
    # resuming a finished run does no new training and keeps the results
    r2 = run(["--resume"], out)
    assert r2.returncode == 0, r2.stderr[-3000:]
    recs2 = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert [x for x in recs2 if x["stage"] in ("sft", "rl", "distill")] == \
        [x for x in recs if x["stage"] in ("sft", "rl", "distill")]
    meta2 = json.load(open(out / "run.json"))  # the same code: one commit; the wall-clock adds up
    assert meta2["commits"] == meta["commits"] and meta2["wall_s"] > meta["wall_s"]
    assert meta2["commands"] == [meta["commands"][0], meta["commands"][0] + " --resume"]
    head = open(out / "results.md").read().splitlines()
    assert "over 2 pieces (resumed)" in head[0] and head[1] == f"command: `{meta['commands'][0]}`"


def test_resume_with_a_larger_budget_extends_the_finished_stage(tmp_path):
    """A finished SFT resumed with more steps trains on from its checkpoint and is evaluated again."""
    out = tmp_path / "run"
    args = ["train.stages=[sft]", "eval.sweep=[1.0]", "eval.thresholds=[1.0]"]
    r = run(args, out)
    assert r.returncode == 0, r.stderr[-3000:]
    r2 = run(["--resume", "sft.steps=4", *args], out)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert "extending stage sft from 3 to 4 steps" in r2.stdout
    recs = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert [x["step"] for x in recs if x["stage"] == "sft"] == [1, 2, 3, 4]
    assert sum(1 for x in recs if x["stage"] == "eval/sft") == 2
    assert json.load(open(out / "ckpt" / "step_00000004" / "state.json"))["extra"]["done"]


def test_startup_errors(tmp_path):
    r = run(["model.path=/nonexistent/ckpt"], tmp_path / "a")
    assert r.returncode == 2 and "model.path" in r.stderr and "not found" in r.stderr
    r = run(["rl.lr=fast"], tmp_path / "b")
    assert r.returncode == 2 and "rl.lr" in r.stderr
    r = run(["env.server_url=http://127.0.0.1:9"], tmp_path / "c")
    assert r.returncode == 2 and "unreachable" in r.stderr
    r = run(["sft.episodes=500"], tmp_path / "d")  # tiny.yaml RL on unseen goals, none left: fail before SFT
    assert r.returncode == 2 and "rl.goals=unseen" in r.stderr and not (tmp_path / "d" / "ckpt").exists()


def _records(out):
    """The last metrics record of every (stage, step) of the training stages, without wall-clock fields."""
    last = {}
    for line in open(out / "metrics.jsonl"):
        x = json.loads(line)
        if x["stage"] in ("sft", "rl", "distill"):
            last[(x["stage"], x["step"])] = {k: v for k, v in x.items() if "time" not in k and "per_s" not in k}
    return last


def _weights(out):
    from safetensors.torch import load_file
    return load_file(str(out / "export" / "model.safetensors"))


def _assert_same_weights(a, b, atol):
    import torch
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def test_killed_mid_stage_and_resumed_equals_uninterrupted(tmp_path):
    """A run killed abruptly (os._exit, no cleanup) inside SFT, stopped by a Ctrl-C inside RL and killed
    again inside distill, then resumed each time, ends with the same weights, metrics and eval results as
    an uninterrupted run. RL's KL reference and distillation's teacher are on: the resumed distillation
    reads its teacher back from disk."""
    args = ["sft.steps=5", "rl.steps=2", "distill.steps=3", "train.save_every=2", "train.threads=1",
            "eval.sweep=[1.0]", "rl.kl=k3", "distill.teacher_weight=1.0"]
    a, b = tmp_path / "a", tmp_path / "b"
    r = run(args, a)
    assert r.returncode == 0, r.stderr[-3000:]
    os.environ["D3MINI_CRASH_AT"] = "sft:3"
    try:
        r = run(args, b)
        assert r.returncode == 75, r.stderr[-3000:]  # died after sft step 3; last checkpoint at step 2
        assert not (b / "results.json").exists()
        del os.environ["D3MINI_CRASH_AT"]
        os.environ["D3MINI_SIGNAL_AT"] = "rl:1"  # a Ctrl-C during RL step 1, between save_every's checkpoints
        r = run(args + ["--resume"], b)
        assert r.returncode == 130, r.stderr[-3000:]
        assert "stopping when the step" in r.stderr and "stopped at rl step 1" in r.stderr
        assert "step_00100001" in os.listdir(b / "ckpt")  # the step in progress, saved
        assert set(json.load(open(b / "results.json"))) == {"sft"}
        del os.environ["D3MINI_SIGNAL_AT"]
        os.environ["D3MINI_CRASH_AT"] = "distill:2"  # after distill's checkpoint at step 2
        r = run(args + ["--resume"], b)
        assert r.returncode == 75, r.stderr[-3000:]
        assert "resuming from" in r.stdout
        assert (b / "frozen" / "rl").is_dir() and (b / "frozen" / "distill").is_dir()  # reference, teacher
    finally:
        for k in ("D3MINI_CRASH_AT", "D3MINI_SIGNAL_AT"):
            os.environ.pop(k, None)
    r = run(args + ["--resume"], b)
    assert r.returncode == 0, r.stderr[-3000:]
    _assert_same_weights(_weights(a), _weights(b), atol=0)
    assert _records(a) == _records(b)
    ra, rb = json.load(open(a / "results.json")), json.load(open(b / "results.json"))
    for stage in ra:
        for x, y in zip(ra[stage], rb[stage]):
            assert {k: v for k, v in x.items() if "time" not in k and "per_s" not in k} == \
                   {k: v for k, v in y.items() if "time" not in k and "per_s" not in k}


def test_torchrun_two_processes_equal_one_process(tmp_path):
    """torchrun --nproc_per_node 2 (gloo, FSDP2) through train.py's own SFT (with a DAgger round) and RL
    stages: the same corrections, losses and gradient norms (1e-6 relative) and the same updated parameters
    as one process on the same global batches. fp32: bf16 autocast rounds differently for the half-size per-rank matmuls. The
    parameter tolerance is 1% of one Adam step (lr 2e-3): Adam's first update is g / (|g| + eps) per
    coordinate, so a gradient entry near 1e-9 whose 7th digit differs (another matmul blocking for
    the half batch) moves by up to ~1e-6 although every loss and norm agrees to 1e-7."""
    args = ["train.stages=[sft,rl]", "sft.steps=2", "rl.steps=1", "train.threads=1", "eval.num_tasks=1",
            "train.dtype=float32", "rl.kl=k3",  # the frozen reference: a copy of the sharded model, saved
            "sft.dagger_at=[1]", "sft.dagger_tasks=2",  # every rank rolls the sharded model out alike
            "eval.sweep=[1.0]", "eval.thresholds=[1.0]"]
    one, two = tmp_path / "one", tmp_path / "two"
    r = run(args, one)
    assert r.returncode == 0, r.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_WAIT_POLICY="PASSIVE", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT)
    r = torchrun(["--nproc_per_node", "2", os.path.join(ROOT, "train.py"), "--config",
                  os.path.join(ROOT, "configs/tiny.yaml"), f"train.out_dir={two}", *SMOKE, *args],
                 env=env, out=two, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert "world 2" in r.stdout
    ra, rb = _records(one), _records(two)
    assert ra.keys() == rb.keys() and ("rl", 1) in ra
    fixes = [json.load(open(d / "dagger" / "step_00000001.json")) for d in (one, two)]
    assert fixes[0] == fixes[1]
    for key in ra:
        for k, v in ra[key].items():
            if k in ("loss", "grad_norm", "rl/loss", "pg_loss") and isinstance(v, float):
                assert abs(v - rb[key][k]) <= 1e-6 * max(1.0, abs(v)), (key, k, v, rb[key][k])
    _assert_same_weights(_weights(one), _weights(two), atol=2e-5)


def test_sft_block_schedule_phases_and_errors(tmp_path):
    sys.path.insert(0, ROOT)
    import train
    from d3mini.config import load_config
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), ["sft.steps=100", "sft.ar_warmup=20",
                                                                  "sft.block_schedule=[2,4,8,8]"])
    got = [train.sft_block_size(cfg, s) for s in (0, 19, 20, 39, 40, 60, 99)]
    assert got == [0, 0, 2, 2, 4, 8, 8]  # 0 = AR warm-up / the model's own block size
    r = run(["sft.block_schedule=[2,4]"], tmp_path / "a")
    assert r.returncode == 2 and "sft.block_schedule" in r.stderr
    r = run(["sft.suffix_masks=1.5"], tmp_path / "b")
    assert r.returncode == 2 and "sft.suffix_masks" in r.stderr


def test_unseen_goals_leave_out_the_sft_tasks():
    sys.path.insert(0, ROOT)
    import train
    from d3mini.config import ConfigError, load_config
    base = ["env.num_products=60", "env.num_goals=80", "env.num_test_goals=20"]
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), base + ["sft.episodes=25"])
    train_ids = train.policy_task_ids(cfg, "train")
    assert train_ids == list(range(20, 80))
    assert train.sft_task_ids(cfg) == list(range(20, 45))  # enough train tasks: the first 25, no repeats
    assert train.policy_task_ids(cfg, "unseen") == list(range(45, 80))
    # fewer train tasks than SFT episodes: a seeded draw with repeats; unseen = the tasks it missed
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), base + ["sft.episodes=70"])
    sft = train.sft_task_ids(cfg)
    assert len(sft) == 70 and set(sft) < set(train_ids) and sft == train.sft_task_ids(cfg)
    assert sorted(train.policy_task_ids(cfg, "unseen")) == sorted(set(train_ids) - set(sft))
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), base + ["sft.episodes=1000"])
    with pytest.raises(ConfigError, match="rl.goals=unseen: all 60 train tasks.*raise env.num_goals"):
        train.policy_task_ids(cfg, "unseen", "rl.goals")
    with pytest.raises(ConfigError, match="rl.goals"):
        load_config(os.path.join(ROOT, "configs/tiny.yaml"), ["rl.goals=held_out"])


def test_results_table_delta_pairs_the_same_threshold():
    sys.path.insert(0, ROOT)
    import train
    from d3mini.config import load_config
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"))
    row = lambda t, wins: {"threshold": t, "num_episodes": len(wins), "failed_episodes": wins.count(None),
                           "success": sum(w or 0 for w in wins) / len(wins), "score": 0.0, "valid_ratio": 1.0,
                           "tpf_denoise": 1.0, "wins": wins}
    res = {"a": [row(1.0, [0, 0, 0, 0]), row(0.95, [1, 1, 1, 1])],
           "b": [row(1.0, [1, 1, 0, 0])],          # only tau 1.0: compared with a's tau 1.0, not its 0.95
           "c": [row(1.0, [None] * 4)],            # no shared outcome: no change shown, no error
           "d": [row(1.0, [1, 1, 1, 1]), {**row(0.9, [0, 0, 0, 0]), "tpf_denoise": 2.0}]}  # AUP rejects
    lines = train.results_table(res, cfg, 90.0, "x", commits=["aaa1111", "bbb2222"], pieces=3).splitlines()
    assert lines[0].endswith("commits aaa1111 → bbb2222 (resumed across commits), wall-clock 1.5 min over 3 pieces "
                             "(resumed)")
    assert lines[-3].split("|")[3].strip() == "+50.0 ± 25.0" and lines[-2].split("|")[3].strip() == "-"
    assert lines[-4].split("|")[2].strip() == "100.0 ± 0.0"  # a's tau 0.95 row
    assert lines[-3].split("|")[2].strip() == "50.0 ± 25.0 (τ 1.0)"  # b has no tau 0.95 row: its tau is named
    assert lines[-1].split("|")[9].strip() == "rejected" and lines[-3].split("|")[9].strip() != "rejected"
    assert lines[-4].split("|")[6].strip() == "-"  # neither the count nor the steps to derive it


def test_results_table_invalid_actions_per_episode():
    """The count column: from invalid_per_episode, else (1 - valid ratio) x steps (older results), with the
    paired change against the stage above where both stages carry per-task counts."""
    sys.path.insert(0, ROOT)
    import train
    from d3mini.config import load_config
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"))
    base = {"threshold": 0.95, "num_episodes": 4, "failed_episodes": 0, "success": 0.5, "score": 0.0,
            "tpf_denoise": 1.0, "wins": [1, 1, 0, 0]}
    res = {"old": [{**base, "valid_ratio": 0.75, "steps": 8.0}],                       # 2 of 8 steps invalid
           "sft": [{**base, "valid_ratio": 0.8, "steps": 10.0, "invalid_per_episode": 2.0, "invalid": [2, 2, 2, 2]}],
           # shorter episodes, one invalid action fewer on two tasks: the ratio falls, the count falls too
           "rl": [{**base, "valid_ratio": 0.75, "steps": 6.0, "invalid_per_episode": 1.5, "invalid": [1, 1, 2, 2]}]}
    lines = train.results_table(res, cfg, 60.0, "x", commits=["aaa1111"]).splitlines()
    col = lambda i: lines[i].split("|")[6].strip()
    assert "invalid / episode (Δ)" in lines[4]
    assert col(-3) == "2.00" and col(-2) == "2.00"   # old results: derived; sft: no per-task counts above it
    # d = (-1, -1, 0, 0): mean -0.5, variance 0.25, se sqrt(0.25 / 4)
    assert col(-1) == f"1.50 (-0.50 ± {math.sqrt(0.25 / 4):.2f})"


def test_sft_validation_scores_teacher_forced_actions_per_kind(monkeypatch, tmp_path):
    """sft_validate compares the greedy answer's projected action with the expert's, per action kind.
    The decoder is replaced by one that answers with the expert's own text (all right) or with a
    product id one character off (every product click wrong, the rest right)."""
    sys.path.insert(0, ROOT)
    import torch
    import train
    from d3mini.config import ConfigError, load_config
    from d3mini.decode import DecodeResult
    from d3mini.envs.webshop import action_kind
    assert [action_kind(a) for a in ("search[red shoes]", "click[b0q13]", "click[next >]", "click[buy now]",
                                     "click[x-large]")] == ["search", "product", "nav", "nav", "option"]
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"),
                      ["env.num_products=60", "env.num_goals=80", "env.num_test_goals=20", "sft.episodes=25",
                       "sft.val_every=10", "sft.val_episodes=4", "model.vocab_size=320",
                       f"train.out_dir={tmp_path}"])
    info = train.dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    tok = train.build_tokenizer(cfg, info)
    val = train.sft_val_set(cfg, tok)
    assert len({s.episode_id for s in val}) == 4 and {action_kind(s.action) for s in val} >= {"search", "product"}
    by_prompt = {tuple(s.prompt_ids): s for s in val}

    def answer(edit):
        def fake_generate(model, prompts, dcfg, tokenizer=None):
            texts = [edit(by_prompt[tuple(p)].text) for p in prompts]
            n = [len(t) for t in texts]
            return DecodeResult(tokens=[[0] * k for k in n], text=texts, n_generated=n, stopped=[False] * len(n),
                                nfe_denoise=[max(k // 2, 1) for k in n], nfe_total=n, tpf_denoise=[2.0] * len(n),
                                tpf_total=[1.0] * len(n), trace=[], confidence=[])
        return fake_generate

    model = torch.nn.Linear(1, 1)
    monkeypatch.setattr(train, "generate", answer(lambda t: t))
    out = train.sft_validate(cfg, model, tok, val)
    assert out["val_acc"] == 1.0 and all(v == 1.0 for k, v in out.items() if k.startswith("val_acc/"))
    assert out["val_tpf"] == pytest.approx(2.0, rel=0.1) and model.training
    monkeypatch.setattr(train, "generate", answer(lambda t: t.replace("[b0", "[b1")))
    out = train.sft_validate(cfg, model, tok, val)
    n_prod = sum(action_kind(s.action) == "product" for s in val)
    assert out["val_acc/product"] == 0.0 and out["val_acc/search"] == 1.0
    assert out["val_acc"] == pytest.approx(1 - n_prod / len(val))
    with pytest.raises(ConfigError, match="sft validation"):  # no train task outside the SFT set
        train.check_startup(load_config(os.path.join(ROOT, "configs/tiny.yaml"),
                                        ["env.num_goals=80", "env.num_test_goals=20", "sft.episodes=1000",
                                         "sft.val_every=10", "train.stages=[sft]"]), info)
    with pytest.raises(ConfigError, match="sft.detours = 0.1: env search has no mistake"):
        train.check_startup(load_config(os.path.join(ROOT, "configs/tiny.yaml"), ["env.name=search", "sft.detours=0.1"]),
                            info)


def test_distill_expert_replay_is_the_sft_loss_on_a_seeded_draw(tmp_path):
    """distill.expert_batch: the closure's value is expert_weight x the SFT loss (the last block_schedule
    phase's block size) on a draw of expert samples that depends only on (seed, step), the same on every rank."""
    sys.path.insert(0, ROOT)
    import random

    import torch
    import train
    from d3mini.config import load_config
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"),
                      [*SMOKE, f"train.out_dir={tmp_path}", "distill.expert_weight=0.5", "distill.expert_score=all"])
    info = train.dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    tok = train.build_tokenizer(cfg, info)
    model = train.build_model(cfg, tok, info)
    expert, _ = train.expert_samples(cfg, tok)
    assert len({x.episode_id for x in expert}) == cfg.sft.episodes
    a, b, c = (train.expert_replay(cfg, model, expert, info, s)() for s in (3, 3, 4))
    assert float(a) == float(b) > 0 and float(a) != float(c)
    rng = random.Random(cfg.train.seed * 7919 + 3)
    batch = [expert[rng.randrange(len(expert))] for _ in range(cfg.distill.expert_batch)]
    ref, _ = train.sft_loss(model, batch, torch.Generator().manual_seed(cfg.train.seed * 100019 + 3), info,
                            cfg.sft.loss_norm, cfg.sft.mask_copies, block_size=8,
                            weight=cfg.sft.loss_weight, suffix=cfg.sft.suffix_masks)
    assert float(a) == pytest.approx(0.5 * float(ref), rel=1e-6) and train.sft_block_size(cfg, cfg.sft.steps - 1) == 8
    a.backward()
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0
    # expert_score "action": the same draw with each think text moved into the prompt (clean context)
    from dataclasses import replace
    from d3mini.envs import action_start
    act = load_config(os.path.join(ROOT, "configs/tiny.yaml"), [*SMOKE, f"train.out_dir={tmp_path}",
                      "distill.expert_weight=0.5", "distill.expert_score=action"])
    assert all(0 < x.think_len == action_start(tok, x.response_ids) < len(x.response_ids) for x in batch)
    moved = [replace(x, prompt_ids=x.prompt_ids + x.response_ids[:x.think_len],
                     response_ids=x.response_ids[x.think_len:]) for x in batch]
    ref, _ = train.sft_loss(model, moved, torch.Generator().manual_seed(cfg.train.seed * 100019 + 3), info,
                            cfg.sft.loss_norm, cfg.sft.mask_copies, block_size=8,
                            weight=cfg.sft.loss_weight, suffix=cfg.sft.suffix_masks)
    d = train.expert_replay(act, model, expert, info, 3)()
    assert float(d) == pytest.approx(0.5 * float(ref), rel=1e-6) and float(d) != pytest.approx(float(a))


def test_sft_prompt_loss_leaves_out_prompts_that_show_a_detour(tmp_path):
    """sft.ar_prompt_loss trains on the prompt's tokens, but not in a sample whose prompt shows a detour:
    there the loss is the response's alone (as without ar_prompt), and the batch's normaliser counts the
    other rows' prompt tokens only; on the AR path the same."""
    sys.path.insert(0, ROOT)
    from dataclasses import replace

    import torch
    import train
    from d3mini.config import load_config
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), [*SMOKE, f"train.out_dir={tmp_path}", "sft.detours=0.3",
                                                                    "env.max_steps=15"])
    info = train.dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    tok = train.build_tokenizer(cfg, info)
    model = train.build_model(cfg, tok, info)
    data, _ = train.expert_samples(cfg, tok)
    hidden = next(x for x in data if not x.prompt_loss)
    shown = replace(hidden, prompt_loss=True)
    gen = torch.Generator()

    def loss(batch, ar_prompt, ar=False):
        return float(train.sft_loss(model, batch, gen, info, "tokens", block_size=1, ar=ar, ar_prompt=ar_prompt,
                                    weight="uniform")[0])
    assert loss([hidden], True) == pytest.approx(loss([hidden], False), rel=1e-5)
    assert loss([shown], True) != pytest.approx(loss([shown], False), rel=1e-3)
    assert loss([hidden], True, ar=True) == pytest.approx(loss([hidden], False, ar=True), rel=1e-5)
    # two rows: the loss is the token-weighted mean of the two rows' own losses
    other = next(x for x in data if x.prompt_loss and x.step > 0)
    n_hidden, n_other = len(hidden.response_ids), len(other.prompt_ids) + len(other.response_ids) - 1
    both = (n_hidden * loss([hidden], True) + n_other * loss([other], True)) / (n_hidden + n_other)
    assert loss([hidden, other], True) == pytest.approx(both, rel=1e-5)


def test_dagger_round_keeps_the_states_from_the_first_wrong_action_on(tmp_path, monkeypatch):
    """A DAgger round's corrections: nothing from an episode that follows the expert throughout; from an
    episode's first wrong action on, each state with the expert's response, one per invalid-action loop; no
    prompt loss where the history window (env.history 1) shows a wrong action. The rollouts are the model's,
    greedy at sft.dagger_threshold, on the first sft.dagger_tasks SFT tasks."""
    sys.path.insert(0, ROOT)
    import torch
    import train
    from d3mini.config import load_config
    from d3mini.rollout import StepSample
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), [*SMOKE, f"train.out_dir={tmp_path}", "env.history=1",
                                                                    "sft.dagger_tasks=5", "sft.dagger_threshold=0.9"])
    plan = {0: [("o0", "a"), ("o1", "b")],  # (observation, policy action); the expert says "x" throughout
            1: [("o0", "x"), ("o1", "a"), ("o1", "a"), ("o1", "a"), ("o1", "x"), ("o2", "x")],
            2: [("o0", "x"), ("o1", "x")]}
    calls = []

    def fake_rollout(model, tok, env_cfg, dcfg, ids, **kw):
        calls.append((dcfg.threshold, dcfg.temperature, list(ids), kw["relabel"], kw["seed"]))
        out = []
        for ep, steps in plan.items():
            for t, (obs, act) in enumerate(steps):
                expert = "x" if ep else act  # episode 0: the policy does what the expert says
                mk = lambda a: StepSample(prompt_ids=[ep, t], response_ids=[1], trace=None, confidence=None, action=a,
                                          valid=True, reward=0.0, group_id=ep, episode_id=ep, step=t, anchor=obs)
                s = mk(act)
                s.relabel = mk(f"{expert}")
                s.relabel.response_ids = [9]
                out.append(s)
        return out, {"success": 0.5, "valid_ratio": 0.75, "num_episodes": 3}

    monkeypatch.setattr(train, "rollout", fake_rollout)
    model = torch.nn.Linear(1, 1)
    fixes, m = train.dagger_samples(cfg, model, None, 7)
    assert calls == [(0.9, 0.0, train.sft_task_ids(cfg)[:5], "expert", cfg.train.seed)]
    assert [(x.prompt_ids, x.action, x.prompt_loss) for x in fixes] == [
        ([1, 1], "x", True),    # the first wrong action: the history shows the right one before it
        ([1, 2], "x", False),   # the same action again on the same page: a loop, kept once ...
        ([1, 4], "x", False),   # ... the step that leaves the loop shows the last repeat
        ([1, 5], "x", True)]    # the model back on the expert's path, its history clean again
    assert all(x.response_ids == [9] for x in fixes) and model.training
    assert m == {"policy_success": 0.5, "policy_valid": 0.75, "episodes": 3, "episodes_off": 1, "corrections": 4}


def test_sft_dagger_round_is_kept_for_a_resumed_run(tmp_path):
    """sft.dagger_at: the round's corrections are written to out_dir/dagger/ and join the SFT data; a run
    killed after the round resumes from a checkpoint before it with the same corrections read back (the same
    weights and losses as an uninterrupted run); a missing file stops the resume with its name."""
    args = ["train.stages=[sft]", "sft.steps=4", "sft.dagger_at=[1]", "sft.dagger_tasks=4", "train.save_every=1",
            "train.threads=1", "eval.sweep=[1.0]", "eval.thresholds=[1.0]"]
    a, b = tmp_path / "a", tmp_path / "b"
    r = run(args, a)
    assert r.returncode == 0, r.stderr[-3000:]
    rec = [json.loads(l) for l in open(a / "metrics.jsonl") if '"sft/dagger"' in l]
    assert len(rec) == 1 and rec[0]["step"] == 1 and rec[0]["episodes"] == 4 and "DAgger round" in r.stdout
    fixes = json.load(open(a / "dagger" / "step_00000001.json"))
    assert len(fixes) == rec[0]["corrections"] > 0  # a 3-step smoke model errs on some task
    assert all(f["response_ids"] and f["action"] for f in fixes)
    os.environ["D3MINI_CRASH_AT"] = "sft:3"
    try:
        r = run(args, b)
        assert r.returncode == 75, r.stderr[-3000:]
    finally:
        del os.environ["D3MINI_CRASH_AT"]
    import shutil
    shutil.rmtree(b / "ckpt" / "step_00000003")  # resume from step 2: after the round, which is not rerun
    os.rename(b / "dagger", tmp_path / "away")
    r = run(args + ["--resume"], b)
    assert r.returncode != 0 and "step_00000001.json" in r.stderr and "sft.dagger_at" in r.stderr
    os.rename(tmp_path / "away", b / "dagger")
    r = run(args + ["--resume"], b)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "DAgger round" not in r.stdout
    _assert_same_weights(_weights(a), _weights(b), atol=0)
    assert _records(a) == _records(b)


def test_rl_rollouts_decode_at_rl_threshold_else_decode_threshold():
    """rl.threshold sets the RL rollouts' decode threshold; unset, they decode at decode.threshold."""
    sys.path.insert(0, ROOT)
    import train
    from d3mini.config import load_config
    base = load_config(os.path.join(ROOT, "configs/tiny.yaml"), ["rl.temperature=0.7"])
    assert train.rl_decode(base).threshold == base.rl.threshold == 0.95  # tiny.yaml: rollouts decoded as evaluated
    base.rl.threshold = None
    d = train.rl_decode(base)
    assert d.threshold == base.decode.threshold == 1.0 and d.temperature == 0.7
    d = train.rl_decode(load_config(os.path.join(ROOT, "configs/tiny.yaml"), ["rl.threshold=0.9"]))
    assert d.threshold == 0.9 and d.temperature == 1.0 and d.block_size == 8


def test_frozen_copy_is_written_at_the_stage_start_and_read_back_on_resume(tmp_path):
    """The KL reference / distillation teacher: at a stage's first step a frozen copy of the model is saved;
    a resumed stage gets those weights back (not the resumed model's), with RNG left to the resume; no copy
    on disk is a clear error."""
    sys.path.insert(0, ROOT)
    from types import SimpleNamespace

    import torch
    import train
    from d3mini import dist
    from d3mini.config import load_config
    from d3mini.model import CheckpointError
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), [f"train.out_dir={tmp_path}", *SMOKE])
    mc = cfg.model
    tok = SimpleNamespace(vocab_size=mc.vocab_size, mask_id=mc.vocab_size - 1, pad_id=0, stop_ids=[1], bos_id=None)
    info = dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    torch.manual_seed(5)
    model = train.build_model(cfg, tok, info)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))  # not what build_model's seed gives
    start = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    ref = train.frozen_copy(cfg, model, tok, info, "distill", None)
    assert torch.equal(torch.get_rng_state(), rng)  # building the copy reseeds; loading it puts the RNG back
    _assert_same_weights(ref.state_dict(), start, atol=0)
    assert not any(p.requires_grad for p in ref.parameters()) and not ref.training
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # training moved the policy
    back = train.frozen_copy(cfg, model, tok, info, "distill", "ckpt/of/the/resume")
    _assert_same_weights(back.state_dict(), start, atol=0)
    assert not torch.equal(model.lm_head.weight, back.lm_head.weight)
    with pytest.raises(CheckpointError, match="frozen/rl"):
        train.frozen_copy(cfg, model, tok, info, "rl", "ckpt/of/the/resume")


def test_distill_rollouts_from_the_frozen_teacher(tmp_path):
    """distill.rollouts=teacher: the targets are decoded by the model as distillation began, so a run whose
    policy moves (lr 1.0, far) rolls out exactly what a run whose policy stays put (lr 0) rolls out."""
    args = ["train.stages=[sft,distill]", "sft.steps=2", "distill.steps=3", "train.threads=1", "eval.num_tasks=1",
            "eval.sweep=[1.0]", "eval.thresholds=[1.0]", "distill.only_success=false", "distill.only_valid=false",
            "distill.expert_batch=0", "distill.rollouts=teacher"]
    moved, still = tmp_path / "moved", tmp_path / "still"
    for out, lr in ((moved, "1.0"), (still, "0.0")):
        r = run(args + [f"distill.lr={lr}"], out)
        assert r.returncode == 0, r.stderr[-3000:]
    ra, rb = _records(moved), _records(still)
    keys = [k for k in ra if k[0] == "distill"]
    assert len(keys) == 3 and all(ra[k]["skipped"] == 0.0 for k in keys)
    for k in keys:
        assert {x: v for x, v in ra[k].items() if x.startswith("rollout/") or x == "samples_in"} == \
               {x: v for x, v in rb[k].items() if x.startswith("rollout/") or x == "samples_in"}
    assert ra[keys[-1]]["loss"] != rb[keys[-1]]["loss"]  # the policy did move


def test_distill_relabel_by_the_frozen_teacher(tmp_path):
    """distill.rollouts=relabel: the teacher answers the policy's prompts; while the policy is the teacher
    (lr 0) no target is relabeled, once it has moved (lr 1.0) some are."""
    args = ["train.stages=[sft,distill]", "sft.steps=2", "distill.steps=3", "train.threads=1", "eval.num_tasks=1",
            "eval.sweep=[1.0]", "eval.thresholds=[1.0]", "distill.only_success=false", "distill.only_valid=false",
            "distill.expert_batch=0", "distill.rollouts=relabel"]
    seen = {}
    for lr in ("1.0", "0.0"):
        r = run(args + [f"distill.lr={lr}"], tmp_path / lr)
        assert r.returncode == 0, r.stderr[-3000:]
        recs = _records(tmp_path / lr)
        seen[lr] = [recs[k]["relabeled"] for k in sorted(recs) if k[0] == "distill"]
    assert len(seen["0.0"]) == 3 and seen["0.0"] == [0.0, 0.0, 0.0]
    assert seen["1.0"][0] == 0.0 and max(seen["1.0"]) > 0  # the first rollouts precede the first update


def test_a_run_folder_is_never_overwritten_or_mixed(tmp_path):
    """What a finished run wrote survives every bad start: a fresh run into its folder, a resume with another
    model size, a damaged results.json, checkpoints that are all corrupt; an out_dir that is a file."""
    out = tmp_path / "run"
    args = ["train.stages=[sft]", "eval.sweep=[1.0]", "eval.thresholds=[1.0]"]
    r = run(args, out)
    assert r.returncode == 0, r.stderr[-3000:]
    names = ("metrics.jsonl", "config.yaml", "run.json", "results.json", "tokenizer.json")
    before = {n: (out / n).read_bytes() for n in names}

    def unchanged():
        return all((out / n).read_bytes() == before[n] for n in names)

    r = run(args, out)  # a fresh run (no --resume) into the finished one
    assert r.returncode == 2 and "holds a run" in r.stderr and "--resume" in r.stderr and unchanged()
    r = run(args + ["--resume", "model.hidden_size=96"], out)  # another model's weights
    assert r.returncode == 2 and "do not fit the model" in r.stderr and "Traceback" not in r.stderr and unchanged()
    (out / "results.json").write_text('{"sft": [')  # cut short
    r = run(args + ["--resume"], out)
    assert r.returncode == 2 and "results.json" in r.stderr and "unreadable" in r.stderr
    (out / "results.json").write_bytes(before["results.json"])
    assert unchanged()
    for ck in (out / "ckpt").iterdir():  # every checkpoint damaged: nothing to resume, and no silent restart
        w = ck / "model.safetensors"
        w.write_bytes(w.read_bytes()[:100])
    r = run(args + ["--resume"], out)
    assert r.returncode == 2 and "none of the" in r.stderr and "intact" in r.stderr and unchanged()
    r = run(args, tmp_path / "run" / "config.yaml")  # out_dir names a file
    assert r.returncode == 2 and "is a file" in r.stderr


def test_non_finite_training_stops_before_a_checkpoint(tmp_path):
    """Weights that overflow (init std 1e30) stop SFT at its first step with a clear error and no checkpoint
    holding them; a non-finite learning rate is a config error."""
    out = tmp_path / "run"
    r = run(["train.stages=[sft]", "train.save_every=1", "model.init_std=1e30"], out)
    assert r.returncode == 2 and "not finite" in r.stderr and "sft step 0" in r.stderr, r.stderr[-2000:]
    assert not (out / "ckpt").exists() or not list((out / "ckpt").iterdir())
    r = run(["rl.lr=inf"], tmp_path / "b")
    assert r.returncode == 2 and "rl.lr = inf: must be finite" in r.stderr


def test_non_finite_rl_update_is_not_saved(tmp_path, monkeypatch):
    """An RL update whose loss comes back NaN stops the run before the step's checkpoint: the latest
    checkpoint on disk is SFT's last, with finite weights."""
    sys.path.insert(0, ROOT)
    import torch
    import train
    import d3mini.rl
    real = d3mini.rl.rl_step

    def nan_step(*a, **k):
        m = real(*a, **k)
        return {**m, "loss": float("nan")}
    monkeypatch.setattr(train, "rl_step", nan_step)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    out = tmp_path / "run"
    threads = torch.get_num_threads()
    try:
        with pytest.raises(FloatingPointError, match="rl step 0: loss is nan"):
            train.main(["--config", os.path.join(ROOT, "configs/tiny.yaml"), f"train.out_dir={out}", *SMOKE,
                        "train.stages=[sft,rl]", "train.save_every=1", "eval.sweep=[1.0]", "eval.thresholds=[1.0]",
                        "train.threads=1"])
    finally:
        torch.set_num_threads(threads)
    steps = sorted(p.name for p in (out / "ckpt").iterdir())
    assert steps[-1] == "step_00000003"  # SFT's 3 steps; no RL checkpoint
    from safetensors.torch import load_file
    assert all(torch.isfinite(v).all() for v in load_file(str(out / "ckpt" / steps[-1] / "model.safetensors")).values())


def test_stop_signals_ask_once_and_a_second_ctrl_c_stops_at_once(monkeypatch):
    """The first SIGINT or SIGTERM only asks for a stop (carried out after the step in progress, with its
    checkpoint: test_killed_mid_stage_and_resumed_equals_uninterrupted); a second SIGINT raises at once, a
    second SIGTERM (a scheduler's notice) does not."""
    import signal
    sys.path.insert(0, ROOT)
    import train
    monkeypatch.setitem(train._STATE, "stop", None)
    train.request_stop(signal.SIGTERM, None)
    assert train._STATE["stop"] == "SIGTERM" and train.stop_requested()
    train.request_stop(signal.SIGTERM, None)
    with pytest.raises(KeyboardInterrupt):
        train.request_stop(signal.SIGINT, None)
    monkeypatch.setitem(train._STATE, "stop", None)
    assert not train.stop_requested()
    train.request_stop(signal.SIGINT, None)
    assert train._STATE["stop"] == "SIGINT"
    with pytest.raises(KeyboardInterrupt):
        train.request_stop(signal.SIGINT, None)


def test_metrics_log_drops_a_record_cut_short(tmp_path):
    """A crash mid-write leaves half a line in metrics.jsonl; the next run's logger drops it, so every line
    stays one JSON record."""
    sys.path.insert(0, ROOT)
    from types import SimpleNamespace
    import train
    (tmp_path / "metrics.jsonl").write_text('{"stage": "sft", "step": 1}\n{"stage": "sft", "st')
    cfg = SimpleNamespace(train=SimpleNamespace(out_dir=str(tmp_path), wandb=False))
    log = train.Logger(cfg, SimpleNamespace(is_main=True))
    log.log({"stage": "sft", "step": 2})
    assert [json.loads(l)["step"] for l in open(tmp_path / "metrics.jsonl")] == [1, 2]


def test_stage_evaluation_refuses_a_table_of_env_failures(tmp_path, monkeypatch):
    """Every held-out episode failing in the env (a dead server) stops the run with the env's error instead of
    writing a 0 % row; the stage's checkpoint is already on disk, so a resume evaluates again."""
    sys.path.insert(0, ROOT)
    from types import SimpleNamespace

    import torch
    import train
    from d3mini import dist
    from d3mini.config import load_config
    from d3mini.envs import EnvError
    cfg = load_config(os.path.join(ROOT, "configs/tiny.yaml"), [f"train.out_dir={tmp_path}", *SMOKE])
    mc = cfg.model
    tok = SimpleNamespace(vocab_size=mc.vocab_size, mask_id=mc.vocab_size - 1, pad_id=0, stop_ids=[1], bos_id=None)
    info = dist.DistInfo(0, 1, 0, torch.device("cpu"), True)
    model = train.build_model(cfg, tok, info)

    def dead(env_cfg):
        raise EnvError("connection refused")
    monkeypatch.setattr("d3mini.rollout.make_env", dead)
    log = SimpleNamespace(log=lambda rec: None)
    with pytest.raises(EnvError, match=r"eval after rl at tau 1.0: every episode failed .*connection refused"):
        train.run_eval(cfg, model, tok, "rl", info, log)


def test_train_imports_every_module_it_uses_at_start():
    """A stage must not import d3mini code hours into a run: files edited meanwhile would mix two versions of
    the code in one run (and the run record names only the first). So `import train` loads them all."""
    code = "import sys, train; print(' '.join(sorted(m for m in sys.modules if m.startswith('d3mini'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = set(out.stdout.split())
    need = {"d3mini.decode", "d3mini.distill", "d3mini.rl", "d3mini.rollout", "d3mini.metrics", "d3mini.model",
            "d3mini.envs.server", "d3mini.dist", "d3mini.lora", "d3mini.data", "d3mini.config"}
    assert need <= loaded, need - loaded
    src = open(os.path.join(ROOT, "train.py")).read()
    assert not [ln for ln in src.splitlines() if ln.startswith((" ", "\t")) and "from d3mini" in ln]
