"""ALFWorld on the real engine: every game loads and the planner expert wins it, "Nothing happens." for
inadmissible commands, the expert following the state, the env server, prompts, splits, clear errors.

Tests marked `alfworld` need the extra (pip install -e ".[alfworld]") and skip without it; the rest run
anywhere. The games are the 5 of tests/fixtures/alfworld; with D3MINI_SLOW=1 (or in CI) also the 24-game
shared sample when it lies beside the repo (shared/data/alfworld) or where D3MINI_ALFWORLD_SAMPLE points.
"""
import importlib.util
import json
import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from d3mini.config import EnvConfig, load_config
from d3mini.envs import EnvError, EnvInputError, is_action_valid
from d3mini.envs import alfworld as A  # imports without the extra; the engine is imported on first use

REPO = Path(__file__).resolve().parents[1]
FIXTURE = REPO / "tests" / "fixtures" / "alfworld"
SAMPLE = Path(os.environ.get("D3MINI_ALFWORLD_SAMPLE", REPO.parent / "shared" / "data" / "alfworld"))


def has_extra() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in ("alfworld", "textworld", "fast_downward"))
    except (ImportError, ValueError):  # a module set to None in sys.modules
        return False


needs_extra = pytest.mark.skipif(not has_extra(), reason='needs the alfworld extra: pip install -e ".[alfworld]"')

BOWL = "valid_seen/look_at_obj_in_light-Bowl-None-DeskLamp-316/trial_T20190908_230702_962704"
CLOTH = "valid_unseen/pick_clean_then_place_in_recep-Cloth-None-Cabinet-424/trial_T20190908_022321_380927"


def cfg(**kw):
    return EnvConfig(**{"name": "alfworld", "data_dir": str(FIXTURE), "max_steps": 50, "obs_format": "text",
                        "prompt": "verl", **kw})


def play_expert(env, rng, tid):
    """Reset, let the expert play to the end; every response must be well-formed and admissible."""
    obs, info = env.reset(task_id=tid)
    rewards = []
    while True:
        action, ok = A.project(A.expert(env, rng))
        assert ok and is_action_valid(action, ok, info["admissible_actions"], True), (tid, action)
        obs, r, done, info = env.step(action)
        rewards.append(r)
        if done:
            return info, rewards


# ----------------------------------------------------------------------------- without the extra
def test_splits_and_task_ids(capsys, monkeypatch):
    monkeypatch.setattr(A, "_WARNED", set())  # the fallback warning is printed once per process
    c = cfg()
    assert A.task_ids(c, "test") == A.task_ids(c, "seen") == A.task_ids(c, "valid_seen")
    assert sorted(A.task_ids(c, "test")) == [BOWL, "valid_seen/pick_and_place_simple-Book-None-SideTable-329/"
                                             "trial_T20190908_050633_745514"]
    unseen = A.task_ids(c, "unseen")
    assert len(unseen) == 3 and CLOTH in unseen and unseen == A.task_ids(c, "unseen")  # fixed order
    assert A.task_ids(c, "train") == unseen  # no train/ folder: valid_unseen stands in, with a warning
    assert "no train/ games" in capsys.readouterr().err
    with pytest.raises(EnvInputError, match="unknown ALFWorld split 'dev'"):
        A.task_ids(c, "dev")
    # data_dir may also name the json_2.1.1 folder itself
    assert A.task_ids(cfg(data_dir=str(FIXTURE / "json_2.1.1")), "test") == A.task_ids(c, "test")


def test_missing_data_errors_name_the_setting(tmp_path, monkeypatch):
    monkeypatch.delenv("ALFWORLD_DATA", raising=False)
    for c in (cfg(data_dir=None), cfg(data_dir=str(tmp_path))):
        with pytest.raises(EnvError, match=r"ALFWorld game files not found.*env.data_dir \(or ALFWORLD_DATA\)"):
            A.make(c)
        with pytest.raises(EnvError, match="ALFWorld game files not found"):
            A.task_ids(c, "test")
    monkeypatch.setenv("ALFWORLD_DATA", str(FIXTURE))
    assert len(A.task_ids(cfg(data_dir=None), "test")) == 2


def test_module_imports_without_the_extra_and_make_says_how_to_install():
    """A fresh interpreter where textworld / alfworld / fast_downward cannot be imported."""
    code = textwrap.dedent(f"""
        import sys
        for m in ("textworld", "alfworld", "fast_downward"):
            sys.modules[m] = None
        from d3mini.config import EnvConfig
        from d3mini.envs import EnvError, make_env
        import d3mini.envs.alfworld as A
        c = EnvConfig(name="alfworld", data_dir={str(FIXTURE)!r})
        print(len(A.task_ids(c, "test")), A.project("<think>x</think><action>Look</action>"))
        try:
            make_env(c)
        except EnvError as e:
            print("ERR", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode == 0, r.stderr
    assert "2 ('look', True)" in r.stdout
    assert 'ERR ALFWorld needs the alfworld extra: pip install -e ".[alfworld]"' in r.stdout


def test_prompts_and_projection():
    c = cfg()
    first = "-= Welcome to TextWorld, ALFRED! =-\n\nYou are in a room.\n\nYour task is to: put a mug in desk."
    adm = ["go to desk 1", "inventory", "look"]
    p = A.prompt("put a mug in desk", first, [], adm, 0, c)
    assert p.count("Your task is to:") == 1 and first in p and "Prior to this step" not in p
    assert "[" + "'go to desk 1'\n 'inventory'\n 'look'" + "]" in p and "<think> </think>" in p
    hist = [(first, "go to desk 1"), ("You arrive at loc 3. On the desk 1, you see a mug 1.", "take mug 1 from desk 1")]
    p = A.prompt("put a mug in desk", "You pick up the mug 1.", hist, adm, 5, c)
    assert "Your task is to: put a mug in desk." in p and "already taken 5 step(s)" in p
    assert "[Observation 4: '" in p and "Action 5: 'take mug 1 from desk 1']" in p and "now at step 6" in p
    long = [("x" * 5000, "look")] * 2
    p = A.prompt("put a mug in desk", "You see.", long, adm, 2, c)
    assert "Prior to this step" not in p and "Your task is to: put a mug in desk." in p  # too long: no history
    p = A.prompt("put a mug in desk", "You pick up the mug 1.", hist, adm, 5, cfg(prompt="compact"))
    assert p.splitlines()[0] == "task: put a mug in desk" and "actions: go to desk 1 | inventory | look" in p
    assert len(p) < 400
    assert A.project("<think>a</think>\n<action> Go to desk 1 </action>") == ("go to desk 1", True)
    assert A.project("x" * 40 + "go to desk 1") == (("x" * 40 + "go to desk 1")[-30:], False)


def test_configs_load():
    for name in ("alfworld", "alfworld-llada", "alfworld-qwen3"):
        c = load_config(str(REPO / "configs" / f"{name}.yaml"), [f"env.data_dir={FIXTURE}"])
        assert c.env.name == "alfworld" and c.env.max_steps == 50 and c.env.prompt == "verl"
        assert len(A.task_ids(c.env, c.eval.split)) == 2


# ----------------------------------------------------------------------------- real engine
def check_games(root: Path) -> int:
    """Every game of both validation splits loads, and the planner expert wins it (each step admissible)."""
    c = cfg(data_dir=str(root))
    goals = {k.split("json_2.1.1/", 1)[1]: v["goal"] for k, v in json.loads((root / "walkthroughs.json").read_text()).items()}
    ids = A.task_ids(c, "seen") + A.task_ids(c, "unseen")
    assert sorted(ids) == sorted(goals)
    env, rng, wins = A.make(c), random.Random(0), 0
    for tid in ids:
        info, rewards = play_expert(env, rng, tid)
        assert info["task"] + "." == goals[tid] and info["task_id"] == tid and tid.split("/")[1].startswith(info["task_type"])
        assert info["gamefile"] == str(root / "json_2.1.1" / tid / "game.tw-pddl")
        assert info["won"] and info["score"] == 1.0 and rewards[-1] == 10.0 and sum(rewards) == 10.0
        assert not info["truncated"] and "help" not in info["admissible_actions"]
        wins += info["won"]
    env.close()
    print(f"planner expert won {wins}/{len(ids)} games of {root}")
    return wins


@pytest.mark.alfworld
@needs_extra
def test_fixture_games_load_and_planner_expert_wins():
    assert check_games(FIXTURE) == 5


@pytest.mark.alfworld
@pytest.mark.slow
@needs_extra
@pytest.mark.skipif(not (SAMPLE / "walkthroughs.json").is_file(), reason=f"no ALFWorld sample at {SAMPLE}")
@pytest.mark.skipif(not (os.environ.get("D3MINI_SLOW") or os.environ.get("CI")),
                    reason="24 games take ~65 s (load + reset ~1.8 s, step ~0.15 s); set D3MINI_SLOW=1 (CI runs it)")
def test_shared_sample_games_load_and_planner_expert_wins():
    assert check_games(SAMPLE) == 24


@pytest.mark.alfworld
@needs_extra
def test_translation_is_memoized_and_gives_sys_argv_back():
    A._engine_api()
    fd = sys.modules["fast_downward"]
    game = json.loads((FIXTURE / "json_2.1.1" / BOWL / "game.tw-pddl").read_text())
    argv = list(sys.argv)
    first = fd.pddl2sas(game["pddl_domain"], game["pddl_problem"] + "\n")  # a key no other test has used
    assert sys.argv == argv  # fast_downward rebinds sys.argv while it translates
    assert fd.pddl2sas(game["pddl_domain"], game["pddl_problem"] + "\n") is first


@pytest.mark.alfworld
@needs_extra
def test_inadmissible_is_nothing_happens_and_truncation():
    env = A.make(cfg(max_steps=4))
    obs, info = env.reset(task_id=BOWL)
    assert obs.startswith("-= Welcome to TextWorld, ALFRED! =-") and info["task"] == "examine the bowl with the desklamp"
    assert info["is_action_valid"] and info["step"] == 0 and info["won"] is False and info["score"] == 0.0
    adm = info["admissible_actions"]
    for bad in ("take bowl 1 from desk 1", "move bowl 1 to desk 1", "help"):  # not here yet / 0.4 grammar / hidden
        obs, r, done, info = env.step(bad)
        assert obs == "Nothing happens." and r == 0.0 and not done and info["is_action_valid"] is False
        assert is_action_valid(bad, True, adm, require_admissible=True) is False
        assert is_action_valid(bad, True, adm, require_admissible=False) is True
        assert info["admissible_actions"] == adm  # nothing changed
    obs, r, done, info = env.step("go to desk 1")
    assert "desk 1" in obs and info["is_action_valid"] and done and info["truncated"] and info["step"] == 4
    assert env.step("look")[2:] == (True, {**info, "is_action_valid": False})  # after the end: no-op
    env.close()


@pytest.mark.alfworld
@needs_extra
def test_expert_follows_the_state_and_replans():
    env, rng = A.make(cfg(obs_format="compact")), random.Random(1)
    obs, info = env.reset(task_id=CLOTH)
    assert "Welcome" not in obs and "Your task" not in obs and info["task"] == "clean some cloth and put it in cabinet"
    walk = A._walkthroughs(env.gdir)[CLOTH]
    resp = A.expert(env, rng)
    assert resp.startswith("<think>") and resp.endswith(f"</think>\n<action>{walk[0]}</action>")
    env.step(walk[0])
    env.step("look")                    # neutral, admissible
    env.step("jump over the cabinet")   # inadmissible: "Nothing happens."
    assert A.project(A.expert(env, rng))[0] == walk[1] and env.plan[0] == 0  # still on the walkthrough
    detour = next(a for a in env.adm if a.startswith("go to") and a != walk[2])
    obs, *_ = env.step(detour)
    assert "You arrive at loc" not in obs  # compact drops 0.3's location ids
    resp = A.expert(env, rng)
    assert any(p in resp for p in A.REPLAN) and env.plan[0] == len(env.trace)  # off the plan: the planner again
    info = {"won": False}
    while not env.done:
        obs, r, done, info = env.step(A.project(A.expert(env, rng))[0])
    assert info["won"] and not info["truncated"]
    env.close()
    with pytest.raises(EnvError, match="in-process AlfWorldEnv"):
        A.expert(object(), rng)
    with pytest.raises(EnvInputError, match="not a game"):
        A.make(cfg()).reset(task_id="valid_seen/../../etc")


@pytest.mark.alfworld
@needs_extra
def test_env_server_serves_alfworld():
    from d3mini.envs import make_env
    from d3mini.envs.server import EnvClient, serve_in_thread
    srv = serve_in_thread(cfg())
    try:
        c = cfg(server_url=srv.url, retries=0, timeout_s=60)
        remote, local, rng = make_env(c), A.make(cfg()), random.Random(2)
        assert isinstance(remote, EnvClient)
        got, want = remote.reset(task_id=BOWL), local.reset(task_id=BOWL)
        assert got == want
        done = False
        while not done:
            action = A.project(A.expert(local, rng))[0]
            got, want = remote.step(action), local.step(action)
            assert got == want
            done = got[2]
        assert got[1] == 10.0 and got[3]["won"] and got[3]["gamefile"].endswith("game.tw-pddl")
        assert remote.reset(task_id=CLOTH)[1]["task_id"] == CLOTH
        assert remote.step("move cloth 1 to cabinet 1")[0] == "Nothing happens."
        with pytest.raises(EnvError, match=r"rejected the request \(400\).*not a game"):
            remote.reset(task_id="valid_seen/nope")
        with pytest.raises(EnvError, match="in-process AlfWorldEnv"):
            A.expert(remote, rng)
        remote.close()
        local.close()
    finally:
        srv.shutdown()
        srv.server_close()
