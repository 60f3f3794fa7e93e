"""The multi-turn agent loop shared by RL, distillation, evaluation and SFT-data collection.

verl-agent's step-independent form (reference/rl.md §6.1): every environment step of every
episode becomes one StepSample whose prompt is rebuilt from the task, the last H (observation,
action) pairs and the current observation, so a long episode never grows one long sequence.

    for each step t:   prompts of all active episodes  ->  one batched generate()
                       project(text) -> action, format ok ->  env.step(action)
    at episode end:    every StepSample of the episode gets the episode reward (10 x won)

N tasks x G episodes per task; a group shares its task and seed. An env failure (server gone,
timeout after retries) marks that episode failed: its samples are dropped (they are not a
signal about the policy) and it is counted in the metrics; the call goes on.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from d3mini.config import DecodeConfig, EnvConfig
from d3mini.data import apply_chat
from d3mini.envs import EnvError, action_start, env_module, is_action_valid, make_env


MAX_DETOURS = 3   # wrong actions per expert episode at most (rollout(detours=...))
DETOUR_ROOM = 6   # ... and only while this many steps are left, for the recovery


@dataclass
class StepSample:
    prompt_ids: list            # chat-templated prompt token ids
    response_ids: list          # generated ids (stop id included)
    trace: Optional[list]       # per response token: denoising forward that committed it (None: expert)
    confidence: Optional[list]  # per response token: p at commit (None: expert)
    action: str                 # projected action string
    valid: bool                 # format ok and (by default) admissible
    reward: float               # the episode's reward (10 x won), filled at episode end
    group_id: int               # same task (and seed) -> same group
    episode_id: int             # unique within one rollout call
    step: int                   # step index within the episode
    won: bool = False           # the episode was won (for distill's only_success)
    score: float = 0.0          # the episode's raw score
    text: str = ""              # decoded response text (for dumps)
    think_len: int = 0          # response tokens before the one that opens <action> (all of them without it)
    anchor: str = ""            # the observation the step acted on (GiGPO's anchor state)
    env_reward: float = 0.0     # the environment's reward for this step alone
    relabel: Optional["StepSample"] = None  # rollout(relabel=...): a second model's response to the same prompt
    prompt_loss: bool = True    # SFT may train on the prompt's tokens (False: its history shows a detour)


@dataclass
class _Episode:
    env: object
    group_id: int
    episode_id: int
    task_id: object
    obs: str = ""
    task: str = ""
    admissible: Optional[list] = None
    history: list = field(default_factory=list)   # [(obs, action)]
    samples: list = field(default_factory=list)
    done: bool = False
    failed: Optional[str] = None
    won: bool = False
    score: float = 0.0
    reward: float = 0.0
    n_valid: int = 0
    tokens: int = 0
    nfe_denoise: int = 0
    nfe_total: int = 0
    tpf_tokens: int = 0                           # generated tokens without stop ids (metrics.md §1.2)
    wrong: list = field(default_factory=list)     # expert rollouts, per step: the action was a detour (not returned)


def build_prompt(mod, tokenizer, ep: _Episode, env_cfg: EnvConfig, step: int, max_tokens: int) -> list:
    """Chat-templated prompt ids; the long-prompt fallback drops the oldest history first."""
    history = ep.history[-env_cfg.history:] if env_cfg.history > 0 else []
    while True:
        text = mod.prompt(ep.task, ep.obs, history, ep.admissible, step, env_cfg)
        ids = apply_chat(tokenizer, [{"role": "user", "content": text}], enable_thinking=False)
        if len(ids) <= max_tokens or not history:
            break
        history = history[1:]
    if len(ids) > max_tokens:  # still too long: keep the tail (the current observation and the cue)
        ids = ids[-max_tokens:]
    return ids


def rollout(model, tokenizer, env_cfg: EnvConfig, decode_cfg: DecodeConfig, task_ids: list,
            group_size: int = 1, expert: bool = False, seed: int = 0, batch_size: int = 64,
            max_prompt_tokens: int = 2048, env_factory: Optional[Callable] = None,
            progress: bool = False, relabel=None, detours: float = 0.0) -> tuple:
    """Run len(task_ids) x group_size episodes; return (step samples, metrics).

    expert=True: the env's scripted expert writes every response (SFT data; `model` may be None).
    detours (with expert=True): the chance per step that the env module's mistake() acts instead, at most
    MAX_DETOURS per episode and only while DETOUR_ROOM steps are left; those steps are not returned, the
    expert's responses after them are: demonstrations of recovering from a wrong action.
    relabel: a second model that answers every prompt the episodes visit (same decoding and noise); its
    response goes into StepSample.relabel and never reaches the env, which steps with `model`'s actions.
    relabel="expert": the env's scripted expert answers them instead (DAgger's labels; in-process env).
    metrics["episodes"] holds one record per episode (task_id, group_id, won, score, steps, ...).
    """
    from d3mini.decode import generate  # decode imports torch; keep this module importable without it

    mod = env_module(env_cfg.name)
    by_expert = isinstance(relabel, str)
    if by_expert and relabel != "expert":
        raise ValueError(f"rollout: relabel={relabel!r}: a model or 'expert'")
    if (expert or by_expert) and env_factory is None and getattr(env_cfg, "server_url", None):
        env_cfg = replace(env_cfg, server_url=None)  # the expert reads the env's goal / plan / answers: in-process
    factory = env_factory or make_env
    if detours and not (expert and hasattr(mod, "mistake")):
        raise ValueError(f"rollout: detours need expert=True and an env with mistake() ({env_cfg.name} "
                         f"{'has' if hasattr(mod, 'mistake') else 'has none'}, expert={expert})")
    rng = random.Random(seed)
    t0 = time.time()
    eps = []
    for g, tid in enumerate(task_ids):
        for j in range(group_size):
            ep = _Episode(env=None, group_id=g, episode_id=len(eps), task_id=tid)
            eps.append(ep)
            try:
                ep.env = factory(env_cfg)
                ep.obs, info = ep.env.reset(task_id=tid, seed=seed + g)
                ep.task, ep.admissible = info.get("task", ""), info.get("admissible_actions")
            except EnvError as e:
                ep.failed, ep.done = f"reset: {e}", True
    t_decode = t_relabel = 0.0
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(eps), desc="episodes", leave=False)
    for step in range(env_cfg.max_steps):
        active = [e for e in eps if not e.done]
        if not active:
            break
        prompts = [build_prompt(mod, tokenizer, e, env_cfg, step, max_prompt_tokens) for e in active]

        def decode_all(m):  # (response ids, text, trace, confidence, nfe_denoise, nfe_total, tokens TPF counts)
            outs = []
            for i in range(0, len(prompts), batch_size):
                dcfg = replace(decode_cfg, seed=decode_cfg.seed + 1000003 * seed + 7919 * step + i)
                res = generate(m, prompts[i:i + batch_size], dcfg, tokenizer)
                for k in range(len(res.tokens)):
                    outs.append((res.tokens[k], res.text[k], res.trace[k], res.confidence[k],
                                 res.nfe_denoise[k], res.nfe_total[k], res.n_generated[k] - int(res.stopped[k])))
            return outs

        def sample(e, p, ids, text, tr, conf):
            action, ok = mod.project(text)
            return StepSample(prompt_ids=p, response_ids=list(ids), trace=tr, confidence=conf, action=action,
                              valid=is_action_valid(action, ok, e.admissible, env_cfg.require_admissible),
                              reward=0.0, group_id=e.group_id, episode_id=e.episode_id, step=step, text=text,
                              think_len=action_start(tokenizer, ids), anchor=e.obs)

        def scripted(text):  # a response written, not decoded: no trace, no forwards
            return tokenizer.encode(text) + [tokenizer.eot_id], text, None, None, 0, 0, 0

        if expert:
            outs = []
            for e in active:
                wrong = None
                if detours and sum(e.wrong) < MAX_DETOURS and env_cfg.max_steps - step >= DETOUR_ROOM \
                        and rng.random() < detours:
                    wrong = mod.mistake(e.env, rng)
                e.wrong.append(wrong is not None)
                outs.append(scripted(mod.expert(e.env, rng) if wrong is None
                                     else f"<think>a detour.</think><action>{wrong}</action>"))
        else:
            td = time.time()
            outs = decode_all(model)
            t_decode += time.time() - td
        other = [None] * len(active)
        if by_expert:
            other = [scripted(mod.expert(e.env, rng)) for e in active]
        elif relabel is not None:
            tr0 = time.time()
            other = decode_all(relabel)
            t_relabel += time.time() - tr0
        for e, p, (ids, text, tr, conf, nd, nt, nc), o in zip(active, prompts, outs, other):
            e.samples.append(sample(e, p, ids, text, tr, conf))
            if o is not None:
                e.samples[-1].relabel = sample(e, p, *o[:4])
            action, valid = e.samples[-1].action, e.samples[-1].valid
            e.n_valid += int(valid)
            e.tokens += len(ids)
            e.nfe_denoise += nd
            e.nfe_total += nt
            e.tpf_tokens += nc
            try:
                obs, reward, done, info = e.env.step(action)
            except EnvError as err:
                e.failed, e.done = f"step {step}: {err}", True
                continue
            e.samples[-1].env_reward = float(reward)
            e.history.append((e.obs, action))
            e.obs, e.admissible = obs, info.get("admissible_actions")
            e.won, e.score = bool(info.get("won", False)), float(info.get("score", 0.0))
            e.reward += float(reward)
            if done or step + 1 >= env_cfg.max_steps:
                e.done = True
        if bar is not None:
            bar.n = sum(e.done for e in eps)
            bar.refresh()
    if bar is not None:
        bar.close()
    samples = []
    for e in eps:
        try:
            if e.env is not None:
                e.env.close()
        except EnvError:
            pass
        if e.failed:
            continue
        for s in e.samples:
            for t in (s, s.relabel) if s.relabel is not None else (s,):
                t.reward, t.won, t.score = e.reward, e.won, e.score
        wrong = e.wrong or [False] * len(e.samples)
        for i, s in enumerate(e.samples):
            s.prompt_loss = not any(wrong[max(0, i - env_cfg.history):i])  # the wrong action is never a target
        samples.extend(s for s, w in zip(e.samples, wrong) if not w)
    return samples, episode_metrics(eps, time.time() - t0, t_decode, t_relabel)


def first_failure(m: dict) -> Optional[str]:
    """The env error of the first failed episode in rollout metrics `m` (its "episodes"), or None."""
    return next((e["failed"] for e in m.get("episodes", []) if e.get("failed")), None)


def check_some_scored(m: dict, where: str) -> None:
    """EnvError when every episode of rollout metrics `m` failed in the env: their table would read as a
    model that wins nothing."""
    if m["num_episodes"] and m["failed_episodes"] == m["num_episodes"]:
        raise EnvError(f"{where}: every episode failed in the env, nothing was scored (first: {first_failure(m)})")


def episode_metrics(eps: list, wall: float, t_decode: float, t_relabel: float = 0.0) -> dict:
    ok = [e for e in eps if not e.failed]
    n = max(len(ok), 1)
    steps = sum(len(e.samples) for e in ok)
    counted = sum(e.tokens for e in ok)
    nd, nt = sum(e.nfe_denoise for e in ok), sum(e.nfe_total for e in ok)
    tpf_tokens = sum(e.tpf_tokens for e in ok)
    return {
        "episodes": [{"task_id": e.task_id, "group_id": e.group_id, "episode_id": e.episode_id, "won": e.won,
                      "score": e.score, "steps": len(e.samples), "valid": e.n_valid, "tokens": e.tokens,
                      "nfe_denoise": e.nfe_denoise, "nfe_total": e.nfe_total, "failed": e.failed} for e in eps],
        "num_episodes": len(eps), "failed_episodes": len(eps) - len(ok),
        "success": sum(e.won for e in ok) / n, "score": sum(e.score for e in ok) / n,
        "steps": steps / n, "valid_ratio": sum(e.n_valid for e in ok) / max(steps, 1),
        "invalid_per_episode": (steps - sum(e.n_valid for e in ok)) / n,
        "detours_per_episode": sum(sum(e.wrong) for e in ok) / n,  # expert rollouts: wrong actions taken
        "gen_tokens": counted, "nfe_denoise": nd, "nfe_total": nt,
        "tpf_denoise": tpf_tokens / max(nd, 1), "tpf_total": tpf_tokens / max(nt, 1),
        "time_rollout": wall, "time_decode": t_decode, "time_relabel": t_relabel,  # relabel: the second model's decodes
        "tokens_per_s": counted / max(t_decode, 1e-9),
    }


def format_samples(samples: list, tokenizer, limit: int = 20) -> str:
    """A readable text dump of step samples (for rollouts written every N steps)."""
    out = []
    for s in samples[:limit]:
        out.append(f"=== group {s.group_id} episode {s.episode_id} step {s.step} reward {s.reward} "
                   f"valid {s.valid} won {s.won}\n--- prompt\n{tokenizer.decode(s.prompt_ids)}\n"
                   f"--- response\n{s.text}\n--- action: {s.action}\n")
    return "\n".join(out)
