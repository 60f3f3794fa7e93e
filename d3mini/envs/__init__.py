"""Text environments: the TextEnv protocol, the info keys, the per-env module interface, the registry.

Every env is a plain Python object with

    reset(task_id=None, seed=None) -> (obs: str, info: dict)
    step(action: str)              -> (obs: str, reward: float, done: bool, info: dict)
    close()                        -> None

``step`` takes the projected action string, never the raw model output. Envs import neither
torch nor the model: they also run as separate processes behind ``d3mini.envs.server``, whose
``EnvClient`` is a TextEnv over HTTP.

``info`` keys (reference/envs.md §5.2), present after reset and after every step:
    task                 task text (instruction / question / goal)
    task_id              goal index, game file or QA id of this episode
    admissible_actions   list of admissible action strings in the new state, or None where the env has none
    is_action_valid      the env's view of the last action: it parsed and was admissible (True after reset);
                         the format check happens outside the env, see is_action_valid() below
    won                  episode solved
    score                raw env score (WebShop reward in [0, 1], EM in {0, 1}, ALFWorld won)
    step                 steps taken so far
    truncated            episode ended by the step limit
Envs may add extras (WebShop ``reward_info``, ALFWorld ``gamefile``, Search ``golden_answers``);
extras are never shown in prompts.

Each env module ``d3mini.envs.<name>`` exposes the same functions, used uniformly by the rollout:

    make(cfg: EnvConfig) -> TextEnv
        one in-process env (the registry's factory).
    task_ids(cfg, split: str) -> list
        the task ids of "train" or "test" (a fixed held-out split); reset(task_id) accepts them.
    prompt(task, obs, history, admissible, step, cfg) -> str
        the user-message text of one step (the rollout applies the chat template). history is the
        last cfg.history (observation, action) pairs before this step, step the number of steps
        already taken, admissible the current info["admissible_actions"]. cfg.prompt selects
        "verl" (a paraphrase of verl-agent's template, with its no-history form for the first
        step and for prompts that grow too long) or "compact" (a few lines for tiny models with a
        context of ~1-2k tokens).
    project(text) -> (action: str, format_ok: bool)
        model text -> action string (reference/envs.md §4.4; WebShop/ALFWorld via project_action).
    expert(env, rng: random.Random) -> str
        the scripted expert's full response for the current state of an in-process env made by
        make(cfg): a short <think> drawn at random from a few phrasings, then the action in the
        env's tags, so SFT episodes have exactly the shape of model responses. It may read
        privileged state (the goal) and raises EnvError for an HTTP client.
    mistake(env, rng) -> Optional[str]            (optional; WebShop has it)
        a plausible wrong action for the current state, or None where none fits: SFT detours
        (sft.detours) take it instead of the expert's action, untrained, so that the expert's
        next steps demonstrate the recovery from where it leads.

The final validity of a step (reward gating, DESIGN.md §4.6) is is_action_valid(action, format_ok,
admissible, cfg.require_admissible), computed by the rollout with the admissible list shown in
the prompt.
"""
from __future__ import annotations

import importlib
import re
from typing import Any, Optional, Protocol, runtime_checkable

INFO_KEYS = ("task", "task_id", "admissible_actions", "is_action_valid", "won", "score", "step", "truncated")


@runtime_checkable
class TextEnv(Protocol):
    def reset(self, task_id: Optional[int] = None, seed: Optional[int] = None) -> tuple[str, dict]: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...

    def close(self) -> None: ...


class EnvError(RuntimeError):
    """An environment could not be reached or failed; the message names the env / URL and the cause."""


class EnvInputError(EnvError):
    """The caller asked for something the env cannot do (unknown task id, split ...); HTTP 400."""


# name -> "module:factory". A factory takes an EnvConfig and returns a TextEnv.
REGISTRY = {
    "webshop": "d3mini.envs.webshop:make",
    "search": "d3mini.envs.search:make",
    "alfworld": "d3mini.envs.alfworld:make",
}


def env_module(name: str):
    """The module of a registered env (it exposes make(), task_ids(), prompt(), project(), expert())."""
    if name not in REGISTRY:
        raise EnvError(f"unknown env {name!r} (known: {sorted(REGISTRY)})")
    return importlib.import_module(REGISTRY[name].split(":")[0])


def make_env(cfg: Any) -> TextEnv:
    """Build one env from an EnvConfig: an HTTP client when cfg.server_url is set, else in-process."""
    if getattr(cfg, "server_url", None):
        from d3mini.envs.server import EnvClient
        return EnvClient(cfg.server_url, env=cfg.name, timeout=cfg.timeout_s, retries=cfg.retries,
                         backoff=getattr(cfg, "backoff_s", 0.5))
    mod = env_module(cfg.name)
    factory = getattr(mod, REGISTRY[cfg.name].split(":")[1])
    return factory(cfg)


def task_ids(cfg: Any, split: str = "train") -> list:
    """Task ids of a split ("train" | "test") of the env named cfg.name."""
    return env_module(cfg.name).task_ids(cfg, split)


# ----------------------------------------------------------------------------- shared helpers
_CJK = re.compile(r"[\u4e00-\u9fff]")


def project_action(text: str, tail: int = 20) -> tuple[str, bool]:
    """verl-agent's WebShop / ALFWorld projection (reference/envs.md §4.4): the lower-cased text between
    the first <action> and the next </action>. Without both tags the action is the last `tail`
    characters and the format fails; it also fails without <think> and </think> (case-sensitive), with
    a CJK character, with more than one <action> tag (d3mini: exactly one action), or an empty action."""
    low = text.lower()
    start = low.find("<action>")
    end = low.find("</action>", start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return low[-tail:].strip(), False
    action = low[start + len("<action>"):end].strip()
    ok = ("<think>" in text and "</think>" in text and not _CJK.search(text)
          and low.count("<action>") == 1 and low.count("</action>") == 1 and action != "")
    return action, ok


def action_start(tokenizer, ids: list) -> int:
    """Index of the response token in which the first `<action>` tag begins (case-insensitive, as
    project_action reads it): the tokens before it are the think text. len(ids) without the tag."""
    pieces = [tokenizer.decode([t]) for t in ids]
    at = "".join(pieces).lower().find("<action>")
    if at < 0:
        return len(ids)
    end = 0
    for i, piece in enumerate(pieces):
        end += len(piece)
        if end > at:
            return i
    return len(ids)


def _canonical(action: str) -> str:
    m = re.fullmatch(r"\s*(\w+)\s*\[\s*(.*?)\s*\]\s*", action, re.S)
    return f"{m.group(1)}[{m.group(2)}]" if m else action.strip()


def is_action_valid(action: str, format_ok: bool, admissible: Optional[list], require_admissible: bool = True) -> bool:
    """format_ok and (no admissible list, or the check is off, or the action is listed). A listed
    search placeholder (WebShop's 'search[<your query>]') admits every search[...] with a non-empty query."""
    if not format_ok:
        return False
    if admissible is None or not require_admissible:
        return True
    a = _canonical(action)
    if a in admissible:
        return True
    return a.startswith("search[") and a != "search[]" and any(x.startswith("search[") for x in admissible)


def history_steps(history: list, step: int) -> list:
    """[(k, obs, action)] with absolute 1-based step numbers for the last len(history) steps before `step`+1."""
    first = step - len(history) + 1
    return [(first + i, o, a) for i, (o, a) in enumerate(history)]
