"""Evaluation: AUP against metrics.md §2 (worked example, test vectors, filter, weights), success-rate
intervals on hand cases, the run record, tables, the plot, and eval.py end to end on a tiny model."""
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import subprocess
import sys
import types

import pytest
import torch
import yaml

from d3mini import envs
from d3mini.config import Config, ModelConfig, load_config
from d3mini.data import build_tiny_tokenizer
from d3mini.envs import EnvError, task_ids
from d3mini.metrics import (AUPError, aup, aup_kept_points, aup_summary, aup_weight, evaluate, markdown_table,
                            plot_acc_vs_tpf, paired_difference, paired_mean_difference, run_record,
                            success_ci, task_invalid)
from d3mini.model import DiffusionLM
from d3mini.rollout import rollout

torch.set_num_threads(2)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": ROOT}


def _eval_script():
    spec = importlib.util.spec_from_file_location("d3mini_eval_script", os.path.join(ROOT, "eval.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


EV = _eval_script()


def pts(*texts):
    return [EV.parse_point(t) for t in texts]


# ----------------------------------------------------------------------------- AUP
def test_aup_cli_worked_example():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "eval.py"), "--aup", "1.447:3.4", "2.944:57.2",
                        "--alpha", "3"], capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert abs(float(r.stdout.strip().splitlines()[-1]) - 47.885) <= 1e-3


def test_aup_worked_example_both_y_max():
    p = pts("1.447:3.4", "2.944:57.2")
    assert aup_weight(3.4, 3.0, 57.2) == pytest.approx(0.059506, abs=1e-6)  # metrics.md §2.4 case 1
    assert aup(p, 3.0) == pytest.approx(4.9198 + 42.96564, abs=1e-4)
    assert aup_weight(57.2, 3.0, 100.0) == pytest.approx(0.276927, abs=1e-6)  # case 2
    assert aup(p, 3.0, y_max=100) == pytest.approx(16.9165, abs=1e-4)
    assert aup(p, 3.0) != pytest.approx(2.944 * 57.2, abs=1.0)  # not the max-relative filter


def test_aup_test_vectors_filter_and_weights():
    p = pts("3.0:76", "1.0:80", "2.0:70")  # metrics.md §2.5; any order
    assert aup_kept_points(p) == [(1.0, 80.0), (3.0, 76.0)]  # 70 < 80 - 5 is dropped
    assert aup_weight(76, 3.0, 80) == pytest.approx(math.exp(-0.15), abs=1e-9)
    assert aup(p, 3.0) == pytest.approx(225.414, abs=1e-3)
    assert aup(list(reversed(p)), 3.0) == pytest.approx(225.414, abs=1e-3)
    assert aup(p, 3.0, y_max=100) == pytest.approx(160.898, abs=1e-3)
    assert aup(pts("2.5:60"), 3.0) == pytest.approx(150.0)  # one point: the unweighted rectangle
    with pytest.raises(AUPError, match="highest-TPF"):
        aup(pts("1.0:80", "2.0:78", "3.0:70"), 3.0)  # endpoint check: rejected, not truncated


def test_aup_filter_is_relative_to_lowest_tpf_point():
    # y1 = 50, best 60: the filter keeps y >= 45, so 54 stays (a max-relative filter would drop it).
    p = pts("1.0:50", "2.0:60", "3.0:54")
    assert aup_kept_points(p) == [(1.0, 50.0), (2.0, 60.0), (3.0, 54.0)]
    # by hand, y_max 60: W(50) = e^-0.5, W(54) = e^-0.3
    want = 1.0 * 50 + 0.5 * (60 + 50 * math.exp(-0.5)) + 0.5 * (54 * math.exp(-0.3) + 60)
    assert aup(p, 3.0) == pytest.approx(want, abs=1e-9) and want == pytest.approx(145.1654, abs=1e-4)
    # exactly y1 - 5 is kept (y >= y1 - 5); weights are capped at 1 above y_max
    assert aup_kept_points(pts("1:80", "2:75", "3:79")) == [(1.0, 80.0), (2.0, 75.0), (3.0, 79.0)]
    assert aup_weight(90, 3.0, 80) == 1.0
    # alpha = 0 makes every weight 1: plain trapezoid after the rectangle
    assert aup(p, 0.0) == pytest.approx(50 + 0.5 * 110 + 0.5 * 114)


def test_aup_preconditions():
    with pytest.raises(AUPError):
        aup([], 3.0)
    with pytest.raises(AUPError, match="TPF > 0"):
        aup([(0.0, 50.0)], 3.0)
    with pytest.warns(UserWarning, match="percent"):
        aup([(1.0, 0.5), (2.0, 0.6)], 3.0)
    assert aup([(1.0, 0.0), (2.0, 0.0)], 3.0) == 0.0  # all-zero curve: y_max 0, area 0


def test_aup_summary_reports_rejection():
    rows = [{"tpf_denoise": 1.0, "success_pct": 80.0}, {"tpf_denoise": 3.0, "success_pct": 70.0}]
    s = aup_summary(rows, 3.0)
    assert s["aup"] is None and "highest-TPF" in s["error"] and s["y_max"] == 80.0
    rows[1]["success_pct"] = 76.0
    s = aup_summary(rows, 3.0, y_max=100.0)
    assert s["aup"] == pytest.approx(aup([(1.0, 80.0), (3.0, 76.0)], 3.0, 100.0)) and s["y_max_rule"] == "given"


def test_cli_errors(tmp_path, capsys):
    assert EV.parse_sweep("0.95:1.0:0.01") == [0.95, 0.96, 0.97, 0.98, 0.99, 1.0]
    assert EV.parse_sweep("0.9:1.0:0.05") == [0.9, 0.95, 1.0]
    assert EV.parse_sweep("1.0,0.9") == [1.0, 0.9]
    for bad, msg in [("0.9:1.0", "START:STOP:STEP"), ("0.9:1.0:0", "STEP"), ("1.0:0.9:0.1", "START"),
                     ("0.9:1.1:0.1", "outside"), ("a:b:c", "not a number")]:
        with pytest.raises(EV.UsageError, match=msg):
            EV.parse_sweep(bad)
    assert EV.main(["--threshold", "1.5", "--ckpt", str(tmp_path)]) == 2
    assert "outside [0, 1]" in capsys.readouterr().err
    assert EV.main(["--threshold", "0.9", "--ckpt", str(tmp_path / "none")]) == 2
    assert "checkpoint folder not found" in capsys.readouterr().err
    assert EV.main(["--threshold", "0.9", "--ckpt", str(tmp_path)]) == 2
    assert "no config.json" in capsys.readouterr().err
    step = tmp_path / "run" / "ckpt" / "step_00000003"  # a training checkpoint whose run folder lost its config
    step.mkdir(parents=True)
    (step / "state.json").write_text("{}")
    (step / "model.safetensors").write_text("")
    (tmp_path / "run" / "config.yaml").write_text("model:\n  family: sdar\n")
    assert EV.main(["--threshold", "0.9", "--ckpt", str(step)]) == 2
    assert "has no tokenizer.json" in capsys.readouterr().err
    assert EV.main(["--aup", "1.0:80", "3.0:70"]) == 2
    assert "rejects" in capsys.readouterr().err
    assert EV.main(["--aup", "1.0"]) == 2
    assert "TPF:ACC" in capsys.readouterr().err


# ----------------------------------------------------------------------------- success rate
def test_success_ci_hand_cases():
    c = success_ci(5, 10)
    assert c["p"] == 0.5 and c["se"] == pytest.approx(math.sqrt(0.025))
    # Wilson: centre (p + z²/2n) / (1 + z²/n) = 0.5, half-width z sqrt(p(1-p)/n + z²/4n²) / (1 + z²/n)
    half = 1.96 * math.sqrt(0.025 + 1.96 ** 2 / 400) / (1 + 1.96 ** 2 / 10)
    assert (c["low"], c["high"]) == pytest.approx((0.5 - half, 0.5 + half)) and c["low"] == pytest.approx(0.2366, abs=1e-4)
    c = success_ci(0, 10)  # the normal interval collapses to [0, 0]; Wilson's upper end is z² / (n + z²)
    assert c["se"] == 0.0 and c["low"] == 0.0 and c["high"] == pytest.approx(1.96 ** 2 / (10 + 1.96 ** 2))
    c = success_ci(20, 20)
    assert c["high"] == 1.0 and c["low"] == pytest.approx(20 / (20 + 1.96 ** 2))
    with pytest.raises(ValueError):
        success_ci(1, 0)
    with pytest.raises(ValueError):
        success_ci(11, 10)


def test_paired_difference_hand_cases():
    # 10 tasks: 3 won by both, 4 lost by both, 2 gained (0 -> 1), 1 lost (1 -> 0)
    before = [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]
    after = [1, 1, 1, 0, 0, 0, 0, 1, 1, 0]
    d = paired_difference(before, after)
    assert (d["gained"], d["lost"], d["n"]) == (2, 1, 10) and d["before"] == 0.4 and d["after"] == pytest.approx(0.5)
    # d = (0 x7, +1, +1, -1): mean 0.1, population variance 0.3 - 0.01 = 0.29
    assert d["diff"] == pytest.approx(0.1) and d["se"] == pytest.approx(math.sqrt(0.29 / 10))
    # the same marginals unpaired would give sqrt(.4*.6/10 + .5*.5/10) = 0.221 > 0.170
    assert d["se"] < math.sqrt(0.4 * 0.6 / 10 + 0.5 * 0.5 / 10)
    # identical runs: no change, no noise; failed tasks (None) are dropped from both sides
    assert paired_difference([1, 0, None], [1, 0, 1]) == {"diff": 0.0, "se": 0.0, "n": 2, "gained": 0, "lost": 0,
                                                          "before": 0.5, "after": 0.5}
    with pytest.raises(ValueError, match="share tasks"):
        paired_difference([1, 0], [1])
    with pytest.raises(ValueError, match="no task"):
        paired_difference([None], [1])


def test_paired_mean_difference_hand_cases():
    # invalid actions on 5 tasks: d = (-2, -1, 0, 0, +1), mean -0.4, variance (2.56+.36+.16+.16+1.96)/5 = 1.04
    d = paired_mean_difference([3, 2, 1, 0, 0], [1, 1, 1, 0, 1])
    assert d["n"] == 5 and d["diff"] == pytest.approx(-0.4) and d["se"] == pytest.approx(math.sqrt(1.04 / 5))
    assert d["before"] == pytest.approx(1.2) and d["after"] == pytest.approx(0.8)
    assert paired_mean_difference([1, None, 3], [2, 5, None]) == {"diff": 1.0, "se": 0.0, "n": 1, "before": 1.0,
                                                                  "after": 2.0}
    with pytest.raises(ValueError, match="share tasks"):
        paired_mean_difference([1, 0], [1])
    with pytest.raises(ValueError, match="no task"):
        paired_mean_difference([None], [1])
    eps = [{"task_id": 7, "failed": False, "steps": 5, "valid": 3}, {"task_id": 8, "failed": True, "steps": 2,
                                                                       "valid": 0}]
    assert task_invalid([8, 7, 9], eps) == [None, 2, None]


# ----------------------------------------------------------------------------- tables, plot
def test_markdown_table():
    rows = [{"a": 1, "b": 0.5, "c": "x|y"}, {"a": 2, "b": None}]
    md = markdown_table(rows, ["a", ("B", "b", ".2f"), ("c", "c"), ("a+1", lambda r: r["a"] + 1)])
    assert md.splitlines() == ["| a | B | c | a+1 |", "|---|---|---|---|", "| 1 | 0.50 | x\\|y | 2 |",
                               "| 2 | - | - | 3 |"]


def test_plot(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from PIL import Image
    path = plot_acc_vs_tpf({"run": [(1.0, 50.0), (2.0, 48.0)]}, str(tmp_path / "p.png"), metadata={"k": 1})
    assert path and json.loads(Image.open(path).text["Description"]) == {"k": 1}
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed: skipped silently
    assert plot_acc_vs_tpf({"run": [(1.0, 50.0)]}, str(tmp_path / "q.png")) is None
    assert not os.path.exists(tmp_path / "q.png")


# ----------------------------------------------------------------------------- end to end
SMALL_ENV = {"num_products": 40, "num_goals": 40, "num_test_goals": 10, "max_steps": 2}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """A tiny random SDAR model and tokenizer saved as a checkpoint folder."""
    cfg = Config()
    cfg.env = dataclasses.replace(cfg.env, **SMALL_ENV)
    boot = build_tiny_tokenizer(["x"], 300)
    samples, _ = rollout(None, boot, cfg.env, cfg.decode, task_ids(cfg.env, "train")[:4], expert=True)
    tok = build_tiny_tokenizer([boot.decode(s.prompt_ids) + s.text for s in samples], 320)
    mc = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, block_size=4, mask_id=tok.mask_id, eos_ids=tok.stop_ids,
                     pad_id=tok.pad_id)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("ckpt") / "tiny"
    DiffusionLM.from_config(mc).save_pretrained(str(path))
    tok.save(str(path))
    return str(path)


def _config(tmp_path, out):
    f = tmp_path / "eval.yaml"
    f.write_text(yaml.safe_dump({"env": SMALL_ENV, "decode": {"block_size": 4, "max_new_tokens": 12},
                                 "train": {"out_dir": str(tmp_path / "run"), "dtype": "float32"},
                                 "eval": {"out": out}}))
    return str(f)


def test_eval_end_to_end(tmp_path, ckpt, capsys):
    out = str(tmp_path / "res" / "eval")
    rc = EV.main(["--config", _config(tmp_path, out), "--ckpt", ckpt, "--sweep", "0.9:1.0:0.1",
                  "--num-tasks", "3", "decode.seed=1"])
    assert rc == 0, capsys.readouterr().err
    res = json.load(open(out + ".json"))
    rows = res["results"]
    assert [r["threshold"] for r in rows] == [1.0, 0.9] and all(r["num_tasks"] == 3 for r in rows)
    # the rows equal a direct rollout of the same model, tasks, seed and threshold
    cfg = load_config(_config(tmp_path, out), ["decode.seed=1"])
    model = DiffusionLM.from_pretrained(ckpt).eval()
    tok = EV.load_checkpoint(ckpt)[1]
    with torch.no_grad():
        _, m = rollout(model, tok, cfg.env, dataclasses.replace(cfg.decode, threshold=0.9),
                       task_ids(cfg.env, "test")[:3], seed=cfg.train.seed)
    for k in ("success", "score", "valid_ratio", "tpf_denoise", "tpf_total", "nfe_denoise", "gen_tokens"):
        assert rows[1][k] == m[k], k
    assert rows[1]["successes"] == sum(e["won"] for e in m["episodes"])
    a = res["aup"]
    pts_ = [(r["tpf_denoise"], 100 * r["success"]) for r in rows]
    assert a["points"] == [list(p) for p in pts_] and a["aup"] == pytest.approx(aup(pts_, 3.0))
    rec = res["record"]
    assert rec["config"]["decode"]["seed"] == 1 and rec["config"]["model"]["path"] == ckpt
    w = os.path.join(ckpt, "model.safetensors")
    assert rec["checkpoint"]["files"]["model.safetensors"] == hashlib.sha256(open(w, "rb").read()).hexdigest()
    md = open(out + ".md").read()
    assert "| tau |" in md and "AUP (tpf_denoise" in md and rec["checkpoint"]["weights_sha256"] in md
    if importlib.util.find_spec("matplotlib"):
        assert os.path.exists(out + ".png")


def test_compare_two_result_files(tmp_path, capsys):
    def result(path, rows):  # the parts of an eval.py JSON that --compare reads
        eps = lambda won: [{"task_id": i, "won": w, "failed": w is None, "steps": 4 + (w or 0), "valid": 4}
                           for i, w in enumerate(won)]  # a won episode here takes one invalid action
        path.write_text(json.dumps({"results": [{"threshold": t, "episodes": eps(w)} for t, w in rows]}))
        return str(path)
    a = result(tmp_path / "a.json", [(1.0, [1, 1, 1, 0, 0, 0, 0, 0, 0, 1]), (0.9, [1, 0])])
    b = result(tmp_path / "b.json", [(1.0, [1, 1, 1, 0, 0, 0, 0, 1, 1, 0]), (0.95, [1, 1])])
    assert EV.main(["--compare", a, b]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3  # header, rule, tau 1.0 only (0.9 and 0.95 are not shared)
    # invalid actions = wins: 0.40 -> 0.50, the same paired change and s.e. as the outcomes'
    assert lines[2] == (f"| 1 | 10 | 40.0 | 50.0 | +10.0 ± {100 * math.sqrt(0.029):.1f} | 2 | 1 | "
                        f"0.40, 0.50, +0.10 ± {math.sqrt(0.029):.2f} |")
    old = tmp_path / "old.json"  # an eval file without per-episode steps: no invalid-action column value
    old.write_text(json.dumps({"results": [{"threshold": 1.0, "episodes": [{"task_id": i, "won": 1, "failed": False}
                                                                          for i in range(10)]}]}))
    assert EV.main(["--compare", a, str(old)]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("| 6 | 0 | - |")
    assert EV.main(["--compare", a, str(tmp_path / "none.json")]) == 2
    assert "not found" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert EV.main(["--compare", a, str(tmp_path / "bad.json")]) == 2
    assert "not an eval.py result" in capsys.readouterr().err
    assert EV.main(["--compare", a, result(tmp_path / "c.json", [(0.5, [1])])]) == 2
    assert "no threshold in common" in capsys.readouterr().err


def test_eval_block_size_mismatch(tmp_path, ckpt, capsys):
    rc = EV.main(["--config", _config(tmp_path, str(tmp_path / "e")), "--ckpt", ckpt, "--threshold", "0.9",
                  "decode.block_size=8"])
    assert rc == 2 and "decode.block_size" in capsys.readouterr().err


def test_eval_refuses_what_would_lose_or_fake_results(tmp_path, ckpt, capsys, monkeypatch):
    """Caught before evaluating: an --out that cannot be written, an env server nothing answers at, a damaged
    tokenizer. Caught after: a table in which every episode failed in the env (it would read as 0 %)."""
    import shutil
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = EV.main(["--config", _config(tmp_path, str(blocker / "eval")), "--ckpt", ckpt, "--threshold", "1.0"])
    assert rc == 2 and "cannot create its folder" in capsys.readouterr().err
    rc = EV.main(["--config", _config(tmp_path, str(tmp_path / "e")), "--ckpt", ckpt, "--threshold", "1.0",
                  "env.server_url=http://127.0.0.1:9"])
    assert rc == 2 and "unreachable" in capsys.readouterr().err and not (tmp_path / "e.json").exists()
    bad = tmp_path / "bad_tok"
    shutil.copytree(ckpt, bad)
    (bad / "tokenizer.json").write_text("{}")
    rc = EV.main(["--config", _config(tmp_path, str(tmp_path / "e")), "--ckpt", str(bad), "--threshold", "1.0"])
    err = capsys.readouterr().err
    assert rc == 2 and "tokenizer.json" in err and "not a readable tokenizer file" in err

    def broken(cfg):
        raise EnvError("the env is gone")
    monkeypatch.setattr("d3mini.rollout.make_env", broken)
    rc = EV.main(["--config", _config(tmp_path, str(tmp_path / "e")), "--ckpt", ckpt, "--threshold", "1.0",
                  "--num-tasks", "2"])
    err = capsys.readouterr().err
    assert rc == 2 and "tau 1.0: every episode failed in the env" in err and "the env is gone" in err
    assert not (tmp_path / "e.json").exists()


def test_run_record_fields(tmp_path, ckpt):
    cfg = Config()
    model = DiffusionLM.from_pretrained(ckpt)
    rec = run_record(cfg, ckpt=ckpt, model=model, num_tasks=7)
    for key in ("time_utc", "command", "config", "checkpoint", "code", "versions", "host", "dtype", "seeds",
                "num_tasks", "tpf_convention"):
        assert key in rec, key
    assert rec["num_tasks"] == 7 and rec["versions"]["torch"] == torch.__version__
    assert rec["versions"]["cuda"] == torch.version.cuda and rec["dtype"]["params"] == "float32"
    assert rec["seeds"] == {"train": cfg.train.seed, "decode": cfg.decode.seed, "env": cfg.env.seed}
    assert rec["config"] == dataclasses.asdict(cfg)
    assert set(rec["checkpoint"]["files"]) == {"model.safetensors", "config.json", "tokenizer.json"}
    c = rec["code"]
    assert c["commit"] is None or (len(c["commit"]) == 40 and isinstance(c["dirty"], bool))
    json.dumps(rec)  # serialisable as is


# ----------------------------------------------------------------------------- success aggregation
class _CoinEnv:
    """One-step env: an episode is won iff its task id is even (independent of the model's text)."""

    def reset(self, task_id=None, seed=None):
        self.tid = int(task_id)
        return "obs", {"task": f"task {task_id}", "admissible_actions": None}

    def step(self, action):
        won = self.tid % 2 == 0
        return "done", 10.0 * won, True, {"won": won, "score": float(won), "admissible_actions": None}

    def close(self):
        pass


def test_evaluate_success_and_ci_on_known_outcomes(ckpt, monkeypatch):
    fake = types.ModuleType("d3mini_test_coin_env")
    fake.make = lambda cfg: _CoinEnv()
    fake.task_ids = lambda cfg, split: list(range(10)) if split == "test" else list(range(10, 20))
    fake.prompt = lambda task, obs, history, admissible, step, cfg: f"{task}: {obs}"
    fake.project = lambda text: (text.strip(), True)
    monkeypatch.setitem(sys.modules, fake.__name__, fake)
    monkeypatch.setitem(envs.REGISTRY, "coin", f"{fake.__name__}:make")
    cfg = Config()
    cfg.env = dataclasses.replace(cfg.env, name="coin", max_steps=1)
    cfg.decode = dataclasses.replace(cfg.decode, max_new_tokens=8)
    model = DiffusionLM.from_pretrained(ckpt)
    rows = evaluate(model, EV.load_checkpoint(ckpt)[1], cfg, [0.5, 1.0], "test", 0)
    assert [r["threshold"] for r in rows] == [1.0, 0.5]
    ci = success_ci(5, 10)
    for r in rows:
        assert (r["num_tasks"], r["successes"], r["success_pct"]) == (10, 5, 50.0)
        assert r["success_se_pct"] == pytest.approx(100 * ci["se"])
        assert (r["success_ci_low_pct"], r["success_ci_high_pct"]) == pytest.approx((100 * ci["low"], 100 * ci["high"]))
    assert evaluate(model, EV.load_checkpoint(ckpt)[1], cfg, [1.0], "test", 4)[0]["successes"] == 2
