"""HTTP JSON server for any registered env, and EnvClient, a TextEnv over HTTP (reference/envs.md §5.4).

    python -m d3mini.envs.server --env webshop --port 8100 [--host 127.0.0.1] [--idle-timeout 3600] [--config FILE] [env.num_products=100 ...]

Endpoints (JSON bodies; errors answer {"error": "..."} with a 4xx for bad requests and a 500
when the env itself fails):

    POST /reset       {"env"?: name, "env_id"?: str, "task_id"?: ..., "seed"?: int} -> {"env_id", "observation", "info"}
                      (a given env_id is created or reset, so a retried reset leaks no session)
    POST /step        {"env_id", "action", "seq"?: int}  -> {"observation", "reward", "done", "info", "seq"}
    POST /step_batch  [{"env_id", "action", "seq"?}, ...] -> [step response or {"error"}, ...]
    POST /close       {"env_id"}                          -> {}
    GET  /health                                          -> {"ok": true, "env", "sessions", "expired", "config"}

``seq`` makes retries safe: it is the number of steps the client has completed in the session;
a step whose seq is one behind the session's is a retry of the last one and gets the stored
answer again instead of a second step. Sessions each carry a lock, so requests for one session
are served one at a time while different sessions run concurrently. A session nobody has reset
or stepped for `idle_timeout` seconds (a client that died without /close) is closed when the next
session is reset, so a long-lived server does not collect abandoned envs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional
from urllib.parse import urlsplit

from d3mini.envs import REGISTRY, EnvError, EnvInputError, make_env

MAX_BODY = 16 << 20  # bytes


# EnvConfig fields that decide which tasks a server's envs hold and what they show: a client with other
# values would be scored on other tasks than it asked for (the rest, prompts and HTTP settings, are the client's)
SERVED_FIELDS = ("name", "seed", "num_products", "num_goals", "num_test_goals", "asin_chars", "obs_format",
                 "data_dir", "topk", "retriever_url")


def check_server(url: str, env_cfg: Any = None, timeout: float = 5.0) -> dict:
    """GET <url>/health; EnvError when nothing answers there or, given the client's env_cfg, when the server
    builds its envs from other SERVED_FIELDS values. Returns the health record."""
    import requests
    try:
        r = requests.get(url.rstrip("/") + "/health", timeout=timeout)
        r.raise_for_status()
        health = r.json()
    except Exception as e:  # connection refused, timeout, an HTTP error, a non-JSON answer
        raise EnvError(f"env.server_url = {url!r} is unreachable: {e}") from None
    served = health.get("config") if isinstance(health, dict) else None
    if env_cfg is not None and isinstance(served, dict):
        diff = [f"{k}: server {served[k]!r}, here {getattr(env_cfg, k)!r}" for k in SERVED_FIELDS
                if k in served and served[k] != getattr(env_cfg, k)]
        if diff:
            raise EnvError(f"env.server_url = {url!r} serves envs built from other settings ({'; '.join(diff)}); "
                           f"start the server with the same env.* values")
    return health


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class Session:
    def __init__(self, env):
        self.env, self.lock, self.seq, self.last, self.ready = env, threading.Lock(), 0, None, False
        self.used, self.expired = time.monotonic(), False  # last reset or step; closed for idleness


class EnvServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cfg, host: str = "127.0.0.1", port: int = 8100, verbose: bool = False,
                 idle_timeout: float = 3600.0):
        self.cfg, self.verbose = dataclasses.replace(cfg, server_url=None), verbose  # serve in-process envs
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()
        self.idle_timeout, self.expired = float(idle_timeout), 0  # 0 = sessions never expire
        make_env(self.cfg).close()  # build the env once now, so missing data fails at start-up, not per request
        super().__init__((host, port), Handler)

    @property
    def url(self) -> str:
        return f"http://{self.server_address[0]}:{self.server_address[1]}"

    # --- endpoint logic (bodies already parsed)
    def _session(self, env_id) -> Session:
        with self.lock:
            s = self.sessions.get(env_id)
        if s is None:
            raise HTTPError(404, f"unknown env_id {env_id!r} (reset first; it may have been closed, or expired "
                                 f"after {self.idle_timeout:g} s idle)")
        return s

    def _expire_idle(self) -> None:
        """Close sessions idle for longer than idle_timeout (none that a request is using right now)."""
        if self.idle_timeout <= 0:
            return
        now, gone = time.monotonic(), []
        with self.lock:
            for env_id, s in list(self.sessions.items()):
                if now - s.used > self.idle_timeout and s.lock.acquire(blocking=False):
                    del self.sessions[env_id]
                    s.expired = True  # a request that looked the session up just before waits, then gets 404
                    gone.append(s)
            self.expired += len(gone)
        for s in gone:
            try:
                if s.env is not None:
                    s.env.close()
            except Exception:  # an env that fails to close is gone all the same
                pass
            finally:
                s.lock.release()

    def reset(self, body: dict) -> dict:
        name = body.get("env", self.cfg.name)
        if name not in REGISTRY:
            raise HTTPError(400, f"unknown env {name!r} (known: {sorted(REGISTRY)})")
        if name != self.cfg.name:
            raise HTTPError(400, f"this server serves env {self.cfg.name!r}, not {name!r}")
        env_id = body.get("env_id")
        if env_id is not None and not isinstance(env_id, str):
            raise HTTPError(400, "field 'env_id' must be a string")
        seed = body.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise HTTPError(400, "field 'seed' must be an integer")
        self._expire_idle()
        with self.lock:
            env_id = env_id or uuid.uuid4().hex
            s = self.sessions.setdefault(env_id, Session(None))
        with s.lock:
            try:
                if s.env is None:
                    s.env = _call("make", lambda: make_env(self.cfg))
                obs, info = _call("reset", lambda: s.env.reset(task_id=body.get("task_id"), seed=seed))
            except HTTPError:
                if not s.ready:  # a session whose first reset failed is dropped, not left half-built
                    with self.lock:
                        if self.sessions.get(env_id) is s:
                            del self.sessions[env_id]
                raise
            s.ready, s.seq, s.last, s.used = True, 0, None, time.monotonic()
        return {"env_id": env_id, "observation": obs, "info": info}

    def step(self, body: Any) -> dict:
        if not isinstance(body, dict):
            raise HTTPError(400, f"a step request must be a JSON object, got {type(body).__name__}")
        for key in ("env_id", "action"):
            if key not in body:
                raise HTTPError(400, f"missing field {key!r}")
            if not isinstance(body[key], str):
                raise HTTPError(400, f"field {key!r} must be a string")
        seq = body.get("seq")
        if seq is not None and (not isinstance(seq, int) or isinstance(seq, bool)):
            raise HTTPError(400, "field 'seq' must be an integer")
        s = self._session(body["env_id"])
        with s.lock:
            if s.expired:  # closed for idleness while this request waited for it
                raise HTTPError(404, f"env_id {body['env_id']!r} expired after {self.idle_timeout:g} s idle")
            if seq is not None and seq == s.seq - 1 and s.last is not None:
                return s.last  # a retry of the step that already ran
            if seq is not None and seq != s.seq:
                raise HTTPError(409, f"env_id {body['env_id']!r}: step seq {seq} but the session is at {s.seq}")
            s.used = time.monotonic()
            obs, reward, done, info = _call("step", lambda: s.env.step(body["action"]))
            s.seq += 1
            s.last = {"observation": obs, "reward": float(reward), "done": bool(done), "info": info, "seq": s.seq}
            return s.last

    def step_batch(self, body: Any) -> list:
        if not isinstance(body, list):
            raise HTTPError(400, f"/step_batch needs a JSON list of step requests, got {type(body).__name__}")
        out = []
        for item in body:
            try:
                out.append(self.step(item))
            except HTTPError as e:
                out.append({"error": str(e), "status": e.status})
        return out

    def close_session(self, body: dict) -> dict:
        if not isinstance(body.get("env_id"), str):
            raise HTTPError(400, "missing field 'env_id'" if "env_id" not in body else "field 'env_id' must be a string")
        s = self._session(body["env_id"])
        with self.lock:
            if self.sessions.get(body["env_id"]) is s:  # not a newer session that took over an expired id
                del self.sessions[body["env_id"]]
        with s.lock:
            if s.env is not None and not s.expired:  # an expired session's env is closed already
                _call("close", s.env.close)
        return {}


def _call(what: str, fn):
    """Run env code; its own input errors become 400, anything else a 500 naming the exception."""
    try:
        return fn()
    except EnvInputError as e:
        raise HTTPError(400, str(e)) from None
    except Exception as e:
        raise HTTPError(500, f"env {what} failed: {type(e).__name__}: {e}") from None


class Handler(BaseHTTPRequestHandler):
    server: EnvServer
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # small kept-alive answers would otherwise wait ~40 ms for a delayed ACK

    def log_message(self, fmt, *args):
        if self.server.verbose:
            super().log_message(fmt, *args)

    def _send(self, status: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            with self.server.lock:
                n = len(self.server.sessions)
            served = {k: getattr(self.server.cfg, k) for k in SERVED_FIELDS}
            self._send(200, {"ok": True, "env": self.server.cfg.name, "sessions": n, "expired": self.server.expired,
                             "config": served})
        else:
            self._send(404 if self.path not in ROUTES else 405, {"error": f"GET {self.path}: use GET /health or POST {sorted(ROUTES)}"})

    def do_POST(self):
        try:
            try:
                n = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                self.close_connection = True
                raise HTTPError(400, "bad Content-Length header") from None
            if n < 0:
                self.close_connection = True
                raise HTTPError(400, "bad Content-Length header")
            if n > MAX_BODY:
                self.close_connection = True
                raise HTTPError(413, f"request body of {n} bytes exceeds {MAX_BODY}")
            raw = self.rfile.read(n)  # read before any check so a kept-alive connection stays in step
            if self.path not in ROUTES:
                raise HTTPError(404, f"unknown endpoint {self.path!r} (POST {sorted(ROUTES)}, GET /health)")
            try:
                body = json.loads(raw or b"{}")
            except ValueError as e:
                raise HTTPError(400, f"request body is not valid JSON: {e}") from None
            if self.path != "/step_batch" and not isinstance(body, dict):
                raise HTTPError(400, f"{self.path} needs a JSON object, got {type(body).__name__}")
            self._send(200, getattr(self.server, ROUTES[self.path])(body))
        except HTTPError as e:
            self._send(e.status, {"error": e.args[0]})
        except Exception as e:  # never let one request take the server down
            self._send(500, {"error": f"internal error: {type(e).__name__}: {e}"})


ROUTES = {"/reset": "reset", "/step": "step", "/step_batch": "step_batch", "/close": "close_session"}


def serve_in_thread(cfg, host: str = "127.0.0.1", port: int = 0, idle_timeout: float = 3600.0) -> EnvServer:
    """Start a server on a background thread (port 0 = any free port); stop it with .shutdown()."""
    srv = EnvServer(cfg, host, port, idle_timeout=idle_timeout)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


# ----------------------------------------------------------------------------- client
class EnvClient:
    """A TextEnv served over HTTP. Connection errors, timeouts and 5xx answers are retried with
    exponential backoff (backoff, 2 backoff, 4 backoff ...); a 4xx is raised at once. Both end in
    EnvError naming the URL and the cause."""

    def __init__(self, url: str, env: str = "webshop", timeout: float = 30.0, retries: int = 3, backoff: float = 0.5):
        import requests  # imported here so the server side does not need it
        self.url, self.env, self.timeout, self.retries, self.backoff = url.rstrip("/"), env, timeout, retries, backoff
        self.http = requests.Session()
        # a local server is never reached through a proxy; skipping the proxy lookup also saves ~1 ms a request
        self.http.trust_env = urlsplit(self.url).hostname not in ("127.0.0.1", "localhost", "::1")
        self.env_id: Optional[str] = None
        self.seq = 0

    def _post(self, path: str, body: Any) -> Any:
        import requests
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                r = self.http.post(self.url + path, json=body, timeout=self.timeout)
            except requests.RequestException as e:
                cause = f"{type(e).__name__}: {e}"
                continue
            try:
                data = r.json()
            except ValueError:
                data = {"error": r.text[:200]}
            if r.status_code < 400:
                return data
            msg = data.get("error", r.text[:200]) if isinstance(data, dict) else r.text[:200]
            if r.status_code < 500:
                raise EnvError(f"env server {self.url}{path} rejected the request ({r.status_code}): {msg}")
            cause = f"HTTP {r.status_code}: {msg}"
        raise EnvError(f"env server {self.url}{path} failed after {self.retries + 1} attempts: {cause}")

    def reset(self, task_id=None, seed=None) -> tuple[str, dict]:
        body = {"env": self.env, "env_id": self.env_id or uuid.uuid4().hex, "task_id": task_id, "seed": seed}
        data = self._post("/reset", body)
        self.env_id, self.seq = data["env_id"], 0
        return data["observation"], data["info"]

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.env_id is None:
            raise EnvError(f"env server {self.url}: call reset() before step()")
        data = self._post("/step", {"env_id": self.env_id, "action": action, "seq": self.seq})
        self.seq = data["seq"]
        return data["observation"], data["reward"], data["done"], data["info"]

    @staticmethod
    def step_batch(clients: list, actions: list) -> list:
        """Step several sessions of one server with a single request: [(obs, reward, done, info)]."""
        if not clients:
            return []
        if len({c.url for c in clients}) != 1 or len(clients) != len(actions):
            raise EnvError("step_batch needs clients of one server and one action per client")
        items = [{"env_id": c.env_id, "action": a, "seq": c.seq} for c, a in zip(clients, actions)]
        out = []
        for c, d in zip(clients, clients[0]._post("/step_batch", items)):
            if "error" in d:
                raise EnvError(f"env server {c.url}/step_batch: env_id {c.env_id}: {d['error']}")
            c.seq = d["seq"]
            out.append((d["observation"], d["reward"], d["done"], d["info"]))
        return out

    def close(self) -> None:
        if self.env_id is not None:
            try:
                self._post("/close", {"env_id": self.env_id})
            except EnvError as e:
                if "unknown env_id" not in str(e):
                    raise
            self.env_id = None
        self.http.close()


def main(argv=None) -> None:
    from d3mini.config import ConfigError, load_config
    ap = argparse.ArgumentParser(prog="python -m d3mini.envs.server", description=__doc__.split("\n")[0],
                                 epilog="Other arguments are config overrides: env.num_products=100 or --env.seed 3.",
                                 allow_abbrev=False)
    ap.add_argument("--env", default=None, help="registered env name (default: env.name of the config)")
    ap.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1, local only)")
    ap.add_argument("--port", type=int, default=8100, help="port (0 = any free port)")
    ap.add_argument("--config", default=None, help="YAML config whose env section is used")
    ap.add_argument("--verbose", action="store_true", help="log every request")
    ap.add_argument("--idle-timeout", type=float, default=3600.0,
                    help="close sessions idle this many seconds, checked at each reset (0 = never; default 3600)")
    args, rest = ap.parse_known_args(argv)
    try:
        cfg = load_config(args.config, (["env.name=" + args.env] if args.env else []) + rest)
        srv = EnvServer(cfg.env, args.host, args.port, args.verbose, idle_timeout=args.idle_timeout)
    except (ConfigError, EnvError, OSError) as e:
        sys.exit(f"env server: {e}")
    print(f"serving env {cfg.env.name!r} on {srv.url}", flush=True)
    try:
        srv.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


if __name__ == "__main__":
    main()
