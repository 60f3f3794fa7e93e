"""Evaluation metrics and reports: AUP, success-rate intervals, run records, tables, plots, evaluate().

AUP (accuracy under parallelism) follows `AUP_leaderboard/aup_utils.py::get_aup` of hao-ai-lab/d3LLM
(reference/metrics.md §2): accuracy in percent against TPF, an unweighted rectangle up to the
lowest-TPF point, then the trapezoid rule over y·W(y) with W(y) = min(exp(-alpha (1 - y / y_max)), 1).
TPF is the ratio of sums of metrics.md §1.1; d3mini's decoder fuses the KV-commit forward into the
next block's first denoising step (convention C), so `tpf_denoise` equals the denoise-only count
and `tpf_total` adds one prefill forward per decode call.

This module imports no torch and no rollout at import time, so `eval.py --aup` runs without them.
"""
from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json
import math
import os
import platform
import socket
import subprocess
import sys
import warnings
from typing import Callable, Optional, Sequence, Union

AUP_OFFSET = 5.0  # get_aup's y_min_offset: percentage points below the lowest-TPF accuracy
TPF_CONVENTION = ("TPF = generated tokens (stop id excluded) / forwards, ratio of sums over all env steps; "
                  "denoise = denoising forwards with the KV commit fused into the next block (metrics.md §1.3 C), "
                  "total = denoise + 1 prefill forward per decode call")


class AUPError(ValueError):
    """Points that get_aup rejects (no points, TPF <= 0, the highest-TPF point lost more than 5 points)."""


# ----------------------------------------------------------------------------- AUP
def aup_kept_points(points: Sequence, offset: float = AUP_OFFSET) -> list:
    """The points AUP integrates over: sorted by TPF, endpoint-checked, then the 5-point filter.

    The reference accuracy is that of the lowest-TPF point, not the best one (metrics.md §2.2 step 3);
    a curve whose highest-TPF point is more than `offset` below it is rejected, not truncated (step 2).
    """
    pts = [(float(r), float(y)) for r, y in points]
    if not pts:
        raise AUPError("AUP needs at least one (TPF, accuracy) point")
    if any(not r > 0 for r, _ in pts):
        raise AUPError(f"AUP needs every TPF > 0, got {[r for r, _ in pts]}")
    if any(not math.isfinite(y) or y < 0 for _, y in pts):
        raise AUPError(f"AUP needs finite accuracies >= 0 (percent), got {[y for _, y in pts]}")
    if any(0 < y < 1.0 for _, y in pts):  # get_aup warns too: accuracies look like fractions
        warnings.warn("AUP: an accuracy is below 1.0; accuracies are in percent (0-100), not fractions")
    pts.sort(key=lambda p: p[0])  # stable: equal TPFs keep their given order
    y_first, y_last = pts[0][1], pts[-1][1]
    if y_first - y_last > offset:
        raise AUPError(f"AUP rejects this curve: the highest-TPF point ({pts[-1][0]:g}, {y_last:g}) is "
                       f"{y_first - y_last:.3g} > {offset:g} points below the lowest-TPF point "
                       f"({pts[0][0]:g}, {y_first:g}); stop the threshold sweep before that")
    return [p for p in pts if p[1] >= y_first - offset]


def aup_weight(y: float, alpha: float, y_max: float) -> float:
    """W(y) = min(exp(-alpha (1 - y / y_max)), 1); with y_max = 0 every y is 0 and W's limit is 1."""
    if y_max <= 0:
        return 1.0
    return min(math.exp(-alpha * (1.0 - y / y_max)), 1.0)


def aup(points: Sequence, alpha: float = 3.0, y_max: Optional[float] = None) -> float:
    """AUP of (tpf, accuracy %) points: rho_1 y_1 + sum_i (rho_i - rho_{i-1}) (y_i W_i + y_{i-1} W_{i-1}) / 2.

    y_max None = the best accuracy among the points (the filter never drops it, so before or after
    filtering is the same). Raises AUPError for points get_aup rejects.
    """
    points = list(points)
    kept = aup_kept_points(points)
    if y_max is None:
        y_max = max(float(y) for _, y in points)
    if y_max < 0:
        raise AUPError(f"AUP y_max must be >= 0, got {y_max}")
    total = kept[0][0] * kept[0][1]  # unweighted rectangle from TPF 0 to rho_1
    for (ra, ya), (rb, yb) in zip(kept, kept[1:]):
        total += 0.5 * (rb - ra) * (yb * aup_weight(yb, alpha, y_max) + ya * aup_weight(ya, alpha, y_max))
    return total


def aup_summary(rows: Sequence[dict], alpha: float = 3.0, y_max: Optional[float] = None,
                tpf_key: str = "tpf_denoise", acc_key: str = "success_pct") -> dict:
    """AUP of evaluation rows with everything needed to read it: the points, the kept ones, y_max,
    and `error` (aup None) when the curve is rejected or a point has no forward pass."""
    points = [(float(r[tpf_key]), float(r[acc_key])) for r in rows
              if r.get(tpf_key) is not None and r.get(acc_key) is not None]
    best = max((y for _, y in points), default=None)
    out = {"aup": None, "alpha": alpha, "y_max": best if y_max is None else float(y_max),
           "y_max_rule": "best accuracy among these points" if y_max is None else "given",
           "tpf": tpf_key, "points": [list(p) for p in points], "kept": None, "error": None}
    try:
        out["kept"] = [list(p) for p in aup_kept_points(points)]
        out["aup"] = aup(points, alpha, out["y_max"])
    except AUPError as e:
        out["error"] = str(e)
    return out


# ----------------------------------------------------------------------------- success rate
def success_ci(successes: int, n: int, z: float = 1.96) -> dict:
    """Success rate p = k / n with its standard error sqrt(p (1 - p) / n) and the Wilson score
    interval (Wilson 1927), which stays inside [0, 1] and is not empty at p = 0 or 1, unlike the
    normal interval p ± z·se. All values are fractions."""
    if n <= 0:
        raise ValueError(f"success_ci: n must be > 0, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"success_ci: successes = {successes} must lie in [0, n = {n}]")
    p = successes / n
    se = math.sqrt(p * (1.0 - p) / n)
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denom
    return {"p": p, "se": se, "low": max(center - half, 0.0), "high": min(center + half, 1.0),
            "n": n, "successes": successes, "z": z, "method": "wilson"}


def task_outcomes(ids: list, episodes: list) -> list:
    """1 / 0 per task of `ids` (won / lost) from rollout episode records, None where the episode failed
    or is missing: the per-task record that paired_difference compares."""
    won = {e["task_id"]: (None if e["failed"] else int(e["won"])) for e in episodes}
    return [won.get(i) for i in ids]


def task_invalid(ids: list, episodes: list) -> list:
    """Invalid actions per task of `ids` (steps the env rejected), None where the episode failed or is
    missing: the per-task counts paired_mean_difference compares."""
    bad = {e["task_id"]: (None if e["failed"] else int(e["steps"]) - int(e["valid"])) for e in episodes}
    return [bad.get(i) for i in ids]


def paired_mean_difference(before: list, after: list) -> dict:
    """Mean change of a per-task value from `before` to `after` on the same tasks (in one task order; pairs
    with a None are dropped), with its paired standard error: d_i = after_i - before_i, diff = mean(d),
    se = sqrt(var(d) / n), var the population variance, so tasks that do not change add no noise. The
    unpaired sqrt(se_a^2 + se_b^2) would count the task-difficulty variance both runs share. Used for
    invalid actions per episode: the valid-action *ratio* divides by the steps taken, so a policy that
    ends its episodes sooner lowers it with fewer invalid actions; the count per episode does not."""
    if len(before) != len(after):
        raise ValueError(f"paired difference: {len(before)} vs {len(after)} values; the runs must share tasks")
    pairs = [(a, b) for a, b in zip(before, after) if a is not None and b is not None]
    n = len(pairs)
    if n == 0:
        raise ValueError("paired difference: no task has a value in both runs")
    d = [b - a for a, b in pairs]
    diff = sum(d) / n
    var = sum((x - diff) ** 2 for x in d) / n
    return {"diff": diff, "se": math.sqrt(var / n), "n": n, "before": sum(a for a, _ in pairs) / n,
            "after": sum(b for _, b in pairs) / n}


def paired_difference(before: list, after: list) -> dict:
    """Success change from `before` to `after` on the same tasks: paired_mean_difference of per-task
    outcomes (1 won, 0 lost, None failed), values as fractions, plus the tasks gained (n01: lost before,
    won after) and lost (n10). For outcomes var(d) = (n01 + n10) / n - diff^2, so tasks both models win or
    both lose add no noise: the standard error to hold a stage's gain against."""
    cast = lambda xs: [None if x is None else int(x) for x in xs]  # noqa: E731
    before, after = cast(before), cast(after)
    out = paired_mean_difference(before, after)
    pairs = [(a, b) for a, b in zip(before, after) if a is not None and b is not None]
    return {**out, "gained": sum(b > a for a, b in pairs), "lost": sum(b < a for a, b in pairs)}


# ----------------------------------------------------------------------------- run record
def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def checkpoint_hashes(path: str) -> dict:
    """sha256 of a checkpoint folder's weights (every *.safetensors) and of its config / tokenizer /
    index files; `weights_sha256` hashes the sorted (name, sha256) list of the weight files."""
    names = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    files = {f: sha256_file(os.path.join(path, f)) for f in names}
    weights = hashlib.sha256("".join(f"{n}:{h}\n" for n, h in files.items()).encode()).hexdigest()
    for extra in ("config.json", "tokenizer.json", "model.safetensors.index.json", "generation_config.json"):
        if os.path.isfile(os.path.join(path, extra)):
            files[extra] = sha256_file(os.path.join(path, extra))
    return {"path": os.path.abspath(path), "files": files, "weights_sha256": weights if names else None}


def code_version(repo: Optional[str] = None) -> dict:
    """git commit of the code and whether the work tree differs from it (None where git is absent)."""
    repo = repo or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def git(*args):
        try:
            r = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return r.stdout.strip() if r.returncode == 0 else None
    from d3mini import __version__
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status), "d3mini": __version__}


def run_record(cfg, ckpt: Optional[str] = None, model=None, num_tasks: Optional[int] = None,
               seeds: Optional[dict] = None, extra: Optional[dict] = None, hash_weights: bool = True) -> dict:
    """Everything needed to reproduce a result: resolved config, checkpoint and weight hashes, code
    commit and dirty flag, library versions, device, dtypes, seeds, number of tasks, command line."""
    import torch
    dev = next(model.parameters()).device if model is not None else None
    if dev is not None and dev.type == "cuda":
        device = torch.cuda.get_device_name(dev)
    else:
        device = f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    ck = None
    if ckpt is not None:
        ck = checkpoint_hashes(ckpt) if hash_weights else {"path": os.path.abspath(ckpt)}
    return {
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "config": dataclasses.asdict(cfg),
        "checkpoint": ck,
        "code": code_version(),
        "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
                     "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None},
        "host": {"name": socket.gethostname(), "platform": platform.platform(), "device": device,
                 "torch_threads": torch.get_num_threads()},
        "dtype": {"params": str(next(model.parameters()).dtype).replace("torch.", "") if model is not None
                  else cfg.model.dtype, "compute": cfg.train.dtype},
        "seeds": seeds if seeds is not None else {"train": cfg.train.seed, "decode": cfg.decode.seed,
                                                  "env": cfg.env.seed},
        "num_tasks": num_tasks,
        "tpf_convention": TPF_CONVENTION,
        **(extra or {}),
    }


# ----------------------------------------------------------------------------- tables and plots
def _cell(v, fmt) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if callable(fmt):
        return str(fmt(v))
    if fmt:
        return format(v, fmt)
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v).replace("|", "\\|")


def markdown_table(rows: Sequence[dict], columns: Sequence) -> str:
    """A markdown table; a column is a key, (header, key) or (header, key, fmt), where key may be a
    function of the row and fmt a format spec or a function of the value. Missing values show '-'."""
    cols = []
    for c in columns:
        c = (c, c) if isinstance(c, str) else tuple(c)
        cols.append((c[0], c[1], c[2] if len(c) > 2 else None))
    out = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        vals = [k(r) if callable(k) else r.get(k) for _, k, _ in cols]
        out.append("| " + " | ".join(_cell(v, f) for v, (_, _, f) in zip(vals, cols)) + " |")
    return "\n".join(out) + "\n"


def plot_acc_vs_tpf(runs: dict, path: str, title: Optional[str] = None,
                    metadata: Optional[dict] = None) -> Optional[str]:
    """Accuracy (%) against TPF, one line per run; `runs` maps a label to (tpf, acc) pairs or to eval
    rows. `metadata` (e.g. the run record) is stored in the PNG's Description text chunk. Returns
    the path, or None when matplotlib is not installed (the `plot` extra)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for label, pts in runs.items():
        xy = [(r["tpf_denoise"], r["success_pct"]) if isinstance(r, dict) else tuple(r) for r in pts]
        xy = sorted(p for p in xy if None not in p)  # a threshold whose episodes all failed has no accuracy
        ax.plot([p[0] for p in xy], [p[1] for p in xy], marker="o", label=label)
    ax.set_xlabel("TPF (tokens per denoising forward)")
    ax.set_ylabel("accuracy (success %)")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if runs:
        ax.legend()
    fig.tight_layout()
    meta = {"Description": json.dumps(metadata, default=str)} if metadata is not None else None
    fig.savefig(path, dpi=120, metadata=meta)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------- evaluation
def threshold_row(tau: float, m: dict, num_tasks: int, split: str) -> dict:
    """One evaluation row from rollout metrics: success with its standard error and Wilson interval
    (percent), score, valid-action ratio, TPF both ways, tokens/s, and the per-episode records."""
    ok = [e for e in m["episodes"] if not e["failed"]]
    k, n = sum(bool(e["won"]) for e in ok), len(ok)
    ci = success_ci(k, n) if n else None
    pct = lambda key: None if ci is None else 100.0 * ci[key]  # noqa: E731
    return {"threshold": float(tau), "split": split, "num_tasks": num_tasks, "num_episodes": m["num_episodes"],
            "failed_episodes": m["failed_episodes"], "successes": k, "success": m["success"],
            "success_pct": pct("p"), "success_se_pct": pct("se"), "success_ci_low_pct": pct("low"),
            "success_ci_high_pct": pct("high"), "score": m["score"], "valid_ratio": m["valid_ratio"],
            "invalid_per_episode": m["invalid_per_episode"], "steps": m["steps"],
            "tpf_denoise": m["tpf_denoise"], "tpf_total": m["tpf_total"],
            "nfe_denoise": m["nfe_denoise"], "nfe_total": m["nfe_total"], "gen_tokens": m["gen_tokens"],
            "tokens_per_s": m["tokens_per_s"], "time_rollout": m["time_rollout"], "time_decode": m["time_decode"],
            "episodes": m["episodes"]}


def evaluate(model, tokenizer, cfg, thresholds: Optional[Sequence[float]] = None, split: Optional[str] = None,
             num_tasks: Optional[int] = None, seed: Optional[int] = None, batch_size: Optional[int] = None,
             env_factory: Optional[Callable] = None, progress: bool = False) -> list:
    """Held-out rollouts at each decode threshold tau (highest first); one row per tau (threshold_row).

    Defaults come from cfg.eval (thresholds, split, num_tasks, batch_episodes) and cfg.train.seed;
    num_tasks 0 = every task of the split. The tasks are the first num_tasks ids of the split, one
    episode each, decoded with cfg.decode except its threshold; bf16 autocast when train.dtype says so.
    """
    import contextlib
    import torch
    from d3mini.envs import env_module
    from d3mini.rollout import rollout

    thresholds = list(cfg.eval.thresholds if thresholds is None else thresholds)
    for t in thresholds:
        if not 0.0 <= float(t) <= 1.0:
            raise ValueError(f"evaluate: threshold {t!r} outside [0, 1]")
    split = split or cfg.eval.split
    n = cfg.eval.num_tasks if num_tasks is None else num_tasks
    ids = list(env_module(cfg.env.name).task_ids(cfg.env, split))
    ids = ids[:n] if n else ids
    if not ids:
        raise ValueError(f"evaluate: env {cfg.env.name!r} has no {split!r} tasks")
    dev = next(model.parameters()).device
    amp = torch.autocast(dev.type, dtype=torch.bfloat16) if cfg.train.dtype == "bfloat16" \
        else contextlib.nullcontext()
    was_training = model.training
    model.eval()
    rows = []
    try:
        for tau in sorted({float(t) for t in thresholds}, reverse=True):
            dcfg = dataclasses.replace(cfg.decode, threshold=tau)
            with torch.no_grad(), amp:
                _, m = rollout(model, tokenizer, cfg.env, dcfg, ids, seed=cfg.train.seed if seed is None else seed,
                               batch_size=batch_size or cfg.eval.batch_episodes, env_factory=env_factory,
                               progress=progress)
            rows.append(threshold_row(tau, m, len(ids), split))
    finally:
        model.train(was_training)
    return rows


RESULT_COLUMNS = [
    ("tau", "threshold", ".3f"),
    ("success % (± s.e.)", lambda r: None if r["success_pct"] is None else
     f"{r['success_pct']:.1f} ± {r['success_se_pct']:.1f}"),
    ("95% CI (Wilson)", lambda r: None if r["success_pct"] is None else
     f"[{r['success_ci_low_pct']:.1f}, {r['success_ci_high_pct']:.1f}]"),
    ("score", "score", ".3f"), ("valid", "valid_ratio", ".3f"),
    ("invalid / episode", "invalid_per_episode", ".2f"), ("TPF denoise", "tpf_denoise", ".3f"),
    ("TPF total", "tpf_total", ".3f"), ("tokens/s", "tokens_per_s", ".1f"),
    ("episodes (failed)", lambda r: f"{r['num_episodes']} ({r['failed_episodes']})"),
]


def results_markdown(rows: Sequence[dict], summaries: Sequence[dict], record: dict) -> str:
    """The report: provenance header, one row per threshold, the AUP lines, the full run record."""
    ck, code, cfg = record.get("checkpoint") or {}, record["code"], record["config"]
    head = [f"# d3mini eval: {cfg['env']['name']} ({rows[0]['split'] if rows else '-'} split, "
            f"{record['num_tasks']} tasks)", "",
            f"- checkpoint: `{ck.get('path', '-')}` (weights sha256 {str(ck.get('weights_sha256'))[:16]})",
            f"- code: {code['commit'] or 'unknown'}{' (dirty)' if code['dirty'] else ''}; torch "
            f"{record['versions']['torch']}, CUDA {record['versions']['cuda']}; device {record['host']['device']}; "
            f"dtype {record['dtype']['params']} (compute {record['dtype']['compute']}); seeds {record['seeds']}",
            f"- decode: {cfg['model']['family']}, rule {cfg['decode']['rule']}, block {cfg['decode']['block_size']}, "
            f"temperature {cfg['decode']['temperature']}, max_new_tokens {cfg['decode']['max_new_tokens']}",
            f"- {record['tpf_convention']}", ""]
    lines = [markdown_table(rows, RESULT_COLUMNS)]
    for s in summaries:
        val = f"**{s['aup']:.3f}**" if s["aup"] is not None else f"rejected ({s['error']})"
        y_max = "-" if s["y_max"] is None else f"{s['y_max']:.1f}"
        lines.append(f"AUP ({s['tpf']}, alpha {s['alpha']:g}, y_max {y_max} = {s['y_max_rule']}): {val}  ")
    body = json.dumps(record, indent=2, default=str)
    return "\n".join(head + lines) + f"\n\n<details><summary>run record</summary>\n\n```json\n{body}\n```\n</details>\n"
