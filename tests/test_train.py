"""Smoke run of the whole pipeline (tiny config, a few steps per stage), resume, and start-up errors."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_layers=2", "model.head_dim=16",
         "model.vocab_size=320", "sft.episodes=12", "sft.steps=3", "sft.batch_size=4", "sft.warmup=1",
         "rl.steps=1", "rl.tasks_per_step=2", "rl.group_size=2", "rl.minibatch=8", "rl.micro_batch=8",
         "distill.steps=1", "distill.tasks_per_step=1", "distill.group_size=2", "distill.batch_size=4",
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
    recs = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert {x["stage"] for x in recs} >= {"sft", "rl", "distill"}
    assert os.path.exists(out / "export" / "model.safetensors") and os.path.exists(out / "results.md")
    assert os.path.exists(out / "tokenizer.json") and os.path.exists(out / "config.yaml")
    # resuming a finished run does no new training and keeps the results
    r2 = run(["--resume"], out)
    assert r2.returncode == 0, r2.stderr[-3000:]
    recs2 = [json.loads(l) for l in open(out / "metrics.jsonl")]
    assert [x for x in recs2 if x["stage"] in ("sft", "rl", "distill")] == \
        [x for x in recs if x["stage"] in ("sft", "rl", "distill")]


def test_startup_errors(tmp_path):
    r = run(["model.path=/nonexistent/ckpt"], tmp_path / "a")
    assert r.returncode == 2 and "model.path" in r.stderr and "not found" in r.stderr
    r = run(["rl.lr=fast"], tmp_path / "b")
    assert r.returncode == 2 and "rl.lr" in r.stderr
    r = run(["env.server_url=http://127.0.0.1:9"], tmp_path / "c")
    assert r.returncode == 2 and "unreachable" in r.stderr
