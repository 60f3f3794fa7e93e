"""Tokenizers and chat templates: hand-written expected strings (models.md §2.4, §5.6), a Jinja rendering through
transformers' apply_chat_template of the same documented formats, and transformers' fast tokenizer on our files."""
import json
import os
import random
import subprocess
import sys

import pytest

from d3mini.data import (TINY_SPECIAL_IDS, TINY_SPECIAL_TOKENS, Tokenizer, apply_chat, build_tiny_tokenizer,
                         render_chat)

SYS = {"role": "system", "content": "You are a shopper."}
U1 = {"role": "user", "content": "Find red shoes."}
U2 = {"role": "user", "content": "Now blue ones."}

CORPUS = [f"<|im_start|>user\nFind {c} shoes size {i % 9}, under ${i * 3}.<|im_end|>\n<|im_start|>assistant\n"
          f"<think>\nThe goal says {c}.\n</think>\n\n<action>search[{c} shoes]</action><|im_end|>\n"
          for i, c in enumerate(["red", "blue", "green", "black", "white", "navy"] * 40)]


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_tokenizer(CORPUS, vocab_size=400)


# ----------------------------------------------------------------------------- SDAR / Qwen3 template

def test_sdar_multiturn_generation_prompt_thinking_off():
    msgs = [SYS, U1, {"role": "assistant", "content": "<action>search[red shoes]</action>"}, U2]
    want = ("<|im_start|>system\nYou are a shopper.<|im_end|>\n"
            "<|im_start|>user\nFind red shoes.<|im_end|>\n"
            "<|im_start|>assistant\n<action>search[red shoes]</action><|im_end|>\n"
            "<|im_start|>user\nNow blue ones.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render_chat(msgs, "sdar") == want
    assert render_chat(msgs, "qwen3", enable_thinking=False) == want
    # thinking on: the model opens its own think block
    assert render_chat(msgs, "sdar", enable_thinking=True) == want[: -len("<think>\n\n</think>\n\n")]
    # no generation prompt: ends after the last turn
    assert render_chat(msgs, "sdar", add_generation_prompt=False) == want[: -len("<|im_start|>assistant\n<think>"
                                                                                "\n\n</think>\n\n")]


def test_sdar_reasoning_before_last_user_is_dropped_after_is_kept():
    msgs = [U1, {"role": "assistant", "content": "A1", "reasoning": "old thought"}, U2,
            {"role": "assistant", "content": "\nA2", "reasoning": "\nnew thought\n\n"},
            {"role": "assistant", "content": "A3"}]  # after the last query, not last, no reasoning: plain
    want = ("<|im_start|>user\nFind red shoes.<|im_end|>\n"
            "<|im_start|>assistant\nA1<|im_end|>\n"
            "<|im_start|>user\nNow blue ones.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nnew thought\n</think>\n\nA2<|im_end|>\n"
            "<|im_start|>assistant\n<think>\n\n</think>\n\nA3<|im_end|>\n")
    # A3 is the last message and after the last query: Qwen3 gives it an (empty) think block
    assert render_chat(msgs, "sdar", add_generation_prompt=False) == want
    msgs[-1] = {"role": "assistant", "content": "A3"}
    msgs.append({"role": "tool", "content": "page"})  # now A3 is not last and has no reasoning
    want_tool = want.replace("<think>\n\n</think>\n\nA3", "A3") + \
        "<|im_start|>user\n<tool_response>\npage\n</tool_response><|im_end|>\n"
    assert render_chat(msgs, "sdar", add_generation_prompt=False) == want_tool


def test_sdar_embedded_think_is_split_like_upstream():
    old = {"role": "assistant", "content": "<think>\nplan A\n</think>\n\nanswer A"}
    new = {"role": "assistant", "content": "<think>plan B</think>answer B"}
    got = render_chat([U1, old, U2, new], "sdar", add_generation_prompt=False)
    assert got == ("<|im_start|>user\nFind red shoes.<|im_end|>\n"
                   "<|im_start|>assistant\nanswer A<|im_end|>\n"
                   "<|im_start|>user\nNow blue ones.<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nplan B\n</think>\n\nanswer B<|im_end|>\n")
    # HF's key name is accepted too; an explicit reasoning leaves the content untouched
    got = render_chat([U1, {"role": "assistant", "content": "x</think>y", "reasoning_content": "r"}], "sdar",
                      add_generation_prompt=False)
    assert got == ("<|im_start|>user\nFind red shoes.<|im_end|>\n"
                   "<|im_start|>assistant\n<think>\nr\n</think>\n\nx</think>y<|im_end|>\n")


def test_sdar_tool_results_share_one_user_turn_and_do_not_count_as_query():
    msgs = [U1, {"role": "assistant", "content": "call", "reasoning": "r1"},
            {"role": "tool", "content": "a"}, {"role": "tool", "content": "b"}]
    want = ("<|im_start|>user\nFind red shoes.<|im_end|>\n"
            "<|im_start|>assistant\n<think>\nr1\n</think>\n\ncall<|im_end|>\n"
            "<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n")
    assert render_chat(msgs, "sdar", enable_thinking=True) == want


# ----------------------------------------------------------------------------- LLaDA template

def test_llada_bos_headers_and_trim():
    msgs = [SYS, {"role": "user", "content": "  Find red shoes.\n"}, {"role": "assistant", "content": "ok\n",
                                                                       "reasoning": "not rendered"}, U2]
    want = ("<|startoftext|><|start_header_id|>system<|end_header_id|>\n\nYou are a shopper.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nFind red shoes.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nok<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nNow blue ones.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert render_chat(msgs, "llada") == want
    assert render_chat(msgs, "llada", enable_thinking=True) == want
    assert render_chat(msgs, "llada", add_generation_prompt=False) == \
        want[: -len("<|start_header_id|>assistant<|end_header_id|>\n\n")]


def test_render_errors_name_the_problem():
    with pytest.raises(ValueError, match="family"):
        render_chat([U1], "llama")
    with pytest.raises(ValueError, match="role"):
        render_chat([{"role": "robot", "content": "x"}], "sdar")
    with pytest.raises(ValueError, match="content"):
        render_chat([{"role": "user"}], "sdar")
    with pytest.raises(ValueError, match="at least one"):
        render_chat([], "llada")


# Our own Jinja renderings of the formats in models.md, run by transformers' apply_chat_template: a second
# implementation to compare against on many random conversations (system / user / assistant turns).
QWEN3_JINJA = r"""
{%- set ns = namespace(q=messages|length - 1) -%}
{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.q = loop.index0 -%}{%- endif -%}{%- endfor -%}
{%- for m in messages -%}
  {%- if m.role != 'assistant' -%}
    {{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' -}}
  {%- else -%}
    {%- if m.reasoning is defined and m.reasoning is not none -%}
      {%- set r = m.reasoning -%}{%- set a = m.content -%}
    {%- elif '</think>' in m.content -%}
      {%- set r = ((m.content.split('</think>')|first).rstrip('\n').split('<think>')|last).lstrip('\n') -%}
      {%- set a = (m.content.split('</think>')|last).lstrip('\n') -%}
    {%- else -%}
      {%- set r = '' -%}{%- set a = m.content -%}
    {%- endif -%}
    {{- '<|im_start|>assistant\n' -}}
    {%- if loop.index0 > ns.q and (loop.last or r) -%}
      {{- '<think>\n' + r.strip('\n') + '\n</think>\n\n' + a.lstrip('\n') -}}
    {%- else -%}{{- a -}}{%- endif -%}
    {{- '<|im_end|>\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<|im_start|>assistant\n' -}}
  {%- if enable_thinking is defined and not enable_thinking -%}{{- '<think>\n\n</think>\n\n' -}}{%- endif -%}
{%- endif -%}
"""
LLADA_JINJA = r"""
{{- bos_token -}}
{%- for m in messages -%}
  {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\n\n' + m.content|trim + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}{%- endif -%}
"""


def _random_conversation(rng):
    bits = ["x", "ok", " ", "\n", "\n\n", "<think>", "</think>", "  plan ", "é", "<action>a</action>"]
    text = lambda: "".join(rng.choice(bits) for _ in range(rng.randint(0, 6)))
    msgs = [{"role": "system", "content": text()}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 6)):
        role = rng.choice(["user", "assistant", "assistant", "system"])
        m = {"role": role, "content": text()}
        if role == "assistant" and rng.random() < 0.5:
            m["reasoning"] = rng.choice([None, "", text()])
        msgs.append(m)
    return msgs


def test_random_conversations_match_jinja_through_transformers(tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=tiny.save(str(tmp_path)), bos_token="<|startoftext|>")
    rng = random.Random(0)
    for _ in range(150):
        msgs = _random_conversation(rng)
        gen, think = rng.random() < 0.7, rng.random() < 0.5
        for family, template in (("sdar", QWEN3_JINJA), ("llada", LLADA_JINJA)):
            want = hf.apply_chat_template(msgs, chat_template=template, tokenize=False, add_generation_prompt=gen,
                                          enable_thinking=think)
            assert render_chat(msgs, family, gen, think) == want, (family, msgs)


# ----------------------------------------------------------------------------- tiny tokenizer

def _random_text(rng, n=60):
    alphabet = list("abcxyz019 .,;:!?[]()<>|/\\\"'-_\n\t") + ["é", "中", "😀", "  ", "\r\n"]
    out = []
    for _ in range(n):
        out.append(rng.choice(TINY_SPECIAL_TOKENS) if rng.random() < 0.08 else rng.choice(alphabet))
    return "".join(out)


def test_tiny_special_ids_are_fixed(tiny):
    assert list(TINY_SPECIAL_IDS.values()) == list(range(18))
    for tok, i in TINY_SPECIAL_IDS.items():
        assert tiny.token_to_id(tok) == i and tiny.encode(tok) == [i]
    assert (tiny.eos_id, tiny.pad_id, tiny.eot_id, tiny.mask_id, tiny.bos_id) == (0, 0, 2, 3, None)
    assert (tiny.think_id, tiny.think_end_id, tiny.stop_ids) == (4, 5, [2, 0])
    llada = build_tiny_tokenizer(CORPUS, vocab_size=400, family="llada")
    assert (llada.eos_id, llada.pad_id, llada.eot_id, llada.mask_id, llada.bos_id) == (0, 0, 9, 3, 6)
    assert llada.stop_ids == [9, 0]


def test_tiny_vocab_size_and_limits():
    assert build_tiny_tokenizer(CORPUS, vocab_size=400).vocab_size == 400
    small = build_tiny_tokenizer(["ab ab"], vocab_size=512)  # the text runs out of pairs: fewer merges
    assert 274 < small.vocab_size < 512
    with pytest.raises(ValueError, match="vocab_size"):
        build_tiny_tokenizer(CORPUS, vocab_size=200)


def test_tiny_round_trip_random_text_with_special_tokens(tiny):
    rng = random.Random(1)
    for _ in range(200):
        s = _random_text(rng)
        ids = tiny.encode(s)
        assert tiny.decode(ids) == s
        for tok, i in TINY_SPECIAL_IDS.items():
            assert ids.count(i) == s.count(tok), tok
        # control tokens are special and dropped by skip_special; the tags stay (agent actions survive)
        plain = s
        for tok in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>", "<|startoftext|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"):
            plain = plain.replace(tok, "")
        assert tiny.decode(ids, skip_special=True) == plain


def test_tiny_bracketed_word_is_the_running_text_id(tiny):
    """A word inside an action's brackets is the same token id as in the task text, so an agent
    copies ids; text that already holds "[ " still round-trips."""
    in_text = tiny.encode("The goal says navy.")
    in_action = tiny.encode("<action>search[navy shoes]</action>")
    navy = tiny.token_to_id("Ġnavy")
    assert navy is not None and navy in in_text and navy in in_action
    for s in ["click[navy]", "a [ b", "[[ x]", "[", "x[ "]:
        assert tiny.decode(tiny.encode(s)) == s


def test_tiny_matches_transformers_fast_tokenizer(tiny, tmp_path):
    transformers = pytest.importorskip("transformers")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=tiny.save(str(tmp_path)))
    rng = random.Random(2)
    for _ in range(100):
        s = _random_text(rng)
        ids = hf.encode(s, add_special_tokens=False)
        assert ids == tiny.encode(s)
        assert hf.decode(ids) == tiny.decode(ids)


def test_tiny_save_load_and_deterministic_bytes(tiny, tmp_path):
    path = tiny.save(str(tmp_path / "ckpt"))
    assert path == str(tmp_path / "ckpt" / "tokenizer.json")
    again = Tokenizer.from_dir(str(tmp_path / "ckpt"), family="sdar")
    text = render_chat([SYS, U1], "sdar") + "<action>click[b0]</action><|im_end|>"
    assert again.encode(text) == tiny.encode(text) and again.vocab_size == tiny.vocab_size
    # a fresh process (fresh hash seeds in Python and Rust) builds the same bytes
    corpus = tmp_path / "corpus.json"
    corpus.write_text(json.dumps(CORPUS))
    script = ("import json, sys; from d3mini.data import build_tiny_tokenizer; "
              "build_tiny_tokenizer(json.load(open(sys.argv[1])), vocab_size=400).save(sys.argv[2])")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    other = tmp_path / "other.json"
    subprocess.run([sys.executable, "-c", script, str(corpus), str(other)], check=True,
                   env={**os.environ, "PYTHONPATH": root, "PYTHONHASHSEED": "123"})
    assert other.read_bytes() == open(path, "rb").read()


def test_apply_chat_is_render_then_encode(tiny):
    msgs = [SYS, U1]
    ids = apply_chat(tiny, msgs, "sdar")
    assert ids == tiny.encode(render_chat(msgs, "sdar"))
    # generation prompt tail: <|im_start|> assistant\n <think> \n\n </think> \n\n
    tail = [TINY_SPECIAL_IDS["<|im_start|>"], *tiny.encode("assistant\n"), TINY_SPECIAL_IDS["<think>"],
            *tiny.encode("\n\n"), TINY_SPECIAL_IDS["</think>"], *tiny.encode("\n\n")]
    assert ids[-len(tail):] == tail
    llada = build_tiny_tokenizer(CORPUS, vocab_size=400, family="llada")
    ids = apply_chat(llada, msgs)  # family from the tokenizer
    assert ids[0] == llada.bos_id and ids.count(llada.bos_id) == 1
    assert ids.count(TINY_SPECIAL_IDS["<|eot_id|>"]) == 2


# ----------------------------------------------------------------------------- real-vocabulary special ids

def _write_tokenizer(path, specials):
    """A word-level tokenizer.json whose special tokens sit at the given (real checkpoint) ids."""
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
              "special": True} for t, i in specials.items()]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": {"a": 0, **specials}, "unk_token": "a"}}
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(spec, f)
    return str(path)


QWEN = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645, "<think>": 151667,
        "</think>": 151668}


def test_real_sdar_qwen3_ids(tmp_path):
    sdar = Tokenizer.from_dir(_write_tokenizer(tmp_path / "sdar", {**QWEN, "<MASK>": 151669}), family="sdar")
    assert (sdar.mask_id, sdar.eos_id, sdar.eot_id, sdar.pad_id, sdar.bos_id) == (151669, 151643, 151645, 151643,
                                                                                  None)
    assert (sdar.think_id, sdar.think_end_id, sdar.stop_ids) == (151667, 151668, [151645, 151643])
    assert sdar.encode("a<|im_end|>a<MASK>") == [0, 151645, 0, 151669]
    qwen3 = Tokenizer.from_dir(_write_tokenizer(tmp_path / "qwen3", QWEN), family="qwen3")
    assert qwen3.mask_id is None and qwen3.stop_ids == [151645, 151643]
    with pytest.raises(ValueError, match=r"no mask token \(looked for '<\|MASK\|>' or '<MASK>'\)"):
        Tokenizer.from_dir(str(tmp_path / "qwen3"), family="sdar")


def test_real_llada_ids(tmp_path):
    specials = {"<|startoftext|>": 126080, "<|endoftext|>": 126081, "<|mdm_mask|>": 126336,
                "<|start_header_id|>": 126346, "<|end_header_id|>": 126347, "<|eot_id|>": 126348}
    tok = Tokenizer.from_dir(_write_tokenizer(tmp_path, specials), family="llada")
    assert (tok.mask_id, tok.eos_id, tok.eot_id, tok.pad_id, tok.bos_id) == (126336, 126081, 126348, 126081, 126080)
    assert tok.think_id is None and tok.stop_ids == [126348, 126081]
    with pytest.raises(ValueError, match="no eot token"):
        Tokenizer.from_dir(_write_tokenizer(tmp_path / "sdar", {**QWEN, "<|MASK|>": 151669}), family="llada")


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no tokenizer.json in checkpoint folder"):
        Tokenizer.from_dir(str(tmp_path), family="sdar")
    with pytest.raises(FileNotFoundError, match="nope.json"):
        Tokenizer.from_file(str(tmp_path / "nope.json"), family="sdar")
