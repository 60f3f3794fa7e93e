"""Search-R1 tool env: tag protocol, EM reward, data, prompts, expert; retrieval lives in envs/retriever.py.

    python -m d3mini.envs.search serve [--corpus corpus.jsonl] [--port 8000] [--host 127.0.0.1] [--topk 3]

An episode is one question. Each step the model writes <think>...</think>, then exactly one of
<search> query </search> (the observation becomes Search-R1's <information>Doc 1(Title: "T") text
...</information> with the top cfg.topk passages) or <answer> a </answer> (ends the episode: exact match
after Search-R1's normalisation against every golden answer, env reward 10 x EM). Anything else is a
no-op answered with Search-R1's invalid-action message. Upstream facts: reference/envs.md §3 and §4.

Data (cfg.data_dir; None = the shipped real-fact set in search_data/, same layout): a wiki-18-style
corpus.jsonl and FlashRAG-style [<dataset>/]{train,dev,test}.jsonl question files; the test split is the
first cfg.num_test_goals test (else dev) questions. Retrieval: cfg.retriever_url names any
Search-R1-compatible /retrieve server; None = the same BM25 index in-process.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import string
import sys
import threading
from typing import Optional

from d3mini.envs import EnvError, EnvInputError, history_steps
from d3mini.envs.retriever import STOP_WORDS, BM25Index, RetrieverClient, serve

DEFAULT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "search_data")
CORPUS_NAMES = ("corpus.jsonl", "corpus.jsonl.gz", "wiki-18.jsonl", "wiki-18.jsonl.gz")
# Search-R1's message for output with neither tag (reference/envs.md §3.2), here for any invalid output
INVALID = ("My previous action is invalid. If I want to search, I should put the query between <search> and "
           "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
           "Let me try again.")


# ----------------------------------------------------------------------------- reward
_PUNCT = str.maketrans("", "", string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """Search-R1's qa_em normalisation, in its order: lower case, drop ASCII punctuation, drop the words
    a / an / the, collapse whitespace (so "state-of-the-art" -> "stateoftheart", reference/envs.md §3.3)."""
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCT)).split())


def em_score(prediction: str, golden: list) -> float:
    """1.0 if the normalised prediction equals any normalised golden answer, else 0.0."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golden))


def contains_answer(text: str, golden) -> bool:
    """Some normalised golden answer occurs in the normalised text as whole words (retrieval recall)."""
    t = f" {normalize_answer(text)} "
    return any(n and f" {n} " in t for n in map(normalize_answer, golden))


# ----------------------------------------------------------------------------- projection
_TAG = re.compile(r"<(search|answer)>(.*?)</\1>", re.S | re.I)
_ANY_TAG = ("<search>", "</search>", "<answer>", "</answer>")


def project(text: str) -> tuple[str, bool]:
    """The model's own response (never the prompt, whose example <answer> must not count) -> the action
    "<search>q</search>" / "<answer>a</answer>" and True, or ("", False) unless the text is <think>...</think>
    followed by exactly one search or answer tag pair with non-empty content. verl-agent runs a search
    that lacks <think>; d3mini answers every invalid output with the invalid-action message instead
    (reference/envs.md §5.3), so "" is the action the env sees."""
    low = text.lower()
    m = _TAG.search(text)
    if m is None or sum(low.count(t) for t in _ANY_TAG) != 2:
        return "", False
    arg = " ".join(m.group(2).split())
    t0, t1 = text.find("<think>"), text.find("</think>")
    if not arg or t0 < 0 or t1 < t0 or t1 > m.start():
        return "", False
    kind = m.group(1).lower()
    return f"<{kind}>{arg}</{kind}>", True


def parse_action(action: str) -> tuple[str, str]:
    """("search" | "answer", argument) of a well-formed projected action, else ("", "")."""
    m = re.fullmatch(r"\s*<(search|answer)>(.*?)</\1>\s*", action or "", re.S | re.I)
    if m is None or not m.group(2).strip() or any(t in m.group(2).lower() for t in _ANY_TAG):
        return "", ""
    return m.group(1).lower(), " ".join(m.group(2).split())


# ----------------------------------------------------------------------------- data
def _read_jsonl(path: str):
    """(line number, row) of a JSON-lines file (or .gz); errors name the file and the line."""
    try:
        with (gzip.open if path.endswith(".gz") else open)(path, "rt", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        yield n, json.loads(line)
                    except ValueError as e:
                        raise EnvError(f"{path}:{n}: not valid JSON: {e}") from None
    except OSError as e:
        raise EnvError(f"cannot read {path}: {e}") from None


def load_questions(path: str, source: str) -> list:
    """FlashRAG rows {"id", "question", "golden_answers": [...]} -> dicts with those keys and "data_source"."""
    rows = []
    for n, r in _read_jsonl(path):
        g = r.get("golden_answers") if isinstance(r, dict) else None
        if not (isinstance(g, list) and g and isinstance(r.get("question"), str)):
            raise EnvError(f"{path}:{n}: a question needs 'question' (text) and 'golden_answers' (a non-empty list)")
        rows.append({"id": str(r.get("id", n)), "question": r["question"].strip(),
                     "golden_answers": [str(a) for a in g], "data_source": source})
    return rows


def load_corpus(path: str) -> list:
    """wiki-18 rows {"id", "contents": '"Title"\\ntext'} (or pyserini's {"title", "text"}) -> [{"id", "contents"}]."""
    docs = []
    for n, r in _read_jsonl(path):
        if isinstance(r, dict) and "contents" not in r and isinstance(r.get("text"), str):
            r = {**r, "contents": f'"{r.get("title", "")}"\n{r["text"]}'}
        if not isinstance(r, dict) or not isinstance(r.get("contents"), str):
            raise EnvError(f"{path}:{n}: a passage needs 'contents' (or 'title' and 'text')")
        docs.append({"id": str(r.get("id", n - 1)), "contents": r["contents"]})
    if not docs:
        raise EnvError(f"{path}: the corpus is empty")
    return docs


def load_qa_dir(root: str) -> tuple[list, list]:
    """(test rows, train rows) of root/{split}.jsonl and root/<dataset>/{split}.jsonl, datasets in name order;
    dev.jsonl stands in for a missing test.jsonl (FlashRAG's HotpotQA, for one, has no test answers)."""
    test, train = [], []
    for sub in [""] + sorted(e for e in os.listdir(root) if os.path.isdir(os.path.join(root, e))):
        folder, source = os.path.join(root, sub), sub or os.path.basename(os.path.normpath(root))
        path = {s: os.path.join(folder, f"{s}.jsonl") for s in ("train", "dev", "test")}
        train += load_questions(path["train"], source) if os.path.isfile(path["train"]) else []
        held_out = next((path[s] for s in ("test", "dev") if os.path.isfile(path[s])), None)
        test += load_questions(held_out, source) if held_out else []
    return test, train


class SearchData:
    """The questions of a data folder (test split first, as WebShop's goals) and its corpus, indexed on first use."""

    def __init__(self, root: str, num_test: int):
        test, train = load_qa_dir(root)
        if not test and not train:
            raise EnvError(f"no questions in {root}: expected [<dataset>/]train.jsonl, test.jsonl or dev.jsonl")
        self.root, self.num_test, self.questions = root, min(num_test, len(test)), test[:num_test] + train
        self.corpus = next((os.path.join(root, c) for c in CORPUS_NAMES if os.path.isfile(os.path.join(root, c))), None)

    def index(self) -> "BM25Index":
        if self.corpus is None:
            raise EnvError(f"no corpus.jsonl in {self.root}: add a wiki-18-style corpus or set env.retriever_url "
                           "to a Search-R1 /retrieve server")
        return get_index(self.corpus)


_CACHE: dict = {}
_CACHE_LOCK = threading.Lock()


def _cached(key: tuple, build):
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]


def get_data(cfg) -> SearchData:
    if cfg.data_dir and not os.path.isdir(cfg.data_dir):
        raise EnvError(f"env.data_dir={cfg.data_dir!r} is not a folder")
    root = cfg.data_dir or DEFAULT_DIR
    return _cached(("data", os.path.abspath(root), cfg.num_test_goals), lambda: SearchData(root, cfg.num_test_goals))


def get_index(corpus_path: str) -> "BM25Index":
    """The (cached) BM25 index of a corpus file, shared by the envs and the retriever server of a process."""
    return _cached(("index", os.path.abspath(corpus_path)), lambda: BM25Index(load_corpus(corpus_path)))


def task_ids(cfg, split: str = "train") -> list:
    """Question indices of a split: test = [0, num_test), train = the rest."""
    data = get_data(cfg)
    if split not in ("train", "test"):
        raise EnvInputError(f"unknown Search split {split!r} (train | test)")
    return list(range(data.num_test)) if split == "test" else list(range(data.num_test, len(data.questions)))


# ----------------------------------------------------------------------------- environment
def format_docs(hits: list) -> str:
    """Search-R1's <information> block: 'Doc i(Title: "T") text' per passage, title = the first line of contents."""
    docs = [d["contents"].partition("\n") for d, _ in hits]
    body = "\n".join(f"Doc {i}(Title: {title}) {text}".rstrip() for i, (title, _, text) in enumerate(docs, 1))
    return f"<information>{body or 'No search results found.'}</information>"


class SearchEnv:
    def __init__(self, cfg):
        self.cfg, self.data = cfg, get_data(cfg)
        self.retriever = (RetrieverClient(cfg.retriever_url, cfg.timeout_s, cfg.retries, cfg.backoff_s)
                          if cfg.retriever_url else self.data.index())
        self.qa: Optional[dict] = None

    def reset(self, task_id=None, seed=None) -> tuple[str, dict]:
        if task_id is None:
            task_id = random.Random(seed).choice(task_ids(self.cfg, "train") or range(len(self.data.questions)))
        try:
            qa = self.data.questions[int(task_id)] if int(task_id) >= 0 else None
        except (ValueError, TypeError, IndexError):
            qa = None
        if qa is None:  # the previous episode stays intact
            raise EnvInputError(f"Search task_id {task_id!r} is not a question index in [0, {len(self.data.questions)})")
        self.qa, self.task_id = qa, int(task_id)
        self.steps, self.done, self.score, self.truncated = 0, False, 0.0, False
        self.queries, self.hits = [], []  # per search: the query and its [(doc, score)] (the expert reads these)
        return self.task, self._info(True)

    @property
    def task(self) -> str:
        q = self.qa["question"]
        return q if q.endswith("?") else q + "?"  # Search-R1 appends "?" to every question

    def _info(self, valid: bool) -> dict:
        return {"task": self.task, "task_id": self.task_id, "admissible_actions": None, "is_action_valid": valid,
                "won": self.score >= 1.0, "score": self.score, "step": self.steps, "truncated": self.truncated,
                "golden_answers": list(self.qa["golden_answers"]), "data_source": self.qa["data_source"]}

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.qa is None:
            raise EnvError("Search: call reset() before step()")
        if self.done:
            return "", 0.0, True, self._info(False)
        kind, arg = parse_action(action)
        obs, reward = INVALID, 0.0
        if kind == "search":
            hits = self.retriever.retrieve(arg, self.cfg.topk)  # an unreachable retriever raises before the step counts
            self.queries.append(arg)
            self.hits.append(hits)
            obs = format_docs(hits)
        elif kind == "answer":
            self.score = em_score(arg, self.qa["golden_answers"])
            obs, reward, self.done = "", 10.0 * self.score, True
        self.steps += 1
        if not self.done and self.steps >= self.cfg.max_steps:
            self.done = self.truncated = True
        return obs, reward, self.done, self._info(kind != "")

    def close(self) -> None:
        if isinstance(self.retriever, RetrieverClient):
            self.retriever.http.close()


def make(cfg) -> SearchEnv:
    return SearchEnv(cfg)


# ----------------------------------------------------------------------------- prompts
VERL_HEAD = "You are an expert agent who answers the given question step by step.\nYour question: {task}\n"
VERL_HISTORY = ("\nPrior to this step you have already taken {k} step(s). Below is the interaction history, where "
                "<search> </search> wraps each query you sent and <information> </information> wraps what the "
                "search engine returned.\n{hist}\n")
VERL_CUE = ("\nNow respond for the current step. First reason inside <think> </think> tags. Then take exactly one "
            "of these two actions, never both:\n(1) if some knowledge is missing, query the search engine with "
            "<search> your query </search>;\n(2) if you can answer with confidence, give the final answer inside "
            "<answer> </answer> without a detailed explanation, for example <answer>Beijing</answer>.")


def prompt(task: str, obs: str, history: list, admissible: Optional[list], step: int, cfg) -> str:
    """The user message for one step (history = the last H (observation, action) pairs before this step).
    "verl" lists each past action with the observation it returned, as verl-agent's search memory does;
    "compact" lists only the past actions and the latest observation."""
    steps = history_steps(history, step)
    returned = [o for _, o, _ in steps[1:]] + [obs]  # action k's result is the observation before step k + 1
    if cfg.prompt == "compact":
        lines = [f"question: {task}"] + [f"step {k}: {a or '(invalid)'}" for k, _, a in steps]
        lines += [f"now: {obs}"] if step else []
        lines.append("reply <think>...</think> then <search>query</search> or <answer>answer</answer>")
        return "\n".join(lines)
    text = VERL_HEAD.format(task=task)
    if step:  # the first step uses the no-history form
        hist = "\n".join(f"Step {k}: {a or '(invalid output)'}\n{r}" for (k, _, a), r in zip(steps, returned))
        text += VERL_HISTORY.format(k=step, hist=hist or f"Latest result:\n{obs}")
    return text + VERL_CUE


# ----------------------------------------------------------------------------- expert
THOUGHTS = {
    "search": ["i am not sure; let me search.", "i should look this up first.", "let me search for the question."],
    "again": ["no answer there; try the key words.", "not found yet; search again.", "nothing useful; rephrase it."],
    "answer": ["the documents say it is {a}.", "according to the results it is {a}.", "the retrieved text gives {a}."],
    "guess": ["not found; my best guess is {a}.", "no clear answer; i will guess {a}.", "not found; answering {a}."],
}


def reformulate(question: str, tried: list) -> str:
    """A new query for BM25: first the question's entities (capitalised words after the first, numbers),
    then its content words without question or stop words."""
    words = re.findall(r"[\w'.-]+", question.rstrip("?"))
    entities = " ".join(w for i, w in enumerate(words) if (i and w[0].isupper()) or w[0].isdigit())
    content = " ".join(w for w in words if w.lower() not in STOP_WORDS)
    return next((q for q in (entities, content, question.lower()) if q and q not in tried), question)


def _span(answer: str, passages: list) -> Optional[str]:
    """The answer as written in a passage (whole words, any case), the answer itself if only the normalised
    forms match, or None if no passage contains it."""
    for p in passages:
        m = re.search(r"(?<!\w)" + re.escape(answer) + r"(?!\w)", p, re.I)
        if m:
            return m.group(0)
    return answer if any(contains_answer(p, [answer]) for p in passages) else None


def expert_action(env: SearchEnv) -> tuple[str, str, str]:
    """(situation key, action, answer): search the question; if a golden answer (privileged) is in the latest
    results, answer it as written there; else search again with a reformulation while a turn remains for
    the answer, then guess the top result's title."""
    if not env.queries:
        return "search", f"<search>{env.task}</search>", ""
    latest = [d["contents"] for d, _ in env.hits[-1]]  # the only results every prompt form still shows
    for g in env.qa["golden_answers"]:
        span = _span(g, latest)
        if span:
            return "answer", f"<answer>{span}</answer>", span
    if env.steps < env.cfg.max_steps - 1:
        return "again", f"<search>{reformulate(env.task, env.queries)}</search>", ""
    guess = latest[0].partition("\n")[0].strip('"') if latest else "unknown"
    return "guess", f"<answer>{guess}</answer>", guess


def expert(env: SearchEnv, rng: random.Random) -> str:
    """The expert's full response for the env's current state: a short <think> drawn from THOUGHTS, then the tag."""
    if not isinstance(env, SearchEnv):
        raise EnvError("the Search expert needs an in-process SearchEnv (it reads the golden answers), "
                       f"got {type(env).__name__}")
    key, action, answer = expert_action(env)
    return f"<think>{rng.choice(THOUGHTS[key]).format(a=answer)}</think>{action}"


# ----------------------------------------------------------------------------- CLI
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m d3mini.envs.search", description="Search env tools")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve a BM25 retriever with Search-R1's POST /retrieve API")
    s.add_argument("--corpus", default=os.path.join(DEFAULT_DIR, "corpus.jsonl"), help="wiki-18-style corpus.jsonl(.gz)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, local only)")
    s.add_argument("--port", type=int, default=8000, help="port (0 = any free port)")
    s.add_argument("--topk", type=int, default=3, help="passages per query when a request sends topk null")
    args = ap.parse_args(argv)
    try:
        index = get_index(args.corpus)
    except (EnvError, OSError) as e:
        sys.exit(f"retriever: {e}")
    serve(index, args.host, args.port, args.topk)


if __name__ == "__main__":
    main()
