"""Text WebShop: hand-computed rewards, the action grammar and pages, the expert, the real-file loader."""
import itertools
import json
import random

import pytest

from d3mini.config import EnvConfig
from d3mini.envs import EnvError, EnvInputError, action_start, is_action_valid, project_action
from d3mini.envs import webshop as W
from d3mini.envs import webshop_data as D


# ----------------------------------------------------------------------------- reward by hand
def product(**kw):
    p = {"asin": "B000000001", "Title": "Acme Gluten Free Protein Bar", "Description": "A tasty snack.",
         "BulletPoints": ["High protein."], "Price": 35.40, "PriceTag": "$35.40", "query": "protein bar",
         "product_category": "Grocery › Snacks › Bars", "category": "grocery",
         "options": {"color": ["black", "white"], "size": ["medium", "large"]},
         "Attributes": ["gluten free", "high protein"], "instruction": None, "instruction_attributes": []}
    p.update(kw)
    return p


def goal(**kw):
    g = {"asin": "B000000001", "instruction_text": "x", "attributes": ["gluten free", "high protein", "vegan"],
         "goal_options": {"color": "black", "size": "large"}, "price_upper": 40.0, "query": "protein bar",
         "category": "grocery", "name": "Acme Gluten Free Protein Bar", "product_category": "Grocery › Snacks › Bars"}
    g.update(kw)
    return g


def test_reward_perfect_purchase_is_one():
    score, info = W.get_reward(goal(attributes=["gluten free", "high protein"]), product(), {"color": "black", "size": "large"})
    assert score == 1.0 and info["r_type"] == 1.0 and info["r_att"] == 1.0 and info["r_option"] == 1.0


def test_reward_worked_example_fractions():
    # 3 goal attributes, 2 matched; options {black, large} vs chosen {black, medium}; price 35.40 <= 40
    score, info = W.get_reward(goal(), product(), {"color": "black", "size": "medium"})
    assert score == pytest.approx((2 + 1 + 1) / (3 + 2 + 1))
    assert info["r_att"] == pytest.approx(2 / 3) and info["r_option"] == 0.5 and info["r_price"] == 1.0
    assert info["w_att"] == pytest.approx(3 / 6) and info["w_option"] == pytest.approx(2 / 6)
    # over the price bound, no options chosen: (2 + 0 + 0) / 6
    score, _ = W.get_reward(goal(price_upper=30.0), product(), {})
    assert score == pytest.approx(2 / 6)


def test_reward_attribute_sources():
    # fuzzy match on product attributes (punctuation ignored), else a substring of title / bullets / description
    p = product(Attributes=["gluten-free"], Title="Acme Protein Bar", BulletPoints=["Great taste", "Vegan recipe"],
                Description="Rich in high protein content.")
    score, info = W.get_reward(goal(goal_options={}), p, {})
    assert info["r_att"] == 1.0 and score == 1.0
    p = product(Attributes=["DUMMY_ATTR"], Title="Acme Bar", BulletPoints=[], Description="")
    _, info = W.get_reward(goal(goal_options={}), p, {})
    assert info["r_att"] == 0.0


def test_reward_colour_normalisation_and_option_lists():
    # "navy blue" and "dark blue" both normalise to "blue" (first colour word in list order)
    assert W.normalize_color("dark blue") == "blue" and W.normalize_color("rose gold") == "gold"
    assert W.normalize_color("medium") == "medium"
    g = goal(attributes=["gluten free"], goal_options={"color": "navy blue"})
    score, _ = W.get_reward(g, product(), {"color": "dark blue"})
    assert score == 1.0
    score, _ = W.get_reward(g, product(), {"color": "red"})
    assert score == pytest.approx(2 / 3)
    # human goals carry option strings in a list
    score, _ = W.get_reward(goal(attributes=["gluten free"], goal_options=["large", "white"]), product(), {"size": "large"})
    assert score == pytest.approx(3 / 4)


def test_type_reward_rules():
    assert W.nouns("Acme Gluten Free Low Sugar Protein Bar, Chocolate") == {"acme", "gluten", "sugar", "protein", "bar", "chocolate"}
    assert W.nouns("Washable Relaxing Cotton Shirt") == {"cotton", "shirt"}
    other = dict(query="shampoo", product_category="Beauty › Hair › Shampoo")
    g = goal(attributes=["gluten free"], goal_options={})
    # no shared noun -> 0 whatever else matches
    assert W.type_reward(g, product(Title="Zeta Shampoo Bottle", **other))["r_type"] == 0.0
    assert W.type_reward(g, product(Title="Zeta Shampoo Bottle"))["r_type"] == 0.0
    # 1 of the goal's 4 nouns (acme, gluten, protein, bar) = 1/4 > 0.2 -> 1 even with other query and category
    t = W.type_reward(g, product(Title="Zeta Protein Shampoo", **other))
    assert t["title_score"] == pytest.approx(1 / 4) and t["r_type"] == 1.0
    # 1 of 5 nouns = 0.2: 0.5 without a query / category match, 1 with a category match (2 shared levels)
    g5 = goal(name="Acme Protein Bar Snack Box", attributes=["gluten free"], goal_options={})
    assert W.type_reward(g5, product(Title="Zeta Box", **other))["r_type"] == 0.5
    assert W.type_reward(g5, product(Title="Zeta Box", query="shampoo", product_category="Grocery › Snacks › Chips"))["r_type"] == 1.0
    # 1 of 11 nouns < 0.1 -> 0.1 even with the query matching
    g11 = goal(name="Acme Protein Bar Snack Box Oats Honey Almond Cocoa Date Raisin")
    assert W.type_reward(g11, product(Title="Zeta Raisin"))["r_type"] == 0.1
    # no noun in the goal name -> title_score 0.2
    assert W.type_reward(goal(name="Free And Low"), product(**other))["title_score"] == 0.2
    score, _ = W.get_reward(g5, product(Title="Zeta Box", **other), {})
    assert score == pytest.approx((1 + 0 + 1) / 2 * 0.5)


# ----------------------------------------------------------------------------- catalog invariants
def cfg(**kw):
    base = dict(obs_format="text", prompt="verl", num_products=160, num_goals=400, num_test_goals=100)
    base.update(kw)
    return EnvConfig(**base)


def test_short_asins_for_tiny_models():
    raw, _ = D.generate_raw(160, seed=3, asin_chars=3)
    assert all(len(p["asin"]) == 5 and p["asin"].startswith("B0") for p in raw)
    assert len({p["asin"] for p in raw}) == 160
    with pytest.raises(ValueError, match="asin_chars"):
        D.generate_raw(160, seed=3, asin_chars=1)
    env = W.make(cfg(asin_chars=3, obs_format="compact", prompt="compact"))
    env.reset(task_id=0)
    rng = random.Random(0)
    for _ in range(15):  # the expert still wins with short ids
        obs, r, done, info = env.step(W.project(W.expert(env, rng))[0])
        if done:
            break
    assert info["won"]


def test_generated_catalog_is_clean_and_deterministic():
    raw, ins = D.generate_raw(160, seed=3)
    assert (raw, ins) == D.generate_raw(160, seed=3) and raw != D.generate_raw(160, seed=4)[0]
    products = D.parse_products(raw, ins, seed=3)
    pools = {t[0]: t[3] for t in D.TYPES}
    for p in products.values():
        # an attribute of the product's type matches exactly when the product has it
        for a in pools[p["query"]]:
            assert W.attribute_matches(a, p) == (a in p["Attributes"]), (p["Title"], a)
        # option values of one group never match each other under the reward's fuzzy rule
        for vals in p["options"].values():
            for x, y in itertools.combinations(vals, 2):
                assert not W._fuzzy(W.normalize_color(x), W.normalize_color(y)), (x, y)
        assert len(p["asin"]) == 10 and p["Title"].lower().endswith(p["query"])


def test_task_splits():
    c = cfg()
    test, train = W.task_ids(c, "test"), W.task_ids(c, "train")
    assert test == list(range(100)) and train == list(range(100, 400))
    goals = W.get_shop(c).goals
    again = D.synthetic_goals(D.parse_products(*D.generate_raw(160, c.seed), c.seed), c.seed)[:400]
    assert [g["instruction_text"] for g in goals] == [g["instruction_text"] for g in again]
    with pytest.raises(EnvInputError, match="split"):
        W.task_ids(c, "valid")
    with pytest.raises(EnvError, match="num_goals"):
        W.get_shop(cfg(num_products=16, num_goals=100000))


# ----------------------------------------------------------------------------- grammar and pages
def test_search_page_and_no_ops():
    env = W.make(cfg())
    obs, info = env.reset(task_id=0)
    task = env.goal["instruction_text"]
    assert obs == f"WebShop [SEP] Instruction: [SEP] {task} [SEP] Search"
    assert info["admissible_actions"] == ["search[<your query>]"] and info["task"] == task and info["task_id"] == 0
    for bad in ["click[search]", "click[buy now]", "buy[now]", "search[]", "search[   ]", "click[]", "hello", ""]:
        o, r, done, info = env.step(bad)
        assert (o, r, done, info["is_action_valid"]) == (obs, 0.0, False, False), bad
    assert info["step"] == 8
    with pytest.raises(EnvInputError, match="task_id"):
        env.reset(task_id=10 ** 6)
    with pytest.raises(EnvInputError, match="task_id"):
        env.reset(task_id="abc")
    assert env.step("search[candle]")[3]["task_id"] == 0  # a refused reset leaves the episode as it was


def test_pagination_items_options_and_buy():
    env = W.make(cfg(max_steps=50))
    env.reset(task_id=1)
    obs, r, done, info = env.step("search[color size]")
    assert info["is_action_valid"] and env.page == "results" and len(env.results) == 50
    assert "Page 1 (Total results: 50) [SEP] Next > [SEP]" in obs and "< Prev" not in obs
    first = env._page_asins()
    assert info["admissible_actions"] == ["click[back to search]", "click[next >]"] + [f"click[{a.lower()}]" for a in first]
    assert f"{first[0]} [SEP] {env.shop.products[first[0]]['Title']} [SEP] {env.shop.products[first[0]]['PriceTag']}" in obs
    for k in range(2, 6):
        obs, *_ = env.step("click[next >]")
        assert f"Page {k} (Total results: 50) [SEP] < Prev" in obs
    assert "next >" not in env.clickables() and env.step("click[next >]")[3]["is_action_valid"] is False
    env.step("click[< prev]")
    assert env.page_no == 4
    # search off the search page is inadmissible: a no-op here, upstream's behaviour when the check is off
    o, _, _, info = env.step("search[candle]")
    assert not info["is_action_valid"] and env.page_no == 4 and env.query == "color size"
    # open an item, choose options, visit sub-pages, come back
    asin = env._page_asins()[0]
    p = env.shop.products[asin]
    obs, _, _, info = env.step(f"click[{asin.lower()}]")
    assert env.page == "item" and obs.endswith("Rating: N.A. [SEP] Description [SEP] Features [SEP] Reviews [SEP] Buy Now")
    assert "Back to Search [SEP] < Prev" in obs and p["Title"] in obs
    name, vals = next(iter(p["options"].items()))
    env.step(f"click[{vals[0]}]")
    env.step(f"click[{vals[1]}]")
    assert env.options == {name: vals[1]}
    obs, *_ = env.step("click[features]")
    assert obs.endswith("< Prev [SEP] " + " [SEP] ".join(p["BulletPoints"]))
    env.step("click[< prev]")
    obs, *_ = env.step("click[description]")
    assert obs.endswith("< Prev [SEP] " + p["Description"])
    env.step("click[< prev]")
    obs, *_ = env.step("click[reviews]")
    assert obs.endswith("< Prev")
    env.step("click[< prev]")
    assert env.page == "item" and env.options == {name: vals[1]}
    env.step("click[< prev]")  # back to the same results page; options cleared
    assert env.page == "results" and env.page_no == 4 and env.options == {}
    env.step(f"click[{asin.lower()}]")
    _, r, done, info = env.step("click[buy now]")
    assert done and info["reward_info"] is not None
    assert r == (10.0 if info["score"] == 1.0 else 0.0) and info["won"] == (info["score"] == 1.0)
    assert info["score"] == pytest.approx(W.get_reward(env.goal, p, {})[0])
    assert env.step("click[back to search]")[1:3] == (0.0, True)


def test_back_to_search_and_search_anywhere_without_check():
    env = W.make(cfg(require_admissible=False))
    env.reset(task_id=2)
    env.step("search[candle]")
    obs, _, _, info = env.step("search[protein bar]")  # upstream: search runs on any page
    assert not info["is_action_valid"] and env.query == "protein bar" and env.page == "results"
    obs, _, _, info = env.step("click[back to search]")
    assert env.page == "search" and obs.startswith("WebShop [SEP]") and info["admissible_actions"] == ["search[<your query>]"]


def test_step_limit_truncates():
    env = W.make(cfg(max_steps=15))
    env.reset(task_id=3)
    for k in range(15):
        obs, r, done, info = env.step("click[nothing]")
    assert done and info["truncated"] and r == 0.0 and not info["won"] and info["step"] == 15


# ----------------------------------------------------------------------------- projection, prompts
class _Pieces:
    """A stand-in tokenizer: id i decodes to pieces[i]."""
    def __init__(self, pieces):
        self.pieces = pieces

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_action_start_finds_the_token_that_opens_the_tag():
    tok = _Pieces(["<think>", "red", " shirt", "</think>", "<Act", "ion>", "click[x]", "</action>", "<act", "x"])
    assert action_start(tok, [0, 1, 2, 3, 4, 5, 6, 7]) == 4       # the tag split over two tokens: its first
    assert action_start(tok, [0, 1, 3, 9, 8, 5, 6]) == 4           # "<act" after "x" still starts the tag
    assert action_start(tok, [0, 1, 2, 3, 6, 7]) == 6              # no tag: everything is think text
    assert action_start(tok, []) == 0


def test_action_start_on_the_tiny_tokenizer():
    from d3mini.data import build_tiny_tokenizer
    tok = build_tiny_tokenizer(["<think>look for a red shirt</think><action>search[red shirt]</action>"] * 4, 300)
    think = tok.encode("<think>look for a red shirt</think>")
    ids = tok.encode("<think>look for a red shirt</think><action>search[red shirt]</action>")
    assert ids[:len(think)] == think and action_start(tok, ids) == len(think)


def test_projection_rules():
    assert W.project("<think>ok</think><action>Click[Buy Now]</action>") == ("click[buy now]", True)
    a, ok = W.project("I would click buy now somewhere here")
    assert a == "buy now somewhere here"[-20:].strip() and not ok
    assert W.project("<action>click[x]</action>") == ("click[x]", False)            # no think
    assert W.project("<THINK>a</THINK><action>click[x]</action>")[1] is False        # think is case-sensitive
    assert W.project("<think>好</think><action>click[x]</action>")[1] is False        # CJK
    assert W.project("<think>a</think><action>click[x]</action><action>click[y]</action>") == ("click[x]", False)
    assert W.project("<think>a</think><action> </action>")[1] is False
    text = "<think></think>No tags at all in this one"
    assert project_action(text, tail=30) == (text.lower()[-30:].strip(), False)
    adm = ["search[<your query>]", "click[back to search]"]
    assert is_action_valid("search[red shirt]", True, adm) and is_action_valid("click[ back to search ]", True, adm)
    assert not is_action_valid("search[red shirt]", True, ["click[back to search]"])
    assert not is_action_valid("search[]", True, adm) and not is_action_valid("click[x]", False, None)
    assert is_action_valid("click[x]", True, None) and is_action_valid("click[x]", True, adm, require_admissible=False)


def test_prompts():
    c = cfg()
    env = W.make(c)
    obs0, info = env.reset(task_id=4)
    task = info["task"]
    p0 = W.prompt(task, obs0, [], info["admissible_actions"], 0, c)
    assert f"Your task is to: {task}." in p0 and "'search[<your query>]'," in p0 and "Prior to this step" not in p0
    assert "<think> </think>" in p0 and "<action> </action>" in p0 and "current observation is: 'Search'." in p0
    obs1, _, _, info = env.step("search[candle]")
    p1 = W.prompt(task, obs1, [(obs0, "search[candle]")], info["admissible_actions"], 1, c)
    assert "already taken 1 step(s)" in p1 and "[Observation 1: ''Search'', Action 1: 'search[candle]']" in p1
    assert "You are now at step 2" in p1 and "'Back to Search' [SEP] 'Page 1" in p1 and p1.count(task) == 1
    long_hist = [("x" * 20000, "click[a]")]
    assert "Prior to this step" not in W.prompt(task, obs1, long_hist, info["admissible_actions"], 1, c)
    cc = cfg(prompt="compact", obs_format="compact")
    pc = W.prompt(task, "search page", [("results page 1/5 | next >\n" + "y" * 300, "click[next >]")], None, 3, cc)
    assert pc.startswith(f"task: {task}\nstep 3: results page 1/5 | next > ") and "\nnow: search page\n" in pc
    assert len(pc) < 400


# ----------------------------------------------------------------------------- expert
@pytest.mark.parametrize("obs_format", ["text", "compact"])
def test_expert_wins_test_goals(obs_format):
    c = EnvConfig(obs_format=obs_format)  # the default catalog: 300 products, 300 test goals
    env, rng = W.make(c), random.Random(0)
    ids = W.task_ids(c, "test")
    wins, longest, thoughts = 0, 0, set()
    for i in ids:
        obs, info = env.reset(task_id=i)
        done = False
        while not done:
            text = W.expert(env, rng)
            action, ok = W.project(text)
            assert ok and is_action_valid(action, ok, info["admissible_actions"]), (text, info["admissible_actions"])
            thoughts.add(text.split("</think>")[0])
            obs, r, done, info = env.step(action)
            if obs_format == "compact":  # results: a header and one short line per product; others tiny
                lines = obs.split("\n")
                if env.page == "results":
                    assert len(lines) <= W.PAGE_SIZE + 1 and max(map(len, lines)) <= 80, obs
                else:
                    assert len(obs) <= 300, obs
        wins += info["won"]
        longest = max(longest, info["step"])
    rate = wins / len(ids)
    print(f"expert success on {len(ids)} test goals ({obs_format}): {rate:.3f}, longest episode {longest} steps")
    assert rate >= 0.95 and longest <= c.max_steps and len(thoughts) > 10
    with pytest.raises(EnvError, match="in-process"):
        W.expert(object(), rng)


def test_search_query_from_instruction():
    q = W.search_query("i am looking for gluten free and low sugar protein bar with flavor: vanilla, and size: 6 count, "
                       "and price lower than 30.00 dollars")
    assert q == "gluten free and low sugar protein bar"
    assert W.search_query("find me wireless headphones") == "wireless headphones"


# ----------------------------------------------------------------------------- real-file loader
def write_real_files(folder, human=True):
    products = [
        {"asin": "B00REAL001", "name": "Sunny Organic Green Tea Bags", "full_description": "Organic green tea.",
         "small_description": ["Caffeine light", "100 bags"], "pricing": "$12.50", "images": ["https://example.invalid/a.jpg"],
         "product_category": "Grocery › Beverages › Tea", "query": " Green Tea ", "category": "grocery",
         "customization_options": {"Flavor": [{"value": "Mint/Lemon", "image": None}, {"value": "Plain", "image": None}],
                                   "Size": [{"value": "20 Count", "image": None}, {"value": "100 Count", "image": None}],
                                   "Style": None}},
        {"asin": "B00REAL002", "name": "Moss Wool Socks", "full_description": "", "small_description": "Warm socks",
         "pricing": "$8.00$12.00", "images": [], "product_category": "Clothing › Socks", "query": "socks",
         "category": "fashion", "customization_options": {}},
        {"asin": "B00REAL002", "name": "duplicate", "pricing": ""},
        {"asin": "nan", "name": "skipped"},
        {"asin": "B00REAL003", "name": "No Price Candle", "pricing": "", "query": "candle"},
    ]
    ins = {"B00REAL001": {"attributes": ["organic", "green tea"], "instruction": "i need organic green tea.",
                          "instruction_attributes": ["organic"]},
           "B00REAL002": {"attributes": ["wool"], "instruction": "i want wool socks", "instruction_attributes": ["wool"]}}
    (folder / "items_shuffle_1000.json").write_text(json.dumps(products))
    (folder / "items_ins_v2_1000.json").write_text(json.dumps(ins))
    if human:
        hum = {"B00REAL002": [{"instruction": "warm wool socks please.", "instruction_attributes": ["wool"],
                               "instruction_options": ["grey"], "attributes": [], "options": [], "asin": "B00REAL002",
                               "assignment_id": "a", "worker_id": "w"}]}
        (folder / "items_human_ins.json").write_text(json.dumps(hum))


def test_real_file_loader(tmp_path):
    write_real_files(tmp_path)
    c = cfg(data_dir=str(tmp_path), num_test_goals=1)
    shop = W.get_shop(c)
    assert sorted(shop.products) == ["B00REAL001", "B00REAL002", "B00REAL003"]
    tea, socks, candle = (shop.products[a] for a in sorted(shop.products))
    assert tea["options"] == {"flavor": ["mint | lemon", "plain"], "size": ["20 count", "100 count"]}
    assert tea["query"] == "green tea" and tea["Price"] == 12.5 and tea["PriceTag"] == "$12.50"
    assert 8.0 <= socks["Price"] <= 12.0 and socks["PriceTag"] == "$8.00 to $12.00" and socks["BulletPoints"] == ["Warm socks"]
    assert candle["Price"] == 100.0 and candle["Attributes"] == ["DUMMY_ATTR"]
    # synthetic goals: 2 x 2 option combinations of the tea + 1 for the socks; the candle has no instruction
    texts = sorted(g["instruction_text"] for g in shop.goals)
    assert len(texts) == 5 and any(t.startswith("i need organic green tea with flavor: mint | lemon, and size: 100 count") for t in texts)
    assert W.task_ids(c, "test") == [0] and W.task_ids(c, "train") == [1, 2, 3, 4]
    env = W.make(c)
    tid = next(i for i, g in enumerate(shop.goals) if g["asin"] == "B00REAL001")
    env.reset(task_id=tid)
    env.step("search[organic green tea]")
    assert env.results[0] == "B00REAL001"
    env.step("click[b00real001]")
    for v in env.goal["goal_options"].values():
        env.step(f"click[{v}]")
    _, r, done, info = env.step("click[buy now]")
    assert done and info["won"] and r == 10.0
    # human goals: option strings, the instruction's trailing period dropped
    raw, ins, h = D.load_files(str(tmp_path), human=True)
    goals = D.human_goals(D.parse_products(raw, ins, 0), h, 0)
    assert len(goals) == 1 and goals[0]["goal_options"] == ["grey"] and goals[0]["instruction_text"].startswith("warm wool socks please, and price lower than")


def test_real_file_errors(tmp_path):
    with pytest.raises(EnvError, match="not a folder"):
        W.get_shop(cfg(data_dir=str(tmp_path / "missing")))
    with pytest.raises(EnvError, match="items_shuffle_1000.json"):
        W.get_shop(cfg(data_dir=str(tmp_path)))
    write_real_files(tmp_path, human=False)
    with pytest.raises(EnvError, match="items_human_ins.json"):
        D.load_files(str(tmp_path), human=True)
    (tmp_path / "items_ins_v2_1000.json").write_text("{not json")
    with pytest.raises(EnvError, match="items_ins_v2_1000.json is not valid JSON"):
        D.load_files(str(tmp_path), human=False)
    (tmp_path / "items_ins_v2_1000.json").write_text("[]")
    with pytest.raises(EnvError, match="expected a JSON dict"):
        D.load_files(str(tmp_path), human=False)
    with pytest.raises(EnvError, match="product #1 needs"):
        D.parse_products([{"asin": "B1", "name": "x"}, {"title": "no asin"}], {}, 0)


# ----------------------------------------------------------------------------- bench/failures.py outcomes
def test_failure_outcomes_of_played_episodes():
    """bench/failures.py's classes on real episodes: the expert's (won), the expert's cut short before its
    last option (too few options), a wrong value of that option's group, and two step-limited episodes."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
    from failures import Counting, outcome

    c = EnvConfig(obs_format="compact")
    env = W.make(c)
    tid = next(i for i in W.task_ids(c, "test") if len(env.shop.goals[i]["goal_options"]) == 2)

    def play(last_option):  # the expert up to its second option click, then last_option(env, that value)
        env.reset(task_id=tid)
        chosen = 0
        while not env.done:
            key, action = W.expert_action(env)
            if key == "option":
                chosen += 1
                if chosen == 2:
                    return last_option(env, action[len("click["):-1])
            env.step(action)
        return env

    env.reset(task_id=tid)
    while not env.done:
        env.step(W.expert_action(env)[1])
    assert outcome(env, 0) == "won"
    e = play(lambda e, v: (e.step("click[buy now]"), e)[1])
    assert e.done and e.score < 1.0 and outcome(e, 0) == "bought: too few options chosen"

    def wrong(e, v):
        group = next(vals for vals in e.product["options"].values() if v in vals)
        e.step(f"click[{next(x for x in group if x != v)}]")
        e.step("click[buy now]")
        return e
    e = play(wrong)
    assert e.done and outcome(e, 0) == "bought: wrong option value"
    env.reset(task_id=tid)
    assert outcome(env, 3) == "no purchase: invalid action repeated"
    assert outcome(env, 0) == "no purchase: all actions valid"
    counted = Counting(env)  # keeps the first rejected action: page, action, what was admissible, its kind
    counted.reset(task_id=tid)
    counted.step("click[buy now]")  # not on the search page
    counted.step("click[next >]")
    assert counted.invalid == 2 and counted.first_invalid == ("search", "click[buy now]", env.admissible(), "search page")
    wanted = W.goal_option_values(env.goal)
    # an item of the shop that lacks the goal's first option, to stand in for the one the agent opens
    lacking = next(a for a, p in env.shop.products.items() if W.offered_value(wanted[0], p) is None)
    counted = Counting(env)
    counted.reset(task_id=tid)
    counted.step(W.expert_action(env)[1])  # search
    page_ids = [a.lower() for a in env._page_asins()]
    counted.step(f"click[{page_ids[0]}x]")  # an id not on the page
    assert counted.first_invalid.page == "results" and counted.first_invalid.kind == "results page: an id not on the page"
    counted.step(f"click[{page_ids[0]}]")
    counted.first_invalid = None
    counted.step("click[no such option]")
    kinds = [counted.first_invalid.kind]
    counted.first_invalid = None
    env.asin = lacking  # the same page, another item: one that lacks the goal's first option
    counted.step(f"click[{wanted[0]}]")
    kinds.append(counted.first_invalid.kind)
    assert kinds == ["item page: other", "item page: a goal value the item does not offer"]


def test_mistake_is_a_wrong_action_the_expert_recovers_from():
    """mistake(): on a results page an item that does not fit the request, on an item page a goal value the
    item lacks (invalid) or another value of a goal option (valid); none on the search page. After up to two
    of them per episode the expert still wins nearly every goal."""
    c = EnvConfig(obs_format="compact")
    env, rng = W.make(c), random.Random(0)
    seen, wins = set(), 0
    for tid in W.task_ids(c, "test")[:60]:
        env.reset(task_id=tid)
        assert W.mistake(env, rng) is None  # the search page
        taken = 0
        while not env.done:
            wrong = W.mistake(env, rng) if taken < 2 else None
            if wrong is None:
                env.step(W.expert_action(env)[1])
                continue
            key, right = W.expert_action(env)
            assert wrong != right
            x = wrong[len("click["):-1]
            if env.page == "results":
                p = env.shop.products[x.upper()]
                assert not W._fits(env.goal, p)
                seen.add("item")
            else:
                assert env.page == "item"
                offered = [v for vs in env.product["options"].values() for v in vs]
                if x in offered:
                    assert x not in (W._option_clicks(env.goal, env.product) or [])
                    seen.add("option")
                else:
                    assert x in [v.lower() for v in W.goal_option_values(env.goal)]
                    seen.add("lacking")
            invalid = env.page == "item" and x not in offered
            _, _, _, info = env.step(wrong)
            assert info["is_action_valid"] != invalid
            taken += 1
        wins += env.score == 1.0
    assert seen == {"item", "option", "lacking"} and wins >= 55


def test_expert_state_think_marks_each_goal_option():
    """env.think = state: on the item page the think text lists the goal's options as the page shows them,
    set or missing, before the stock phrase; other pages keep the stock phrases."""
    c = EnvConfig(obs_format="compact", think="state")
    env, rng = W.make(c), random.Random(0)
    tid = next(i for i in W.task_ids(c, "test") if len(env.shop.goals[i]["goal_options"]) == 2)
    env.reset(task_id=tid)
    seen = []
    while not env.done:
        text = W.expert(env, rng)
        key, action = W.expert_action(env)
        think = text.split("</think>")[0][len("<think>"):]
        if key in ("option", "buy"):
            a, b = W._option_clicks(env.goal, env.product)
            marks = [("set" if v in env.options.values() else "missing") for v in (a, b)]
            assert think.startswith(f"{a} {marks[0]}, {b} {marks[1]}. ") and think.split(". ", 1)[1] in W.THOUGHTS[key]
            seen.append(key)
        else:
            assert think in W.THOUGHTS[key]
        env.step(W.project(text)[0])
    assert env.score == 1.0 and seen == ["option", "option", "buy"]


def test_expert_state_all_think_names_the_option_an_item_lacks():
    """env.think = state_all: going back from an item that lacks a goal option, the think text first marks
    each goal option (the lacking one "not offered"); with state the same step keeps its stock phrase, and
    the option and buy steps read the same under both."""
    texts = {}
    for think in ("state", "state_all"):
        c = EnvConfig(obs_format="compact", think=think)
        env, rng = W.make(c), random.Random(0)
        for tid in W.task_ids(c, "test"):
            env.reset(task_id=tid)
            steps = []
            while not env.done:
                key, _ = W.expert_action(env)
                text = W.expert(env, rng)
                steps.append((key, text.split("</think>")[0][len("<think>"):],
                              env.goal, env.product if env.page == "item" else None))
                env.step(W.project(text)[0])
            if any(k == "lacks" for k, *_ in steps):
                break
        texts[think] = steps
    assert "lacks" in [k for k, *_ in texts["state"]]  # an episode that goes back from a lacking item was found
    assert [k for k, *_ in texts["state"]] == [k for k, *_ in texts["state_all"]]
    for (key, t1, goal, product), (_, t2, _, _) in zip(texts["state"], texts["state_all"]):
        if key != "lacks":
            assert t1 == t2
            continue
        assert t1 in W.THOUGHTS["lacks"]
        status, phrase = t2.split(". ", 1)
        assert phrase in W.THOUGHTS["lacks"]
        offered = [v for vs in product["options"].values() for v in vs]
        parts = status.split(", ")
        assert len(parts) == len(goal["goal_options"]) and any(p.endswith(" not offered") for p in parts)
        for p in parts:  # an offered value is named as the page spells it
            assert p.endswith(" not offered") or p.rsplit(" ", 1)[0] in offered
