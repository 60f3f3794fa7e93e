"""Agent rollouts: batched equals one by one at temperature 0; env failures are contained."""
import dataclasses

import pytest
import torch

from d3mini.config import Config, EnvConfig, ModelConfig
from d3mini.data import build_tiny_tokenizer
from d3mini.envs import EnvError, make_env, task_ids
from d3mini.envs.server import EnvClient, serve_in_thread
from d3mini.model import DiffusionLM
from d3mini.decode import generate
from d3mini.envs import webshop
from d3mini.rollout import rollout

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def setup():
    cfg = Config()
    cfg.env = dataclasses.replace(cfg.env, num_products=40, num_goals=40, num_test_goals=10, max_steps=3)
    ids = task_ids(cfg.env, "train")[:6]
    boot = build_tiny_tokenizer(["x"], 300)
    samples, m = rollout(None, boot, cfg.env, cfg.decode, ids, expert=True)
    tok = build_tiny_tokenizer([boot.decode(s.prompt_ids) + s.text for s in samples], 320)
    mc = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=16, block_size=4, mask_id=tok.mask_id, eos_ids=tok.stop_ids)
    torch.manual_seed(0)
    model = DiffusionLM.from_config(mc).eval()
    dcfg = dataclasses.replace(cfg.decode, block_size=4, threshold=0.9, max_new_tokens=12)
    return cfg, tok, model, dcfg, ids


def test_expert_rollout_records_samples(setup):
    cfg, tok, _, dcfg, ids = setup
    samples, m = rollout(None, tok, cfg.env, dcfg, ids[:3], group_size=2, expert=True)
    assert m["num_episodes"] == 6 and m["failed_episodes"] == 0
    assert all(s.response_ids[-1] == tok.eot_id and s.valid for s in samples)
    assert {s.group_id for s in samples} == {0, 1, 2}
    for s in samples:  # every step sample carries its episode's reward
        assert s.reward == (10.0 if s.won else 0.0)
    for e in m["episodes"]:  # the step rewards sum to the episode's; each anchor is the observation acted on
        mine = sorted((s for s in samples if s.episode_id == e["episode_id"]), key=lambda s: s.step)
        assert sum(s.env_reward for s in mine) == mine[0].reward
        env = make_env(cfg.env)
        obs, _ = env.reset(task_id=e["task_id"], seed=e["group_id"])
        for s in mine:
            assert s.anchor == obs
            obs, reward, _, _ = env.step(s.action)
            assert s.env_reward == reward


def test_batched_equals_one_by_one(setup):
    cfg, tok, model, dcfg, ids = setup
    with torch.no_grad():
        batched, mb = rollout(model, tok, cfg.env, dcfg, ids[:2], group_size=3, batch_size=64)
        single = []
        for tid in ids[:2]:
            for _ in range(3):
                s, _ = rollout(model, tok, cfg.env, dcfg, [tid], group_size=1, batch_size=1)
                single.append(s)
    key = lambda s: (s.step, s.prompt_ids, s.response_ids, s.action, s.valid, s.trace)
    per_ep = {}
    for s in batched:
        per_ep.setdefault(s.episode_id, []).append(key(s))
    assert list(per_ep.values()) == [[key(s) for s in ep] for ep in single]
    assert mb["nfe_denoise"] > 0 and mb["tpf_denoise"] > 0


def test_detours_leave_out_the_wrong_steps_and_keep_the_recoveries(setup):
    """rollout(detours=p): the returned steps are exactly the expert's answers to the states the episode was
    in, wrong actions taken between them (read back from the prompts' history) are left out, and each is
    followed by the expert's recovery; p = 0 consumes no randomness (the samples of a plain call)."""
    cfg, tok, _, dcfg, _ = setup
    env_cfg = EnvConfig(obs_format="compact", prompt="compact", history=3)
    ids = task_ids(env_cfg, "train")[:30]
    plain, _ = rollout(None, tok, env_cfg, dcfg, ids, expert=True, seed=3)
    zero, _ = rollout(None, tok, env_cfg, dcfg, ids, expert=True, seed=3, detours=0.0)
    assert [(s.text, s.prompt_ids) for s in plain] == [(s.text, s.prompt_ids) for s in zero]
    samples, m = rollout(None, tok, env_cfg, dcfg, ids, expert=True, seed=3, detours=0.3)
    assert m["detours_per_episode"] >= 0.5 and m["success"] >= 0.9
    n_detours = kinds = 0
    for e in m["episodes"]:
        mine = {s.step: s for s in samples if s.episode_id == e["episode_id"]}
        env = webshop.make(env_cfg)
        env.reset(task_id=e["task_id"])
        for t in range(e["steps"]):
            if t in mine:
                assert "a detour" not in mine[t].text and mine[t].action == webshop.expert_action(env)[1]
                env.step(mine[t].action)
                continue
            later = mine[min(k for k in mine if k > t)]  # a detour is never the last step
            history = [line for line in tok.decode(later.prompt_ids).split("\n") if line.startswith(f"step {t + 1}: ")]
            wrong = history[0].rsplit(" -> ", 1)[1]
            assert wrong != webshop.expert_action(env)[1]
            kinds += wrong[len("click["):-1] not in env.clickables()  # an invalid click: the page stays
            env.step(wrong)
            n_detours += 1
        assert env.done and env.score == e["score"]
    assert n_detours == round(m["detours_per_episode"] * len(ids)) and len(samples) + n_detours == m["steps"] * len(ids)
    assert 0 < kinds < n_detours
    for s in samples:  # the prompts that show a detour are not SFT prompt-loss targets (sft.ar_prompt_loss)
        t = s.step
        shown = [k for k in range(max(0, t - env_cfg.history), t) if k not in
                 {x.step for x in samples if x.episode_id == s.episode_id}]
        assert s.prompt_loss == (not shown)
    assert not all(s.prompt_loss for s in samples) and all(s.prompt_loss for s in plain)
    with pytest.raises(ValueError, match="detours need expert=True"):
        rollout(None, tok, env_cfg, dcfg, ids[:1], detours=0.1)


def test_relabel_answers_the_visited_prompts_and_never_steers(setup):
    """rollout(relabel=m2): m2 answers every prompt the policy's episodes visit (its response, trace and
    projected action in StepSample.relabel, with the episode's outcome), and the episodes are exactly the
    ones the policy runs alone: the env only sees the policy's actions."""
    cfg, tok, model, dcfg, ids = setup
    torch.manual_seed(1)
    other = DiffusionLM.from_config(model.cfg).eval()
    key = lambda s: (s.episode_id, s.step, s.prompt_ids, s.response_ids, s.trace, s.action, s.valid, s.won)
    with torch.no_grad():
        alone, ma = rollout(model, tok, cfg.env, dcfg, ids[:3], group_size=2)
        both, mb = rollout(model, tok, cfg.env, dcfg, ids[:3], group_size=2, relabel=other)
        same, _ = rollout(model, tok, cfg.env, dcfg, ids[:3], group_size=2, relabel=model)
        assert [key(s) for s in both] == [key(s) for s in alone] and mb["nfe_denoise"] == ma["nfe_denoise"]
        assert ma["time_relabel"] == 0.0 and 0.0 < mb["time_relabel"] < mb["time_rollout"]  # timed apart
        assert all(s.relabel is None for s in alone) and all(key(s.relabel) == key(s) for s in same)
        for s in both:
            r, ref = s.relabel, generate(other, [s.prompt_ids], dcfg, tok)
            assert (r.prompt_ids, r.response_ids, r.trace) == (s.prompt_ids, ref.tokens[0], ref.trace[0])
            assert r.action == webshop.project(ref.text[0])[0]
            assert (r.episode_id, r.step, r.won, r.reward, r.anchor) == (s.episode_id, s.step, s.won, s.reward, s.anchor)
    assert any(s.relabel.response_ids != s.response_ids for s in both)


def test_expert_relabel_answers_every_state_the_policy_reaches(setup):
    """rollout(relabel="expert") (an SFT DAgger round): the env's expert answers each prompt the policy's
    episodes visit, read back by replaying the policy's actions in a fresh env; the episodes are the policy's."""
    cfg, tok, model, dcfg, ids = setup
    env_cfg = dataclasses.replace(cfg.env, max_steps=5)
    with torch.no_grad():
        alone, _ = rollout(model, tok, env_cfg, dcfg, ids, seed=2)
        steps, m = rollout(model, tok, env_cfg, dcfg, ids, seed=2, relabel="expert")
    assert [(s.prompt_ids, s.response_ids, s.action) for s in steps] == [(s.prompt_ids, s.response_ids, s.action)
                                                                         for s in alone]
    assert m["time_relabel"] == 0.0
    for e in m["episodes"]:
        env = webshop.make(env_cfg)
        env.reset(task_id=e["task_id"], seed=2 + e["group_id"])
        for s in sorted((s for s in steps if s.episode_id == e["episode_id"]), key=lambda s: s.step):
            r = s.relabel
            assert r.prompt_ids == s.prompt_ids and r.trace is None and r.response_ids[-1] == tok.eot_id
            assert r.action == webshop.expert_action(env)[1] and r.text.startswith("<think>")
            env.step(s.action)
    assert any(s.relabel.action != s.action for s in steps)  # a random model errs where the expert would not
    with pytest.raises(ValueError, match="a model or 'expert'"):
        rollout(model, tok, env_cfg, dcfg, ids[:1], relabel="teacher")


class _Flaky:
    """An env whose step raises EnvError after `fail_at` steps (a server gone mid-episode)."""

    def __init__(self, env, fail_at):
        self.env, self.fail_at, self.n = env, fail_at, 0

    def reset(self, task_id=None, seed=None):
        return self.env.reset(task_id=task_id, seed=seed)

    def step(self, action):
        self.n += 1
        if self.n > self.fail_at:
            raise EnvError("http://127.0.0.1:1/step: connection refused after 3 attempts")
        return self.env.step(action)

    def close(self):
        self.env.close()


def test_env_failure_marks_episode_failed(setup):
    cfg, tok, model, dcfg, ids = setup
    made = []

    def factory(ec):
        made.append(_Flaky(make_env(ec), fail_at=0 if len(made) % 2 == 0 else 99))
        return made[-1]
    with torch.no_grad():
        samples, m = rollout(model, tok, cfg.env, dcfg, ids[:2], group_size=2, env_factory=factory)
    assert m["failed_episodes"] == 2 and m["num_episodes"] == 4
    assert {s.episode_id for s in samples} <= {1, 3}
    assert all(e["failed"] for e in m["episodes"] if e["episode_id"] in (0, 2))


def test_server_killed_mid_rollout(setup):
    cfg, tok, model, dcfg, ids = setup
    srv = serve_in_thread(cfg.env)
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    ec = dataclasses.replace(cfg.env, server_url=url, retries=1, backoff_s=0.01, timeout_s=2.0)
    calls = {"n": 0}

    def factory(c):
        client = EnvClient(url, env="webshop", timeout=2.0, retries=1, backoff=0.01)
        orig = client.step

        def step(action):
            calls["n"] += 1
            if calls["n"] == 2:  # the server goes away (keep-alive threads would outlive shutdown())
                srv.shutdown()
                srv.server_close()
                client.url = "http://127.0.0.1:9"
            return orig(action)
        client.step = step
        return client
    with torch.no_grad():
        samples, m = rollout(model, tok, ec, dcfg, ids[:2], group_size=1, env_factory=factory)
    assert m["failed_episodes"] >= 1 and m["num_episodes"] == 2
