"""Search env: EM reward, projection, episodes, prompts, retriever server and client, default data, expert,
the env behind the HTTP env server, and the Search-R1 / FlashRAG loader."""
import gzip
import json
import os
import random
import socket
import subprocess
import sys
import threading

import pytest
import requests

from d3mini.config import EnvConfig, load_config
from d3mini.envs import INFO_KEYS, EnvError, EnvInputError, is_action_valid, make_env, task_ids
from d3mini.envs import retriever as R
from d3mini.envs import search as S
from d3mini.envs.server import EnvClient, serve_in_thread

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = next((p for p in (os.path.join(ROOT, "..", "shared", "data", "search"),  # CI: shared/ beside the clone
                           os.path.join(ROOT, "shared", "data", "search")) if os.path.isdir(p)), None)
CFG = dict(name="search", max_steps=4, history=4, prompt="verl")
CORPUS = os.path.join(S.DEFAULT_DIR, "corpus.jsonl")


def env_cfg(**kw) -> EnvConfig:
    return EnvConfig(**{**CFG, **kw})


def find_question(env, text: str) -> int:
    return next(i for i, q in enumerate(env.data.questions) if q["question"] == text)


def free_port() -> int:
    with socket.socket() as s:  # bound then closed: nothing listens there afterwards
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def retriever():
    srv = R.RetrieverServer(S.get_index(CORPUS), port=0)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


# ----------------------------------------------------------------------------- reward
@pytest.mark.parametrize("text,norm", [
    ("The Eiffel Tower!", "eiffel tower"),        # case, article, punctuation
    ("  a   cat\n sat ", "cat sat"),                # whitespace
    ("An apple", "apple"),
    ("Theodore the Great", "theodore great"),       # only whole-word articles go
    ("state-of-the-art", "stateoftheart"),          # punctuation is removed before articles
    ("3.14", "314"),
    ("the", ""),
    ("it\u2019s", "it\u2019s"),                     # only ASCII punctuation is removed
    ("Washington, D.C.", "washington dc"),
])
def test_normalize_answer(text, norm):
    assert S.normalize_answer(text) == norm


def test_em_against_several_golden_answers():
    golden = ["Alexander Graham Bell", "Graham Bell", "Bell"]
    assert S.em_score("alexander graham bell.", golden) == 1.0
    assert S.em_score("  The  Bell ", golden) == 1.0
    assert S.em_score("Graham", golden) == 0.0
    assert S.em_score("Bell, Alexander Graham", golden) == 0.0  # exact match, not a bag of words
    assert S.em_score("Washington DC", ["Washington, D.C."]) == 1.0
    assert S.em_score("the Beatles", ["Beatles"]) == 1.0 and S.em_score("Beatles band", ["The Beatles"]) == 0.0
    assert S.contains_answer("He met Graham Bell in 1876.", golden) and not S.contains_answer("Bellevue", golden)


# ----------------------------------------------------------------------------- projection
@pytest.mark.parametrize("text,action,ok", [
    ("<think>look it up</think><search> capital of France </search>", "<search>capital of France</search>", True),
    ("<think>known</think>\n<answer>Paris</answer>", "<answer>Paris</answer>", True),
    ("<think>x</think><SEARCH>a\n b</SEARCH> trailing text", "<search>a b</search>", True),
    ("<search>capital of France</search>", "", False),                                  # missing think
    ("<think>x<search>q</search>", "", False),                                           # think never closed
    ("<search>q</search><think>x</think>", "", False),                                  # think after the action
    ("<think>x</think><search>q</search><answer>Paris</answer>", "", False),            # two tags
    ("<think>x</think><search>a</search><search>b</search>", "", False),                # two searches
    ("<think>x</think> the answer is Paris", "", False),                                 # no tag
    ("<think>x</think><answer>Paris", "", False),                                        # unclosed tag
    ("<think>x</think><answer>  </answer>", "", False),                                  # empty answer
])
def test_projection_and_validity(text, action, ok):
    assert S.project(text) == (action, ok)
    assert is_action_valid(action, ok, None, True) is ok  # no admissible list: validity = format


def test_invalid_output_gets_search_r1_message():
    env = S.make(env_cfg())
    obs, info = env.reset(task_id=0)
    assert info["is_action_valid"] and info["admissible_actions"] is None
    for text in ("<search>q</search>", "<think>x</think><search>q</search><answer>a</answer>", "<think>x</think> paris"):
        obs, reward, done, info = env.step(S.project(text)[0])
        assert obs == S.INVALID and reward == 0.0 and not done and not info["is_action_valid"]
    assert S.INVALID.startswith("My previous action is invalid.") and env.queries == []
    assert env.step("<search>a</search> <answer>b</answer>")[3]["is_action_valid"] is False  # the env checks too
    assert env.steps == 4 and env.done and env.truncated


def test_prompt_example_answer_is_never_scored():
    env = S.make(env_cfg())
    tid = find_question(env, "Which city is the capital of China?")
    obs, info = env.reset(task_id=tid)
    assert info["golden_answers"] == ["Beijing"]
    text = S.prompt(info["task"], obs, [], None, 0, env.cfg)
    assert "<answer>Beijing</answer>" in text  # the prompt's own example is the golden answer here
    response = "<think>i am not sure what the capital is.</think>"
    assert S.project(response) == ("", False)
    assert S.project(text + response) == ("", False)  # even a caller passing prompt + response scores nothing
    obs, reward, done, info = env.step(S.project(response)[0])
    assert (reward, done, info["score"], info["won"]) == (0.0, False, 0.0, False)
    obs, reward, done, info = env.step(S.project("<think>i know it</think><answer> beijing </answer>")[0])
    assert (reward, done, info["score"], info["won"]) == (10.0, True, 1.0, True)


# ----------------------------------------------------------------------------- episodes and prompts
def test_episode_info_and_limits():
    cfg = env_cfg()
    env = S.make(cfg)
    test, train = task_ids(cfg, "test"), task_ids(cfg, "train")
    assert len(test) == env.data.num_test > 0 and len(train) >= 200 and not set(test) & set(train)
    obs, info = env.reset(seed=3)
    assert info["task_id"] in train and env.reset(seed=3)[1]["task_id"] == info["task_id"]
    tid = find_question(env, "Who patented the telephone in 1876?")
    obs, info = env.reset(task_id=tid)
    assert obs == info["task"] == "Who patented the telephone in 1876?" and set(INFO_KEYS) <= set(info)
    obs, reward, done, info = env.step("<search>telephone inventor patent</search>")
    assert obs.startswith('<information>Doc 1(Title: "Telephone") Alexander Graham Bell') and obs.endswith("</information>")
    assert obs.count("\nDoc ") == 2 and (reward, done, info["step"], info["is_action_valid"]) == (0.0, False, 1, True)
    obs, reward, done, info = env.step("<answer>Thomas Edison</answer>")
    assert (reward, done, info["score"], info["won"], info["truncated"]) == (0.0, True, 0.0, False, False)
    assert info["golden_answers"][0] == "Alexander Graham Bell" and info["data_source"] == "facts"
    assert env.step("<answer>Bell</answer>")[2:] == (True, {**info, "is_action_valid": False})  # done stays done
    env.reset(task_id=tid)
    for k in range(4):
        obs, reward, done, info = env.step(f"<search>query {k}</search>")
    assert done and info["truncated"] and info["step"] == 4 and not info["won"]
    assert S.format_docs([]) == "<information>No search results found.</information>"
    env1 = S.make(env_cfg(topk=1))
    env1.reset(task_id=tid)
    assert "Doc 2" not in env1.step("<search>telephone</search>")[0]
    with pytest.raises(EnvInputError, match="task_id"):
        env.reset(task_id=10 ** 6)
    with pytest.raises(EnvInputError, match="split"):
        task_ids(cfg, "valid")


def test_prompts_verl_and_compact():
    cfg = env_cfg()
    env = S.make(cfg)
    obs0, info = env.reset(task_id=find_question(env, "Who discovered penicillin?"))
    p0 = S.prompt(info["task"], obs0, [], None, 0, cfg)
    assert "Your question: Who discovered penicillin?" in p0 and "Prior to this step" not in p0
    assert "<think> </think>" in p0 and "<search> your query </search>" in p0
    a1 = "<search>penicillin discovery</search>"
    obs1 = env.step(a1)[0]
    obs2 = env.step("")[0]
    hist = [(obs0, a1), (obs1, "")]
    p2 = S.prompt(info["task"], obs2, hist, None, 2, cfg)
    assert "already taken 2 step(s)" in p2 and f"Step 1: {a1}\n{obs1}" in p2
    assert f"Step 2: (invalid output)\n{S.INVALID}" in p2
    assert S.prompt(info["task"], obs2, hist[1:], None, 2, cfg).count("Step ") == 1  # window of H = 1
    assert f"Latest result:\n{obs2}" in S.prompt(info["task"], obs2, [], None, 2, cfg)  # history 0
    c2 = S.prompt(info["task"], obs2, hist, None, 2, env_cfg(prompt="compact"))
    assert c2.splitlines()[:3] == ["question: Who discovered penicillin?", f"step 1: {a1}", "step 2: (invalid)"]
    assert "Doc 1" not in c2 and len(S.prompt(info["task"], obs0, [], None, 0, env_cfg(prompt="compact"))) < 200


# ----------------------------------------------------------------------------- retriever
def test_retriever_server_answers_both_request_forms(retriever):
    u = retriever.url
    batch = requests.post(u, json={"queries": ["capital of France", "chemical symbol Fe"], "topk": 2,
                                   "return_scores": True}, timeout=10).json()["result"]
    assert [len(r) for r in batch] == [2, 2]
    assert batch[0][0]["document"]["contents"].startswith('"France"\n') and batch[0][0]["score"] > batch[0][1]["score"] > 0
    assert batch[1][0]["document"]["contents"].startswith('"Iron"\n')
    single = requests.post(u, json={"query": "capital of France", "topk": None}, timeout=10).json()["result"]
    assert len(single) == 1 and len(single[0]) == 3 and single[0][0] == batch[0][0]["document"]  # bare documents
    assert set(single[0][0]) == {"id", "contents"}
    assert requests.post(u, json={"queries": ["zzzz qqqq"]}, timeout=10).json() == {"result": [[]]}
    s = requests.Session()  # one kept-alive connection survives bad requests
    for body, msg in [({"q": "x"}, "'queries'"), ({"queries": "x"}, "'queries'"), ({"query": 3}, "'query'"),
                      ({"query": "x", "topk": 0}, "'topk'"), ([1], "JSON object")]:
        r = s.post(u, json=body, timeout=10)
        assert r.status_code == 400 and msg in r.json()["error"], (body, r.text)
    r = s.post(u, data=b"{oops", headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 400 and "Expecting" in r.json()["error"]
    assert s.post(u.replace("/retrieve", "/search"), json={}, timeout=10).status_code == 404
    with socket.create_connection(retriever.server_address, timeout=10) as raw:  # a body it cannot skip
        raw.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n")
        reply = raw.makefile("rb").read().decode()  # read() returns once the server closes the connection
    assert reply.startswith("HTTP/1.1 400") and "Connection: close" in reply and "bad Content-Length" in reply
    client = R.RetrieverClient(u.replace("/retrieve", ""), timeout=10)  # the path is added when missing
    local = S.get_index(CORPUS).retrieve("capital of France", 3)
    assert [(d, round(x, 4)) for d, x in client.retrieve("capital of France", 3)] == [(d, round(x, 4)) for d, x in local]


def test_env_with_retriever_url_matches_in_process(retriever):
    remote, local = S.make(env_cfg(retriever_url=retriever.url)), S.make(env_cfg())
    assert isinstance(remote.retriever, R.RetrieverClient)
    rng_a, rng_b = random.Random(0), random.Random(0)
    for tid in task_ids(local.cfg, "test")[:10]:
        assert remote.reset(task_id=tid) == local.reset(task_id=tid)
        done = False
        while not done:
            a, b = S.expert(remote, rng_a), S.expert(local, rng_b)
            assert a == b
            got, want = remote.step(S.project(a)[0]), local.step(S.project(b)[0])
            assert got == want
            done = got[2]


def test_client_falls_back_to_the_single_form(retriever):
    calls = []

    def single_only(body):  # a verl-agent-style server that only accepts {"query": ...}
        calls.append(sorted(body))
        if "queries" in body:
            raise ValueError("field 'query' required")
        return R.RetrieverServer.answer(retriever, body)

    retriever.answer = single_only
    client = R.RetrieverClient(retriever.url, timeout=10, retries=0)
    assert client.retrieve("capital of France", 1)[0][0]["contents"].startswith('"France"')
    assert client.retrieve("capital of Peru", 1)[0][0]["contents"].startswith('"Peru"')
    batch, single = ["queries", "return_scores", "topk"], ["query", "return_scores", "topk"]
    assert calls == [batch, single, single]  # the refused form is not tried again
    retriever.answer = lambda body: (_ for _ in ()).throw(ValueError("nothing works"))
    with pytest.raises(EnvError, match=r"rejected both request forms .*HTTP 400.*nothing works"):
        client.retrieve("x", 1)


def test_client_retries_and_names_url_and_cause(retriever):
    port = free_port()
    client = R.RetrieverClient(f"http://127.0.0.1:{port}/retrieve", timeout=2, retries=2, backoff=0.01)
    with pytest.raises(EnvError, match=rf"retriever http://127.0.0.1:{port}/retrieve failed after 3 attempts: ConnectionError"):
        client.retrieve("capital of France", 3)
    env = S.make(env_cfg(retriever_url=f"http://127.0.0.1:{port}", retries=1, backoff_s=0.01, timeout_s=2))
    env.reset(task_id=0)
    with pytest.raises(EnvError, match=f"127.0.0.1:{port}/retrieve failed after 2 attempts"):
        env.step("<search>anything</search>")
    assert env.steps == 0 and env.step("<answer>x</answer>")[2]  # the failed search did not count
    calls = []

    def broken(query, k):
        calls.append(query)
        raise RuntimeError("index broke")

    retriever.index = type("Broken", (), {"retrieve": staticmethod(broken), "docs": []})()
    client = R.RetrieverClient(retriever.url, timeout=5, retries=2, backoff=0.01)
    with pytest.raises(EnvError, match=r"failed after 3 attempts: HTTP 500: .*RuntimeError: index broke"):
        client.retrieve("capital of France", 3)
    assert len(calls) == 3
    bad = type("R", (), {"json": lambda self: {"result": [[{"document": {"no": "contents"}}]]}, "text": "{...}"})()
    with pytest.raises(EnvError, match="unexpected answer"):
        client._parse(bad)


def test_cli_serves_and_stops():
    proc = subprocess.Popen([sys.executable, "-m", "d3mini.envs.search", "serve", "--port", "0", "--topk", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"})
    timer = threading.Timer(60, proc.kill)  # bounds the test if the server never prints its address
    timer.start()
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving BM25 over 319 passages on http://127.0.0.1:"), (line, proc.poll())
        url = line.rsplit(" ", 1)[1].strip()
        hits = requests.post(url, json={"query": "moons Phobos and Deimos"}, timeout=10).json()["result"][0]
        assert len(hits) == 2 and hits[0]["contents"].startswith('"Mars"')
    finally:
        timer.cancel()
        proc.kill()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()
    r = subprocess.run([sys.executable, "-m", "d3mini.envs.search", "serve", "--corpus", "/no/such.jsonl", "--port", "0"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"})
    assert r.returncode != 0 and "cannot read /no/such.jsonl" in r.stderr


# ----------------------------------------------------------------------------- default data and expert
def test_default_set_top3_recall():
    env = S.make(env_cfg())
    qs = env.data.questions
    hits = [any(S.contains_answer(d["contents"], q["golden_answers"]) for d, _ in env.retriever.retrieve(q["question"], 3))
            for q in qs]
    recall = sum(hits) / len(qs)
    print(f"\nSearch default set: {len(qs)} questions over {len(env.retriever.docs)} passages, BM25 top-3 recall {recall:.3f}")
    assert len(qs) >= 200 and recall >= 0.95


def test_expert_success_on_default_set():
    env, rng = S.make(env_cfg()), random.Random(0)
    won = steps = 0
    for tid in range(len(env.data.questions)):
        env.reset(task_id=tid)
        done = False
        while not done:
            text = S.expert(env, rng)
            action, ok = S.project(text)
            assert ok and text.startswith("<think>"), text
            _, reward, done, info = env.step(action)
            steps += 1
        won += info["won"]
        assert reward == 10.0 * info["won"]
    rate = won / len(env.data.questions)
    print(f"\nSearch expert: success {rate:.3f} over {len(env.data.questions)} questions, {steps / len(env.data.questions):.2f} steps")
    assert rate >= 0.9
    with pytest.raises(EnvError, match="in-process SearchEnv"):
        S.expert(object(), rng)


def test_expert_reformulates_then_guesses(tmp_path):
    docs = [{"id": str(i), "contents": f'"Doc{i}"\nabout rivers {i}'} for i in range(3)]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    q = {"id": "q", "question": "Which River is longest", "golden_answers": ["Nile"]}
    (tmp_path / "test.jsonl").write_text(json.dumps(q))
    env, rng = S.make(env_cfg(data_dir=str(tmp_path))), random.Random(0)
    obs, info = env.reset(task_id=0)
    assert obs == "Which River is longest?"
    actions = []
    done = False
    while not done:
        action = S.project(S.expert(env, rng))[0]
        actions.append(action)
        obs, reward, done, info = env.step(action)
    assert actions[:3] == ["<search>Which River is longest?</search>", "<search>River</search>",
                           "<search>River longest</search>"]  # the question, its entities, its content words
    assert actions[3].startswith("<answer>Doc") and not info["won"] and not info["truncated"]


# ----------------------------------------------------------------------------- env server
def test_search_env_behind_the_env_server():
    cfg = env_cfg()
    srv = serve_in_thread(cfg)
    try:
        remote = make_env(env_cfg(server_url=srv.url, timeout_s=10, retries=1, backoff_s=0.01))
        local, rng = S.make(cfg), random.Random(1)
        assert isinstance(remote, EnvClient)
        for tid in task_ids(cfg, "test")[:8]:
            assert remote.reset(task_id=tid) == local.reset(task_id=tid)
            done = False
            while not done:
                action = S.project(S.expert(local, rng))[0] if rng.random() < 0.8 else ""
                got, want = remote.step(action), local.step(action)
                assert got == want
                done = got[2]
        with pytest.raises(EnvError, match="in-process SearchEnv"):
            S.expert(remote, rng)
        with pytest.raises(EnvError, match=r"rejected the request \(400\).*task_id"):
            remote.reset(task_id=-1)
        remote.close()
    finally:
        srv.shutdown()
        srv.server_close()


# ----------------------------------------------------------------------------- loader and configs
@pytest.mark.skipif(SHARED is None, reason="shared/data/search is not present")
def test_loader_on_search_r1_samples():
    cfg = env_cfg(data_dir=SHARED, num_test_goals=100)
    data = S.get_data(cfg)
    assert len(data.questions) == data.num_test == 17 and data.questions[16]["id"] == "test_16"  # no final newline
    assert all(q["data_source"] == "nq" and q["golden_answers"] for q in data.questions)
    assert task_ids(cfg, "train") == []  # no train.jsonl there
    assert task_ids(env_cfg(data_dir=SHARED, num_test_goals=5), "test") == [0, 1, 2, 3, 4]  # the first 5 questions
    index = data.index()
    assert len(index.docs) == 10 and all(d["contents"].startswith('"') for d in index.docs)
    assert index.retrieve("Pavia Cathedral", 1)[0][0]["contents"].startswith('"Pavia Cathedral"\n')
    env = S.make(cfg)
    obs, info = env.reset(seed=0)  # no train questions: any question
    assert obs.endswith("?") and obs[:-1] == data.questions[info["task_id"]]["question"]
    obs = env.step("<search>who was Evan Morris</search>")[0]
    assert obs.startswith('<information>Doc 1(Title: "Evan Morris") Evan Morris') and obs.endswith("</information>")


def test_loader_formats_and_errors(tmp_path):
    rows = [{"id": "7", "title": "Nile", "text": "The Nile flows into the Mediterranean Sea."}]
    with gzip.open(tmp_path / "wiki-18.jsonl.gz", "wt") as f:
        f.write(json.dumps(rows[0]) + "\n")
    (tmp_path / "hotpotqa").mkdir()
    (tmp_path / "hotpotqa" / "dev.jsonl").write_text(json.dumps({"id": "d0", "question": "where does the nile end",
                                                                 "golden_answers": ["Mediterranean Sea"]}) + "\n")
    (tmp_path / "hotpotqa" / "train.jsonl").write_text(json.dumps({"question": "q", "golden_answers": ["a"]}) + "\n")
    cfg = env_cfg(data_dir=str(tmp_path))
    env = S.make(cfg)
    assert task_ids(cfg, "test") == [0] and task_ids(cfg, "train") == [1]
    assert env.data.questions[0]["data_source"] == "hotpotqa" and env.data.questions[1]["id"] == "1"
    env.reset(task_id=0)
    obs = env.step("<search>nile</search>")[0]
    assert obs == '<information>Doc 1(Title: "Nile") The Nile flows into the Mediterranean Sea.</information>'
    assert env.step("<answer>the Mediterranean sea</answer>")[3]["won"]
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "test.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n{oops\n')
    with pytest.raises(EnvError, match=r"bad/test.jsonl:2: not valid JSON"):
        S.make(env_cfg(data_dir=str(bad)))
    (bad / "test.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    with pytest.raises(EnvError, match=r"test.jsonl:1: a question needs 'question' \(text\) and 'golden_answers'"):
        S.make(env_cfg(data_dir=str(bad), num_test_goals=7))
    (bad / "test.jsonl").write_text('{"question": "q", "golden_answers": ["a"]}\n')
    with pytest.raises(EnvError, match="no corpus.jsonl in .*env.retriever_url"):
        S.make(env_cfg(data_dir=str(bad), num_test_goals=8))
    assert S.make(env_cfg(data_dir=str(bad), num_test_goals=8, retriever_url="http://127.0.0.1:1")).reset()[0] == "q?"
    with pytest.raises(EnvError, match="env.data_dir='/no/such/dir' is not a folder"):
        S.make(env_cfg(data_dir="/no/such/dir"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(EnvError, match="no questions in"):
        S.make(env_cfg(data_dir=str(tmp_path / "empty")))


def test_search_configs_load_and_build_envs():
    names = sorted(f for f in os.listdir(os.path.join(ROOT, "configs")) if f.startswith("search"))
    assert names == ["search-llada.yaml", "search-qwen3.yaml", "search.yaml"]
    for f in names:
        c = load_config(os.path.join(ROOT, "configs", f)).env
        assert (c.name, c.prompt, c.max_steps, c.history, c.topk) == ("search", "verl", 4, 4, 3)
        assert c.data_dir is None and c.retriever_url is None  # the shipped data and the in-process BM25
        test = task_ids(c, "test")
        assert len(test) == S.get_data(c).num_test <= c.num_test_goals and len(test) >= 200
        assert len(task_ids(c, "train")) >= 800
        env = make_env(c)
        obs, info = env.reset(task_id=test[0])
        assert S.prompt(info["task"], obs, [], None, 0, c).startswith("You are an expert agent")
