"""Search-R1's retrieval side: a BM25 index over passage contents (bm25s, pyserini's defaults, Lucene-like
tokenising), a client for any Search-R1-compatible POST /retrieve server (both request forms, retries),
and an embedded /retrieve server over a BM25Index (run it with python -m d3mini.envs.search serve).
Upstream facts: reference/envs.md §3.1.
"""
from __future__ import annotations

import json
import re
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import bm25s
import requests
from bm25s.stopwords import STOPWORDS_EN

from d3mini.envs import EnvError

# Lucene's English stop words (pyserini's BM25) plus question words: on a small corpus a rare "who" or
# "which" in a passage would otherwise outweigh the question's entity.
STOP_WORDS = sorted(set(STOPWORDS_EN) | set("what which who whom whose when where why how do does did".split()))
_POSSESSIVE = re.compile(r"['\u2019]s\b")  # Lucene's EnglishPossessiveFilter: "Earth's" -> "Earth"


def _plural(words: list) -> list:
    """A minimal plural stemmer (moons -> moon, countries -> country) in place of Lucene's Porter stemmer."""
    return [w[:-3] + "y" if len(w) > 4 and w.endswith("ies") else
            w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")) else w for w in words]


def _tokenize(texts: list, ids: bool):
    # one-character tokens stay (chemical symbols such as "C" or "K"); bm25s drops them by default
    return bm25s.tokenize([_POSSESSIVE.sub("", t) for t in texts], token_pattern=r"(?u)\b\w+\b", stopwords=STOP_WORDS,
                          stemmer=_plural, return_ids=ids, show_progress=False)


class BM25Index:
    """BM25 over passage contents with pyserini's defaults (k1 0.9, b 0.4), as Search-R1's BM25 retriever."""

    def __init__(self, docs: list):
        self.docs = docs
        self.bm25 = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
        self.bm25.index(_tokenize([d["contents"] for d in docs], True), show_progress=False)
        self.lock = threading.Lock()

    def retrieve(self, query: str, k: int) -> list:
        """[(doc, score)] of the top k passages with a positive score, best first."""
        toks = _tokenize([query], False)[0]
        if not toks or k < 1:
            return []
        with self.lock:
            ids, scores = self.bm25.retrieve([toks], k=min(k, len(self.docs)), show_progress=False)
        return [(self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


class RetrieverClient:
    """Any Search-R1-compatible POST /retrieve server (reference/envs.md §3.1). Sends Search-R1's batch form
    {"queries": [q], "topk", "return_scores"}; a server that refuses it with a 4xx (verl-agent's fork takes
    {"query": q}) is asked in the single form from then on. Connection errors, timeouts and 5xx are retried
    with exponential backoff; every failure is an EnvError naming the URL and the cause."""

    def __init__(self, url: str, timeout: float = 30.0, retries: int = 3, backoff: float = 0.5):
        self.url = url if url.rstrip("/").endswith("/retrieve") else url.rstrip("/") + "/retrieve"
        self.timeout, self.retries, self.backoff, self.single = timeout, retries, backoff, False
        self.http = requests.Session()
        self.http.trust_env = urlsplit(self.url).hostname not in ("127.0.0.1", "localhost", "::1")  # no proxy locally

    def _post(self, body: dict):
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = self.http.post(self.url, json=body, timeout=self.timeout)
            except requests.RequestException as e:
                cause = f"{type(e).__name__}: {e}"
                continue
            if r.status_code < 500:
                return r
            cause = f"HTTP {r.status_code}: {r.text[:200]}"
        raise EnvError(f"retriever {self.url} failed after {self.retries + 1} attempts: {cause}")

    def retrieve(self, query: str, k: int) -> list:
        for single in (self.single, not self.single):
            r = self._post({**({"query": query} if single else {"queries": [query]}), "topk": k, "return_scores": True})
            if r.status_code < 400:
                self.single = single
                return self._parse(r)
            refused = f"HTTP {r.status_code}: {r.text[:200]}"
        raise EnvError(f"retriever {self.url} rejected both request forms (queries / query): {refused}")

    def _parse(self, r) -> list:
        try:
            result = r.json()["result"]
            out = []
            for h in (result[0] if result else []):
                doc = h["document"] if "document" in h else h  # return_scores wraps each document
                c = doc["contents"] if "contents" in doc else f'"{doc.get("title", "")}"\n{doc["text"]}'
                out.append(({"id": str(doc.get("id", "")), "contents": str(c)}, float(h.get("score", 0.0))))
            return out
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
            raise EnvError(f"retriever {self.url} sent an unexpected answer ({type(e).__name__}: {e}): "
                           f"{r.text[:200]}") from None


class RetrieverServer(ThreadingHTTPServer):
    """Search-R1's retrieval API over a BM25Index: POST /retrieve in the batch or the single form."""
    daemon_threads = True

    def __init__(self, index: BM25Index, host: str = "127.0.0.1", port: int = 8000, topk: int = 3):
        self.index, self.topk = index, topk
        super().__init__((host, port), _RetrieveHandler)

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}/retrieve"

    def answer(self, body) -> dict:
        """The response to a request body; ValueError (-> 400) names a bad field."""
        if not isinstance(body, dict):
            raise ValueError("the body must be a JSON object")
        queries = body["queries"] if "queries" in body else [body.get("query")]  # Search-R1's batch / verl-agent's single form
        if not isinstance(queries, list) or not all(isinstance(q, str) for q in queries):
            raise ValueError("the body needs 'queries' (a list of strings) or 'query' (a string)")
        k = self.topk if body.get("topk") is None else body["topk"]
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError("'topk' must be a positive integer or null")
        wrap = bool(body.get("return_scores", False))
        return {"result": [[{"document": d, "score": s} if wrap else d for d, s in self.index.retrieve(q, k)]
                           for q in queries]}


class _RetrieveHandler(BaseHTTPRequestHandler):
    server: RetrieverServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small kept-alive answers would otherwise wait for a delayed ACK

    def log_message(self, fmt, *args):  # quiet: one line per request would drown the training logs
        pass

    def _reply(self, status: int, obj) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")  # tell a kept-alive client not to reuse this connection
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        try:
            n = int(self.headers.get("Content-Length") or 0)
            if not 0 <= n <= 16 << 20:
                raise ValueError
        except ValueError:  # the body cannot be skipped, so the connection ends here
            self.close_connection = True
            return self._reply(400, {"error": "bad Content-Length header"})
        raw = self.rfile.read(n)  # read before any check so a kept-alive connection stays in step
        if self.path != "/retrieve":
            return self._reply(404, {"error": f"unknown endpoint {self.path!r} (POST /retrieve)"})
        try:
            status, out = 200, self.server.answer(json.loads(raw or b"{}"))
        except ValueError as e:  # bad JSON or a bad field
            status, out = 400, {"error": str(e)}
        except Exception as e:  # never let one request take the server down
            status, out = 500, {"error": f"retrieval failed: {type(e).__name__}: {e}"}
        self._reply(status, out)


def serve(index: BM25Index, host: str = "127.0.0.1", port: int = 8000, topk: int = 3) -> None:
    """Serve index over POST /retrieve until interrupted; an address that cannot be bound exits with the cause."""
    try:
        srv = RetrieverServer(index, host, port, topk)
    except OSError as e:
        sys.exit(f"retriever: {e}")
    print(f"serving BM25 over {len(srv.index.docs)} passages on {srv.url}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()
