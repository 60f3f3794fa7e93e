"""Text WebShop: pages, action grammar, BM25 search, reward, prompts and a scripted expert.

A clean-room engine that follows the behaviour of princeton-nlp/WebShop's text env
(reference/envs.md §1): a search page, results (top 50 by BM25 with k1 0.9, b 0.4, 10 per page),
item pages with option groups, description / features / reviews sub-pages; ``search[...]`` and
``click[...]`` actions, anything else a no-op; ``click[buy now]`` ends the episode with the task
score of ``web_agent_site/engine/goal.py::get_reward``. Env reward is 10 when the score is 1.0,
else 0 (verl-agent). Two observation formats: ``text`` (WebShop's [SEP]-joined strings) and
``compact`` (a few hundred characters, lower case, no instruction, for tiny models).

One deviation by design: upstream runs ``search[...]`` on every page; here that happens only when
``cfg.require_admissible`` is False, since an inadmissible action is a no-op otherwise.
"""
from __future__ import annotations

import random
import re
import threading
from typing import Optional

import bm25s
from rapidfuzz import fuzz, utils

from d3mini.envs import EnvError, EnvInputError, history_steps, project_action
from d3mini.envs import webshop_data as data

PAGE_SIZE, TOP_K, SEP = 10, 50, " [SEP] "
# colour words, alphabetical: normalize_color returns the first that occurs in a string
# (engine/normalize.py's rule: list order wins, so "dark blue" -> "blue", "rose gold" -> "gold")
COLOR_WORDS = ["beige", "black", "blue", "bronze", "brown", "burgundy", "charcoal", "coral", "cream", "dark",
               "gold", "gray", "green", "grey", "ivory", "khaki", "light", "maroon", "mauve", "mint", "navy",
               "olive", "orange", "pink", "plum", "purple", "red", "silver", "teal", "turquoise", "violet",
               "white", "yellow"]


# ----------------------------------------------------------------------------- reward
def normalize_color(s: str) -> str:
    return next((c for c in COLOR_WORDS if c in s), s)


def _fuzzy(a: str, b: str) -> bool:
    # thefuzz's token_set_ratio lower-cases and strips punctuation first; default_process does the same
    return fuzz.token_set_ratio(a, b, processor=utils.default_process) > 85


_STOP = set("a an and the for with of in on to by from at or is are this that your you our it its as be "
            "all new one two set pack count size inch ounce free low high long short slim soft extra super non "
            "anti easy best great premium natural pure quick".split())
_ADJ_SUFFIXES = ("able", "ible", "ful", "ous", "ive", "less", "ish", "ic", "al", "ed", "ing", "ly", "est")


def nouns(title: str) -> set:
    """Noun heuristic standing in for spaCy's NOUN/PROPN tags in the type reward: alphabetic words of
    3+ letters that are not stop words, colour words or common title adjectives, and do not end in an
    adjective / participle suffix (checked only on words of 6+ letters)."""
    words = re.findall(r"[a-z]+", title.lower())
    return {w for w in words if len(w) >= 3 and w not in _STOP and w not in COLOR_WORDS
            and not (len(w) >= 6 and w.endswith(_ADJ_SUFFIXES))}


def type_reward(goal: dict, p: dict) -> dict:
    """r_type of goal.py::get_type_reward: 1, 0.5 without query/category/title match, 0.1 / 0 for weak titles."""
    query_match = bool(goal["query"]) and p["query"] == goal["query"]
    cats = lambda s: {c.strip() for c in s.split("›") if c.strip()}
    category_match = len(cats(p["product_category"]) & cats(goal["product_category"])) >= 2
    g = nouns(goal["name"])
    title_score = len(nouns(p["Title"]) & g) / len(g) if g else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def attribute_matches(g: str, p: dict) -> bool:
    if any(_fuzzy(a, g) for a in p["Attributes"]):
        return True
    return any(g in s.lower() for s in (p["Title"], " ".join(p["BulletPoints"]), p["Description"]))


def get_reward(goal: dict, p: dict, options: dict) -> tuple[float, dict]:
    """(N_attr + N_opt + r_price) / (|attributes| + |options| + 1) * r_type  (reference/envs.md §1.7)."""
    attrs = goal["attributes"]
    gopts = goal_option_values(goal)
    chosen = [normalize_color(v) for v in options.values()]
    n_attr = sum(attribute_matches(g, p) for g in attrs)
    n_opt = sum(any(_fuzzy(normalize_color(g), c) for c in chosen) for g in gopts)
    r_price = float(p["Price"] <= goal["price_upper"])
    t = type_reward(goal, p)
    denom = len(attrs) + len(gopts) + 1
    score = (n_attr + n_opt + r_price) / denom * t["r_type"]
    info = dict(t, r_att=n_attr / max(len(attrs), 1), w_att=len(attrs) / denom,
                r_option=n_opt / len(gopts) if gopts else None, w_option=len(gopts) / denom,
                r_price=r_price, w_price=1 / denom)
    return score, info


# ----------------------------------------------------------------------------- catalog + search
def _stem(words: list) -> list:
    """A minimal plural stemmer (bars -> bar, berries -> berry) in place of Lucene's Porter stemmer."""
    out = []
    for w in words:
        if len(w) > 4 and w.endswith("ies"):
            w = w[:-3] + "y"
        elif len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us")):
            w = w[:-1]
        out.append(w)
    return out


class Shop:
    """Products, goals (test split first) and a BM25 index over WebShop's search documents (§1.9)."""

    def __init__(self, products: dict, goals: list, num_test: int):
        if not goals:
            raise EnvError("WebShop has no goals (no product carries an instruction with attributes)")
        if not 0 < num_test < len(goals):
            raise EnvError(f"env.num_test_goals={num_test} must be in [1, {len(goals) - 1}] for {len(goals)} goals")
        self.products, self.goals, self.num_test = products, goals, num_test
        self.asins = list(products)
        docs = []
        for p in products.values():
            opt_text = ", and ".join(f"{n}: {', '.join(v)}" for n, v in p["options"].items())
            first = p["BulletPoints"][0] if p["BulletPoints"] else ""
            docs.append(f"{p['Title']} {p['Description']} {first} {opt_text}".lower())
        self.bm25 = bm25s.BM25(k1=0.9, b=0.4, method="lucene")
        self.bm25.index(bm25s.tokenize(docs, stopwords="en", stemmer=_stem, show_progress=False), show_progress=False)
        self._cache, self._lock = {}, threading.Lock()

    def search(self, query: str) -> list:
        """ASINs of the top 50 documents with a positive BM25 score."""
        with self._lock:
            if query not in self._cache:
                toks = bm25s.tokenize([query], stopwords="en", stemmer=_stem, show_progress=False, return_ids=False)
                hits = []
                if toks[0]:
                    ids, scores = self.bm25.retrieve(toks, k=min(TOP_K, len(self.asins)), show_progress=False)
                    hits = [self.asins[int(i)] for i, s in zip(ids[0], scores[0]) if s > 0]
                self._cache[query] = hits
            return self._cache[query]


_SHOPS: dict = {}
_SHOPS_LOCK = threading.Lock()


def get_shop(cfg) -> Shop:
    """The (cached) shop for a config: the real files in cfg.data_dir, else the generated catalog."""
    key = (cfg.data_dir, cfg.human_goals, cfg.seed, cfg.num_products, cfg.num_goals, cfg.num_test_goals,
           cfg.asin_chars)
    with _SHOPS_LOCK:
        if key not in _SHOPS:
            if cfg.data_dir:
                raw, ins, hum = data.load_files(cfg.data_dir, cfg.human_goals)
                products = data.parse_products(raw, ins, cfg.seed)
                goals = data.human_goals(products, hum, cfg.seed) if hum is not None else data.synthetic_goals(products, cfg.seed)
            else:
                products = data.parse_products(*data.generate_raw(cfg.num_products, cfg.seed, cfg.asin_chars), cfg.seed)
                goals = data.synthetic_goals(products, cfg.seed)
                if len(goals) < cfg.num_goals:
                    raise EnvError(f"env.num_goals={cfg.num_goals} but {cfg.num_products} products give only "
                                   f"{len(goals)} goals; raise env.num_products")
                goals = goals[:cfg.num_goals]
            _SHOPS[key] = Shop(products, goals, cfg.num_test_goals)
        return _SHOPS[key]


def task_ids(cfg, split: str = "train") -> list:
    """Goal indices of a split: test = [0, num_test_goals), train = the rest (verl-agent's layout)."""
    shop = get_shop(cfg)
    if split == "test":
        return list(range(shop.num_test))
    if split == "train":
        return list(range(shop.num_test, len(shop.goals)))
    raise EnvInputError(f"unknown WebShop split {split!r} (train | test)")


# ----------------------------------------------------------------------------- environment
class WebShopEnv:
    def __init__(self, cfg):
        self.cfg, self.shop = cfg, get_shop(cfg)
        self.goal: Optional[dict] = None

    # --- state
    def reset(self, task_id=None, seed=None) -> tuple[str, dict]:
        if task_id is None:
            task_id = random.Random(seed).choice(task_ids(self.cfg, "train"))
        try:
            goal = self.shop.goals[int(task_id)] if int(task_id) >= 0 else None
        except (ValueError, TypeError, IndexError):
            goal = None
        if goal is None:  # the previous episode stays intact
            raise EnvInputError(f"WebShop task_id {task_id!r} is not a goal index in [0, {len(self.shop.goals)})")
        self.goal, self.task_id = goal, int(task_id)
        self.page, self.query, self.results, self.page_no = "search", "", [], 1
        self.asin, self.options, self.visited, self.queries = None, {}, [], []
        self.steps, self.done, self.score, self.truncated, self.reward_info = 0, False, 0.0, False, None
        return self.observation(), self._info(True)

    def clickables(self) -> list:
        if self.page == "search":
            return ["search"]
        if self.page == "done":
            return []
        c = ["back to search"]
        if self.page == "results":
            n_pages = max(1, -(-len(self.results) // PAGE_SIZE))
            c += (["< prev"] if self.page_no > 1 else []) + (["next >"] if self.page_no < n_pages else [])
            return c + [a.lower() for a in self._page_asins()]
        c.append("< prev")
        if self.page == "item":
            c += [v for vals in self.product["options"].values() for v in vals]
            c += ["description", "features", "reviews", "buy now"]
        return c

    def admissible(self) -> list:
        """search[<your query>] on the search page, then click[x] for every clickable except 'search' (a no-op)."""
        acts = ["search[<your query>]"] if self.page == "search" else []
        return acts + [f"click[{c}]" for c in self.clickables() if c != "search"]

    @property
    def product(self) -> dict:
        return self.shop.products[self.asin]

    def _page_asins(self) -> list:
        return self.results[(self.page_no - 1) * PAGE_SIZE: self.page_no * PAGE_SIZE]

    def _info(self, valid: bool) -> dict:
        return {"task": self.goal["instruction_text"], "task_id": self.task_id,
                "admissible_actions": self.admissible(), "is_action_valid": valid,
                "won": self.score >= 1.0 - 1e-9, "score": self.score, "step": self.steps,
                "truncated": self.truncated, "reward_info": self.reward_info}

    # --- dynamics
    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.goal is None:
            raise EnvError("WebShop: call reset() before step()")
        if self.done:
            return self.observation(), 0.0, True, self._info(False)
        self.steps += 1
        m = re.fullmatch(r"\s*(\w+)\s*\[(.*)\]\s*", action or "", re.S)
        verb, arg = (m.group(1).lower(), m.group(2).strip().lower()) if m else ("", "")
        valid, reward = False, 0.0
        if verb == "search" and arg:
            valid = self.page == "search"
            if valid or not self.cfg.require_admissible:
                self.queries.append(arg)
                self.page, self.query, self.results, self.page_no = "results", arg, self.shop.search(arg), 1
        elif verb == "click" and arg != "search" and arg in self.clickables():
            valid = True
            reward = self._click(arg)
        if not self.done and self.steps >= self.cfg.max_steps:
            self.done = self.truncated = True
        return self.observation(), reward, self.done, self._info(valid)

    def _click(self, x: str) -> float:
        if x == "back to search":
            self.page, self.query, self.results, self.asin, self.options = "search", "", [], None, {}
        elif x == "next >":
            self.page_no += 1
        elif x == "< prev":
            if self.page == "results":
                self.page_no -= 1
            elif self.page == "item":
                self.page, self.asin, self.options = "results", None, {}  # rendering results clears options
            else:
                self.page = "item"
        elif self.page == "results":
            self.asin = next(a for a in self._page_asins() if a.lower() == x)
            self.page, self.options = "item", {}
            self.visited.append(self.asin)
        elif x in ("description", "features", "reviews"):
            self.page = x
        elif x == "buy now":
            self.score, self.reward_info = get_reward(self.goal, self.product, self.options)
            self.page, self.done = "done", True
            return 10.0 if self.score >= 1.0 - 1e-9 else 0.0
        else:  # an option value of the item page
            self.options[next(n for n, vals in self.product["options"].items() if x in vals)] = x
        return 0.0

    # --- rendering
    def observation(self) -> str:
        return self._compact() if self.cfg.obs_format == "compact" else self._text()

    def _text(self) -> str:
        head = ["Instruction:", self.goal["instruction_text"]]
        if self.page == "search":
            return SEP.join(["WebShop"] + head + ["Search"])
        if self.page == "done":
            p = self.product
            return SEP.join(["Thank you for shopping with us!", "Purchased:", p["asin"], p["Title"], "Options:",
                             ", ".join(f"{k}: {v}" for k, v in self.options.items()) or "none",
                             "Score (0 to 1):", f"{self.score:.3f}"])
        parts = head + ["Back to Search"]
        if self.page == "results":
            nav = [{"< prev": "< Prev", "next >": "Next >"}[c] for c in self.clickables() if c in ("< prev", "next >")]
            parts += [f"Page {self.page_no} (Total results: {len(self.results)})"] + nav
            for a in self._page_asins():
                parts += [a, self.shop.products[a]["Title"], self.shop.products[a]["PriceTag"]]
            return SEP.join(parts)
        p, parts = self.product, parts + ["< Prev"]
        if self.page == "item":
            for name, vals in p["options"].items():
                parts += [name] + vals
            parts += [p["Title"], f"Price: {p['PriceTag']}", "Rating: N.A.", "Description", "Features", "Reviews", "Buy Now"]
        elif self.page == "description":
            parts.append(p["Description"])
        elif self.page == "features":
            parts += p["BulletPoints"]
        return SEP.join(parts)

    def _compact(self) -> str:
        if self.page == "search":
            return "search page"
        if self.page == "done":
            return f"bought {self.asin.lower()}, score {self.score:.2f}"
        p = self.product if self.asin else None
        if self.page == "results":
            n_pages = max(1, -(-len(self.results) // PAGE_SIZE))
            nav = " | ".join(c for c in self.clickables() if c in ("< prev", "next >", "back to search"))
            rows = [f"{a.lower()} {_short_title(self.shop.products[a])} {self.shop.products[a]['PriceTag']}"
                    for a in self._page_asins()]
            return "\n".join([f"page {self.page_no}/{n_pages} | {nav}"] + (rows or ["no results"]))
        if self.page == "item":
            groups = [f"{n}: " + ", ".join(f"[{v}]" if self.options.get(n) == v else v for v in vals)
                      for n, vals in p["options"].items()]
            return "\n".join([f"item {p['asin'].lower()}: {_short_title(p)} {p['PriceTag']}"] + groups +
                             ["description | features | reviews | < prev | back to search | buy now"])
        body = p["Description"] if self.page == "description" else "; ".join(p["BulletPoints"]) if self.page == "features" else "no reviews"
        return f"{self.page}: {body.lower()[:200]}\n< prev | back to search"

    def close(self) -> None:
        pass


def _short_title(p: dict) -> str:
    """Compact title: lower case, a leading brand dropped, at most 60 characters."""
    t = p["Title"].lower()
    b = p.get("brand", "").lower()
    if b and t.startswith(b + " "):
        t = t[len(b) + 1:]
    return t[:60]


def make(cfg) -> WebShopEnv:
    return WebShopEnv(cfg)


# ----------------------------------------------------------------------------- prompts
VERL_TEMPLATE = ("You are an expert autonomous agent shopping in the WebShop e-commerce environment. "
                 "Your task is to: {task}.{hist} {now}current observation is: {obs}.\n"
                 "Your admissible actions in the current situation are:\n[\n{acts}\n].\n\n"
                 "Now take one action for the current step. First reason step by step about the situation "
                 "and about which admissible action brings you closer to the shopping goal, and put that "
                 "reasoning inside <think> </think> tags. Then give one admissible action inside "
                 "<action> </action> tags.")
VERL_MAX_CHARS = 13000  # verl-agent drops the history when a WebShop prompt grows past this


def _strip_task(obs: str, task: str) -> str:
    """verl-agent's formatting: keep the parts after the instruction, each quoted ('Back to Search' [SEP] ...)."""
    key = f"Instruction:{SEP}{task}{SEP}"
    if key not in obs:
        return obs
    return SEP.join(f"'{s}'" for s in obs.split(key, 1)[1].split(SEP))


def prompt(task: str, obs: str, history: list, admissible: Optional[list], step: int, cfg) -> str:
    """The user message for one step (history = the last H (observation, action) pairs before this step)."""
    steps = history_steps(history, step)
    if cfg.prompt == "compact":
        lines = [f"task: {task}"]
        lines += [f"step {k}: {o[:80].replace(chr(10), ' ')} -> {a}" for k, o, a in steps]
        lines += [f"now: {obs}", "reply <think>...</think><action>search[query] or click[item]</action>"]
        return "\n".join(lines)
    acts = ",\n".join(f"'{a}'" for a in (admissible or [])) + ("," if admissible else "")
    obs = _strip_task(obs, task)
    full = None
    if steps:
        hist = "\n".join(f"[Observation {k}: '{_strip_task(o, task)}', Action {k}: '{a}']" for k, o, a in steps)
        full = VERL_TEMPLATE.format(task=task, obs=obs, acts=acts, now=f"You are now at step {step + 1} and your ",
                                    hist=f" Prior to this step you have already taken {step} step(s). Below are the "
                                         f"most recent {len(steps)} observations and the actions you took: {hist}\n")
    if full is None or len(full) > VERL_MAX_CHARS:
        full = VERL_TEMPLATE.format(task=task, obs=obs, acts=acts, hist="", now="Your ")
    return full


def project(text: str) -> tuple[str, bool]:
    """<action>...</action> -> action; without the tags the last 20 characters (verl-agent's WebShop rule)."""
    return project_action(text, tail=20)


NAV_CLICKS = ("back to search", "< prev", "next >", "description", "features", "reviews", "buy now")


def action_kind(action: str) -> str:
    """search | product (a product id) | nav (page navigation and buy now) | option, for per-kind
    accuracies (SFT validation)."""
    a = action.strip().lower()
    if a.startswith("search["):
        return "search"
    x = a[len("click["):-1] if a.startswith("click[") and a.endswith("]") else a
    if x in NAV_CLICKS:
        return "nav"
    return "product" if re.fullmatch(r"b0[0-9a-z]+", x) else "option"


# ----------------------------------------------------------------------------- expert
def search_query(instruction: str) -> str:
    """The expert's query, derived from the visible instruction: drop the price clause, the option clause
    and a leading request phrase ("i am looking for gluten free protein bar with flavor: ..." -> "gluten free protein bar")."""
    q = re.sub(r",? and price lower than [\d.]+ dollars$", "", instruction.lower().strip())
    q = re.sub(r" with [a-z0-9 ]+: .*$", "", q)
    q = re.sub(r"^(i am looking for|i'm looking for|looking for|i need|i want to buy|i want|i would like|find me|"
               r"show me|get me|buy)( an?| some| the)? ", "", q)
    return q.strip()


def goal_option_values(goal: dict) -> list:
    """The values the goal asks for, one per option (goal_options is a name -> value dict or a list)."""
    g = goal["goal_options"]
    return list(g.values() if isinstance(g, dict) else g)


def offered_value(goal_value: str, p: dict) -> Optional[str]:
    """The product's option value that matches one the goal asks for (None if it offers none)."""
    vals = [v for vs in p["options"].values() for v in vs]
    return next((v for v in vals if _fuzzy(normalize_color(goal_value), normalize_color(v))), None)


def _option_clicks(goal: dict, p: dict) -> Optional[list]:
    """The product's option value for each goal option (None if one is missing)."""
    out = [offered_value(g, p) for g in goal_option_values(goal)]
    return None if None in out else out


def _fits(goal: dict, p: dict) -> bool:
    """Every term but the options is perfect (attributes, price, type): all readable from the results page."""
    return (all(attribute_matches(g, p) for g in goal["attributes"]) and p["Price"] <= goal["price_upper"]
            and type_reward(goal, p)["r_type"] == 1.0)


def expert_action(env: WebShopEnv) -> tuple[str, str]:
    """(situation key, action): search the derived query; open the first unvisited result that fits;
    go back if it lacks a goal option; else click each goal option, then buy now."""
    g, page = env.goal, env.page
    if page == "search":
        q = search_query(g["instruction_text"])
        return "search", f"search[{q if q and q not in env.queries else g['name'].lower()}]"
    if page == "results":
        for a in env._page_asins():
            if a not in env.visited and _fits(g, env.shop.products[a]):
                return "open", f"click[{a.lower()}]"
        if "next >" in env.clickables() and env.page_no < TOP_K // PAGE_SIZE:
            return "next", "click[next >]"
        return "again", "click[back to search]"
    if page == "item":
        clicks = _option_clicks(g, env.product)
        if clicks is None or not _fits(g, env.product):
            return "lacks", "click[< prev]"
        for v in clicks:
            if v not in env.options.values():
                return "option", f"click[{v}]"
        return "buy", "click[buy now]"
    return "back", "click[< prev]"


THOUGHTS = {
    "search": ["i should search for the item.", "let me search the shop first.", "first i search for what i need."],
    "open": ["this result fits the request.", "this one matches; open it.", "that item looks right."],
    "next": ["nothing here fits; next page.", "no match on this page.", "keep looking on the next page."],
    "again": ["no fit found; search again.", "these results do not fit.", "let me try another search."],
    "lacks": ["this item lacks an option i need.", "wrong item; go back.", "it does not fit; back to results."],
    "option": ["i need to choose the right option.", "select the requested option.", "pick the option from the task."],
    "buy": ["everything matches; buy it.", "all options are set, buy now.", "ready to buy."],
    "back": ["back to the item page.", "return to the item.", "go back to the item."],
}


def expert(env: WebShopEnv, rng: random.Random) -> str:
    """The expert's full response for the env's current state: a short <think> drawn from THOUGHTS, then the action.
    With env.think = "state" the item page's think first lists the goal's options as set / missing before an
    option click or the purchase; "state_all" also before going back from an item that lacks one ("not offered")."""
    if not isinstance(env, WebShopEnv):
        raise EnvError("the WebShop expert needs an in-process WebShopEnv (it reads the goal), "
                       f"got {type(env).__name__}")
    key, action = expert_action(env)
    think = rng.choice(THOUGHTS[key])
    spelled = {"phrases": (), "state": ("option", "buy"), "state_all": ("option", "buy", "lacks")}[env.cfg.think]
    if key in spelled:  # the decision to pick an option, buy or go back, spelled out: the goal's options as shown
        think = f"{option_status(env.goal, env.product, env.options.values())}. {think}"
    return f"<think>{think}</think><action>{action}</action>"


def mistake(env: WebShopEnv, rng: random.Random) -> Optional[str]:
    """A wrong action of the kinds a policy makes (bench/failures.py), for SFT detours: on a results page
    open an unvisited item that does not fit the request (the expert opens only those that do); on an item
    page click a goal value the item does not offer (an invalid action: the page stays) or another value of
    an option the goal names. None on the other pages, or where no such action exists. The expert's next
    steps go back or re-pick."""
    g, page = env.goal, env.page
    if page == "results":
        wrong = [a for a in env._page_asins() if a not in env.visited and not _fits(g, env.shop.products[a])]
        return f"click[{rng.choice(wrong).lower()}]" if wrong else None
    if page != "item":
        return None
    p = env.product
    wrong = []
    for value in goal_option_values(g):
        hit = offered_value(value, p)
        if hit is None:
            wrong.append(value.lower())
        else:
            wrong += [v for vals in p["options"].values() if hit in vals for v in vals if v != hit]
    return f"click[{rng.choice(wrong)}]" if wrong else None


def option_status(goal: dict, product: dict, chosen) -> str:
    """Each goal option as an item page shows it: "<value> set" (chosen), "<value> missing" (offered, not
    chosen) or "<goal's value> not offered" (the item has no such value), comma-separated."""
    out = []
    for g in goal_option_values(goal):
        hit = offered_value(g, product)
        out.append(f"{g} not offered" if hit is None else f"{hit} {'set' if hit in chosen else 'missing'}")
    return ", ".join(out)
