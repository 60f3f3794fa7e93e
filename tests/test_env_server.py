"""Env server and client: concurrent sessions against in-process envs, errors, retries, start-up."""
import json
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import requests

from d3mini.config import EnvConfig
from d3mini.envs import EnvError, make_env
from d3mini.envs import webshop as W
from d3mini.envs.server import EnvClient, serve_in_thread

CFG = dict(num_products=96, num_goals=300, num_test_goals=64, obs_format="compact")


@pytest.fixture(scope="module")
def server():
    srv = serve_in_thread(EnvConfig(**CFG))
    yield srv
    srv.shutdown()
    srv.server_close()


def client(srv, **kw):
    return EnvClient(srv.url, env="webshop", timeout=10, **{"retries": 1, "backoff": 0.01, **kw})


def test_concurrent_sessions_match_in_process_envs(server):
    """64 threads x 20 steps: each session's transcript equals that of a private in-process env."""
    errors, lock = [], threading.Lock()

    def worker(i):
        try:
            remote, local, rng = client(server), W.make(EnvConfig(**CFG)), random.Random(i)
            task = i
            obs_r, info_r = remote.reset(task_id=task)
            assert (obs_r, info_r) == local.reset(task_id=task)
            for k in range(20):
                action = W.project(W.expert(local, rng))[0] if rng.random() < 0.8 else "click[nonsense]"
                got = remote.step(action)
                want = local.step(action)
                assert got == want, (i, k, got, want)
                assert got[3]["task_id"] == task
                if got[2]:
                    task = (task + 64) % 300
                    assert remote.reset(task_id=task) == local.reset(task_id=task)
            remote.close()
        except Exception as e:  # collected so the main thread reports every failure
            with lock:
                errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    health = requests.get(server.url + "/health").json()
    assert {k: health[k] for k in ("ok", "env", "sessions", "expired")} == \
        {"ok": True, "env": "webshop", "sessions": 0, "expired": 0}


def test_step_batch_and_retry_replay(server):
    a, b = client(server), client(server)
    a.reset(task_id=1)
    b.reset(task_id=2)
    (oa, *_), (ob, *_) = EnvClient.step_batch([a, b], ["search[candle]", "search[hoodie]"])
    ref = W.make(EnvConfig(**CFG))
    ref.reset(task_id=1)
    assert oa == ref.step("search[candle]")[0] and ob != oa
    # a step re-sent with the same seq (a retry after a lost answer) is answered again, not re-run
    body = {"env_id": a.env_id, "action": "click[next >]", "seq": a.seq}
    first = requests.post(server.url + "/step", json=body).json()
    again = requests.post(server.url + "/step", json=body).json()
    assert first == again and first["info"]["step"] == 2
    stale = requests.post(server.url + "/step", json={**body, "seq": 0})
    assert stale.status_code == 409 and "seq" in stale.json()["error"]
    a.close()
    b.close()


def test_malformed_requests_get_4xx_and_server_keeps_serving(server):
    u = server.url
    cases = [
        ("/reset", b"{not json", 400, "not valid JSON"),
        ("/reset", b"[1, 2]", 400, "JSON object"),
        ("/reset", json.dumps({"env": "nosuch"}).encode(), 400, "unknown env 'nosuch'"),
        ("/reset", json.dumps({"env": "search"}).encode(), 400, "serves env 'webshop'"),
        ("/reset", json.dumps({"task_id": 10 ** 6}).encode(), 400, "task_id"),
        ("/reset", json.dumps({"seed": "x"}).encode(), 400, "'seed'"),
        ("/step", json.dumps({"action": "click[x]"}).encode(), 400, "missing field 'env_id'"),
        ("/step", json.dumps({"env_id": "nope", "action": "click[x]"}).encode(), 404, "unknown env_id 'nope'"),
        ("/step", json.dumps({"env_id": "nope"}).encode(), 400, "missing field 'action'"),
        ("/step", json.dumps({"env_id": "nope", "action": 3}).encode(), 400, "'action' must be a string"),
        ("/step_batch", json.dumps({"env_id": "x"}).encode(), 400, "JSON list"),
        ("/close", json.dumps({}).encode(), 400, "missing field 'env_id'"),
        ("/close", json.dumps({"env_id": "nope"}).encode(), 404, "unknown env_id"),
        ("/nowhere", b"{}", 404, "unknown endpoint"),
    ]
    s = requests.Session()  # one kept-alive connection: bodies of rejected requests must not leak into the next
    for path, data, status, msg in cases:
        r = s.post(u + path, data=data, headers={"Content-Type": "application/json"})
        assert r.status_code == status and msg in r.json()["error"], (path, data, r.status_code, r.text)
    assert s.get(u + "/reset").status_code == 405
    out = s.post(u + "/step_batch", json=[{"env_id": "nope", "action": "x"}]).json()
    assert out[0]["status"] == 404 and "nope" in out[0]["error"]
    c = client(server)
    obs, info = c.reset(task_id=3)
    assert info["task_id"] == 3 and c.step("click[x]")[3]["is_action_valid"] is False
    with pytest.raises(EnvError, match="rejected the request \\(400\\).*task_id"):
        c.reset(task_id=-5)
    assert c.step("click[y]")[3]["step"] == 2  # the refused reset left the session's episode intact
    c.close()
    r = s.post(u + "/reset", json={"env_id": "fresh", "task_id": -1})
    assert r.status_code == 400 and s.get(u + "/health").json()["sessions"] == 0  # no half-built session kept
    assert s.get(u + "/health").json()["ok"] is True


def test_env_exception_is_500_and_retried(server, monkeypatch):
    c = client(server, retries=2)
    c.reset(task_id=0)
    calls = []

    def broken(self, action):
        calls.append(action)
        raise ValueError("engine broke")

    monkeypatch.setattr(W.WebShopEnv, "step", broken)
    with pytest.raises(EnvError, match=r"/step failed after 3 attempts: HTTP 500: env step failed: ValueError: engine broke"):
        c.step("click[x]")
    assert len(calls) == 3
    monkeypatch.undo()
    assert c.step("search[candle]")[3]["is_action_valid"]
    c.close()


def test_no_server_raises_env_error():
    c = EnvClient("http://127.0.0.1:9", timeout=2, retries=2, backoff=0.01)
    with pytest.raises(EnvError, match=r"http://127.0.0.1:9/reset failed after 3 attempts: ConnectionError"):
        c.reset()


def test_cli_starts_serves_and_client_fails_cleanly_when_killed():
    cmd = [sys.executable, "-m", "d3mini.envs.server", "--env", "webshop", "--port", "0",
           "env.num_products=64", "--env.num_goals", "200", "env.num_test_goals=50"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    try:
        line = proc.stdout.readline()  # "serving env 'webshop' on http://127.0.0.1:PORT"
        assert line.startswith("serving env 'webshop' on http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" on ")[1].strip()
        health = requests.get(url + "/health", timeout=10).json()
        print(f"env server ready in {time.perf_counter() - t0:.2f} s")
        assert {k: v for k, v in health.items() if k != "config"} == {"ok": True, "env": "webshop", "sessions": 0,
                                                                       "expired": 0}
        cfg = EnvConfig(server_url=url, num_products=64, num_goals=200, num_test_goals=50, retries=2, backoff_s=0.01, timeout_s=5)
        env = make_env(cfg)
        assert isinstance(env, EnvClient)
        obs, info = env.reset(task_id=7)
        env.step("search[candle]")
        proc.kill()
        proc.wait(timeout=10)
        with pytest.raises(EnvError, match=rf"{url}/step failed after 3 attempts: ConnectionError"):
            env.step("click[next >]")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def test_cli_reports_bad_config():
    r = subprocess.run([sys.executable, "-m", "d3mini.envs.server", "--port", "0", "env.data_dir=/no/such/dir"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "env.data_dir='/no/such/dir' is not a folder" in r.stderr
    r = subprocess.run([sys.executable, "-m", "d3mini.envs.server", "--port", "0", "env.bogus=1"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "unknown key 'env.bogus'" in r.stderr


def test_idle_sessions_expire_at_the_next_reset():
    """A session left without /close (a client that died) is closed once it has been idle for idle_timeout;
    sessions in use stay, and stepping an expired one is a clear 404."""
    srv = serve_in_thread(EnvConfig(**CFG), idle_timeout=0.2)
    try:
        old, live = client(srv), client(srv)
        old.reset(task_id=1)
        live.reset(task_id=2)
        for action in ("search[shirt]", "click[back to search]", "click[back to search]"):
            time.sleep(0.1)  # `live` keeps stepping, `old` is abandoned
            live.step(action)
        client(srv).reset(task_id=3)  # the next reset sweeps
        health = requests.get(srv.url + "/health", timeout=5).json()
        assert health["expired"] == 1 and health["sessions"] == 2
        with pytest.raises(EnvError, match="expired after 0.2 s idle"):
            old.step("search[shirt]")
        live.step("search[shirt]")  # still served
    finally:
        srv.shutdown()
        srv.server_close()
    never = serve_in_thread(EnvConfig(**CFG), idle_timeout=0)
    try:
        c = client(never)
        c.reset(task_id=1)
        time.sleep(0.05)
        client(never).reset(task_id=2)
        health = requests.get(never.url + "/health", timeout=5).json()
        assert {k: v for k, v in health.items() if k != "config"} == {"ok": True, "env": "webshop", "sessions": 2,
                                                                       "expired": 0}
    finally:
        never.shutdown()
        never.server_close()


def test_check_server_names_an_unreachable_or_mismatched_server(server):
    """check_server: the health record when the server builds its envs as the client asks; an EnvError
    naming every differing setting when it does not, or the URL when nothing answers."""
    from d3mini.envs.server import check_server
    assert check_server(server.url, EnvConfig(**CFG))["config"]["num_products"] == 96
    assert check_server(server.url, EnvConfig(**CFG, history=5, timeout_s=3.0))["ok"]  # client-side settings
    with pytest.raises(EnvError, match=r"seed: server 0, here 7.*num_goals: server 300, here 200"):
        check_server(server.url, EnvConfig(**{**CFG, "seed": 7, "num_goals": 200}))
    with pytest.raises(EnvError, match="127.0.0.1:9.*unreachable"):
        check_server("http://127.0.0.1:9")


def test_expert_episodes_play_in_process_beside_a_server():
    """The scripted expert reads the env's goal, which a client cannot: with env.server_url set (even to a
    dead server) expert rollouts run on in-process envs, the same episodes as without it."""
    from d3mini.config import DecodeConfig
    from d3mini.data import build_tiny_tokenizer
    from d3mini.rollout import rollout
    tok = build_tiny_tokenizer(["search click buy now"], vocab_size=300, family="sdar")
    plain = EnvConfig(**CFG, max_steps=6)
    a, ma = rollout(None, tok, plain, DecodeConfig(), [0, 1, 2], expert=True, seed=3)
    b, mb = rollout(None, tok, EnvConfig(**CFG, max_steps=6, server_url="http://127.0.0.1:9"), DecodeConfig(),
                    [0, 1, 2], expert=True, seed=3)
    assert mb["failed_episodes"] == 0 and [s.text for s in a] == [s.text for s in b] and len(a) > 3
