"""Evaluate a checkpoint on held-out tasks at one or more decode thresholds; AUP over a sweep.

    python eval.py --config configs/webshop.yaml --ckpt runs/webshop-sdar8b/export --threshold 0.95
    python eval.py --config configs/tiny.yaml --ckpt runs/tiny/export --sweep 0.9:1.0:0.05 eval.num_tasks=50
    python eval.py --aup 1.447:3.4 2.944:57.2 --alpha 3          # AUP of given TPF:ACC points, no model
    python eval.py --compare runs/a/eval.json runs/b/eval.json    # success and invalid actions: paired change, no model
    python eval.py --ckpt runs/tiny/ckpt/step_00100020 --threshold 0.95   # a resumable training checkpoint
    python eval.py --threshold 0.95       # no --ckpt: model.path, else the finished run in train.out_dir (runs/tiny)

--ckpt takes an exported folder (config.json, safetensors, tokenizer.json) or one of train.py's
resumable `<out_dir>/ckpt/step_*` folders; the latter is built from the run's config.yaml and
tokenizer.json, and that config is the default for --config. Without --threshold or --sweep the
config's eval.sweep is run. Remaining arguments are config
overrides (`section.key=value` or `--section.key value`). Each threshold tau runs one episode per
task (the first eval.num_tasks ids of the split; decode section as configured, greedy by default),
bf16 autocast when train.dtype is bfloat16 (as train.py's own eval), and reports success rate
with its standard error and Wilson 95% interval, score, valid-action ratio, TPF over denoising and
over all forwards, and tokens/s. AUP (reference/metrics.md §2) uses alpha = eval.alpha and
y_max = eval.y_max, or the best accuracy among the evaluated points. Results go to
<prefix>.json, <prefix>.md and <prefix>.png (with matplotlib), prefix = eval.out or
<train.out_dir>/eval; each file carries the run record (config, weight hashes, commit, versions).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from d3mini.config import ConfigError, load_config
from d3mini.envs import EnvError
from d3mini.metrics import (AUPError, aup, aup_kept_points, aup_summary, aup_weight, evaluate, paired_difference,
                            paired_mean_difference, plot_acc_vs_tpf, results_markdown, run_record)


class UsageError(ValueError):
    """A bad command line or input: sweep / point syntax, threshold range, missing or unreadable checkpoint."""


# ----------------------------------------------------------------------------- argument parsing
def _number(text: str, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a number") from None


def check_threshold(tau: float, what: str = "--threshold") -> float:
    if not 0.0 <= tau <= 1.0:
        raise UsageError(f"{what}: threshold {tau:g} is outside [0, 1] (tau commits tokens with confidence > tau)")
    return tau


def parse_sweep(text: str) -> list:
    """'START:STOP:STEP' (both ends included, e.g. 0.95:1.0:0.01 -> 0.95 ... 1.0) or 'T1,T2,...'."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise UsageError(f"--sweep {text!r}: expected START:STOP:STEP, e.g. 0.95:1.0:0.01")
        start, stop, step = (_number(p, f"--sweep {text!r}") for p in parts)
        if step <= 0:
            raise UsageError(f"--sweep {text!r}: STEP must be > 0")
        if start > stop:
            raise UsageError(f"--sweep {text!r}: START must be <= STOP")
        n = int((stop - start) / step + 1e-9)  # tolerance: 0.05 / 0.01 is 4.9999... in floats
        taus = [round(start + i * step, 10) for i in range(n + 1)]
    else:
        taus = [_number(p, f"--sweep {text!r}") for p in text.split(",") if p.strip()]
        if not taus:
            raise UsageError(f"--sweep {text!r}: no thresholds")
    return [check_threshold(t, f"--sweep {text!r}") for t in taus]


def parse_point(text: str) -> tuple:
    """'TPF:ACC' with ACC in percent, e.g. 2.944:57.2."""
    parts = text.split(":")
    if len(parts) != 2:
        raise UsageError(f"--aup point {text!r}: expected TPF:ACC, e.g. 2.944:57.2")
    return _number(parts[0], f"--aup point {text!r}"), _number(parts[1], f"--aup point {text!r}")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="d3mini evaluation: success rate, TPF, AUP", allow_abbrev=False,
                                epilog="other arguments are config overrides: section.key=value")
    p.add_argument("--config", help="YAML config (defaults when omitted)")
    p.add_argument("--ckpt", help="checkpoint folder: config.json, *.safetensors, tokenizer.json "
                                  "(default: model.path, else <train.out_dir>/export of a finished run)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--threshold", help="one decode threshold tau in [0, 1]")
    g.add_argument("--sweep", help="START:STOP:STEP (ends included) or T1,T2,...; default eval.sweep")
    g.add_argument("--aup", nargs="+", metavar="TPF:ACC", help="print the AUP of these points and exit")
    g.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"),
                   help="success change between two result JSONs of this script, per threshold, with the "
                        "paired standard error over their shared tasks; no model")
    p.add_argument("--split", help="task split (default eval.split)")
    p.add_argument("--num-tasks", type=int, help="held-out tasks (default eval.num_tasks; 0 = all)")
    p.add_argument("--alpha", type=float, help="AUP alpha (default eval.alpha = 3)")
    p.add_argument("--y-max", type=float, help="AUP y_max in percent (default: best accuracy among the points)")
    p.add_argument("--out", help="result file prefix (default eval.out or <train.out_dir>/eval)")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default cuda when available)")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="parameter dtype (default: the checkpoint's)")
    return p


# ----------------------------------------------------------------------------- modes
def aup_main(ns) -> int:
    """Pure AUP of given points; the value is the last line printed."""
    points = [parse_point(t) for t in ns.aup]
    alpha = 3.0 if ns.alpha is None else ns.alpha
    y_max = max(y for _, y in points) if ns.y_max is None else ns.y_max
    kept = aup_kept_points(points)
    print("points (by TPF): " + " ".join(f"{r:g}:{y:g}" for r, y in sorted(points)))
    print(f"kept (acc >= {kept[0][1]:g} - 5): " + " ".join(f"{r:g}:{y:g}" for r, y in kept))
    print(f"alpha {alpha:g}, y_max {y_max:g} ({'given' if ns.y_max is not None else 'best accuracy given'}); "
          "W: " + " ".join(f"{aup_weight(y, alpha, y_max):.6f}" for _, y in kept))
    print(f"{aup(points, alpha, y_max):.3f}")
    return 0


def _outcomes(path: str) -> dict:
    """threshold -> {task_id: (1 | 0 | None, invalid actions | None)} from an eval JSON written by this script
    (the count is None for a failed episode or a file without per-episode steps)."""
    def bad(e):
        return None if e["failed"] or "steps" not in e or "valid" not in e else int(e["steps"]) - int(e["valid"])
    try:
        with open(path) as f:
            rows = json.load(f)["results"]
        return {float(r["threshold"]): {e["task_id"]: (None if e["failed"] else int(e["won"]), bad(e))
                                        for e in r["episodes"]} for r in rows}
    except FileNotFoundError:
        raise UsageError(f"--compare: {path} not found") from None
    except (ValueError, KeyError, TypeError) as e:
        raise UsageError(f"--compare: {path} is not an eval.py result JSON with episodes ({e!r})") from None


def compare_main(ns) -> int:
    """Per shared threshold: both success rates on the shared tasks, the change, and its paired s.e.; then the
    invalid actions per episode before and after, and their paired change."""
    before, after = (_outcomes(p) for p in ns.compare)
    taus = sorted(set(before) & set(after), reverse=True)
    if not taus:
        raise UsageError(f"--compare: no threshold in common ({sorted(before)} vs {sorted(after)})")
    print("| tau | tasks | before % | after % | change (paired s.e.) | gained | lost | invalid / episode: before, "
          "after, change (paired s.e.) |")
    print("|---|---|---|---|---|---|---|---|")
    for t in taus:
        ids = [i for i in before[t] if i in after[t]]
        a, b = [before[t][i][0] for i in ids], [after[t][i][0] for i in ids]
        try:
            d = paired_difference(a, b)
        except ValueError as e:
            raise UsageError(f"--compare tau {t:g}: {e}") from None
        try:
            v = paired_mean_difference([before[t][i][1] for i in ids], [after[t][i][1] for i in ids])
            bad = f"{v['before']:.2f}, {v['after']:.2f}, {v['diff']:+.2f} ± {v['se']:.2f}"
        except ValueError:  # no per-episode steps in one of the files
            bad = "-"
        print(f"| {t:g} | {d['n']} | {100 * d['before']:.1f} | {100 * d['after']:.1f} | "
              f"{100 * d['diff']:+.1f} ± {100 * d['se']:.1f} | {d['gained']} | {d['lost']} | {bad} |")
    return 0


def run_dir_of(ckpt: str):
    """The train.py run folder of a resumable checkpoint <run>/ckpt/step_*, or None for an export."""
    if not os.path.isfile(os.path.join(ckpt, "state.json")):
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(ckpt)))


def check_checkpoint(ckpt: str) -> None:
    """Clear errors before anything heavy is imported or loaded."""
    if not os.path.isdir(ckpt):
        raise UsageError(f"--ckpt {ckpt}: checkpoint folder not found")
    names = set(os.listdir(ckpt))
    run = run_dir_of(ckpt)
    if run is not None:  # a training checkpoint: the run folder holds what the weights need
        for name in ("config.yaml", "tokenizer.json"):
            if not os.path.isfile(os.path.join(run, name)):
                raise UsageError(f"--ckpt {ckpt}: a training checkpoint, but its run folder {run} has no {name}")
        if "model.safetensors" not in names:
            raise UsageError(f"--ckpt {ckpt}: no model.safetensors")
        return
    if "config.json" not in names:
        raise UsageError(f"--ckpt {ckpt}: no config.json")
    if not any(n.endswith(".safetensors") for n in names):
        raise UsageError(f"--ckpt {ckpt}: no *.safetensors weights")
    if "tokenizer.json" not in names:
        raise UsageError(f"--ckpt {ckpt}: no tokenizer.json (export with dist.export_hf or save the tokenizer there)")


def load_checkpoint(ckpt: str, dtype=None, device=None):
    """(DiffusionLM, Tokenizer) from a checkpoint folder."""
    from d3mini.data import Tokenizer
    from d3mini.model import CheckpointError, DiffusionLM
    try:
        model = DiffusionLM.from_pretrained(ckpt, dtype=dtype, device=device)
        tok = Tokenizer.from_dir(ckpt, model.cfg.family)
    except CheckpointError as e:
        raise UsageError(f"--ckpt: {e}") from None
    except ValueError as e:  # a tokenizer without the family's special tokens
        raise UsageError(f"--ckpt {ckpt}: tokenizer.json: {e}") from None
    return model.eval(), tok


def load_training_checkpoint(ckpt: str, cfg, dtype=None, device=None):
    """(DiffusionLM, Tokenizer) from train.py's <run>/ckpt/step_* folder: the model is built as the
    run built it (its config.yaml, tokenizer.json, LoRA included), then the step's weights are loaded."""
    import torch
    from d3mini import dist
    from d3mini.data import Tokenizer
    from d3mini.model import DTYPES, CheckpointError
    from train import build_model  # the run's own construction
    run = run_dir_of(ckpt)
    run_cfg = load_config(os.path.join(run, "config.yaml"))
    run_cfg.train = dataclasses.replace(run_cfg.train, activation_checkpointing=False)
    try:
        tok = Tokenizer.from_file(os.path.join(run, "tokenizer.json"), run_cfg.model.family)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(f"--ckpt {ckpt}: {run}/tokenizer.json: {e}") from None
    info = dist.DistInfo(0, 1, 0, torch.device(device or "cpu"), True)
    model = build_model(run_cfg, tok, info)
    try:
        dist.load(ckpt, model)
    except CheckpointError as e:
        raise UsageError(f"--ckpt: {e}") from None
    except RuntimeError as e:  # a state dict that does not fit the run's model
        raise UsageError(f"--ckpt {ckpt}: weights do not match the model of {run}/config.yaml ({e})") from None
    torch.manual_seed(cfg.train.seed)  # dist.load restored the run's RNG streams; evaluation has its own seed
    if dtype is not None:
        model.to(DTYPES[dtype])
    return model.eval(), tok


def _atomic_write(path: str, text: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def write_results(prefix: str, rows: list, summaries: list, record: dict, label: str) -> list:
    """<prefix>.json (record, rows with episodes, AUP), <prefix>.md, <prefix>.png; returns the paths."""
    os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    out = {"record": record, "results": rows, "aup": summaries[0], "aup_total": summaries[1]}
    _atomic_write(prefix + ".json", json.dumps(out, indent=2, default=str))
    _atomic_write(prefix + ".md", results_markdown(rows, summaries, record))
    paths = [prefix + ".json", prefix + ".md"]
    png = plot_acc_vs_tpf({label: rows}, prefix + ".png", title=f"{record['config']['env']['name']}: "
                          f"accuracy vs TPF", metadata=record)
    return paths + ([png] if png else [])


def default_checkpoint(config, overrides: list) -> tuple:
    """No --ckpt: (model.path, --config) when the config sets it, else the finished run in the config's
    train.out_dir (runs/tiny by default): (its export, its config.yaml), so `python eval.py --threshold 0.95`
    after `python train.py --config configs/tiny.yaml` evaluates what that run trained, on its own tasks."""
    base = load_config(config, overrides)
    if base.model.path:
        return base.model.path, config
    run = base.train.out_dir
    if not (os.path.isfile(os.path.join(run, "export", "config.json")) and os.path.isfile(os.path.join(run, "config.yaml"))):
        raise UsageError(f"no --ckpt and no model.path, and train.out_dir {run} holds no finished run (export/ and "
                         "config.yaml): pass --ckpt DIR, or train first (python train.py --config configs/tiny.yaml)")
    print(f"evaluating {os.path.join(run, 'export')}, the run in {run} (--ckpt picks another)", file=sys.stderr)
    return os.path.join(run, "export"), config or os.path.join(run, "config.yaml")


def eval_main(ns, overrides: list) -> int:
    ckpt, config = ns.ckpt, ns.config
    if ckpt is None:
        ckpt, config = default_checkpoint(config, overrides)
    run = run_dir_of(ckpt) if os.path.isdir(ckpt) else None
    config = config or (os.path.join(run, "config.yaml") if run else None)  # the run's env and decoder
    cfg = load_config(config, overrides)
    if ns.threshold is not None:
        taus = [check_threshold(_number(ns.threshold, "--threshold"))]
    elif ns.sweep is not None:
        taus = parse_sweep(ns.sweep)
    else:
        taus = [check_threshold(float(t), "eval.sweep") for t in cfg.eval.sweep]
    if ns.num_tasks is not None and ns.num_tasks < 0:
        raise UsageError(f"--num-tasks {ns.num_tasks}: must be >= 0")
    ev = cfg.eval
    cfg.eval = dataclasses.replace(ev, split=ns.split or ev.split, alpha=ev.alpha if ns.alpha is None else ns.alpha,
                                   y_max=ev.y_max if ns.y_max is None else ns.y_max, out=ns.out or ev.out,
                                   num_tasks=ev.num_tasks if ns.num_tasks is None else ns.num_tasks)
    check_checkpoint(ckpt)
    prefix = cfg.eval.out or os.path.join(cfg.train.out_dir, "eval")
    if os.path.isdir(prefix) or prefix.endswith(os.sep):
        prefix = os.path.join(prefix, "eval")
    try:  # before the evaluation, not after it: an unwritable --out would lose the results
        os.makedirs(os.path.dirname(os.path.abspath(prefix)), exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {prefix}: cannot create its folder ({e})") from None
    if cfg.env.server_url:
        from d3mini.envs.server import check_server
        check_server(cfg.env.server_url, cfg.env)  # EnvError: unreachable, or built from other env settings

    import torch
    if cfg.train.threads > 0:
        torch.set_num_threads(cfg.train.threads)
    torch.manual_seed(cfg.train.seed)
    device = ns.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if run_dir_of(ckpt) is not None:
        model, tok = load_training_checkpoint(ckpt, cfg, dtype=ns.dtype, device=device)
    else:
        model, tok = load_checkpoint(ckpt, dtype=ns.dtype, device=device)
    cfg.model = dataclasses.replace(model.cfg, path=ckpt)  # the record shows the model that was evaluated
    fam, K = model.cfg.family, cfg.decode.block_size
    if fam == "qwen3" and K != 1:
        raise ConfigError(f"decode.block_size = {K}: the qwen3 checkpoint decodes autoregressively, set it to 1")
    if fam == "sdar" and K != model.cfg.block_size:
        raise ConfigError(f"decode.block_size = {K} must equal the checkpoint's block_size = {model.cfg.block_size}")

    rows = evaluate(model, tok, cfg, taus, cfg.eval.split, cfg.eval.num_tasks, progress=sys.stderr.isatty())
    from d3mini.rollout import check_some_scored
    for r in rows:
        check_some_scored(r, f"tau {r['threshold']}")  # EnvError: a table of env failures would read as 0 %
    summaries = [aup_summary(rows, cfg.eval.alpha, cfg.eval.y_max, tpf) for tpf in ("tpf_denoise", "tpf_total")]
    record = run_record(cfg, ckpt=ckpt, model=model, num_tasks=rows[0]["num_tasks"],
                        extra={"thresholds": taus, "split": cfg.eval.split})
    paths = write_results(prefix, rows, summaries, record, label=os.path.basename(os.path.normpath(ckpt)))
    print(results_markdown(rows, summaries, record).split("\n<details>")[0])
    print("wrote " + ", ".join(paths))
    return 0


def main(argv=None) -> int:
    parser = build_parser()
    ns, rest = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    try:
        if ns.aup is not None:
            if ns.ckpt or ns.config or rest:
                raise UsageError("--aup takes only points, --alpha and --y-max (no model, config or overrides)")
            return aup_main(ns)
        if ns.compare is not None:
            if ns.ckpt or ns.config or rest:
                raise UsageError("--compare takes two result JSONs only (no model, config or overrides)")
            return compare_main(ns)
        return eval_main(ns, rest)
    except (UsageError, ConfigError, AUPError, FileNotFoundError, EnvError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # nothing is written before the evaluation ends
        print("\ninterrupted: no results written", file=sys.stderr)
        sys.exit(130)
