"""WebShop data: a seeded catalog generator, a loader for the real files, and goal generation.

Both sources go through the same path: raw products in WebShop's schema (the
``items_shuffle_1000.json`` list) plus per-ASIN attributes and instructions (the
``items_ins_v2_1000.json`` dict) -> ``parse_products`` -> ``synthetic_goals`` (or ``human_goals``).
The generated catalog keeps a modest vocabulary (16 product types, 5 attributes and 1-2 option
groups per type) so a tiny model can learn it: every product title names all of its attributes,
and every instruction names the product type and some of those attributes, so whether a listed
product fits can be read from the results page. Facts about the schema: reference/envs.md §1.6-1.8.
"""
from __future__ import annotations

import itertools
import json
import os
import random
import re
from typing import Optional

from d3mini.envs import EnvError

COLORS = ["black", "white", "navy", "red", "grey", "green", "beige", "pink", "brown", "purple"]
TECH_COLORS = ["black", "white", "silver", "blue", "rose gold"]
SIZES = ["xs", "small", "medium", "large", "xl"]
SHOE_SIZES = ["6", "7", "8", "9", "10", "11"]
VOLUMES = ["travel size", "8 ounce", "16 ounce", "32 ounce"]
COUNTS = ["6 count", "12 count", "30 count"]
PACKS = ["single", "2 pack", "6 pack"]
BAGS = ["small bag", "medium bag", "large bag"]
SCENTS = ["lavender", "vanilla", "unscented", "eucalyptus", "coconut", "sandalwood"]
FLAVORS = ["chocolate", "peanut butter", "vanilla", "cookies and cream", "salted caramel", "blueberry"]
LIP_COLORS = ["ruby red", "nude", "berry", "coral", "mauve", "plum"]

# type term, category, product_category, attribute pool, option groups, price range (dollars)
TYPES = [
    ("t-shirt", "fashion", "Clothing, Shoes & Jewelry › Men › Shirts",
     ["short sleeve", "machine washable", "slim fit", "moisture wicking", "crew neck"],
     {"color": COLORS, "size": SIZES}, (8, 30)),
    ("hoodie", "fashion", "Clothing, Shoes & Jewelry › Men › Sweatshirts",
     ["fleece lined", "zip up", "relaxed fit", "kangaroo pocket", "heavyweight"],
     {"color": COLORS, "size": SIZES}, (20, 60)),
    ("running shoes", "fashion", "Clothing, Shoes & Jewelry › Women › Shoes",
     ["non slip", "lightweight", "breathable mesh", "arch support", "memory foam"],
     {"color": COLORS, "size": SHOE_SIZES}, (30, 120)),
    ("yoga pants", "fashion", "Clothing, Shoes & Jewelry › Women › Leggings",
     ["high waist", "tummy control", "squat proof", "stretchy", "side pockets"],
     {"color": COLORS, "size": SIZES}, (15, 45)),
    ("shampoo", "beauty", "Beauty & Personal Care › Hair Care › Shampoo",
     ["sulfate free", "dry hair", "argan oil", "color safe", "tea tree"],
     {"scent": SCENTS, "size": VOLUMES}, (6, 35)),
    ("lipstick", "beauty", "Beauty & Personal Care › Makeup › Lips",
     ["long lasting", "matte finish", "cruelty free", "vitamin e", "waterproof"],
     {"color": LIP_COLORS}, (5, 25)),
    ("face cream", "beauty", "Beauty & Personal Care › Skin Care › Face",
     ["hyaluronic acid", "fragrance free", "sensitive skin", "anti aging", "spf 30"],
     {"size": VOLUMES}, (10, 60)),
    ("body lotion", "beauty", "Beauty & Personal Care › Skin Care › Body",
     ["shea butter", "non greasy", "paraben free", "aloe vera", "fast absorbing"],
     {"scent": SCENTS, "size": VOLUMES}, (6, 30)),
    ("protein bar", "grocery", "Grocery & Gourmet Food › Snacks › Bars",
     ["gluten free", "low sugar", "high protein", "keto friendly", "non gmo"],
     {"flavor": FLAVORS, "size": COUNTS}, (10, 45)),
    ("coffee beans", "grocery", "Grocery & Gourmet Food › Beverages › Coffee",
     ["whole bean", "dark roast", "fair trade", "usda organic", "single origin"],
     {"size": BAGS}, (9, 40)),
    ("granola", "grocery", "Grocery & Gourmet Food › Breakfast › Cereal",
     ["whole grain", "no added sugar", "vegan", "high fiber", "nut free"],
     {"flavor": FLAVORS, "size": BAGS}, (5, 25)),
    ("candle", "home", "Home & Kitchen › Home Decor › Candles",
     ["soy wax", "long burning", "clean burning", "hand poured", "gift set"],
     {"scent": SCENTS, "size": ["travel tin", "medium jar", "large jar"]}, (8, 40)),
    ("throw pillow", "home", "Home & Kitchen › Bedding › Pillows",
     ["hypoallergenic", "down alternative", "zipper closure", "velvet cover", "washable"],
     {"color": COLORS, "size": ["small", "medium", "large"]}, (12, 50)),
    ("bath towel", "home", "Home & Kitchen › Bath › Towels",
     ["quick dry", "super absorbent", "pure cotton", "oversized", "fade resistant"],
     {"color": COLORS, "size": PACKS}, (10, 55)),
    ("headphones", "electronics", "Electronics › Audio › Headphones",
     ["wireless", "noise cancelling", "built in mic", "foldable", "long battery"],
     {"color": TECH_COLORS}, (25, 200)),
    ("power bank", "electronics", "Electronics › Accessories › Power Banks",
     ["fast charging", "usb c", "led display", "compact", "travel size"],
     {"color": TECH_COLORS, "capacity": ["5000mah", "10000mah", "26800mah"]}, (15, 60)),
]
BRANDS = ["norvik", "alderbay", "brightleaf", "cobbleton", "dunmore", "everfield", "fairholm", "glenrock",
          "harlow", "ivory peak", "juniper", "kestrel", "lumen", "marlowe", "northway", "oakhurst",
          "pinecrest", "quillon", "ravenna", "sorrel"]
INSTRUCTIONS = ["i am looking for {x}", "i need {x}", "i want to buy {x}", "find me {x}", "show me {x}"]
FILLERS = ["Great for everyday use.", "Makes a thoughtful present.", "Backed by a one year guarantee.",
           "Designed and tested by our team.", "Ships in recyclable packaging."]
ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


# ----------------------------------------------------------------------------- generator
def generate_raw(num_products: int, seed: int, asin_chars: int = 8) -> tuple[list, dict]:
    """A seeded catalog in WebShop's raw schema: (items_shuffle-style list, items_ins_v2-style dict).
    ASINs are "B0" + asin_chars random characters (8 = WebShop's 10-character form)."""
    if 36 ** asin_chars < 2 * num_products:
        raise ValueError(f"env.asin_chars = {asin_chars} is too few for {num_products} distinct products")
    rng = random.Random(seed)
    products, ins, asins = [], {}, set()
    for i in range(num_products):
        term, cat, path, pool, groups, (lo, hi) = TYPES[i % len(TYPES)]
        while True:
            asin = "B0" + "".join(rng.choice(ALPHABET) for _ in range(asin_chars))
            if asin not in asins:
                asins.add(asin)
                break
        brand = rng.choice(BRANDS)
        attrs = rng.sample(pool, rng.choice([2, 3]))
        title = " ".join(w.capitalize() for w in f"{brand} {' '.join(attrs)} {term}".split())
        opts = {name: [{"value": v, "image": None} for v in sorted(rng.sample(vals, min(len(vals), rng.choice([2, 3, 4]))), key=vals.index)]
                for name, vals in groups.items()}
        bullets = [f"{a.capitalize()}." for a in attrs] + [rng.choice(FILLERS)]
        desc = f"This {term} by {brand.title()} is {', '.join(attrs[:-1])} and {attrs[-1]}. {rng.choice(FILLERS)}"
        products.append({
            "asin": asin, "name": title, "brand": brand.title(), "full_description": desc, "small_description": bullets,
            "pricing": f"${rng.uniform(lo, hi):.2f}", "images": [], "product_category": path,
            "query": term, "category": cat, "customization_options": opts})
        named = rng.sample(attrs, rng.choice([1, 2, 2, 3][:len(attrs) + 1]))
        x = " and ".join(named) + " " + term
        ins[asin] = {"attributes": list(attrs), "instruction": rng.choice(INSTRUCTIONS).format(x=x),
                     "instruction_attributes": named}
    return products, ins


# ----------------------------------------------------------------------------- real files
PRODUCT_FILES = ["items_shuffle_1000.json", "items_shuffle.json"]
ATTR_FILES = ["items_ins_v2_1000.json", "items_ins_v2.json"]
HUMAN_FILE = "items_human_ins.json"


def _read_json(path: str, kind: type):
    try:
        with open(path) as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise EnvError(f"WebShop data file {path} is not valid JSON: {e}") from None
    if not isinstance(data, kind):
        raise EnvError(f"WebShop data file {path}: expected a JSON {kind.__name__}, got {type(data).__name__}")
    return data


def _find(data_dir: str, names: list) -> str:
    for n in names:
        if os.path.exists(os.path.join(data_dir, n)):
            return os.path.join(data_dir, n)
    raise EnvError(f"WebShop data file not found: none of {names} in env.data_dir={data_dir!r}")


def load_files(data_dir: str, human: bool) -> tuple[list, dict, Optional[dict]]:
    """Read the real WebShop files from data_dir: (products list, attributes dict, human instructions or None)."""
    if not os.path.isdir(data_dir):
        raise EnvError(f"env.data_dir={data_dir!r} is not a folder (expected {PRODUCT_FILES[0]}, {ATTR_FILES[0]})")
    products = _read_json(_find(data_dir, PRODUCT_FILES), list)
    ins = _read_json(_find(data_dir, ATTR_FILES), dict)
    hum = _read_json(_find(data_dir, [HUMAN_FILE]), dict) if human else None
    return products, ins, hum


# ----------------------------------------------------------------------------- parsing
def _prices(pricing) -> list:
    nums = [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*(?:\.\d+)?", str(pricing or ""))]
    return nums[:2] or [100.0]


def parse_products(raw: list, ins: dict, seed: int) -> dict:
    """Raw products -> {asin: product} with the fields the engine uses (reference/envs.md §1.8)."""
    rng = random.Random(seed)
    out = {}
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or "asin" not in p or "name" not in p:
            raise EnvError(f"WebShop product #{i} needs at least 'asin' and 'name' (got {str(p)[:80]!r})")
        asin = str(p["asin"])
        if asin == "nan" or len(asin) > 10 or asin in out:
            continue
        bullets = p.get("small_description") or []
        bullets = [bullets] if isinstance(bullets, str) else [str(b) for b in bullets]
        prices = _prices(p.get("pricing"))
        # a price range is fixed once at load by a uniform draw (engine.generate_product_prices)
        price = prices[0] if len(prices) == 1 else rng.uniform(prices[0], prices[1])
        opts = {}
        for name, vals in (p.get("customization_options") or {}).items():
            if vals:
                opts[name.lower()] = [str(v["value"]).lower().replace("/", " | ") for v in vals]
        extra = ins.get(asin) or {}
        out[asin] = {
            "asin": asin, "Title": str(p["name"]), "brand": str(p.get("brand") or ""), "Description": str(p.get("full_description") or ""),
            "BulletPoints": bullets, "Price": price,
            "PriceTag": f"${prices[0]:.2f}" if len(prices) == 1 else f"${prices[0]:.2f} to ${prices[1]:.2f}",
            "product_category": str(p.get("product_category") or ""),
            "query": str(p.get("query") or "").lower().strip(), "category": str(p.get("category") or ""),
            "options": opts, "Attributes": list(extra.get("attributes") or ["DUMMY_ATTR"]),
            "instruction": extra.get("instruction"), "instruction_attributes": list(extra.get("instruction_attributes") or []),
        }
    if not out:
        raise EnvError("WebShop catalog is empty: no product with a valid 'asin'")
    return out


# ----------------------------------------------------------------------------- goals
def _price_bound(price: float, rng: random.Random) -> tuple[float, str]:
    """Two of the first four tens above the price; the larger is the bound (goal.py's rule)."""
    above = [x for x in range(10, 1000, 10) if x > price][:4]
    if len(above) < 2:
        return 1_000_000.0, ""
    upper = float(max(rng.sample(above, 2)))
    return upper, f", and price lower than {upper:.2f} dollars"


def _goal(p: dict, text: str, attrs: list, options, rng: random.Random) -> dict:
    upper, price_text = _price_bound(p["Price"], rng)
    return {"asin": p["asin"], "instruction_text": text + price_text, "attributes": attrs,
            "goal_options": options, "price_upper": upper, "query": p["query"], "category": p["category"],
            "name": p["Title"], "product_category": p["product_category"]}


def synthetic_goals(products: dict, seed: int) -> list:
    """One goal per (product with an instruction, combination of its option values), shuffled."""
    rng = random.Random(seed)
    goals = []
    for p in products.values():
        if not p["instruction"] or not p["instruction_attributes"]:
            continue
        names = sorted(p["options"])
        for combo in itertools.product(*(p["options"][n] for n in names)):
            opts = dict(zip(names, combo))
            text = p["instruction"].strip().rstrip(".")
            if opts:
                text += " with " + ", and ".join(f"{n}: {v}" for n, v in opts.items())
            goals.append(_goal(p, text, list(p["instruction_attributes"]), opts, rng))
    rng.shuffle(goals)
    return goals


def human_goals(products: dict, human: dict, seed: int) -> list:
    """Goals from items_human_ins.json: instruction text, its attributes and option strings."""
    rng = random.Random(seed)
    goals = []
    for asin, entries in human.items():
        if asin not in products:
            continue
        for e in entries if isinstance(entries, list) else []:
            if e.get("instruction_attributes"):
                text = str(e.get("instruction", "")).strip().strip(".")
                goals.append(_goal(products[asin], text, list(e["instruction_attributes"]),
                                   list(e.get("instruction_options") or []), rng))
    rng.shuffle(goals)
    return goals
