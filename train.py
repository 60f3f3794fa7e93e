"""Train a diffusion-LLM agent: SFT -> reward-gated agentic RL -> online self-distillation.

    python train.py --config configs/tiny.yaml [section.key=value ...] [--resume]
    torchrun --nproc_per_node 4 train.py --config webshop.yaml      # a bare name is looked up in configs/

Overrides are dotted config keys (d3mini/config.py lists every one with its meaning): `rl.lr=1e-5`,
`--rl.kl k3`, `"eval.sweep=[1.0,0.95]"`.

Stages run in the order of `train.stages`. Every rank holds the whole (deterministic) data and
rollout batch and trains on its slice of each global batch, with loss normalisers computed over
the global batch, so 1 process and N processes take the same optimizer steps (dist.py sums the
gradients). Checkpoints (model, optimizer, scheduler, RNG, stage, step, cursors) are written
every `train.save_every` steps and when the run is stopped (Ctrl-C or SIGTERM: the step in progress ends
and is saved; a second Ctrl-C stops at once); `--resume` continues from the latest intact one. After each stage
the model is evaluated on held-out tasks and a results table is written to <out_dir>/results.md.

<out_dir> holds: config.yaml, tokenizer.json, metrics.jsonl (one line per step and evaluation),
ckpt/step_* (resumable; `eval.py --ckpt` evaluates one), rollouts/ (sample dumps), dagger/ (the
corrections of sft.dagger_at's rounds, read back by a resumed run), results.json
(per stage and threshold, with per-task outcomes), results.md, run.json (commands, commits and
wall-clock of the run's pieces) and export/ (the final model as a checkpoint folder).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import random
import signal
import sys
import time
from typing import Optional

import numpy as np
import torch

# every d3mini module at start: a run keeps the code it started with, even if files change under it
from d3mini import dist
from d3mini.config import ConfigError, load_config, save_config, to_dict
from d3mini.data import Tokenizer, build_tiny_tokenizer
from d3mini.decode import generate
from d3mini.distill import distill_step, select_samples
from d3mini.envs import EnvError, _canonical, env_module
from d3mini.envs.server import check_server
from d3mini.lora import apply_lora
from d3mini.metrics import (AUPError, aup, paired_difference, paired_mean_difference, plot_acc_vs_tpf, success_ci,
                            task_invalid, task_outcomes)
from d3mini.model import DiffusionLM
from d3mini.rl import (batch_tokens, corrupt_iid, corrupt_suffix, credited, masked_loss, per_copy_count,
                       prompt_targets, rl_step)
from d3mini.rollout import StepSample, check_some_scored, first_failure, format_samples, rollout


# ----------------------------------------------------------------------------- setup
def parse_args(argv):
    """--config FILE (a path, or a bare name in configs/), --resume, and dotted overrides (section.key=value or
    --section.key value); -h / --help prints this module's usage."""
    if "-h" in argv or "--help" in argv:
        print(__doc__.strip())
        raise SystemExit(0)
    cfg_path, resume, rest = None, False, []
    i = 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("cli: --config needs a file")
            cfg_path, i = argv[i + 1], i + 2
        elif argv[i] == "--resume":
            resume, i = True, i + 1
        else:
            rest.append(argv[i])
            i += 1
    return load_config(cfg_path, rest), cfg_path, resume


def check_startup(cfg, info):
    """Clear errors before any work starts."""
    if cfg.model.path and not os.path.isdir(cfg.model.path):
        raise ConfigError(f"model.path = {cfg.model.path!r}: checkpoint folder not found")
    if cfg.model.attn_impl == "flash" and not torch.cuda.is_available():
        raise ConfigError("model.attn_impl = 'flash' needs CUDA; use sdpa on CPU")
    if cfg.decode.compile and not torch.cuda.is_available():
        dist.print0("note: decode.compile on CPU compiles for tens of seconds per shape")
    for name, n in [("sft.batch_size", cfg.sft.batch_size), ("distill.batch_size", cfg.distill.batch_size),
                    ("rl.minibatch", cfg.rl.minibatch)]:
        if n % info.world:
            raise ConfigError(f"{name} = {n} is not divisible by the world size {info.world}")
    sched = cfg.sft.block_schedule
    if sched and (cfg.model.family != "sdar" or sched[-1] != cfg.model.block_size or min(sched) < 1):
        raise ConfigError(f"sft.block_schedule = {sched}: needs family sdar, sizes >= 1 and the last equal to "
                          f"model.block_size = {cfg.model.block_size}")
    if cfg.sft.suffix_masks and (cfg.model.family != "sdar" or not 0 < cfg.sft.suffix_masks <= 1):
        raise ConfigError(f"sft.suffix_masks = {cfg.sft.suffix_masks}: a fraction in (0, 1], family sdar only")
    for stage, goals in (("rl", cfg.rl.goals), ("distill", cfg.distill.goals)):
        if stage in cfg.train.stages and goals == "unseen":
            policy_task_ids(cfg, goals, f"{stage}.goals")  # an empty set fails now, not after SFT
    if "sft" in cfg.train.stages and cfg.sft.val_every:
        policy_task_ids(cfg, "unseen", "sft validation (sft.val_every > 0) tasks")
    if cfg.sft.detours and not hasattr(env_module(cfg.env.name), "mistake"):  # now, not when a stage starts
        raise ConfigError(f"sft.detours = {cfg.sft.detours}: env {cfg.env.name} has no mistake() to take them")
    if cfg.model.family == "sdar" and cfg.decode.block_size != cfg.model.block_size:
        raise ConfigError(f"decode.block_size = {cfg.decode.block_size} must equal model.block_size = "
                          f"{cfg.model.block_size} for sdar")
    if cfg.env.server_url:
        check_server(cfg.env.server_url, cfg.env)  # EnvError (named by main): unreachable, or other env settings


def seed_all(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def autocast(cfg):
    if cfg.train.dtype == "bfloat16":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        return torch.autocast(dev, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def expert_texts(cfg, n_episodes: int) -> list:
    """Rendered prompt + response strings of expert episodes, to train a tiny tokenizer on."""
    boot = build_tiny_tokenizer(["bootstrap"], vocab_size=300, family=cfg.model.family)
    ids = env_module(cfg.env.name).task_ids(cfg.env, "train")[:n_episodes]
    samples, _ = rollout(None, boot, cfg.env, cfg.decode, ids, expert=True, seed=cfg.train.seed)
    return [boot.decode(s.prompt_ids) + s.text for s in samples]


def build_tokenizer(cfg, info, resume: bool = False) -> Tokenizer:
    fam = "llada" if cfg.model.family == "llada" else cfg.model.family
    try:
        if cfg.train.tokenizer:
            return Tokenizer.from_file(cfg.train.tokenizer, fam)
        if cfg.model.path:
            return Tokenizer.from_dir(cfg.model.path, fam)
        path = os.path.join(cfg.train.out_dir, "tokenizer.json")
        if resume and os.path.exists(path):  # the run's own tokenizer
            return Tokenizer.from_file(path, fam)
    except (ValueError, FileNotFoundError) as e:
        raise ConfigError(f"tokenizer: {e}") from None
    tok = build_tiny_tokenizer(expert_texts(cfg, min(200, cfg.sft.episodes)), cfg.model.vocab_size, fam)
    if info.is_main:
        tok.save(path)
    dist.barrier()
    return tok


def build_model(cfg, tok, info):
    dev = info.device
    if cfg.model.path:
        model = DiffusionLM.from_pretrained(cfg.model.path, device=dev)
    else:
        mc = cfg.model
        mc.vocab_size = tok.vocab_size
        mc.mask_id, mc.pad_id, mc.eos_ids = tok.mask_id, tok.pad_id, list(tok.stop_ids)
        mc.bos_id = tok.bos_id
        torch.manual_seed(cfg.train.seed)  # identical weights on every rank
        model = DiffusionLM.from_config(mc, device=dev)
    if cfg.lora.rank > 0:
        torch.manual_seed(cfg.train.seed + 1)
        apply_lora(model, cfg.lora)
    return dist.shard(model, cfg.train, info)


def make_optimizer(cfg, model, lr: float, steps: int, warmup: int, min_ratio: float):
    dist.reshard(model)  # after an eval / rollout forward the FSDP root holds unsharded, non-trainable copies
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(cfg.train.betas), weight_decay=cfg.train.weight_decay)

    def sched(step):  # linear warmup, cosine decay to min_ratio
        if step < warmup:
            return (step + 1) / max(warmup, 1)
        t = (step - warmup) / max(steps - warmup, 1)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, sched)


class Logger:
    """metrics.jsonl (rank 0), optional wandb; never needs guarding by the caller."""

    def __init__(self, cfg, info):
        self.main = info.is_main
        self.path = os.path.join(cfg.train.out_dir, "metrics.jsonl")
        self.wandb = None
        if self.main and os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            with open(self.path, "rb+") as f:  # a record cut short by a crash: drop it, keep the rest
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    f.seek(0)
                    f.truncate(f.read().rfind(b"\n") + 1)
        if self.main and cfg.train.wandb:
            try:
                import wandb
                self.wandb = wandb.init(project="d3mini", config=to_dict(cfg))
            except Exception as e:
                print(f"wandb disabled: {e}")

    def log(self, rec: dict):
        if not self.main:
            return
        rec = {k: v for k, v in rec.items() if isinstance(v, (int, float, str, bool)) or v is None}
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        if self.wandb is not None:
            self.wandb.log(rec)


def finite_or_raise(loss, where: str):
    if not torch.isfinite(loss):
        raise FloatingPointError(f"{where}: loss is {loss.item()} (not finite); the last checkpoint is kept")


def finite_metrics_or_raise(metrics: dict, where: str):
    """After an RL / distillation update: a non-finite loss or gradient norm stops the run before the
    next checkpoint, so the checkpoints on disk stay finite."""
    for key in ("loss", "grad_norm"):
        v = metrics.get(key)
        if v is not None and not math.isfinite(float(v)):
            raise FloatingPointError(f"{where}: {key} is {v} (not finite); the update is not saved, the last "
                                     f"checkpoint is kept (lower the learning rate, or resume from it)")


# ----------------------------------------------------------------------------- stages
def sft_loss(model, batch, gen, info, norm, copies: int = 1, ar: bool = False, block_size: int = 0,
             ar_prompt: bool = False, weight: str = "elbo", suffix: float = 0.0):
    """The family's masked-diffusion SFT loss (rl.masked_loss) on this rank's rows of a global batch.
    block_size 1 (a block_schedule phase) masks every response token (p = 1): row j, fed a mask,
    predicts token j from the clean tokens before it, i.e. next-token prediction with the diffusion
    model's own unshifted head, so what it learns carries over when the block grows.
    Masks are drawn for the whole global batch (same on every rank) and the loss is rescaled to the
    global normaliser, so the summed gradients over ranks equal one process on the whole batch."""
    b = batch_tokens([s.prompt_ids for s in batch], [s.response_ids for s in batch], model.cfg.pad_id,
                     next(model.parameters()).device)
    ar = ar or model.cfg.family == "qwen3"
    ar_prompt = ar_prompt and (ar or block_size == 1)
    prompt = None  # ar_prompt: the prompt's tokens are targets too, except in a prompt whose history shows a detour
    if ar_prompt:
        prompt = prompt_targets(b, torch.tensor([s.prompt_loss for s in batch], device=b.ids.device))
    if ar:
        masked, p = prompt, None
    elif block_size == 1:  # one-token blocks, all masked: the AR loss in the unshifted diffusion parametrization
        masked, p = (b.resp if prompt is None else prompt), torch.ones(len(batch), device=b.ids.device)
    elif suffix > 0:
        masked, p = corrupt_suffix(b, gen, block_size or model.cfg.block_size, copies=copies, frac=suffix)
    else:
        masked, p = corrupt_iid(b, gen, copies=copies)
    idx = list(range(info.rank, len(batch), info.world))
    sb = b.select(idx)
    sm = None if masked is None else masked[idx][..., : sb.ids.shape[1]]
    sp = None if p is None else p[idx]
    loss, stats = masked_loss(model, sb, sm, sp, norm, ar=ar, block_size=block_size, ar_prompt=ar_prompt,
                              weight=weight)
    if norm == "tokens":  # this rank's normaliser -> the global batch's
        if ar_prompt:
            total = masked.sum()  # every token after the first is a target (AR or one-token blocks) but detours
        elif weight == "uniform" and not ar:
            total = per_copy_count(masked)
        else:
            total = b.resp_len.sum()
        loss = loss * stats["tokens"] / float(total)
    else:
        loss = loss * len(idx) / len(batch)
    return loss, stats


def length_batches(lengths: list, batch_size: int, n_batches: int, seed: int, pool: int = 16) -> list:
    """n_batches lists of sample indices: each epoch is a fresh permutation cut into pools of `pool`
    batches; a pool is sorted by length before it is cut into batches, so rows of similar length are
    padded together (~2x fewer padded tokens on agent prompts), and the batch order is shuffled again.
    Deterministic in (seed, lengths), so every rank and a resumed run see the same batches."""
    rs = np.random.RandomState(seed)
    out = []
    while len(out) < n_batches:
        perm = rs.permutation(len(lengths))
        epoch = []
        for i in range(0, len(perm) - batch_size + 1, batch_size * pool):
            chunk = sorted(perm[i:i + batch_size * pool], key=lambda j: lengths[j])
            epoch += [chunk[k:k + batch_size] for k in range(0, len(chunk) - batch_size + 1, batch_size)]
        if not epoch:  # fewer samples than one batch: sample with replacement
            epoch = [list(rs.randint(0, len(lengths), batch_size))]
        out += [epoch[k] for k in rs.permutation(len(epoch))]
    return out[:n_batches]


def sft_block_size(cfg, step: int) -> int:
    """SDAR block size of the SFT loss at `step`: sft.block_schedule splits the steps after the AR
    warm-up into equal phases, one block size each (e.g. [2, 4, 8, 8]: grow the block as SDAR grows an
    AR checkpoint into a block-diffusion model); empty = the model's block size throughout."""
    sched = cfg.sft.block_schedule
    if not sched or step < cfg.sft.ar_warmup:
        return 0
    done = (step - cfg.sft.ar_warmup) / max(cfg.sft.steps - cfg.sft.ar_warmup, 1)
    return int(sched[min(int(done * len(sched)), len(sched) - 1)])


def sft_task_ids(cfg) -> list:
    """The train tasks of the SFT demonstrations: the first sft.episodes, or a seeded draw with
    repeats when the split is smaller."""
    ids = env_module(cfg.env.name).task_ids(cfg.env, "train")
    if len(ids) >= cfg.sft.episodes:
        return ids[:cfg.sft.episodes]
    rng = random.Random(cfg.train.seed)
    return [ids[rng.randrange(len(ids))] for _ in range(cfg.sft.episodes)]


def policy_task_ids(cfg, goals: str, what: str = "goals") -> list:
    """Train tasks for RL / distill rollouts. `unseen` leaves out the SFT demonstrations' tasks, so
    that the policy is trained where the SFT model has to generalise (it can memorise its own)."""
    ids = env_module(cfg.env.name).task_ids(cfg.env, "train")
    if goals == "train":
        return ids
    if goals != "unseen":
        raise ConfigError(f"{what}={goals!r}: expected train | unseen")
    seen = set(sft_task_ids(cfg))
    rest = [i for i in ids if i not in seen]
    if not rest:
        raise ConfigError(f"{what}=unseen: all {len(ids)} train tasks are SFT tasks (sft.episodes="
                          f"{cfg.sft.episodes}); raise env.num_goals")
    return rest


def expert_samples(cfg, tok) -> tuple:
    """The SFT demonstrations: (expert step samples, rollout metrics) of the SFT tasks."""
    return rollout(None, tok, cfg.env, cfg.decode, sft_task_ids(cfg), expert=True, seed=cfg.train.seed,
                   detours=cfg.sft.detours)


def sft_val_set(cfg, tok) -> list:
    """Expert step samples of sft.val_episodes train tasks the SFT set does not use (never test tasks)."""
    if not cfg.sft.val_every:
        return []
    ids = policy_task_ids(cfg, "unseen", "sft validation (sft.val_every > 0) tasks")
    data, _ = rollout(None, tok, cfg.env, cfg.decode, ids[:cfg.sft.val_episodes], expert=True,
                      seed=cfg.train.seed + 1)
    return data


def sft_validate(cfg, model, tok, val: list) -> dict:
    """Teacher-forced action accuracy: the model answers each held-out expert prompt greedily (decode
    config as in rollouts) and the projected action must equal the expert's; overall and per action
    kind (the env's action_kind, else the verb), with the mean TPF of those answers."""
    mod = env_module(cfg.env.name)
    kind = getattr(mod, "action_kind", lambda a: a.split("[", 1)[0].strip())
    dcfg = _decode(cfg, temperature=0.0)
    hits, tokens, nfe = {}, 0, 0
    model.eval()
    with torch.no_grad(), autocast(cfg):
        for i in range(0, len(val), cfg.eval.batch_episodes):
            chunk = val[i:i + cfg.eval.batch_episodes]
            r = generate(model, [s.prompt_ids for s in chunk], dcfg, tokenizer=tok)
            t = r.totals()
            tokens, nfe = tokens + t["counted_tokens"], nfe + t["nfe_denoise"]
            for s, text in zip(chunk, r.text):
                action, ok = mod.project(text)
                hits.setdefault(kind(s.action), []).append(ok and _canonical(action) == _canonical(s.action))
    model.train()
    n = sum(len(h) for h in hits.values())
    out = {"val_acc": sum(sum(h) for h in hits.values()) / max(n, 1), "val_tpf": tokens / max(nfe, 1)}
    out.update({f"val_acc/{k}": sum(h) / len(h) for k, h in sorted(hits.items())})
    return out


def dagger_samples(cfg, model, tok, step: int) -> tuple:
    """A DAgger round at SFT step `step`: (expert-labelled step samples, metrics). The model rolls out
    greedily at sft.dagger_threshold on the first sft.dagger_tasks SFT tasks (the env seeded as for the
    demonstrations) while the env's expert answers every prompt the episodes visit. An episode contributes
    from its first step whose action differs from the expert's on: the states the model's own errors lead
    to, each with the expert's response (once per loop: an invalid action repeated on an unchanged page gives
    the same prompt but for its step number). A prompt whose history window shows one of the model's wrong
    actions is no prompt-loss target (sft.ar_prompt_loss would otherwise train on that action)."""
    dcfg = _decode(cfg, temperature=0.0, threshold=cfg.sft.dagger_threshold)
    was = model.training
    model.eval()
    with torch.no_grad(), autocast(cfg):
        steps, m = rollout(model, tok, cfg.env, dcfg, sft_task_ids(cfg)[:cfg.sft.dagger_tasks], seed=cfg.train.seed,
                           batch_size=cfg.eval.batch_episodes, relabel="expert")
    model.train(was)
    episodes: dict = {}
    for s in steps:
        episodes.setdefault(s.episode_id, []).append(s)
    out, off, seen = [], 0, set()
    for ep in episodes.values():
        wrong = [_canonical(s.action) != _canonical(s.relabel.action) for s in ep]
        if not any(wrong):
            continue
        off += 1
        for i in range(wrong.index(True), len(ep)):
            fix = ep[i].relabel
            key = (ep[i].episode_id, ep[i].anchor, ep[i - 1].action if i else None, ep[i].action)
            if key in seen:  # the same invalid action again: the page, the history and the answer are as before
                continue
            seen.add(key)
            fix.prompt_loss = not any(wrong[max(0, i - cfg.env.history):i])
            out.append(fix)
    return out, {"policy_success": m["success"], "policy_valid": m["valid_ratio"], "episodes": m["num_episodes"],
                 "episodes_off": off, "corrections": len(out)}


def dagger_file(cfg, step: int) -> str:
    return os.path.join(cfg.train.out_dir, "dagger", f"step_{step:08d}.json")


def dagger_round(cfg, model, tok, info, log, step: int, resumed: bool) -> list:
    """The corrections of the DAgger round at `step`: computed (and kept in out_dir/dagger/ for a resumed
    run), or read back when the run resumes past it (the model that made them is gone by then)."""
    path = dagger_file(cfg, step)
    if resumed:
        recs = read_json(path, f"the DAgger round of SFT step {step} (sft.dagger_at)")
        return [StepSample(prompt_ids=r["prompt_ids"], response_ids=r["response_ids"], trace=None, confidence=None,
                           action=r["action"], valid=True, reward=0.0, group_id=-1, episode_id=-1, step=-1,
                           prompt_loss=r["prompt_loss"]) for r in recs]
    out, m = dagger_samples(cfg, model, tok, step)
    if info.is_main:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json(path, [{"prompt_ids": s.prompt_ids, "response_ids": s.response_ids, "action": s.action,
                           "prompt_loss": s.prompt_loss} for s in out])
    log.log({"stage": "sft/dagger", "step": step, **m})
    dist.print0(f"sft step {step}: DAgger round, the model won {m['policy_success']:.3f} of {m['episodes']} SFT "
                f"tasks, {m['episodes_off']} episodes left the expert's path: {m['corrections']} corrections join")
    return out


def sft_stage(cfg, model, tok, info, log, start, ckpt_extra):
    data, m = expert_samples(cfg, tok)
    dist.print0(f"sft: {len(data)} expert step samples from {m['num_episodes']} episodes "
                f"(expert success {m['success']:.3f}" +
                (f", {m['detours_per_episode']:.2f} detours per episode)" if cfg.sft.detours else ")"))
    val = sft_val_set(cfg, tok)
    opt, sch = make_optimizer(cfg, model, cfg.sft.lr, cfg.sft.steps, cfg.sft.warmup, cfg.sft.min_lr_ratio)
    step = resume_into(cfg, model, opt, sch, start)

    def plan(data: list, first: int) -> list:  # the batches of steps first.. (a DAgger round grows the data)
        return length_batches([len(s.prompt_ids) + len(s.response_ids) for s in data], cfg.sft.batch_size,
                              cfg.sft.steps - first, cfg.train.seed + first)

    first = 0
    for t in cfg.sft.dagger_at:
        if t < step:
            data = data + dagger_round(cfg, model, tok, info, log, t, resumed=True)
            first = t
    batches = plan(data, first)
    bar = progress(cfg.sft.steps, step, "sft", info)
    while step < cfg.sft.steps:
        t0 = time.time()
        if step in cfg.sft.dagger_at:
            data = data + dagger_round(cfg, model, tok, info, log, step, resumed=False)
            first, batches = step, plan(data, step)
        batch = [data[i] for i in batches[step - first]]
        gen = torch.Generator().manual_seed(cfg.train.seed * 100003 + step)
        with autocast(cfg):
            loss, stats = sft_loss(model, batch, gen, info, cfg.sft.loss_norm, cfg.sft.mask_copies,
                                   ar=step < cfg.sft.ar_warmup, block_size=sft_block_size(cfg, step),
                                   ar_prompt=cfg.sft.ar_prompt_loss, weight=cfg.sft.loss_weight,
                                   suffix=cfg.sft.suffix_masks)
        finite_or_raise(loss, f"sft step {step}")
        loss.backward()
        gnorm = dist.clip_grad_norm([p for p in model.parameters() if p.requires_grad], cfg.train.grad_clip)
        finite_metrics_or_raise({"grad_norm": gnorm}, f"sft step {step}")  # before the weights take it
        opt.step()
        sch.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        rec = {"stage": "sft", "step": step, "loss": float(dist.all_reduce_sum(loss.detach()).item()),
               "grad_norm": gnorm, "lr": sch.get_last_lr()[0], "time": time.time() - t0}
        if val and (step % cfg.sft.val_every == 0 or step == cfg.sft.steps):
            rec.update(sft_validate(cfg, model, tok, val))
            if info.is_main:
                bar.write(f"sft step {step}: held-out action accuracy {rec['val_acc']:.3f} (" + ", ".join(
                    f"{k[8:]} {v:.2f}" for k, v in rec.items() if k.startswith("val_acc/")) + ")")
        log.log(rec)
        bar.set_postfix(loss=f"{rec['loss']:.3f}")
        bar.update(1)
        maybe_save(cfg, model, opt, sch, "sft", step, cfg.sft.steps)
        crash_point("sft", step)
    bar.close()


def policy_rollout(cfg, model, tok, dcfg, ids, n_tasks, group_size, key, step, relabel=None):
    """Rollouts of the current policy on n_tasks train tasks; the task draw depends only on
    (key, step), so a resumed run draws the same tasks. relabel: see rollout()."""
    rng = random.Random(cfg.train.seed * key + step)
    tasks = [ids[rng.randrange(len(ids))] for _ in range(n_tasks)]
    was = model.training
    model.eval()
    with torch.no_grad(), autocast(cfg):
        out = rollout(model, tok, cfg.env, dcfg, tasks, group_size=group_size,
                      seed=cfg.train.seed * 1000 + step, batch_size=cfg.eval.batch_episodes, relabel=relabel)
    model.train(was)
    return out


def rl_stage(cfg, model, tok, info, log, start, ckpt_extra):
    ids = policy_task_ids(cfg, cfg.rl.goals, "rl.goals")
    opt, sch = make_optimizer(cfg, model, cfg.rl.lr, cfg.rl.steps, 0, 1.0)
    # explicit-KL baseline: the reference is the policy frozen as RL began
    ref = frozen_copy(cfg, model, tok, info, "rl", start) if cfg.rl.kl != "none" else None
    step = resume_into(cfg, model, opt, sch, start)
    bar = progress(cfg.rl.steps, step, "rl", info)
    dcfg = rl_decode(cfg)
    while step < cfg.rl.steps:
        samples, rm = policy_rollout(cfg, model, tok, dcfg, ids, cfg.rl.tasks_per_step, cfg.rl.group_size,
                                     7919, step)
        samples = samples[: len(samples) - len(samples) % info.world]  # every rank trains an equal slice
        if not samples:
            first = first_failure(rm)
            why = f"{rm['failed_episodes']} failed episodes" + (f"; first: {first}" if first else "")
            raise FloatingPointError(f"rl step {step}: the rollout produced no usable step samples ({why})")
        with autocast(cfg):
            metrics = rl_step(model, opt, samples, cfg.rl, ref_model=ref, rollout_metrics=rm, rank=info.rank,
                              world=info.world, grad_clip=cfg.train.grad_clip, clip_fn=dist.clip_grad_norm,
                              step=step)
        # rl_step knows no process group: its loss is this rank's share of the global-normalised sum
        metrics["loss"] = dist.all_reduce_sum(float(metrics["loss"]))
        finite_metrics_or_raise(metrics, f"rl step {step}")
        sch.step()
        step += 1
        rec = {"stage": "rl", "step": step, **{f"rollout/{k}": v for k, v in rm.items() if k != "episodes"},
               **metrics}
        log.log(rec)
        bar.set_postfix(succ=f"{rm['success']:.2f}", valid=f"{rm['valid_ratio']:.2f}")
        bar.update(1)
        dump(cfg, info, tok, samples, "rl", step)
        maybe_save(cfg, model, opt, sch, "rl", step, cfg.rl.steps)
        crash_point("rl", step)
    bar.close()


def rl_decode(cfg):
    """The RL rollouts' decoding: sampled at rl.temperature, at rl.threshold (decode.threshold if unset)."""
    tau = cfg.decode.threshold if cfg.rl.threshold is None else cfg.rl.threshold
    return _decode(cfg, temperature=cfg.rl.temperature, threshold=tau)


def distill_stage(cfg, model, tok, info, log, start, ckpt_extra):
    ids = policy_task_ids(cfg, cfg.distill.goals, "distill.goals")
    opt, sch = make_optimizer(cfg, model, cfg.distill.lr, cfg.distill.steps, 0, 1.0)
    need = cfg.distill.teacher_weight > 0 or cfg.distill.teacher_gate > 0 or cfg.distill.rollouts != "policy"
    teacher = frozen_copy(cfg, model, tok, info, "distill", start) if need else None
    actor = teacher if cfg.distill.rollouts == "teacher" else model  # whose decodes are the targets
    relabel = teacher if cfg.distill.rollouts == "relabel" else None  # answers the actor's prompts too
    step = resume_into(cfg, model, opt, sch, start)
    bar = progress(cfg.distill.steps, step, "distill", info)
    dcfg = _decode(cfg, threshold=cfg.distill.threshold, temperature=0.0)
    samples, expert = [], []
    if cfg.distill.expert_batch:  # replay: the SFT demonstrations, trained with the SFT loss beside distillation
        expert, _ = expert_samples(cfg, tok)
    while step < cfg.distill.steps:
        t0 = time.time()
        fresh = not samples or step % cfg.distill.rollouts_every == 0
        if fresh:
            samples, rm = policy_rollout(cfg, actor, tok, dcfg, ids, cfg.distill.tasks_per_step,
                                         cfg.distill.group_size, 104729, step, relabel=relabel)
        t1 = time.time()
        mine = samples[info.rank::info.world]
        if info.world > 1 and dist.all_reduce_sum(float(not select_samples(mine, cfg.distill))) > 0:
            mine = []  # a rank without usable samples would skip the collectives the others enter: all skip
        with autocast(cfg):
            metrics = distill_step(model, opt, mine, cfg.distill, progress=step / max(cfg.distill.steps - 1, 1),
                                   gen=torch.Generator().manual_seed(cfg.train.seed * 31 + step + info.rank),
                                   grad_clip=cfg.train.grad_clip, clip_fn=dist.clip_grad_norm, world=info.world,
                                   regularizer=expert_replay(cfg, model, expert, info, step) if expert else None,
                                   teacher=teacher)
        finite_metrics_or_raise(metrics, f"distill step {step}")
        sch.step()
        step += 1
        rec = {"stage": "distill", "step": step, "time": time.time() - t0, "time/update": time.time() - t1,
               **({f"rollout/{k}": v for k, v in rm.items() if k != "episodes"} if fresh else {}),  # as RL logs them
               **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}
        log.log(rec)
        bar.set_postfix(succ=f"{rm['success']:.2f}", tpf=f"{rm['tpf_denoise']:.2f}")
        bar.update(1)
        dump(cfg, info, tok, samples, "distill", step)
        maybe_save(cfg, model, opt, sch, "distill", step, cfg.distill.steps)
        crash_point("distill", step)
    bar.close()


def expert_replay(cfg, model, expert: list, info, step: int):
    """distill.expert_batch expert samples (the same draw on every rank, resumable by step) -> a
    closure computing this rank's share of expert_weight x the SFT loss as the SFT stage ended (its last
    block_schedule phase); with distill.expert_score "action" on the action only, given the think text."""
    from dataclasses import replace
    rng = random.Random(cfg.train.seed * 7919 + step)
    batch = [expert[rng.randrange(len(expert))] for _ in range(cfg.distill.expert_batch)]
    moved = credited(batch, cfg.distill.expert_score)  # "action": the think text moves to the prompt
    batch = [replace(s, prompt_ids=list(s.prompt_ids) + list(s.response_ids[:c]), response_ids=s.response_ids[c:],
                     think_len=0) if c else s for s, c in zip(batch, moved)]
    gen = torch.Generator().manual_seed(cfg.train.seed * 100019 + step)

    def loss():
        value, _ = sft_loss(model, batch, gen, info, cfg.sft.loss_norm, cfg.sft.mask_copies,
                            block_size=sft_block_size(cfg, cfg.sft.steps - 1), weight=cfg.sft.loss_weight,
                            suffix=cfg.sft.suffix_masks)
        return cfg.distill.expert_weight * value
    return loss


STAGES = {"sft": sft_stage, "rl": rl_stage, "distill": distill_stage}


# ----------------------------------------------------------------------------- helpers
def _decode(cfg, **kw):
    from dataclasses import replace
    return replace(cfg.decode, **kw)


def progress(total, start, desc, info):
    from tqdm import tqdm
    return tqdm(total=total, initial=start, desc=desc, disable=not info.is_main, dynamic_ncols=True)


def dump(cfg, info, tok, samples, stage, step):
    if info.is_main and cfg.train.dump_every and step % cfg.train.dump_every == 0:
        d = os.path.join(cfg.train.out_dir, "rollouts")
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, f"{stage}_{step:06d}.txt"), "w") as f:
            f.write(format_samples(samples, tok, limit=8))


_STATE = {"stage_index": 0}


def git_commit() -> str:
    """Short commit of the code that runs, '+' when the tree has uncommitted changes; 'unknown' outside git."""
    import subprocess
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=here)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, cwd=here)
    except OSError:
        return "unknown"
    commit = head.stdout.strip()
    return (commit + ("+" if dirty.stdout.strip() else "")) if head.returncode == 0 and commit else "unknown"


def start_run_record(cfg, info, resume: bool, command: str, t0: Optional[float] = None) -> dict:
    """<out_dir>/run.json: the command of every piece of the run (the start, then each resume), the
    commits they ran (one more each time a resume ran other code) and the wall-clock summed over the
    pieces, so a resumed run's table reports the whole run."""
    path = os.path.join(cfg.train.out_dir, "run.json")
    rec = {"commands": [], "commits": [], "wall_s": 0.0}
    if resume and os.path.exists(path):
        rec = {**rec, **read_json(path, "the run record")}
    rec["commands"].append(command)
    commit = git_commit()
    if not rec["commits"] or rec["commits"][-1] != commit:
        rec["commits"].append(commit)
    _STATE.update(run_record=rec, run_path=path, wall0=float(rec["wall_s"]), t0=time.time() if t0 is None else t0)
    update_run_record(info.is_main)
    return rec


def update_run_record(is_main: bool) -> dict:
    """Add this piece's time so far to the record and write it (rank 0); called at every checkpoint."""
    rec = _STATE.get("run_record")
    if rec is None:
        return {"commands": [], "commits": [git_commit()], "wall_s": 0.0}
    rec["wall_s"] = _STATE["wall0"] + time.time() - _STATE["t0"]
    if is_main:
        tmp = _STATE["run_path"] + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rec, f, indent=2)
        os.replace(tmp, _STATE["run_path"])
    return rec


def maybe_save(cfg, model, opt, sch, stage, step, total):
    """A checkpoint every train.save_every steps, at the stage's end and when a stop was asked for (request_stop);
    then the stop is carried out (Stopped). Every rank calls this after every step, so all stop at the same one."""
    signal_point(stage, step)
    stop = stop_requested()
    if stop or step % cfg.train.save_every == 0 or step == total:
        bad = sum(int(not torch.isfinite(getattr(p, "to_local", lambda: p)()).all()) for p in model.parameters())
        if dist.all_reduce_sum(float(bad)) > 0:  # never a checkpoint that a resume could not train on
            raise FloatingPointError(f"{stage} step {step}: {bad} weight tensors are not finite; not saved, the last "
                                     f"checkpoint is kept (lower the learning rate, or resume from it)")
        dist.save(os.path.join(cfg.train.out_dir, "ckpt"), _STATE["global"] + step, model, opt, sch,
                  extra={"stage": stage, "stage_index": _STATE["stage_index"], "stage_step": step,
                         "done": step == total}, keep=cfg.train.keep_checkpoints)
        update_run_record(dist.is_main())
    if stop:
        raise Stopped(f"{stage} step {step}")


# ----------------------------------------------------------------------------- stopping
class Stopped(Exception):
    """A stop asked for by a signal, carried out at a step boundary after its checkpoint was written."""


def request_stop(signum, frame):
    """Signal handler (the main process's SIGINT and SIGTERM): the first signal asks the run to stop after the
    step in progress, which is then checkpointed (maybe_save); a second Ctrl-C stops at once, losing the steps
    since the last checkpoint. SIGTERM, a batch scheduler's notice before its kill, only ever asks. torchrun
    forwards the signal it gets to its workers (each in its own session, so a terminal's Ctrl-C reaches them once)
    and kills them 30 s later."""
    name = signal.Signals(signum).name
    if _STATE.get("stop") and signum == signal.SIGINT:
        raise KeyboardInterrupt
    if not _STATE.get("stop"):
        print(f"\n{name}: stopping when the step (or evaluation) in progress ends, with a checkpoint of it; "
              "Ctrl-C again stops now", file=sys.stderr, flush=True)
    _STATE["stop"] = name


def stop_requested() -> bool:
    """Whether any rank was asked to stop (a collective: every rank calls it at the same point)."""
    return dist.all_reduce_sum(float(bool(_STATE.get("stop")))) > 0


def signal_point(stage: str, step: int):
    """Fault injection for the stop test: D3MINI_SIGNAL_AT=<stage>:<step> sends this process a SIGINT right
    after that step's update, as a Ctrl-C would during the step."""
    if os.environ.get("D3MINI_SIGNAL_AT") == f"{stage}:{step}":
        os.kill(os.getpid(), signal.SIGINT)


def crash_point(stage: str, step: int):
    """Fault injection for the kill-and-resume test: D3MINI_CRASH_AT=<stage>:<step> ends the process
    abruptly (no cleanup, like kill -9) right after that step."""
    if os.environ.get("D3MINI_CRASH_AT") == f"{stage}:{step}":
        os._exit(75)


def frozen_copy(cfg, model, tok, info, stage: str, start):
    """The model frozen as `stage` began (RL's KL reference, distillation's teacher). Written once to
    out_dir/frozen/<stage> when the stage starts and read back into a second model built like the first
    (FSDP modules cannot be deep-copied), also when the stage resumes, so a resumed run keeps the same one.
    Call it before resume_into: loading restores the RNG state too (here: the one the save recorded, so
    build_model's seeding leaves no trace)."""
    path = os.path.join(cfg.train.out_dir, "frozen", stage)
    if start is None:
        dist.save(path, 0, model, keep=1)
    elif not os.path.isdir(path):
        raise dist.CheckpointError(f"resuming {stage} needs the model frozen as the stage began, written to {path} "
                                   f"when it started; it is missing (a run from an older version?). Start the "
                                   f"stage over from its first step's checkpoint, or set the option that needs it "
                                   f"to its off value")
    ref = build_model(cfg, tok, info)
    dist.load(path, ref)
    return ref.eval().requires_grad_(False)


def resume_into(cfg, model, opt, sch, start) -> int:
    """Restore model/optimizer/scheduler/RNG when resuming inside this stage; returns the stage step."""
    if start is None:
        return 0
    extra = dist.load(start, model, opt, sch)
    return int(extra["stage_step"])


def read_json(path: str, what: str):
    """A JSON file the run wrote, or a ConfigError naming it (a damaged file stops a resume, it is not rewritten)."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} ({what}) is unreadable: {e}; restore it or move it away") from None


def write_json(path: str, data) -> None:
    tmp = path + ".tmp"  # atomic: a crash mid-write leaves the previous file
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, default=str)
    os.replace(tmp, path)


def check_out_dir(cfg, resume: bool):
    """A fresh run never writes into another run's folder (checkpoints, metrics and results would mix)."""
    out = cfg.train.out_dir
    if os.path.exists(out) and not os.path.isdir(out):
        raise ConfigError(f"train.out_dir = {out!r} is a file, not a folder")
    held = [n for n in ("ckpt", "metrics.jsonl", "results.json") if os.path.exists(os.path.join(out, n))]
    if held and not resume:
        raise ConfigError(f"train.out_dir = {out!r} holds a run ({', '.join(held)}): continue it with --resume, "
                          f"or pass another train.out_dir")


def peek_checkpoint(cfg):
    """(folder, extra) of the latest intact checkpoint, or (None, None) when the run has none yet."""
    root = os.path.join(cfg.train.out_dir, "ckpt")
    ck = dist.latest_checkpoint(root) if os.path.isdir(root) else None
    if ck is None:
        steps = [d for d in os.listdir(root) if d.startswith("step_")] if os.path.isdir(root) else []
        if steps:  # starting over would overwrite the run's metrics, export and results
            raise dist.CheckpointError(f"{root}: none of the {len(steps)} checkpoints is intact (see the warnings); "
                                       f"nothing to resume from, and nothing was overwritten")
        return None, None
    with open(os.path.join(ck, "state.json")) as f:
        return ck, json.load(f)["extra"]


def run_eval(cfg, model, tok, stage, info, log):
    """Greedy held-out rollouts at every threshold of eval.thresholds and eval.sweep."""
    ids = env_module(cfg.env.name).task_ids(cfg.env, cfg.eval.split)[: cfg.eval.num_tasks]
    rows = []
    model.eval()
    for tau in sorted(set(cfg.eval.thresholds) | set(cfg.eval.sweep), reverse=True):
        with torch.no_grad(), autocast(cfg):
            _, m = rollout(model, tok, cfg.env, _decode(cfg, threshold=float(tau), temperature=0.0), ids,
                           seed=cfg.train.seed, batch_size=cfg.eval.batch_episodes)
        check_some_scored(m, f"eval after {stage} at tau {tau}")  # the stage's checkpoint is on disk: resume
        row = {"threshold": float(tau), **{k: v for k, v in m.items() if k != "episodes"}}
        row["wins"] = task_outcomes(ids, m["episodes"])  # per task, for the paired stage-to-stage change
        row["invalid"] = task_invalid(ids, m["episodes"])  # invalid actions per task, paired the same way
        rows.append(row)
        log.log({"stage": f"eval/{stage}", **{k: v for k, v in row.items() if k not in ("wins", "invalid")}})
        dist.print0(f"eval {stage} tau={tau}: success {m['success']:.3f} score {m['score']:.3f} "
                    f"valid {m['valid_ratio']:.3f} tpf {m['tpf_denoise']:.2f}")
    model.train()
    return rows


def results_table(results: dict, cfg, wall: float, command: str, commits=None, pieces: int = 1) -> str:
    """stage x (success +- s.e., score, valid ratio, invalid actions per episode, TPF at 0.95 and 1.0, AUP)
    as markdown; success and invalid actions with their paired change from the stage above. `command`
    started the run; `commits`: the code of its pieces (run.json), default the current one; `pieces`:
    how many starts and resumes the wall-clock sums."""
    import platform
    commits = list(commits or [git_commit()])
    code = f"commit {commits[0]}" if len(commits) == 1 else f"commits {' → '.join(commits)} (resumed across commits)"
    rows = ["| stage | success % (± s.e.) | Δ vs previous (paired s.e.) | score | valid | invalid / episode (Δ) "
            "| TPF @0.95 | TPF @1.0 | AUP |", "|---|---|---|---|---|---|---|---|---|"]
    prev = None
    all_acc = [100 * r["success"] for rs in results.values() for r in rs]
    y_max = cfg.eval.y_max if cfg.eval.y_max is not None else max(all_acc, default=0.0)
    for stage, rs in results.items():
        by = {float(r["threshold"]): r for r in rs}
        ref = by.get(0.95) or by.get(1.0) or rs[0]
        n = int(ref["num_episodes"]) - int(ref.get("failed_episodes", 0))
        ci = success_ci(round(ref["success"] * n), n) if n > 0 else {"p": 0.0, "se": 0.0}
        p, se = ci["p"], 100 * ci["se"]
        pts = [(r["tpf_denoise"], 100 * r["success"]) for r in rs]
        try:
            a = f"{aup(pts, alpha=cfg.eval.alpha, y_max=y_max):.2f}"
        except AUPError:  # a curve whose fastest point lost > 5 points is rejected (metrics.md §2)
            a = "rejected"
        tpf = lambda t: f"{by[t]['tpf_denoise']:.2f}" if t in by else "-"
        delta = "-"
        before = (prev or {}).get(float(ref["threshold"]), {}).get("wins")  # the stage above, same threshold
        if before and ref.get("wins") and len(before) == len(ref["wins"]):
            try:
                d = paired_difference(before, ref["wins"])
                delta = f"{100 * d['diff']:+.1f} ± {100 * d['se']:.1f}"
            except ValueError:  # no task with an outcome in both stages
                pass
        # invalid actions per episode: a shorter episode lowers the valid ratio with fewer invalid actions
        bad = ref.get("invalid_per_episode")
        if bad is None and "steps" in ref:  # results written before the count: (1 - ratio) x steps is the same
            bad = (1.0 - ref["valid_ratio"]) * ref["steps"]
        bad = "-" if bad is None else f"{bad:.2f}"
        before = (prev or {}).get(float(ref["threshold"]), {}).get("invalid")
        if before and ref.get("invalid") and len(before) == len(ref["invalid"]):
            try:
                d = paired_mean_difference(before, ref["invalid"])
                bad += f" ({d['diff']:+.2f} ± {d['se']:.2f})"
            except ValueError:
                pass
        prev = by
        at = "" if float(ref["threshold"]) == 0.95 else f" (τ {float(ref['threshold'])})"  # no 0.95 row
        rows.append(f"| {stage} | {100 * p:.1f} ± {se:.1f}{at} | {delta} | {ref['score']:.3f} | "
                    f"{ref['valid_ratio']:.3f} | {bad} | {tpf(0.95)} | {tpf(1.0)} | {a} |")
    head = (f"machine: {platform.node()} ({platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cpus, torch {torch.__version__}), {code}, wall-clock {wall / 60:.1f} min"
            f"{f' over {pieces} pieces (resumed)' if pieces > 1 else ''}\n"
            f"command: `{command}`\nsuccess at tau 0.95 (else the τ named) over {cfg.eval.num_tasks} held-out tasks; "
            f"AUP over thresholds {sorted(set(cfg.eval.sweep) | set(cfg.eval.thresholds))} "
            f"(alpha {cfg.eval.alpha}, y_max {y_max:.1f}; rejected: the fastest point lost > 5 points); "
            f"Δ: change from the stage above on the same tasks, ± paired s.e.\n\n")
    return head + "\n".join(rows) + "\n"


def write_results(cfg, results: dict, info, rec: dict):
    """results.md (the table), results.json and, with matplotlib (the `plot` extra), results.png: accuracy
    against TPF over the evaluated thresholds, one line per stage; rec: the run record (commands, commits,
    wall-clock), also stored in the PNG's metadata."""
    if not info.is_main:
        return
    md = results_table(results, cfg, wall=rec["wall_s"], command=rec["commands"][0], commits=rec["commits"],
                       pieces=len(rec["commands"]))
    with open(os.path.join(cfg.train.out_dir, "results.md"), "w") as f:
        f.write(md)
    write_json(os.path.join(cfg.train.out_dir, "results.json"), results)
    curves = {stage: [(r["tpf_denoise"], 100 * r["success"]) for r in rs]
              for stage, rs in results.items()}
    png = plot_acc_vs_tpf(curves, os.path.join(cfg.train.out_dir, "results.png"), metadata=rec,
                          title=f"{cfg.env.name}: accuracy vs TPF per stage")
    print(md + (f"plot: {png}\n" if png else ""))


def main(argv=None):
    t_start = time.time()
    argv = sys.argv[1:] if argv is None else argv
    cfg, cfg_path, resume = parse_args(argv)
    info = dist.setup(cfg.train.threads)
    check_startup(cfg, info)
    check_out_dir(cfg, resume)
    dist.barrier()  # every rank has checked the folder before rank 0 writes into it
    try:
        os.makedirs(cfg.train.out_dir, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"train.out_dir = {cfg.train.out_dir!r}: cannot create it ({e})") from None
    results_path = os.path.join(cfg.train.out_dir, "results.json")
    results = read_json(results_path, "evaluations so far") if resume and os.path.exists(results_path) else {}
    seed_all(cfg.train.seed)
    tok = build_tokenizer(cfg, info, resume)
    model = build_model(cfg, tok, info)
    ck, extra = peek_checkpoint(cfg) if resume else (None, None)
    cur, done = -1, False
    if ck is not None:  # resume: weights as of the latest intact checkpoint, before config.yaml is rewritten
        dist.load(ck, model)
        cur, done = int(extra["stage_index"]), bool(extra.get("done"))
        dist.print0(f"resuming from {ck} (stage {extra['stage']}, step {extra['stage_step']})")
        budget = getattr(cfg, extra["stage"]).steps
        if done and int(extra["stage_step"]) < budget:  # a larger budget for the finished stage: go on
            done = False  # its schedule is rebuilt for the new step count; its evaluation and later ones are stale
            for stage in cfg.train.stages[cur:]:
                results.pop(stage, None)
            dist.print0(f"extending stage {extra['stage']} from {extra['stage_step']} to {budget} steps")
    start_run_record(cfg, info, resume, "python train.py " + " ".join(argv), t0=t_start)  # a piece that ran
    if info.is_main:
        save_config(cfg, os.path.join(cfg.train.out_dir, "config.yaml"))
        print(f"model: {cfg.model.family} {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, "
              f"world {info.world}, device {info.device}")
    log = Logger(cfg, info)
    for si, stage in enumerate(cfg.train.stages):
        _STATE["stage_index"], _STATE["global"] = si, 100000 * si  # checkpoint folders sort by stage, step
        if si > cur or (si == cur and not done):
            STAGES[stage](cfg, model, tok, info, log, ck if si == cur else None, extra)
        if stage not in results:
            results[stage] = run_eval(cfg, model, tok, stage, info, log)
            if info.is_main:
                write_json(results_path, results)
            update_run_record(info.is_main)
        if stop_requested():  # asked during the evaluation: the stage's last checkpoint is already written
            raise Stopped(f"the end of stage {stage}")
    dist.export_hf(model, tok, os.path.join(cfg.train.out_dir, "export"), layout="native")
    write_results(cfg, results, info, update_run_record(info.is_main))
    dist.teardown()


if __name__ == "__main__":
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGTERM, request_stop)
    try:
        main()
    except (ConfigError, FloatingPointError, dist.CheckpointError, EnvError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except Stopped as e:
        print(f"stopped at {e} ({_STATE['stop']}), checkpoint written: the run goes on from there with the same "
              "command and --resume", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("\ninterrupted: the run goes on from its last checkpoint with the same command and --resume",
              file=sys.stderr)
        sys.exit(130)
