"""Text environments: the TextEnv protocol, the info keys, and the registry.

Every env is a plain Python object with

    reset(task_id=None, seed=None) -> (obs: str, info: dict)
    step(action: str)              -> (obs: str, reward: float, done: bool, info: dict)
    close()                        -> None

and its module also provides the prompt template, the action projection (model text ->
action string + format ok) and a scripted expert for SFT demonstrations. Envs import neither
torch nor the model: they also run as separate processes behind ``d3mini.envs.server``.

``info`` keys (reference/envs.md §5.2):
    task                 task text (instruction / question / goal)
    admissible_actions   list of admissible action strings, or None where the env has none
    is_action_valid      whether the last action parsed and was admissible
    won                  episode solved
    score                raw env score (WebShop reward in [0, 1], EM in {0, 1}, ...)
    step                 steps taken so far
    truncated            episode ended by the step limit
"""
from __future__ import annotations

import importlib
from typing import Any, Optional, Protocol, runtime_checkable

INFO_KEYS = ("task", "admissible_actions", "is_action_valid", "won", "score", "step", "truncated")


@runtime_checkable
class TextEnv(Protocol):
    def reset(self, task_id: Optional[int] = None, seed: Optional[int] = None) -> tuple[str, dict]: ...

    def step(self, action: str) -> tuple[str, float, bool, dict]: ...

    def close(self) -> None: ...


class EnvError(RuntimeError):
    """An environment could not be reached or failed; the message names the env / URL and the cause."""


# name -> "module:factory". A factory takes an EnvConfig and returns a TextEnv.
REGISTRY = {
    "webshop": "d3mini.envs.webshop:make",
    "search": "d3mini.envs.search:make",
    "alfworld": "d3mini.envs.alfworld:make",
}


def env_module(name: str):
    """The module of a registered env (it exposes prompt(), project(), expert() ...)."""
    if name not in REGISTRY:
        raise EnvError(f"unknown env {name!r} (known: {sorted(REGISTRY)})")
    return importlib.import_module(REGISTRY[name].split(":")[0])


def make_env(cfg: Any) -> TextEnv:
    """Build one env from an EnvConfig: an HTTP client when cfg.server_url is set, else in-process."""
    if getattr(cfg, "server_url", None):
        from d3mini.envs.server import EnvClient
        return EnvClient(cfg.server_url, env=cfg.name, timeout=cfg.timeout_s, retries=cfg.retries)
    mod = env_module(cfg.name)
    factory = getattr(mod, REGISTRY[cfg.name].split(":")[1])
    return factory(cfg)
