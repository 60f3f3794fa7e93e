"""torch.distributed in one place: process group, FSDP2, resumable checkpoints, HF export.

The same code runs under `python` (one process, no process group) and `torchrun` (1..N processes
on one or many nodes: nccl on GPU, gloo on CPU).

Gradient scale. The losses divide by a GLOBAL token count (`global_count`), so each rank's loss is
its share of the global mean and the right gradient is the SUM of the ranks' gradients. FSDP2
averages by default (divides by world size); `shard` sets `set_gradient_divide_factor(1.0)` and
`set_force_sum_reduction_for_comms(True)` (a plain SUM, which gloo has, not PREMUL_SUM) on every
FSDP module, so the reduce-scatter sums. Losses are never rescaled by world size; the global loss
for logging is `all_reduce_sum(local_loss)`.

Checkpoints: full (gathered) state dicts written by rank 0 as safetensors + JSON, not DCP
(DCP's .metadata file is a pickle; ours unpickle nothing). One folder per step:

    step_00000040/ model.safetensors  optimizer.safetensors  extra.safetensors (tensors in extra)
                   state.json (step, extra, scheduler, optimizer scalars, tied names)
                   rng_<rank>.json (python, numpy, torch CPU/CUDA RNG of every rank)
                   manifest.json (size + sha256 of every file; written last)

written into `.tmp_step_*` and renamed, so a crash mid-save leaves the previous folder intact.
Rank 0 holds the full model and optimizer in CPU memory while saving, and the folder must be on
a filesystem every rank sees (every rank writes its RNG file there).
"""
from __future__ import annotations

import base64
import copy
import json
import os
import random
import re
import shutil
import warnings
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from d3mini.lora import lora_scales, merged_state_dict
from d3mini.metrics import sha256_file  # torch-free helper shared with run records
from d3mini.model import DTYPES, CheckpointError, DiffusionLM


# ----------------------------------------------------------------------------- process group
@dataclass
class DistInfo:
    rank: int              # global rank
    world: int             # number of processes
    local_rank: int        # rank on this node (GPU index)
    device: torch.device   # cuda:<local_rank> or cpu
    is_main: bool          # rank == 0: logs, writes files


def setup(threads: int = 0) -> DistInfo:
    """Read torchrun's env (absent = one process), pick the device, start the process group.
    CPU: torch threads = cores // processes on this node (or `threads` when > 0)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"LOCAL_RANK {local_rank} but only {torch.cuda.device_count()} GPUs visible")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        threads = threads or max(1, cores // local_world)  # oversubscribed OpenMP threads spin and crawl
    if threads:
        torch.set_num_threads(threads)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return DistInfo(rank, world, local_rank, device, rank == 0)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def print0(*args, **kwargs) -> None:
    if is_main():
        print(*args, **kwargs, flush=True)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _reduce(x, mean: bool):
    """Sum (or mean) over ranks of a number, tensor or dict of numbers; returns the same kind."""
    if isinstance(x, dict):
        vals = _reduce(torch.tensor([float(x[k]) for k in sorted(x)], dtype=torch.float64), mean)
        return dict(zip(sorted(x), vals.tolist()))
    if world_size() == 1:
        return x
    dev = f"cuda:{torch.cuda.current_device()}" if dist.get_backend() == "nccl" else "cpu"
    out = (x.detach() if torch.is_tensor(x) else torch.tensor(x, dtype=torch.float64)).to(dev, copy=True)
    dist.all_reduce(out)
    out = out / world_size() if mean else out
    if torch.is_tensor(x):
        return out.to(x.device)
    return int(out.item()) if isinstance(x, int) and not mean else out.item()


def all_reduce_sum(x):
    return _reduce(x, mean=False)


def all_reduce_mean(x):
    return _reduce(x, mean=True)


def global_count(n_local):
    """Tokens (or samples) over all ranks: the normaliser of a global token-mean loss."""
    return all_reduce_sum(n_local)


# ----------------------------------------------------------------------------- sharding
def _checkpoint_block(block: nn.Module) -> None:
    """Recompute the block's activations in backward. Wrapping `forward` (not the module) keeps
    parameter names unchanged for FSDP, LoRA targets and checkpoints."""
    inner = block.forward

    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return torch.utils.checkpoint.checkpoint(inner, *args, use_reentrant=False, **kwargs)

    block.forward = forward


def _sum_grad(g):
    """Replicated params: sum this backward's fresh gradient (a tensor hook runs before accumulation,
    so gradient accumulation over micro-batches stays right)."""
    g = g.clone()
    dist.all_reduce(g)
    return g


def shard(model: nn.Module, cfg, info: DistInfo) -> nn.Module:
    """FSDP2 as torchtitan's parallelize: `fully_shard` per block, then the root (in place).

    GPU: params gathered in `cfg.mp_dtype` (bf16), gradients reduced in fp32; CPU: all fp32.
    cfg.fsdp = False with world > 1: plain replication, each gradient all-reduce-summed in a hook.
    World size 1: only activation checkpointing (when on) is applied."""
    if cfg.activation_checkpointing:
        for block in model.model.layers:
            _checkpoint_block(block)
    if info.world == 1:
        return model
    if not cfg.fsdp:
        for p in model.parameters():
            dist.broadcast(p.data, 0)  # replicas must start equal
            if p.requires_grad:
                p.register_hook(_sum_grad)
        return model
    if info.device.type == "cuda":
        if cfg.mp_dtype not in ("bfloat16", "float32"):
            raise ValueError(f"train.mp_dtype = {cfg.mp_dtype!r}: must be bfloat16 or float32")
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[cfg.mp_dtype], reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()  # fp32 on CPU
    for block in model.model.layers:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)  # backward needs the root's params at once
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)  # sum, not mean: see the module docstring
            m.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


def clip_grad_norm(params, max_norm: float) -> float:
    """clip_grad_norm_ for plain or FSDP2 (DTensor) gradients; returns the global norm."""
    norm = torch.nn.utils.clip_grad_norm_(list(params), max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def reshard(model: nn.Module) -> None:
    """Put FSDP2 modules back to their sharded parameters. The root is kept unsharded after a forward
    (reshard_after_forward=False), and a forward without backward (decoding, no-grad scoring) leaves it
    so: its registered parameters are then not the optimizer's, and optimizer state dicts fail."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_state_dict(model: nn.Module) -> dict:
    """Gathered CPU state dict on rank 0 ({} elsewhere); a collective under FSDP."""
    if world_size() == 1:
        return {k: v.detach().cpu() for k, v in model.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


# ----------------------------------------------------------------------------- checkpoints
def _write_json(fp: str, obj) -> None:
    with open(fp, "w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())


def _save_tensors(fp: str, tensors: dict) -> None:
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, fp)


def _replace_dir(tmp: str, final: str) -> None:
    """Rename tmp -> final; an existing final is moved aside first and removed after."""
    old = final + ".old"
    shutil.rmtree(old, ignore_errors=True)
    if os.path.exists(final):
        os.rename(final, old)
    os.rename(tmp, final)
    shutil.rmtree(old, ignore_errors=True)


def _rng_state() -> dict:
    v, mt, gauss = random.getstate()
    np_state = np.random.get_state()
    b64 = lambda t: base64.b64encode(t.numpy().tobytes()).decode()  # noqa: E731
    return {"python": [v, list(mt), gauss],
            "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "torch": b64(torch.get_rng_state()),
            "cuda": [b64(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else []}


def _set_rng_state(s: dict) -> None:
    unb64 = lambda x: torch.frombuffer(bytearray(base64.b64decode(x)), dtype=torch.uint8)  # noqa: E731
    random.setstate((s["python"][0], tuple(s["python"][1]), s["python"][2]))
    n = s["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    torch.set_rng_state(unb64(s["torch"]))
    if s["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([unb64(x) for x in s["cuda"]])


def _step_dirs(path: str) -> list:
    """Finished checkpoint folders, oldest first (not .tmp_* leftovers of a crashed save)."""
    return sorted(d for d in os.listdir(path) if re.fullmatch(r"step_\d+", d))


def save(path: str, step: int, model: nn.Module, optimizer=None, scheduler=None, extra: dict = None,
         keep: int = 3) -> str:
    """Write `path/step_<step>` (call on every rank); keep the newest `keep` folders. `extra`: JSON
    values plus top-level tensors (e.g. a generator's get_state()), taken from rank 0."""
    extra = dict(extra or {})
    ext_t = {k: extra.pop(k) for k in list(extra) if torch.is_tensor(extra[k])}
    sched = scheduler.state_dict() if scheduler is not None else None
    try:  # fail on every rank before any collective or file write
        json.dumps({"extra": extra, "scheduler": sched})
    except TypeError as e:
        raise TypeError(f"dist.save: extra and scheduler state must be JSON-serialisable (tensors allowed at "
                        f"the top level of extra): {e}") from None
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    reshard(model)
    msd = full_state_dict(model)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    rank = dist.get_rank() if dist.is_initialized() else 0
    final = os.path.join(path, f"step_{step:08d}")
    tmp = os.path.join(path, f".tmp_step_{step:08d}")
    if rank == 0:
        os.makedirs(path, exist_ok=True)
        for d in os.listdir(path):  # leftovers of crashed saves
            if d.startswith(".tmp_step_"):
                shutil.rmtree(os.path.join(path, d), ignore_errors=True)
        os.makedirs(tmp)
    barrier()
    _write_json(os.path.join(tmp, f"rng_{rank}.json"), _rng_state())
    barrier()
    if rank == 0:
        seen, tied = {}, {}
        for k, v in list(msd.items()):  # safetensors refuses shared storage: store tied weights once
            if v.data_ptr() in seen:
                tied[k] = seen[v.data_ptr()]
                del msd[k]
            else:
                seen[v.data_ptr()] = k
        _save_tensors(os.path.join(tmp, "model.safetensors"), msd)
        _save_tensors(os.path.join(tmp, "extra.safetensors"), ext_t)
        meta = {"step": step, "world": world_size(), "tied": tied, "extra": extra, "scheduler": sched}
        if osd is not None:  # {state: {fqn: {key: tensor|number}}, param_groups: [...]} -> tensors + JSON
            ot = {f"{fqn}/{k}": v for fqn, st in osd["state"].items() for k, v in st.items() if torch.is_tensor(v)}
            meta["optimizer"] = {"param_groups": osd["param_groups"],
                                 "scalars": {fqn: {k: v for k, v in st.items() if not torch.is_tensor(v)}
                                             for fqn, st in osd["state"].items()}}
            _save_tensors(os.path.join(tmp, "optimizer.safetensors"), ot)
        _write_json(os.path.join(tmp, "state.json"), meta)
        files = sorted(os.listdir(tmp))
        _write_json(os.path.join(tmp, "manifest.json"),
                    {f: {"size": os.path.getsize(os.path.join(tmp, f)), "sha256": sha256_file(os.path.join(tmp, f))}
                     for f in files})
        _replace_dir(tmp, final)
        for d in _step_dirs(path)[:-keep] if keep > 0 else []:
            shutil.rmtree(os.path.join(path, d), ignore_errors=True)
    barrier()
    return final


def verify_checkpoint(ckpt: str, hashes: bool = True):
    """None when every file in the manifest is present with its size (and hash); else the reason."""
    mf = os.path.join(ckpt, "manifest.json")
    try:
        with open(mf) as f:
            manifest = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return f"unreadable manifest.json ({e})"
    for name, want in manifest.items():
        fp = os.path.join(ckpt, name)
        if not os.path.exists(fp):
            return f"{name} missing"
        if os.path.getsize(fp) != want["size"]:
            return f"{name} has {os.path.getsize(fp)} bytes, manifest says {want['size']}"
        if hashes and sha256_file(fp) != want["sha256"]:
            return f"{name} sha256 differs from the manifest"
    return None


def latest_checkpoint(path: str, hashes: bool = True):
    """The newest intact `step_*` folder under `path` (None if none); corrupt ones are skipped with
    a warning. Rank 0 decides and tells the others."""
    choice = [None]
    if is_main() and os.path.isdir(path):
        for d in reversed(_step_dirs(path)):
            why = verify_checkpoint(os.path.join(path, d), hashes)
            if why is None:
                choice[0] = os.path.join(path, d)
                break
            warnings.warn(f"checkpoint {os.path.join(path, d)} is corrupt ({why}); trying the previous one")
    if world_size() > 1:
        dist.broadcast_object_list(choice, 0)  # a path string between our own processes
    return choice[0]


def load(path: str, model: nn.Module, optimizer=None, scheduler=None) -> dict:
    """Restore a folder written by `save` (or the latest intact one under `path`) into the
    (sharded) model, optimizer, scheduler and every rank's RNG; returns extra + {"step": step}."""
    from safetensors.torch import load_file
    ckpt = path if os.path.exists(os.path.join(path, "manifest.json")) else latest_checkpoint(path)
    if ckpt is None:
        raise CheckpointError(f"{path}: no intact checkpoint (step_* folder with a valid manifest.json)")
    why = verify_checkpoint(ckpt, hashes=False)
    if why:
        raise CheckpointError(f"{ckpt}: {why}")
    with open(os.path.join(ckpt, "state.json")) as f:
        meta = json.load(f)
    bcast = any(isinstance(p, DTensor) for p in model.parameters())  # FSDP: rank 0 reads and broadcasts
    reader = not bcast or is_main()
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=bcast, strict=True)
    msd = {}
    if reader:
        msd = load_file(os.path.join(ckpt, "model.safetensors"))
        msd.update({k: msd[src] for k, src in meta["tied"].items()})
    try:
        if world_size() == 1:
            model.load_state_dict(msd, strict=True)
        else:
            set_model_state_dict(model, msd, options=opts)
    except RuntimeError as e:  # missing / unexpected keys, size mismatches: another model's checkpoint
        why = "; ".join(line.strip() for line in str(e).splitlines()[1:4]) or str(e)
        raise CheckpointError(f"{ckpt}: its weights do not fit the model built from the config ({why})") from None
    if optimizer is not None:
        if "optimizer" not in meta:
            raise CheckpointError(f"{ckpt}: no optimizer state saved, but an optimizer was given")
        osd = {}
        if reader:
            ot, om = load_file(os.path.join(ckpt, "optimizer.safetensors")), meta["optimizer"]
            state = {fqn: dict(sc) for fqn, sc in om["scalars"].items()}
            for key, v in ot.items():
                fqn, k = key.rsplit("/", 1)
                state.setdefault(fqn, {})[k] = v
            osd = {"state": state, "param_groups": om["param_groups"]}
        set_optimizer_state_dict(model, optimizer, osd, options=opts)
    if scheduler is not None and meta["scheduler"] is not None:
        scheduler.load_state_dict(meta["scheduler"])
    rank = dist.get_rank() if dist.is_initialized() else 0
    rng = os.path.join(ckpt, f"rng_{rank}.json")  # each rank continues its own random streams
    if os.path.exists(rng):
        with open(rng) as f:
            _set_rng_state(json.load(f))
    else:
        warnings.warn(f"{ckpt}: no RNG state for rank {rank} (saved with {meta['world']} ranks)")
    return {**meta["extra"], **load_file(os.path.join(ckpt, "extra.safetensors")), "step": meta["step"]}


# ----------------------------------------------------------------------------- export
def _save_tokenizer(tok, path: str) -> None:
    if isinstance(tok, str):
        src = os.path.join(tok, "tokenizer.json") if os.path.isdir(tok) else tok
        if not os.path.isfile(src):
            raise FileNotFoundError(f"export_hf: tokenizer file {src} not found")
        shutil.copyfile(src, os.path.join(path, "tokenizer.json"))
    elif hasattr(tok, "save_pretrained"):  # transformers tokenizer
        tok.save_pretrained(path)
    elif hasattr(tok, "save"):  # tokenizers.Tokenizer
        tok.save(os.path.join(path, "tokenizer.json"))
    else:
        raise TypeError(f"export_hf: tokenizer must be a path, a tokenizers.Tokenizer or a transformers "
                        f"tokenizer, got {type(tok).__name__}")


def export_hf(model: nn.Module, tokenizer, path: str, layout: str = "hf") -> None:
    """config.json + model.safetensors + tokenizer.json for DiffusionLM.from_pretrained and
    transformers (layout "hf": Qwen3 / Llama names; "native": the family's own). LoRA adapters are
    merged; under FSDP the full state is gathered (call on every rank; rank 0 writes)."""
    if layout not in ("hf", "native"):
        raise ValueError(f"export_hf: layout must be 'hf' or 'native', got {layout!r}")
    state = full_state_dict(model)
    if is_main():
        scales = lora_scales(model)
        state = merged_state_dict(state, scales) if scales else state
        cfg = copy.deepcopy(model.cfg)
        cfg.dtype = next(k for k, v in DTYPES.items() if v == state["model.embed_tokens.weight"].dtype)
        with torch.device("meta"):
            plain = DiffusionLM(cfg)
        plain.load_state_dict(state, strict=True, assign=True)
        plain.tie()
        tmp = path.rstrip("/") + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        plain.save_pretrained(tmp, layout=layout)
        if tokenizer is not None:
            _save_tokenizer(tokenizer, tmp)
        _replace_dir(tmp, path.rstrip("/"))
    barrier()
