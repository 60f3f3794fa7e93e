"""ALFWorld text games on the real engine (alfworld 0.4.2 + textworld 1.7.0's PDDL env) behind TextEnv.

    pip install -e ".[alfworld]"                  # alfworld==0.4.2; fast-downward compiles with cmake, g++, make
    export ALFWORLD_DATA=/path/to/alfworld        # or env.data_dir: the folder that holds json_2.1.1/

Each game is a ``json_2.1.1/<split>/<task>/<trial>/game.tw-pddl`` (reference/envs.md §2.2-2.3); its
task id is the path below ``json_2.1.1`` ("valid_seen/<task>/<trial>"). Splits: "train" = train/
(when the data has none, e.g. the 24-game sample, valid_unseen stands in, with a warning), "test" =
valid_seen (verl-agent validates on eval_in_distribution; the configs' 140 games), and the explicit
names "seen" / "valid_seen" and "unseen" / "valid_unseen". Games are filtered as AlfredTWEnv does
(solvable only, no 'movable' / 'Sliced' trials) and listed in a fixed shuffle, so that a prefix mixes
the six task types.

The engine is what AlfredTWEnv runs per game: textworld's PddlEnv wrapped by alfworld's
AlfredDemangler (ALFRED ids -> "cabinet 3"), without name shuffling. Differences to verl-agent: no
gym/batch layer, ``help`` is never admissible, a command outside the admissible list answers
"Nothing happens." (what the engine says) without reaching it, and ``cfg.max_steps`` truncates.
Reward 10 x won on the winning step, score = won (verl-agent). The task is the text after "Your task
is to: " in the first observation.

The expert replays the PDDL planner's walkthrough (walkthroughs.json beside json_2.1.1/, else the
game file's own, else the planner), and asks the planner again from the current state once the
episode has left it. alfworld's hand-coded expert speaks the 0.4 grammar ("move X to Y") and fails
the placing steps of 0.3-era games ("put X in/on Y"), so it is not used (§2.7-2.8).
"""
from __future__ import annotations

import functools
import json
import os
import random
import re
import sys
import threading
from typing import Optional

from d3mini.envs import EnvError, EnvInputError, history_steps, project_action

INSTALL = 'pip install -e ".[alfworld]"  (alfworld==0.4.2; its fast-downward-textworld compiles with cmake, g++ and make)'
SPLITS = {"test": "valid_seen", "seen": "valid_seen", "valid_seen": "valid_seen",
          "unseen": "valid_unseen", "valid_unseen": "valid_unseen", "train": "train"}
NOTHING = "Nothing happens."
NEUTRAL = ("look", "inventory", "examine", "help")  # verbs that leave the world as it is (plan tracking skips them)
_WARNED: set = set()


# ----------------------------------------------------------------------------- data
def games_dir(cfg) -> str:
    """The json_2.1.1 folder from cfg.data_dir or $ALFWORLD_DATA (either the folder holding it or itself)."""
    root = cfg.data_dir or os.environ.get("ALFWORLD_DATA")
    hint = ("set env.data_dir (or ALFWORLD_DATA) to the folder that holds json_2.1.1/{train,valid_seen,valid_unseen}/"
            "<task>/<trial>/game.tw-pddl: `alfworld-download` fetches the full set; tests/fixtures/alfworld has 5 games")
    if not root:
        raise EnvError(f"ALFWorld game files not found: {hint}")
    root = os.path.abspath(os.path.expanduser(root))
    sub = os.path.join(root, "json_2.1.1")
    d = sub if os.path.isdir(sub) else root
    if not any(_list_games(d, s) for s in ("train", "valid_seen", "valid_unseen")):
        raise EnvError(f"ALFWorld game files not found: no solvable game.tw-pddl under {d}; {hint}")
    return d


@functools.lru_cache(maxsize=None)
def _list_games(gdir: str, split: str) -> tuple:
    """Ids of the solvable games of one split folder, sorted (cached: train has 3,553 files of ~80 KB)."""
    base, ids = os.path.join(gdir, split), []
    for root, _, files in os.walk(base):
        rel = os.path.relpath(root, gdir).replace(os.sep, "/")
        if "game.tw-pddl" not in files or "movable" in rel or "Sliced" in rel:
            continue
        with open(os.path.join(root, "game.tw-pddl")) as f:
            text = f.read()
        # a regex instead of json.load: AlfredTWEnv skips games without `"solvable": true`, and parsing
        # every file just for that key costs seconds on the train split
        if re.search(r'"solvable"\s*:\s*true', text):
            ids.append(rel)
    return tuple(sorted(ids))


def task_ids(cfg, split: str = "train") -> list:
    """Game ids of a split in a fixed shuffle (seed 0, independent of cfg.seed)."""
    if split not in SPLITS:
        raise EnvInputError(f"unknown ALFWorld split {split!r} ({' | '.join(SPLITS)})")
    gdir = games_dir(cfg)
    ids = list(_list_games(gdir, SPLITS[split]))
    if split == "train" and not ids:
        ids = list(_list_games(gdir, "valid_unseen"))
        if gdir not in _WARNED:
            _WARNED.add(gdir)
            print(f"alfworld: {gdir} has no train/ games; 'train' uses valid_unseen ({len(ids)} games)", file=sys.stderr)
    random.Random(0).shuffle(ids)
    return ids


@functools.lru_cache(maxsize=8)
def _walkthroughs(gdir: str) -> dict:
    """{task id: planner walkthrough} from a walkthroughs.json beside (or inside) json_2.1.1/, keyed json_2.1.1/<id>."""
    for path in (os.path.join(os.path.dirname(gdir), "walkthroughs.json"), os.path.join(gdir, "walkthroughs.json")):
        if os.path.isfile(path):
            with open(path) as f:
                raw = json.load(f)
            return {k.split("json_2.1.1/", 1)[-1]: v["walkthrough"] for k, v in raw.items()}
    return {}


# ----------------------------------------------------------------------------- engine
_TRANSLATE_LOCK = threading.Lock()
_POOL: list = []  # idle engines; each holds its own copy of libdownward.so, so they are reused, not rebuilt
_POOL_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _engine_api():
    """(EnvInfos, PddlEnv, AlfredDemangler), imported on first use so d3mini imports without the extra."""
    try:
        import fast_downward
        import textworld
        from alfworld.agents.environment.alfred_tw_env import AlfredDemangler
        from textworld.envs.pddl import PddlEnv
    except ImportError as e:
        raise EnvError(f"ALFWorld needs the alfworld extra: {INSTALL} ({type(e).__name__}: {e})") from None
    _patch_translation(fast_downward)
    return textworld.EnvInfos, PddlEnv, AlfredDemangler


def _patch_translation(fd) -> None:
    """textworld's PddlState translates PDDL -> SAS twice at load and twice again at every reset. The
    translation is a pure function of its arguments, but it flips module-global options and rebinds
    sys.argv: memoize it (halves load + reset, makes a group's resets of one game ~free), serialize
    it (threaded env server) and give sys.argv back."""
    raw = fd.pddl2sas
    if getattr(raw, "d3mini_cached", False):
        return

    @functools.lru_cache(maxsize=64)
    def cached(domain, problem, verbose, optimize):
        argv = sys.argv
        try:
            return raw(domain, problem, verbose=verbose, optimize=optimize)
        finally:
            sys.argv = argv

    def pddl2sas(domain, problem, verbose=False, optimize=False):
        with _TRANSLATE_LOCK:
            return cached(domain, problem, verbose, optimize)

    pddl2sas.d3mini_cached = True
    fd.pddl2sas = pddl2sas


class _Engine:
    """One textworld PddlEnv (wrapped by AlfredDemangler) and the game file it has loaded."""

    def __init__(self):
        EnvInfos, PddlEnv, AlfredDemangler = _engine_api()
        self.tw = AlfredDemangler(shuffle=False)(PddlEnv(EnvInfos(won=True, admissible_commands=True)))
        self.game: Optional[str] = None

    def reset(self, gamefile: str):
        if self.game != gamefile:
            self.game = None  # a failed load leaves no stale game behind
            self.tw.load(gamefile)
            self.game = gamefile
        return self.tw.reset()

    def plan(self) -> list:
        """The planner's commands from the current state (what EnvInfos(policy_commands=True) would compute
        on every step; asked for only when the expert needs it, since it can take seconds)."""
        return list(self.tw._pddl_state.replan(self.tw._entity_infos))


# ----------------------------------------------------------------------------- environment
class AlfWorldEnv:
    def __init__(self, cfg):
        self.cfg, self.gdir = cfg, games_dir(cfg)
        _engine_api()  # fail here, at make(), when the extra is missing
        self.engine: Optional[_Engine] = None
        self.task_id: Optional[str] = None

    def reset(self, task_id=None, seed=None) -> tuple[str, dict]:
        if task_id is None:
            task_id = random.Random(seed).choice(task_ids(self.cfg, "train"))
        tid = str(task_id).strip("/")
        gamefile = os.path.join(self.gdir, tid, "game.tw-pddl")
        if ".." in tid.split("/") or not os.path.isfile(gamefile):
            raise EnvInputError(f"ALFWorld task_id {task_id!r} is not a game under {self.gdir} "
                                "(ids look like 'valid_seen/<task>/<trial>')")
        if self.engine is None:
            with _POOL_LOCK:
                self.engine = _POOL.pop() if _POOL else None
            self.engine = self.engine or _Engine()
        self.task_id = None  # should the engine fail below, step() refuses rather than play a half-loaded game
        state = self.engine.reset(gamefile)
        m = re.search(r"Your task is to: (.*)", state.feedback)
        self.task_id, self.gamefile = tid, gamefile
        self.task = m.group(1).strip().rstrip(".") if m else ""
        self.task_type = tid.split("/")[1].split("-")[0] if "/" in tid else ""
        self.obs, self.adm = self._render(state.feedback), self._admissible(state)
        self.trace: list = []  # admissible actions taken, in order (the expert follows its plan along them)
        self.plan: Optional[tuple] = None  # expert: (len(trace) when made, commands)
        self.steps, self.done, self.won, self.truncated = 0, False, False, False
        return self.obs, self._info(True)

    @staticmethod
    def _admissible(state) -> list:
        return [c for c in state["admissible_commands"] if c != "help"]

    def _render(self, text: str) -> str:
        """Raw engine text; "compact" drops the banner, the task line and 0.3's 'You arrive at loc N.'."""
        if self.cfg.obs_format != "compact":
            return text
        text = re.sub(r"-= Welcome to TextWorld, ALFRED! =-|Your task is to: .*|You arrive at loc \d+\. ", "", text)
        return re.sub(r"\s*\n\s*", "\n", text).strip()

    def _info(self, valid: bool) -> dict:
        return {"task": self.task, "task_id": self.task_id, "admissible_actions": list(self.adm),
                "is_action_valid": valid, "won": self.won, "score": float(self.won), "step": self.steps,
                "truncated": self.truncated, "gamefile": self.gamefile, "task_type": self.task_type}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.task_id is None:
            raise EnvError("ALFWorld: call reset() before step()")
        if self.done:
            return self.obs, 0.0, True, self._info(False)
        self.steps += 1
        cmd = " ".join((action or "").lower().split())
        valid, reward = cmd in self.adm, 0.0
        if valid:
            state, _, _ = self.engine.tw.step(cmd)
            self.trace.append(cmd)
            self.obs, self.adm = self._render(state.feedback), self._admissible(state)
            if state["won"]:
                self.won = self.done = True
                reward = 10.0
        else:  # the engine answers the same for any command it cannot parse or apply
            self.obs = NOTHING
        if not self.done and self.steps >= self.cfg.max_steps:
            self.done = self.truncated = True
        return self.obs, reward, self.done, self._info(valid)

    def close(self) -> None:
        if self.engine is not None:
            with _POOL_LOCK:
                _POOL.append(self.engine)
            self.engine = None
        self.task_id = None


def make(cfg) -> AlfWorldEnv:
    return AlfWorldEnv(cfg)


# ----------------------------------------------------------------------------- prompts
VERL_TEMPLATE = ("You are an expert agent acting in the ALFRED embodied household environment. "
                 "{task}{hist}{now}current observation is: {obs}\n"
                 "Your admissible actions in the current situation are: [{acts}].\n\n"
                 "Now it is your turn to act. First reason step by step about the situation and about what "
                 "brings you closer to the goal, inside <think> </think> tags. Then give exactly one "
                 "admissible action inside <action> </action> tags.")
VERL_MAX_CHARS = 8000  # ~2,048 tokens, verl-agent's ALFWorld prompt budget; longer prompts drop the history


def prompt(task: str, obs: str, history: list, admissible: Optional[list], step: int, cfg) -> str:
    """The user message of one step (history = the last H (observation, action) pairs before it)."""
    steps = history_steps(history, step)
    acts = admissible or []
    if cfg.prompt == "compact":
        lines = [f"task: {task}"]
        lines += [f"step {k}: {o[:80].replace(chr(10), ' ')} -> {a}" for k, o, a in steps]
        lines += [f"now: {obs}", "actions: " + " | ".join(acts),
                  "reply <think>...</think><action>one action from the list</action>"]
        return "\n".join(lines)
    acts_text = "\n ".join(f"'{a}'" for a in acts)
    if steps:
        hist = "\n".join(f"[Observation {k}: '{o}', Action {k}: '{a}']" for k, o, a in steps)
        full = VERL_TEMPLATE.format(
            task=f"Your task is to: {task}.", obs=obs, acts=acts_text, now=f"You are now at step {step + 1} and your ",
            hist=f" Prior to this step you have already taken {step} step(s). Below are the most recent "
                 f"{len(steps)} observations and the actions you took:\n{hist}\n")
        if len(full) <= VERL_MAX_CHARS:
            return full
    # verl-agent's no-history form: at the first step the observation itself states the task
    task_line = "" if "Your task is to:" in obs else f"Your task is to: {task}. "
    return VERL_TEMPLATE.format(task=task_line, hist="", now="Your ", obs=obs, acts=acts_text)


def project(text: str) -> tuple[str, bool]:
    """<action>...</action> -> action; without the tags the last 30 characters (verl-agent's ALFWorld rule)."""
    return project_action(text, tail=30)


# ----------------------------------------------------------------------------- expert
THOUGHTS = {
    "go": ["i should go to the {x}.", "next i head to the {x}.", "the {x} is where i need to be now."],
    "take": ["i pick up what i need: {x}.", "time to take it: {x}.", "i should take this now: {x}."],
    "put": ["now i put it down: {x}.", "place it where the task wants: {x}.", "i can put it in place: {x}."],
    "open": ["the {x} is closed; open it.", "let me open the {x}.", "i need to open the {x} first."],
    "close": ["close the {x} again.", "i should close the {x}.", "shut the {x}."],
    "use": ["switch on the {x}.", "i turn on the {x}.", "use the {x} to see."],
    "heat": ["heat it: {x}.", "it has to be hot: {x}.", "warm it up: {x}."],
    "cool": ["cool it: {x}.", "it has to be cold: {x}.", "chill it: {x}."],
    "clean": ["clean it: {x}.", "it has to be clean: {x}.", "wash it: {x}."],
    "slice": ["slice it: {x}.", "cut it: {x}.", "it needs slicing: {x}."],
    "other": ["next: {x}.", "i will do this: {x}.", "the plan says: {x}."],
}
REPLAN = ["that left my plan; from here: ", "plans changed, so ", "i went off track; now "]


def _walkthrough(env: AlfWorldEnv) -> list:
    w = _walkthroughs(env.gdir).get(env.task_id) or getattr(env.engine.tw, "walkthrough", None)
    return list(w) if w else env.engine.plan()


def expert_action(env: AlfWorldEnv) -> tuple[str, str, bool]:
    """(verb, command, replanned): the next command of the plan while the episode follows it (look /
    inventory / examine and inadmissible actions change nothing and are skipped); else a new plan."""
    if env.done:
        return "other", "look", False
    if env.plan is None:
        env.plan = (0, _walkthrough(env))
    start, cmds = env.plan
    moves = [a for a in env.trace[start:] if a.split()[0] not in NEUTRAL]
    replanned = not (moves == cmds[:len(moves)] and len(moves) < len(cmds) and cmds[len(moves)] in env.adm)
    if replanned:
        try:
            cmds = env.engine.plan()
        except Exception:  # the planner failing must not end an SFT run; a harmless look keeps the episode going
            cmds = []
        env.plan, moves = (len(env.trace), cmds), []
        if not cmds or cmds[0] not in env.adm:
            return "other", "look", True
    cmd = cmds[len(moves)]
    return cmd.split()[0], cmd, replanned


def expert(env: AlfWorldEnv, rng: random.Random) -> str:
    """The expert's response for the env's current state: a short <think>, then the planner's next command."""
    if not isinstance(env, AlfWorldEnv):
        raise EnvError("the ALFWorld expert needs an in-process AlfWorldEnv (it reads the game's plan), "
                       f"got {type(env).__name__}")
    if env.task_id is None:
        raise EnvError("ALFWorld expert: call reset() first")
    verb, cmd, replanned = expert_action(env)
    key = verb if verb in THOUGHTS else "other"
    words = cmd.split(" ")  # the receptacle for go / open / close / use, else the whole command
    x = " ".join(words[2:]) if verb == "go" else " ".join(words[1:]) if verb in ("open", "close", "use") else cmd
    think = (rng.choice(REPLAN) if replanned and env.steps else "") + rng.choice(THOUGHTS[key]).format(x=x)
    return f"<think>{think}</think>\n<action>{cmd}</action>"
