"""Data: tokenizers, chat templates (rendered in code), and the tiny BPE tokenizer for tiny models.

Special ids and template formats follow the upstream checkpoints (shared/reference/models.md §2.4, §5.6):
- SDAR / Qwen3 share the Qwen2 BPE vocabulary and the Qwen3 chat template (`chat_template.jinja`).
- LLaDA uses the Llama-3 style header template with a leading BOS.
Templated strings are always tokenized without adding special tokens: the template already holds them.
"""
from __future__ import annotations

import json
import os
import re
from typing import Iterable, Optional

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

FAMILIES = ("sdar", "qwen3", "llada")

# ============================================================================= tokenizers

# role -> (token strings to try, in order; required?) per family. SDAR's training copy spells the mask `<MASK>`
# (same id 151669 as `<|MASK|>`); Qwen3-AR has no mask token at all; the tiny tokenizer stands in `<|MASK|>` for
# LLaDA's `<|mdm_mask|>`.
_QWEN_TOKENS = {
    "eos": (("<|endoftext|>",), True),     # end of text; also the pad token (tokenizer_config)
    "eot": (("<|im_end|>",), True),        # end of turn; first stop id
    "pad": (("<|endoftext|>",), True),
    "bos": ((), False),                    # Qwen adds no BOS
    "think": (("<think>",), False),
    "think_end": (("</think>",), False),
}
_SPECIAL_TOKENS = {
    "sdar": {**_QWEN_TOKENS, "mask": (("<|MASK|>", "<MASK>"), True)},
    "qwen3": {**_QWEN_TOKENS, "mask": (("<|MASK|>", "<MASK>"), False)},
    "llada": {
        "mask": (("<|mdm_mask|>", "<|MASK|>"), True),
        "eos": (("<|endoftext|>",), True),  # EOS, also pad (SFT padded answers with it)
        "eot": (("<|eot_id|>",), True),
        "pad": (("<|endoftext|>",), True),
        "bos": (("<|startoftext|>",), True),
        "think": (("<think>",), False),
        "think_end": (("</think>",), False),
    },
}


def _check_family(family: str) -> str:
    if family not in FAMILIES:
        raise ValueError(f"unknown model family {family!r}; expected one of {FAMILIES}")
    return family


class Tokenizer:
    """A `tokenizers.Tokenizer` plus the family's named special ids.

    Attributes: family, mask_id, eos_id, eot_id, pad_id, bos_id (None for SDAR/Qwen3), think_id and think_end_id
    (None where absent), stop_ids = [eot_id, eos_id], vocab_size.
    """

    def __init__(self, backend: tokenizers.Tokenizer, family: str, source: str = "<memory>"):
        self.backend, self.family, self.source = backend, _check_family(family), source
        ids = {}
        for role, (candidates, required) in _SPECIAL_TOKENS[family].items():
            found = [i for i in map(backend.token_to_id, candidates) if i is not None]
            if required and not found:
                raise ValueError(f"{source}: the {family} tokenizer has no {role} token "
                                 f"(looked for {' or '.join(map(repr, candidates))})")
            ids[role] = found[0] if found else None
        self.mask_id: Optional[int] = ids["mask"]     # None only for Qwen3-AR, which has no mask token
        self.eos_id: int = ids["eos"]                  # end of text
        self.eot_id: int = ids["eot"]                  # end of turn
        self.pad_id: int = ids["pad"]
        self.bos_id: Optional[int] = ids["bos"]
        self.think_id: Optional[int] = ids["think"]
        self.think_end_id: Optional[int] = ids["think_end"]
        # Qwen3 generation_config eos [151645, 151643]; LLaDA stops at <|eot_id|> or <|endoftext|>.
        self.stop_ids: list[int] = [self.eot_id, self.eos_id]

    @classmethod
    def from_file(cls, path: str, family: str) -> "Tokenizer":
        if not os.path.isfile(path):
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        try:
            backend = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library raises a bare Exception on a damaged or foreign file
            raise ValueError(f"{path}: not a readable tokenizer file ({e})") from None
        return cls(backend, family, source=path)

    @classmethod
    def from_dir(cls, path: str, family: str) -> "Tokenizer":
        """Load `<path>/tokenizer.json` (the layout of every HF checkpoint folder and of ours)."""
        file = os.path.join(path, "tokenizer.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no tokenizer.json in checkpoint folder {path} (looked for {file})")
        return cls.from_file(file, family)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> Optional[int]:
        return self.backend.token_to_id(token)

    def id_to_token(self, i: int) -> Optional[str]:
        return self.backend.id_to_token(i)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text map to their single ids, none is added."""
        if not isinstance(text, str):
            raise TypeError(f"encode expects a str, got {type(text).__name__}")
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def save(self, path: str) -> str:
        """Write tokenizer.json to `path` (a folder, created if needed, or a file ending in .json); returns the file."""
        if not path.endswith(".json"):
            os.makedirs(path, exist_ok=True)
            path = os.path.join(path, "tokenizer.json")
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.backend.to_str(pretty=True))
        return path

    def __repr__(self) -> str:
        return (f"Tokenizer({self.family}, vocab={self.vocab_size}, mask={self.mask_id}, eos={self.eos_id}, "
                f"eot={self.eot_id}, pad={self.pad_id}, bos={self.bos_id}, source={self.source})")


# ============================================================================= chat templates

def _check_messages(messages: list[dict]) -> None:
    if not messages:
        raise ValueError("render_chat needs at least one message")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with a 'role' and a str 'content', got {m!r}")
        if m["role"] not in ("system", "user", "assistant", "tool"):
            raise ValueError(f"message {i}: unknown role {m['role']!r} (system | user | assistant | tool)")


def _split_think(content: str) -> tuple[str, str]:
    """Reasoning embedded in content as `<think>..</think>answer` -> (reasoning, answer), as the Qwen3 template
    splits it: the reasoning is what precedes the first `</think>` (after the last `<think>`), the answer what
    follows the last one."""
    if "</think>" not in content:
        return "", content
    reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
    return reasoning, content.split("</think>")[-1].lstrip("\n")


def _render_qwen3(messages: list[dict], add_generation_prompt: bool, enable_thinking: bool) -> str:
    # Qwen3 `chat_template.jinja` (no tools/tool_calls): reasoning is shown only for assistant turns after the last
    # real user query (a user turn that is not a wrapped <tool_response>); earlier turns keep only the answer.
    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        c = messages[i]["content"]
        if messages[i]["role"] == "user" and not (c.startswith("<tool_response>") and c.endswith("</tool_response>")):
            last_query = i
            break
    out = []
    for i, m in enumerate(messages):
        role, content = m["role"], m["content"]
        if role in ("system", "user"):
            out.append(f"<|im_start|>{role}\n{content}<|im_end|>\n")
        elif role == "assistant":
            reasoning = m.get("reasoning", m.get("reasoning_content"))
            if reasoning is None:
                reasoning, content = _split_think(content)
            if i > last_query and (i == len(messages) - 1 or reasoning):
                content = "<think>\n" + reasoning.strip("\n") + "\n</think>\n\n" + content.lstrip("\n")
            out.append(f"<|im_start|>assistant\n{content}<|im_end|>\n")
        else:  # tool: consecutive tool results share one user turn
            first = i == 0 or messages[i - 1]["role"] != "tool"
            last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
            out.append(("<|im_start|>user" if first else "") + f"\n<tool_response>\n{content}\n</tool_response>"
                       + ("<|im_end|>\n" if last else ""))
    if add_generation_prompt:
        # enable_thinking=False pre-fills an empty think block so the model answers directly.
        out.append("<|im_start|>assistant\n" + ("" if enable_thinking else "<think>\n\n</think>\n\n"))
    return "".join(out)


def _render_llada(messages: list[dict], add_generation_prompt: bool) -> str:
    # LLaDA-8B-Instruct tokenizer_config chat_template: BOS, then header + trimmed content + <|eot_id|> per message.
    # The template has no reasoning slot, so a message's `reasoning` is not rendered (as upstream ignores it).
    out = ["<|startoftext|>"]
    for m in messages:
        out.append(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>")
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


def render_chat(messages: list[dict], family: str, add_generation_prompt: bool = True,
                enable_thinking: bool = False) -> str:
    """Render messages [{role, content, [reasoning]}] with the family's chat template, exactly as upstream does.

    SDAR/Qwen3: Qwen3 template; `reasoning` (or HF's `reasoning_content`, or a `<think>..</think>` prefix in content)
    is shown for assistant turns after the last user query. LLaDA: header template with BOS; enable_thinking and
    reasoning do not apply.
    """
    _check_family(family)
    _check_messages(messages)
    if family == "llada":
        return _render_llada(messages, add_generation_prompt)
    return _render_qwen3(messages, add_generation_prompt, enable_thinking)


def apply_chat(tokenizer: Tokenizer, messages: list[dict], family: Optional[str] = None,
               enable_thinking: bool = False, add_generation_prompt: bool = True) -> list[int]:
    """render_chat then encode (no special tokens added: the template holds BOS where the family has one)."""
    family = family or tokenizer.family
    return tokenizer.encode(render_chat(messages, family, add_generation_prompt, enable_thinking))


# ============================================================================= tiny BPE tokenizer

# Fixed ids so tiny configs can name them (ModelConfig defaults: mask 3, eos_ids [2, 0], pad 0). Control tokens are
# special (dropped by decode(skip_special=True)); the tags are plain added tokens, like Qwen's <think>, so agent
# actions survive skip_special decoding and each tag is one token for a tiny model to learn.
TINY_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>", "<think>", "</think>", "<|startoftext|>",
    "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<action>", "</action>", "<search>", "</search>",
    "<answer>", "</answer>", "<information>", "</information>",
)
TINY_SPECIAL_IDS = {tok: i for i, tok in enumerate(TINY_SPECIAL_TOKENS)}
_TINY_CONTROL = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>", "<|startoftext|>",
                 "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}
_TINY_SPLIT = re.compile("|".join(re.escape(t) for t in TINY_SPECIAL_TOKENS))


def build_tiny_tokenizer(texts: Iterable[str], vocab_size: int = 512, family: str = "sdar") -> Tokenizer:
    """Byte-level BPE trained on `texts`, with TINY_SPECIAL_TOKENS at ids 0..17.

    The vocabulary holds the 18 special tokens, the 256 byte symbols and up to vocab_size - 274 merges; it is
    exactly vocab_size unless the texts run out of pairs to merge (then smaller; `.vocab_size` tells). Same texts
    give the same tokenizer.json bytes.
    """
    _check_family(family)
    n_base = len(TINY_SPECIAL_TOKENS) + 256
    if vocab_size < n_base:
        raise ValueError(f"vocab_size {vocab_size} < {n_base} (18 special tokens + 256 byte symbols)")
    # Special tokens are matched before BPE at encode time, so they are cut out of the training text too.
    pieces = [p for text in texts for p in _TINY_SPLIT.split(text) if p]
    tok = tokenizers.Tokenizer(models.BPE())
    # Byte-level BPE glues a word to the space before it, so "purple" in "click[purple]" and " purple" in
    # "color: purple" would be two unrelated ids and every copy from the prompt into an action a learned
    # lookup. Spelling "[" as "[ " (and back at decode) makes a bracketed word the same id as in running
    # text: copying is copying an id. Decoding drops exactly the inserted space, so round trips stay exact.
    tok.normalizer = normalizers.Replace("[", "[ ")
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Replace("[ ", "[")])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(TINY_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(pieces, trainer=trainer)
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] in _TINY_CONTROL
    backend = tokenizers.Tokenizer.from_str(json.dumps(spec))
    for t, i in TINY_SPECIAL_IDS.items():
        assert backend.token_to_id(t) == i, (t, i)
    return Tokenizer(backend, family, source="tiny")
