"""Configs: one dataclass per component, YAML overrides, dotted CLI overrides, clear errors.

A YAML file only overrides defaults:

    model: {family: sdar, block_size: 8}
    rl: {lr: 1.0e-5}

CLI overrides take either form: ``--rl.lr 1e-6`` or ``rl.lr=1e-6``. An unknown key, a value of
the wrong type or an impossible value raises ``ConfigError`` naming the key and the file.
This module imports neither torch nor any other part of d3mini, so env servers can use it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml


class ConfigError(ValueError):
    """A config problem; the message names the file (or 'cli') and the dotted key."""


# ----------------------------------------------------------------------------- components
@dataclass
class ModelConfig:
    family: str = "sdar"            # sdar (block-causal) | qwen3 (causal AR) | llada (bidirectional)
    path: Optional[str] = None      # checkpoint folder (config.json + safetensors); None = build from these fields
    vocab_size: int = 512           # rows of the embedding / LM head
    hidden_size: int = 128          # model width
    intermediate_size: int = 384    # SwiGLU hidden width
    num_layers: int = 4             # transformer blocks
    num_heads: int = 4              # query heads
    num_kv_heads: int = 2           # key/value heads (GQA when < num_heads)
    head_dim: int = 32              # explicit per-head width (Qwen3 style; need not equal hidden/heads)
    rope_theta: float = 1.0e6       # RoPE base (Qwen3/SDAR 1e6, LLaDA 5e5)
    rms_norm_eps: float = 1.0e-6    # RMSNorm epsilon (Qwen3/SDAR 1e-6, LLaDA 1e-5)
    qk_norm: bool = True            # per-head RMSNorm on q and k before RoPE (Qwen3/SDAR yes, LLaDA no)
    tie_embeddings: bool = False    # share embed_tokens and lm_head
    block_size: int = 4             # SDAR diffusion block (1 = AR); ignored by llada's attention
    max_position: int = 32768       # max_position_embeddings written to config.json
    mask_id: int = 3                # <|MASK|> id; distinct from pad and eos
    bos_id: Optional[int] = None    # id prepended by the chat template (LLaDA) or None
    eos_ids: list = field(default_factory=lambda: [2, 0])  # stop ids; the first is end-of-turn
    pad_id: int = 0                 # padding id (never used to build masks)
    dtype: str = "float32"          # float32 | bfloat16 | float16: parameter dtype when loading/building
    init_std: float = 0.02          # normal init std for from-scratch models
    attn_impl: str = "sdpa"         # sdpa | flash (flash-attn on CUDA where the mask allows)


@dataclass
class DecodeConfig:
    block_size: int = 4             # decode block (must equal the SDAR model's block_size; 1 = AR)
    steps_per_block: int = 0        # denoising steps per block; 0 = block_size (one token per step at tau 1)
    rule: str = "threshold"         # threshold (low_confidence_dynamic) | static (top-k schedule) | prefix
                                    #   (threshold, but only the left-contiguous run of p > tau commits)
    order: str = "confidence"       # which masks the forced top-k picks take: confidence | left (leftmost first)
    threshold: float = 0.95         # tau: commit every masked token with confidence > tau
    temperature: float = 0.0        # 0 = greedy argmax
    top_k: int = 0                  # 0 = off
    top_p: float = 1.0              # 1.0 = off
    max_new_tokens: int = 64        # generation budget per call
    stop_ids: Optional[list] = None # None = the model's eos_ids
    compile: bool = False           # torch.compile the per-step function (GPU benchmarks)
    seed: int = 0                   # sampling generator seed
    llada_prefix_cache: bool = False  # LLaDA: reuse the prefix K/V within a block (refreshed per block)
    cache_len: int = 0              # SDAR/AR static KV/canvas slots; 0 = just enough for the batch (a fixed
                                    # value keeps one compiled shape across calls with other prompt lengths)


@dataclass
class EnvConfig:
    name: str = "webshop"           # webshop | search | alfworld
    server_url: Optional[str] = None  # http://127.0.0.1:PORT to use an env server; None = in-process
    max_steps: int = 15             # episode step limit (webshop 15, search 4, alfworld 50)
    history: int = 2                # last H (observation, action) pairs shown in the prompt
    prompt: str = "compact"         # verl (verl-agent style) | compact (short, for tiny models)
    obs_format: str = "compact"     # text ([SEP]-joined pages) | compact
    require_admissible: bool = True # validity also needs the action to be admissible
    seed: int = 0                   # catalog / goal generator seed
    num_products: int = 300         # embedded WebShop catalog size
    num_goals: int = 1000           # embedded WebShop goals
    num_test_goals: int = 300       # held-out goals (fixed test split)
    asin_chars: int = 8             # embedded WebShop: random characters after "B0" in an ASIN (8 = real form;
                                    # tiny models copy a short id far sooner, see dev/LOG.md)
    think: str = "phrases"          # embedded WebShop expert's <think>: phrases (a stock phrase per situation) | state
                                    # (before an option click or buy, the goal's options each marked set / missing, then
                                    # the phrase) | state_all (also before going back: an option the item lacks is
                                    # "not offered")
    data_dir: Optional[str] = None  # folder with real data files (WebShop json, Search jsonl, ALFWorld games)
    topk: int = 3                   # search: documents per <information>
    retriever_url: Optional[str] = None  # search: Search-R1 /retrieve server; None = embedded BM25
    timeout_s: float = 30.0         # HTTP timeout per request
    retries: int = 3                # HTTP retries on connection errors and 5xx
    backoff_s: float = 0.5          # first retry delay; doubles on every further retry
    human_goals: bool = False       # webshop with real data: goals from items_human_ins.json instead of synthetic ones


@dataclass
class LoRAConfig:
    rank: int = 0                   # 0 = full fine-tuning
    alpha: float = 16.0             # scale = alpha / rank
    targets: list = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                                    "gate_proj", "up_proj", "down_proj"])


@dataclass
class SFTConfig:
    steps: int = 200                # optimizer steps
    episodes: int = 400             # expert episodes collected for the SFT set
    batch_size: int = 16            # step samples per optimizer step (global)
    lr: float = 1.0e-3              # peak learning rate
    warmup: int = 20                # linear warmup steps
    min_lr_ratio: float = 0.1       # cosine decay floor as a fraction of lr
    loss_norm: str = "tokens"       # tokens (divide by label tokens) | samples (per-sample answer length)
    loss_weight: str = "elbo"       # elbo (CE / p_mask, SDAR) | uniform (mean CE over masked tokens; tokens norm)
    mask_copies: int = 1            # mask draws per sample (stratified t); sdar shares one clean prompt pass
    suffix_masks: float = 0.0       # sdar: fraction of mask draws that mask a suffix of each block (rl.corrupt_suffix)
    ar_warmup: int = 0              # first N steps use the AR loss (causal) on a from-scratch diffusion model
    ar_prompt_loss: bool = False    # AR warm-up and one-token-block phases also predict the prompt's tokens
    block_schedule: list = field(default_factory=list)  # sdar: block sizes of equal phases after the warm-up,
                                    # e.g. [2, 4, 8, 8]; the last must be model.block_size; [] = fixed
    val_every: int = 0              # every N steps (and at the end): teacher-forced action accuracy on held-out
                                    # expert steps, greedy at decode.threshold, per action kind (0 = off)
    val_episodes: int = 20          # expert episodes on train tasks the SFT set does not use (rl.goals: unseen)
    detours: float = 0.0            # per expert step: the chance of a wrong action instead (the env's mistake(),
                                    # untrained), so that the demonstrations show the recovery from it
    dagger_at: list = field(default_factory=list)  # SFT steps at which the model rolls out on sft.dagger_tasks of
                                    # the SFT tasks and the expert labels the states it reaches (a DAgger round);
                                    # from its first wrong action on, an episode's states with the expert's
                                    # responses join the SFT data ([] = off)
    dagger_tasks: int = 300         # SFT tasks rolled out per DAgger round (the first N)
    dagger_threshold: float = 0.95  # decode threshold of those rollouts (greedy, as evaluated)


@dataclass
class RLConfig:
    algo: str = "d3llm_v2"          # d3llm_v2 | d1 | espo | bgpo | gdpo | grpo
    steps: int = 20                 # rl_step calls
    tasks_per_step: int = 8         # N tasks per rollout batch
    group_size: int = 8             # G episodes per task
    epochs: int = 1                 # mu: inner passes over the rollout batch
    minibatch: int = 64             # step samples per optimizer update
    micro_batch: int = 16           # step samples per forward/backward (gradient accumulation)
    lr: float = 1.0e-5              # learning rate
    clip_low: float = 0.2           # ratio clip below 1
    clip_high: float = 0.28         # ratio clip above 1
    advantage: str = "grpo"         # grpo (mean/std) | mean | loo (leave-one-out)
    gating: str = "gate"            # gate (invalid step -> reward 0) | penalty (-0.1 x invalid) | none
    penalty: float = 0.1            # penalty mode coefficient
    kl: str = "none"                # none | k2 | k3
    kl_coef: float = 0.01           # beta when kl != none
    entropy_floor: float = 0.0      # 0 = off; else penalise mean entropy below this (nats)
    entropy_coef: float = 0.0       # weight of the entropy-floor penalty
    mc_samples: int = 2             # mask draws per sample for ELBO estimators
    estimator: str = "auto"         # auto (family default) | ar | sdar_block | sdar_trace | llada_mc | llada_coupled
                                    # | mean_field; sdar_trace = each token scored where the rollout committed it
    temperature: float = 1.0        # rollout sampling temperature
    threshold: Optional[float] = None  # rollout decode threshold; None = decode.threshold (TraceRL samples SDAR
                                    # at a dynamic threshold 0.9: confident tokens commit in parallel, as in eval)
    p_mask_prompt: float = 0.15     # d1 one-step estimator: prompt masking rate
    seed: int = 0                   # mask-draw seed base
    mask_scheme: str = "auto"       # ELBO mask draws: auto (algo/estimator default) | stratified | coupled | sdmc
    trace_shrink: int = 1           # sdar_trace: merge every s consecutive steps of a block into one copy (TraceRL's
                                    # shrink; 1 = exact, s > 1 = ~s x fewer copies, later tokens of a merged step
                                    # scored with less context than the decoder had)
    dual_clip: float = 3.0          # verl dual-clip bound c for A < 0 (grpo, bgpo); 0 = off
    goals: str = "train"            # train (every train task) | unseen (train tasks the SFT stage did not use)
    score: str = "all"              # all | action: response tokens the policy gradient credits; action = from the
                                    # <action> tag on, the think text before it then clean context like the prompt
    step_advantage: str = "none"    # none | mean | mean_std: GiGPO's step-level advantage added to the episode's,
                                    # from discounted step returns compared within anchor-state groups (same task,
                                    # same observation); mean_std divides by the group's std (reference/rl.md §6.5)
    step_weight: float = 1.0        # w in A = A_episode + w * A_step
    gamma: float = 0.95             # discount of the step returns
    neg_weight: float = 1.0         # scale of negative advantages (1 = as computed; 0 = credit only better-than-
                                    # average samples; no gain measured on the tiny config, dev/LOG.md)


@dataclass
class DistillConfig:
    steps: int = 50                 # distill_step calls
    rollouts_every: int = 1         # fresh rollouts every N steps
    tasks_per_step: int = 8         # tasks per rollout batch
    group_size: int = 4             # episodes per task
    batch_size: int = 32            # step samples per update
    lr: float = 1.0e-4              # learning rate
    r_max: float = 0.8              # final mask-ratio ceiling and floor target (d3LLM's, at block 4 the late
                                    # stage is fully masked blocks; at block K that needs r > 1 - 1/K, 0.875 at 8;
                                    # r_max 1.0 on the tiny config: no better, dev/LOG.md 2026-12-07 (5))
    entropy_coef: float = 2.0       # lambda: entropy term on correctly predicted positions
    entropy_temp: float = 0.5       # softmax temperature inside the entropy term
    only_valid: bool = True         # train only on valid step samples
    only_success: bool = False      # train only on steps of successful episodes
    tie_break: str = "confidence"   # confidence | random: order among tokens committed at the same forward
    score: str = "all"              # all | think: response tokens the loss trains; think = only those before
                                    # the <action> tag (the action's tokens stay masked in both copies, unscored)
    threshold: float = 0.95         # decode threshold for the rollouts that make targets
    goals: str = "train"            # train | unseen, as rl.goals
    micro_batch: int = 16           # step samples per forward/backward (gradient accumulation)
    complementary: bool = True      # also train the complementary in-block mask (dParallel / d3LLM CE_rev)
    block_sizes: list = field(default_factory=list)  # llada block-size curriculum over the stage, e.g.
                                    # [16, 16, 24, 24, 32, 32] (d3LLM); [] = the model's block_size
    expert_batch: int = 0           # expert step samples per update trained with the SFT loss beside the
                                    # distillation loss (replay against drift from the SFT behaviour); 0 = off
    expert_weight: float = 1.0      # weight of that SFT loss
    expert_score: str = "all"       # all | action: what the replay trains; action = from the <action> tag on, the
                                    # expert's think text then clean context (with score: think, each loss keeps
                                    # to its own part of the response)
    teacher_weight: float = 0.0     # KL(teacher || policy) on the masked tokens teacher_on names, the teacher being
                                    # the policy frozen as the stage began (the RL model); 0 = no KL term
    teacher_on: str = "action"      # action | response: the tokens the teacher term covers (response: the think
                                    # text too, where the agent's decisions are written)
    rollouts: str = "policy"        # policy | teacher | relabel: whose decodes are the targets: the policy being
                                    # distilled (on-policy), the frozen teacher (a fixed target distribution), or
                                    # the policy's where the teacher, answering the same prompt, takes the same
                                    # action, else the teacher's (the policy's states, the teacher's decisions)
    relabel_first: bool = False     # rollouts "relabel": the teacher's corrections always enter the batch_size cap
                                    # (the agreeing samples fill the rest at random) instead of sharing it by chance
                                    # (tiny config, seed 1: -3.7 points and half the TPF gain; dev/LOG.md)
    teacher_gate: float = 0.0       # sharpen (CE, CE_comp, H) only tokens whose teacher top probability is at
                                    # least this; the teacher's KL covers the others; 0 = sharpen every token
    gate_on: str = "all"            # all | action: the scored tokens the gate filters; action = only the action's
                                    # (with score: all, the think text sharpened whole, the action where the teacher
                                    # is sure; tiny config at gate 0.5: seed 2 -8.0 points, dev/LOG.md 2026-12-07 (7))


@dataclass
class TrainConfig:
    stages: list = field(default_factory=lambda: ["sft", "rl", "distill"])  # subset of sft | rl | distill
    out_dir: str = "runs/tiny"      # checkpoints, metrics.jsonl, rollouts, results
    seed: int = 0                   # global seed
    dtype: str = "float32"          # float32 | bfloat16 (autocast) compute dtype
    grad_clip: float = 1.0          # max grad norm
    weight_decay: float = 0.0       # AdamW weight decay
    betas: list = field(default_factory=lambda: [0.9, 0.95])  # AdamW betas
    log_every: int = 1              # metrics.jsonl cadence (steps)
    save_every: int = 50            # checkpoint cadence (steps)
    eval_every: int = 0             # periodic eval cadence (0 = only after each stage)
    dump_every: int = 10            # rollouts dumped as text every N steps
    activation_checkpointing: bool = False  # recompute block activations in backward
    fsdp: bool = True               # shard with FSDP2 when world size > 1
    mp_dtype: str = "bfloat16"      # FSDP2 param dtype on GPU (bfloat16 | float32; grads reduced in fp32; CPU: fp32)
    keep_checkpoints: int = 3       # newest step_* checkpoint folders kept by dist.save
    wandb: bool = False             # log to wandb when installed
    tokenizer: Optional[str] = None # tokenizer.json path; None = the checkpoint's or a tiny one built here
    threads: int = 0                # torch CPU threads (0 = leave torch's default)


@dataclass
class EvalConfig:
    num_tasks: int = 300            # held-out tasks
    split: str = "test"             # test | train (env-specific names are mapped by the env)
    thresholds: list = field(default_factory=lambda: [1.0, 0.95])  # taus evaluated after each stage
    sweep: list = field(default_factory=lambda: [1.0, 0.95, 0.9, 0.8, 0.7])  # taus for the AUP sweep
    alpha: float = 3.0              # AUP alpha
    y_max: Optional[float] = None   # AUP y_max; None = best accuracy among compared runs
    batch_episodes: int = 64        # episodes decoded together
    out: Optional[str] = None       # result file prefix; None = <out_dir>/eval


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


# ----------------------------------------------------------------------------- validation
_CHOICES = {
    "model.family": ("sdar", "qwen3", "llada"),
    "model.dtype": ("float32", "bfloat16", "float16"),
    "model.attn_impl": ("sdpa", "flash"),
    "decode.rule": ("threshold", "static", "prefix"),
    "decode.order": ("confidence", "left"),
    "env.name": ("webshop", "search", "alfworld"),
    "env.prompt": ("verl", "compact"),
    "env.obs_format": ("text", "compact"),
    "env.think": ("phrases", "state", "state_all"),
    "sft.loss_norm": ("tokens", "samples"),
    "sft.loss_weight": ("elbo", "uniform"),
    "rl.algo": ("d3llm_v2", "d1", "espo", "bgpo", "gdpo", "grpo"),
    "rl.advantage": ("grpo", "mean", "loo"),
    "rl.gating": ("gate", "penalty", "none"),
    "rl.kl": ("none", "k2", "k3"),
    "rl.goals": ("train", "unseen"),
    "distill.goals": ("train", "unseen"),
    "rl.estimator": ("auto", "ar", "sdar_block", "sdar_trace", "llada_mc", "llada_coupled", "mean_field"),
    "distill.tie_break": ("confidence", "random"),
    "distill.score": ("all", "think"),
    "distill.teacher_on": ("action", "response"),
    "distill.gate_on": ("all", "action"),
    "distill.rollouts": ("policy", "teacher", "relabel"),
    "rl.score": ("all", "action"),
    "rl.step_advantage": ("none", "mean", "mean_std"),
    "distill.expert_score": ("all", "action"),
    "train.dtype": ("float32", "bfloat16"),
}
_POSITIVE = ["model.vocab_size", "model.hidden_size", "model.intermediate_size", "model.num_layers",
             "model.num_heads", "model.num_kv_heads", "model.head_dim", "model.block_size",
             "model.rope_theta", "model.rms_norm_eps", "decode.block_size", "decode.max_new_tokens",
             "env.max_steps", "sft.batch_size", "sft.mask_copies", "rl.tasks_per_step", "rl.group_size", "rl.epochs",
             "rl.minibatch", "rl.micro_batch", "rl.mc_samples", "rl.trace_shrink", "distill.batch_size", "distill.micro_batch",
             "distill.tasks_per_step", "distill.group_size", "eval.batch_episodes", "env.timeout_s",
             "train.save_every", "sft.dagger_tasks"]
_NONNEG = ["env.history", "sft.steps", "sft.episodes", "sft.warmup", "rl.steps", "distill.steps",
           "decode.temperature", "decode.top_k", "decode.steps_per_block", "rl.clip_low", "rl.clip_high",
           "rl.kl_coef", "rl.entropy_coef", "lora.rank", "train.grad_clip", "eval.num_tasks",
           "env.retries", "train.threads", "sft.val_every", "sft.val_episodes", "distill.expert_batch",
           "distill.expert_weight", "distill.teacher_weight", "rl.step_weight", "rl.neg_weight",
           "sft.lr", "rl.lr", "distill.lr"]
_UNIT = ["sft.detours", "sft.dagger_threshold", "rl.gamma", "decode.top_p", "rl.p_mask_prompt", "distill.r_max",
         "sft.min_lr_ratio", "distill.teacher_gate"]


def _check_values(cfg: Config, src: str) -> None:
    def get(key):
        sec, name = key.split(".")
        return getattr(getattr(cfg, sec), name)

    def bad(key, why):
        raise ConfigError(f"{src}: {key} = {get(key)!r}: {why}")

    for sec in dataclasses.fields(cfg):  # NaN passes every comparison below: no setting means NaN
        for f in dataclasses.fields(getattr(cfg, sec.name)):
            v = getattr(getattr(cfg, sec.name), f.name)
            if isinstance(v, float) and math.isnan(v):
                bad(f"{sec.name}.{f.name}", "is not a number")
    for key in ("sft.lr", "rl.lr", "distill.lr"):
        if math.isinf(get(key)):
            bad(key, "must be finite")
    if len(cfg.train.betas) != 2 or not all(isinstance(b, (int, float)) and 0.0 <= b < 1.0 for b in cfg.train.betas):
        bad("train.betas", "must be two numbers in [0, 1) (AdamW's beta1, beta2)")
    for key, choices in _CHOICES.items():
        if get(key) not in choices:
            bad(key, f"must be one of {list(choices)}")
    for key in _POSITIVE:
        if get(key) <= 0:
            bad(key, "must be > 0")
    for key in _NONNEG:
        if get(key) < 0:
            bad(key, "must be >= 0")
    for key in _UNIT:
        if not 0.0 <= get(key) <= 1.0:
            bad(key, "must be in [0, 1]")
    m = cfg.model
    if m.num_heads % m.num_kv_heads:
        bad("model.num_kv_heads", f"must divide model.num_heads = {m.num_heads}")
    if m.mask_id in m.eos_ids or m.mask_id == m.pad_id:
        bad("model.mask_id", "must differ from pad_id and every eos id")
    if not m.eos_ids:
        bad("model.eos_ids", "needs at least one stop id")
    if m.head_dim % 2:
        bad("model.head_dim", "must be even (RoPE rotates halves)")
    if cfg.decode.steps_per_block > cfg.decode.block_size:
        bad("decode.steps_per_block", f"must be <= decode.block_size = {cfg.decode.block_size}")
    for key, tau in (("decode.threshold", cfg.decode.threshold), ("rl.threshold", cfg.rl.threshold),
                     ("distill.threshold", cfg.distill.threshold)):
        if tau is not None and not 0.0 <= tau <= 1.0:
            bad(key, "must be in [0, 1]")
    for s in cfg.train.stages:
        if s not in ("sft", "rl", "distill"):
            raise ConfigError(f"{src}: train.stages: unknown stage {s!r} (sft | rl | distill)")
    if cfg.lora.alpha <= 0:
        bad("lora.alpha", "must be > 0")
    at = cfg.sft.dagger_at
    if any(isinstance(t, bool) or not isinstance(t, int) for t in at) or sorted(set(at)) != list(at) \
            or (at and not 0 <= at[0] <= at[-1] < cfg.sft.steps):
        bad("sft.dagger_at", f"must be increasing integer steps in [0, sft.steps = {cfg.sft.steps})")
    for t in cfg.eval.thresholds + cfg.eval.sweep:
        if not 0.0 <= float(t) <= 1.0:
            raise ConfigError(f"{src}: eval thresholds must lie in [0, 1], got {t!r}")


# ----------------------------------------------------------------------------- type coercion
def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against annotation `tp`; ints are accepted for floats."""
    origin = typing.get_origin(tp)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return value
    if tp is list or origin is list:
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        return value
    return value


def _apply(obj: Any, data: dict, src: str, prefix: str = "") -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{src}: {prefix.rstrip('.') or 'top level'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for key, value in data.items():
        dotted = prefix + str(key)
        if key not in names:
            raise ConfigError(f"{src}: unknown key {dotted!r} (known: {sorted(names)})")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current):
            _apply(current, value if value is not None else {}, src, dotted + ".")
        else:
            setattr(obj, key, _coerce(value, hints[key], f"{src}: {dotted}"))


CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


def find_config(path: str) -> str:
    """The config file `path` names: the path itself, else a bare name (`webshop.yaml`, `webshop`) looked up in
    the project's configs/ folder, so `train.py --config webshop.yaml` works from anywhere."""
    if os.path.exists(path):
        return path
    if os.path.dirname(path) == "":
        for name in (path, path + ".yaml"):
            if os.path.isfile(os.path.join(CONFIG_DIR, name)):
                return os.path.join(CONFIG_DIR, name)
    known = sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml")) if os.path.isdir(CONFIG_DIR) else []
    raise ConfigError(f"{path}: config file not found" + (f" (configs/ has {', '.join(known)})" if known else ""))


def load_config(path: Optional[str] = None, overrides: Optional[list] = None) -> Config:
    """Defaults <- YAML file (find_config) <- CLI overrides, then validated."""
    cfg = Config()
    if path is not None:
        path = find_config(path)
        try:
            with open(path) as f:
                data = yaml.safe_load(f) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"{path}: not valid YAML: {e}") from None
        except (OSError, UnicodeDecodeError) as e:  # a folder, a binary file, no permission
            raise ConfigError(f"{path}: cannot read the config ({e})") from None
        _apply(cfg, data, path)
        _check_values(cfg, path)
    if overrides:
        apply_overrides(cfg, overrides)
    _check_values(cfg, path or "defaults")
    return cfg


def parse_overrides(args: list) -> dict:
    """['--rl.lr', '1e-6', 'model.family=llada'] -> nested dict with YAML-parsed values."""
    out: dict = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            a = a[2:]
            if "=" in a:
                key, raw = a.split("=", 1)
            else:
                if i + 1 >= len(args):
                    raise ConfigError(f"cli: --{a} needs a value")
                key, raw = a, args[i + 1]
                i += 1
        elif "=" in a:
            key, raw = a.split("=", 1)
        else:
            raise ConfigError(f"cli: cannot parse override {a!r} (use --section.key VALUE or section.key=VALUE)")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError:
            value = raw
        if isinstance(value, str) and value.strip() != raw.strip():
            value = raw
        node = out
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
        i += 1
    return out


def apply_overrides(cfg: Config, args: list) -> Config:
    data = parse_overrides(args)
    # a float field given as "1e-6" is parsed by YAML as a string; convert numeric strings for numeric fields
    _apply(cfg, _numeric_strings(cfg, data), "cli")
    return cfg


def _numeric_strings(obj: Any, data: dict) -> dict:
    hints = typing.get_type_hints(type(obj)) if dataclasses.is_dataclass(obj) else {}
    out = {}
    for k, v in data.items():
        cur = getattr(obj, k, None)
        if isinstance(v, dict) and dataclasses.is_dataclass(cur):
            out[k] = _numeric_strings(cur, v)
            continue
        tp = hints.get(k)
        base = [a for a in typing.get_args(tp) if a is not type(None)] if typing.get_origin(tp) is typing.Union else [tp]
        if isinstance(v, str) and base and base[0] in (int, float):
            try:
                v = base[0](float(v)) if base[0] is float else int(v)
            except ValueError:
                pass
        out[k] = v
    return out


def to_dict(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def save_config(cfg: Config, path: str) -> None:
    """Write the resolved config as YAML (.yaml/.yml) or JSON (anything else), atomically."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        if path.endswith((".yaml", ".yml")):
            yaml.safe_dump(to_dict(cfg), f, sort_keys=False)
        else:
            json.dump(to_dict(cfg), f, indent=2)
    os.replace(tmp, path)


def from_dict(data: dict, src: str = "dict") -> Config:
    cfg = Config()
    _apply(cfg, data, src)
    _check_values(cfg, src)
    return cfg
