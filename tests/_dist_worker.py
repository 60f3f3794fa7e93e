"""Training scenarios shared by tests/test_dist.py: run in-process (one process) or as

    python -m torch.distributed.run --nproc_per_node 2 tests/_dist_worker.py parity OUT
    python tests/_dist_worker.py loop OUT --steps 6 --stop-at 3      (killed after saving step 3)

Every scenario draws its global batch and masks from seeded RNGs identically on all ranks and
trains on its rank's slice of rows, so 1 and N processes must agree.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from d3mini import dist  # noqa: E402
from d3mini.config import LoRAConfig, ModelConfig, TrainConfig  # noqa: E402
from d3mini.lora import apply_lora  # noqa: E402
from d3mini.model import DiffusionLM  # noqa: E402

B, L = 4, 8  # global batch rows, row length


def tiny_cfg(family="sdar", tie=False):
    return ModelConfig(family=family, vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                       num_heads=2, num_kv_heads=1 if family != "llada" else 2, head_dim=16, block_size=4,
                       qk_norm=family != "llada", tie_embeddings=tie, mask_id=3, eos_ids=[2, 0], pad_id=0)


def seed_all(seed):
    torch.manual_seed(seed), random.seed(seed), np.random.seed(seed)


def build(seed=0, lora=0, tie=False):
    seed_all(seed)
    m = DiffusionLM.from_config(tiny_cfg(tie=tie))
    if lora:
        apply_lora(m, LoRAConfig(rank=lora, alpha=8.0))
    return m


def global_batch(step: int):
    """Clean ids [B, L] and a masked-position bool [B, L] (at least one per row)."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(4, 64, (B, L), generator=g)
    t = torch.rand(B, 1, generator=g).clamp_min(0.2)  # per-row mask ratio, as in masked diffusion
    masked = torch.rand(B, L, generator=g) < t
    masked[:, 0] = True
    return ids, masked


def masked_ce(model, ids, masked, n=None, mask_id=3):
    """sum of CE over masked positions / n, the GLOBAL masked count of the step (all ranks, all
    micro-batches): the losses' normalisation."""
    noisy = torch.where(masked, torch.full_like(ids, mask_id), ids)
    logits = model(noisy)  # [b, L, V]
    n = dist.global_count(masked.sum()) if n is None else n
    return F.cross_entropy(logits[masked].float(), ids[masked], reduction="sum") / n


def rows(info):
    per = B // info.world
    return slice(info.rank * per, (info.rank + 1) * per)


def make_opt(model):
    """AdamW (eps 1e-6 so that near-zero gradients do not blow summation-order rounding up to
    full-size updates) with a 3-step linear warmup."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, eps=1e-6,
                            weight_decay=0.1)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 3))


def train(model, info, steps=2, loss_fn=None, opt=None, sched=None, start=0, ckpt=None, stop_at=None,
          metrics=None):
    """AdamW + warmup schedule + grad clip, two micro-batches accumulated per step; the masks of
    step s also depend on the global RNG state (torch, python, numpy), so a resume that loses any
    RNG state is caught."""
    loss_fn = loss_fn or masked_ce
    params = [p for p in model.parameters() if p.requires_grad]
    if opt is None:
        opt, sched = make_opt(model)
    metrics = [] if metrics is None else metrics
    for step in range(start, steps):
        ids, masked = global_batch(step)
        extra_mask = torch.rand(B, L) < 0.1 * random.random() + float(np.random.rand()) * 0.1  # RNG-dependent
        masked = masked | extra_mask
        ids, masked = ids[rows(info)], masked[rows(info)]
        n = dist.global_count(masked.sum())
        loss = 0.0
        for mb in (slice(0, len(ids) // 2), slice(len(ids) // 2, len(ids))):  # gradient accumulation
            part = loss_fn(model, ids[mb], masked[mb], n)
            part.backward()
            loss = loss + part.detach()
        gn = dist.clip_grad_norm(params, 0.5)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        metrics.append({"step": step + 1, "loss": dist.all_reduce_sum(loss).item(), "grad_norm": gn,
                        "lr": sched.get_last_lr()[0]})
        if ckpt is not None:
            dist.save(ckpt, step + 1, model, opt, sched, {"metrics": metrics, "cursor": step + 1}, keep=3)
        if stop_at is not None and step + 1 == stop_at:
            os.kill(os.getpid(), signal.SIGKILL)  # a hard crash: nothing after the last save survives
    return opt, sched, metrics


def full_params(model):
    return {k: v.clone() for k, v in dist.full_state_dict(model).items()}


def grads_after_one_step(model, info, loss_fn=None):
    """Full gradients of one backward on step 0's batch (gathered on rank 0)."""
    ids, masked = global_batch(0)
    (loss_fn or masked_ce)(model, ids[rows(info)], masked[rows(info)]).backward()
    out = {}
    for n, p in model.named_parameters():
        if p.grad is not None:
            g = p.grad.full_tensor() if isinstance(p.grad, torch.distributed.tensor.DTensor) else p.grad
            out[n] = g.detach().clone()
    model.zero_grad(set_to_none=True)
    return out


def scenarios(info, out=None, loss_fn=None):
    """All parity scenarios -> {name: (metrics, tensors)}. `out` receives the FSDP export."""
    res = {}
    for name, kw, tcfg in [("fsdp", {}, TrainConfig()), ("fsdp_ac", {}, TrainConfig(activation_checkpointing=True)),
                           ("replicate", {}, TrainConfig(fsdp=False)), ("lora", {"lora": 4}, TrainConfig()),
                           ("tied", {"tie": True}, TrainConfig())]:
        model = dist.shard(build(**kw), tcfg, info)
        grads = grads_after_one_step(model, info, loss_fn)
        _, _, metrics = train(model, info, steps=3, loss_fn=loss_fn)
        tensors = {f"grad/{k}": v for k, v in grads.items()}
        tensors.update({f"param/{k}": v for k, v in full_params(model).items()})
        res[name] = (metrics, tensors)
        if name == "lora" and out is not None:
            dist.export_hf(model, None, os.path.join(out, "export_lora"), layout="hf")
    return res


def resume_scenario(info, ckpt, loss_fn=None):
    """Uninterrupted 5 steps vs 2 steps + fresh objects + scrambled RNG + load + 3 steps."""
    tcfg = TrainConfig()
    ref = dist.shard(build(7), tcfg, info)
    _, _, ref_metrics = train(ref, info, steps=5, loss_fn=loss_fn)
    ref_params = full_params(ref)
    first = dist.shard(build(7), tcfg, info)
    train(first, info, steps=2, loss_fn=loss_fn, ckpt=ckpt)
    model = dist.shard(build(99), tcfg, info)  # the restart must not depend on this seed
    opt, sched = make_opt(model)
    extra = dist.load(ckpt, model, opt, sched)
    _, _, metrics = train(model, info, steps=5, loss_fn=loss_fn, opt=opt, sched=sched, start=extra["step"],
                          metrics=extra["metrics"])
    return ref_metrics, ref_params, metrics, full_params(model)


def helper_results(info):
    """The process-group helpers on known per-rank inputs."""
    def gather(x):  # per-rank python number -> list over ranks
        onehot = torch.zeros(info.world)
        onehot[info.rank] = x
        return [int(v) for v in dist.all_reduce_sum(onehot).tolist()]

    return {"world": info.world, "ranks": gather(info.rank), "mean_rank": dist.all_reduce_mean(float(info.rank)),
            "sum_int": dist.global_count(info.rank + 1), "dict_mean": dist.all_reduce_mean({"a": 1 + info.rank, "b": -1}),
            "tensor_sum": dist.all_reduce_sum(torch.tensor([0.5, 1.5])).tolist(),
            "threads": gather(torch.get_num_threads()), "cores": len(os.sched_getaffinity(0))}


def main():
    from safetensors.torch import save_file
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["parity", "loop"])
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--stop-at", type=int, default=None)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    info = dist.setup(threads=args.threads)
    if args.mode == "parity":
        if info.is_main:
            os.makedirs(args.out, exist_ok=True)
        helpers = helper_results(info)
        if info.is_main:
            with open(os.path.join(args.out, "helpers.json"), "w") as f:
                json.dump(helpers, f)
        res = scenarios(info, args.out)
        ref_m, ref_p, res_m, res_p = resume_scenario(info, os.path.join(args.out, "ckpt"))
        res["resume_ref"], res["resume"] = (ref_m, ref_p), (res_m, res_p)
    else:  # loop: train with a checkpoint every step; resume from the latest if there is one
        ckpt = os.path.join(args.out, "ckpt")
        model = dist.shard(build(7), TrainConfig(), info)
        opt, sched = make_opt(model)
        start, metrics = 0, []
        if dist.latest_checkpoint(ckpt) is not None:
            extra = dist.load(ckpt, model, opt, sched)
            start, metrics = extra["step"], extra["metrics"]
        _, _, metrics = train(model, info, steps=args.steps, opt=opt, sched=sched, start=start, ckpt=ckpt,
                              stop_at=args.stop_at, metrics=metrics)
        res = {"loop": (metrics, full_params(model))}
    if info.is_main:
        for name, (metrics, tensors) in res.items():
            save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(args.out, f"{name}.safetensors"))
            with open(os.path.join(args.out, f"{name}.json"), "w") as f:
                json.dump(metrics, f)
    dist.barrier()
    dist.teardown()


if __name__ == "__main__":
    main()
