"""The vocabulary: text <-> token ids, chat templates, and streaming detokenization.

The engine's Tokenizer wraps a model folder's `tokenizer.json` (Hugging Face `tokenizers`, fast
Rust BPE) and renders the chat template from `tokenizer_config.json` / `chat_template.jinja` with
Jinja. `bpe_encode` below is the same byte-level BPE written out in Python, for reading.
"""
from __future__ import annotations

import json
import os

import regex
from tokenizers import Tokenizer as HFTokenizer

from minillm.config import read_json_object, read_text
from minillm.sampling_params import check_text, describe, is_integer  # noqa: F401 (check_text: re-exported)


# >>> exercise 1.1 | notebooks/01_vocab_weights_runtime.ipynb | 3. Byte-level BPE, step by step
def bpe_encode(piece: bytes, ranks: dict[bytes, int]) -> list[int]:
    """Byte-level BPE of one pre-tokenized piece, exactly as tiktoken does it.

    piece: the UTF-8 bytes of one regex piece (e.g. b" world"); ranks: token bytes -> token id,
    where a lower id means the merge was learned earlier (tiktoken's "mergeable ranks"; every
    single byte is a token). -> the token ids of the final parts, in order ([] for b"").
    The ids depend on both arguments: the notebook replays a piece with a few merges, then all.
    Start from single bytes; repeatedly find the adjacent pair whose concatenation has the lowest
    rank and merge it into one part; stop when no adjacent pair is in `ranks`.
    Hints: piece[i:i + 1] is a bytes object of length 1 (piece[i] is an int); when the same pair
    occurs twice, merge the leftmost first.
    """
    parts = [piece[i:i + 1] for i in range(len(piece))]
    while len(parts) > 1:
        best, best_rank = -1, None
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and (best_rank is None or rank < best_rank):
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best:best + 2] = [parts[best] + parts[best + 1]]
    return [ranks[p] for p in parts]


# exercise: given
def bpe_tokenize(text: str, ranks: dict[bytes, int], pattern: str, special: dict[str, int]) -> list[int]:
    """text -> token ids: split out special tokens, pre-tokenize each stretch with the regex
    `pattern`, BPE each piece (special: token text -> id, e.g. {"<|im_end|>": 151645})."""
    ids: list[int] = []
    splitter = "(" + "|".join(regex.escape(s) for s in sorted(special, key=len, reverse=True)) + ")" if special else None
    chunks = regex.split(splitter, text) if splitter else [text]
    for chunk in chunks:
        if chunk in special:
            ids.append(special[chunk])
            continue
        for piece in regex.findall(pattern, chunk):
            ids.extend(bpe_encode(piece.encode("utf-8"), ranks))
    return ids
# <<< exercise 1.1


class Encoding(dict):
    """What tokenizer(text) returns: transformers' BatchEncoding's dict, its keys also read as attributes."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


class _TokenId:
    """A named special token's id (bos_token_id reads bos_token's), None where it is unset: computed on
    each read, so setting the token (tok.pad_token = tok.eos_token) moves its id, as in transformers."""

    def __set_name__(self, owner, name: str) -> None:
        self.token = name.removesuffix("_id")

    def __get__(self, tok, owner=None) -> int | None:
        return self if tok is None else tok._token_id(getattr(tok, self.token))


class Tokenizer:
    """A model folder's tokenizer: encode, decode, chat template, EOS ids.
    A missing, unreadable or corrupt file raises ValueError naming it."""

    def __init__(self, path: str):
        tok_file = os.path.join(path, "tokenizer.json")
        if not os.path.lexists(tok_file):
            raise ValueError(f"{path!r} has no tokenizer.json; minillm reads fast (tokenizers) tokenizers only")
        # the small files first: their errors should not wait for the vocabulary to be parsed
        cfg_file = os.path.join(path, "tokenizer_config.json")
        cfg = read_json_object(cfg_file) if os.path.lexists(cfg_file) else {}
        self.chat_template = _chat_template(cfg.get("chat_template"), cfg_file)
        jinja_file = os.path.join(path, "chat_template.jinja")  # transformers 5 writes it beside
        if self.chat_template is None and os.path.lexists(jinja_file):
            self.chat_template = read_text(jinja_file)
        # the named special tokens as transformers reads them from tokenizer_config.json (plain attributes: code
        # written for transformers sets them, e.g. tok.pad_token = tok.eos_token, and the *_id properties follow)
        (self.bos_token, self.eos_token, self.unk_token, self.sep_token, self.pad_token, self.cls_token,
         self.mask_token) = (_token_str(cfg.get(key), key, cfg_file) for key in NAMED_SPECIAL_TOKENS)
        self.extra_special_tokens = _extra_special_tokens(cfg, cfg_file)
        text = read_text(tok_file)
        try:
            self._tok = HFTokenizer.from_str(text)
        except Exception as e:  # noqa: BLE001 -- the tokenizers library raises a bare Exception
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ValueError(f"{tok_file} is not a valid tokenizer.json ({reason})") from None
        added = self._tok.get_added_tokens_decoder()
        self.special_ids = {i for i, t in added.items() if t.special}

    @staticmethod
    def available(path: str) -> bool:
        # lexists: a tokenizer.json that is a folder or a dangling link is reported, not ignored
        return os.path.lexists(os.path.join(path, "tokenizer.json"))

    @property
    def vocab_size(self) -> int:
        """The base vocabulary, added tokens left out (transformers' vocab_size: 151643 for Qwen3). len(tokenizer)
        counts them too (151669): the ids a tokenizer can decode are range(len(tokenizer))."""
        return self._tok.get_vocab_size(with_added_tokens=False)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(check_text(text), add_special_tokens=add_special_tokens).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        """Token ids (a list, a 1-D tensor or array, or one int) -> text. Special tokens are left out unless
        skip_special_tokens=False: minillm's default is the engine's (its outputs leave them out, as vLLM's
        do); transformers' decode keeps them by default."""
        return self._tok.decode(id_list(ids), skip_special_tokens=skip_special_tokens)

    def batch_decode(self, sequences, skip_special_tokens: bool = True) -> list[str]:
        """decode() of each row (a list of lists, or a 2-D tensor or array)."""
        rows = sequences.tolist() if hasattr(sequences, "tolist") else sequences
        return [self.decode(ids, skip_special_tokens) for ids in rows]

    def __len__(self) -> int:
        """transformers' len(tokenizer): the whole vocabulary, added tokens included (151669 for Qwen3)."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        """transformers' name: a token's id, or a list of them; a token not in the vocabulary gets unk_token_id
        (None for a tokenizer without an unk token, as Qwen3's)."""
        if isinstance(tokens, str):
            found = self.token_to_id(tokens)
            return self.unk_token_id if found is None else found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    # ---- transformers' names, so that code written for vLLM's get_tokenizer() (a transformers tokenizer) runs
    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """A token id's vocabulary entry ("Ġworld" for " world"; None outside the vocabulary), or a list of
        them (special tokens left out with skip_special_tokens=True, as transformers does)."""
        if is_integer(ids):
            return self._tok.id_to_token(int(ids))
        special = {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special} if skip_special_tokens \
            else set()
        return [self._tok.id_to_token(int(i)) for i in id_list(ids) if int(i) not in special]

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """text -> its tokens' vocabulary entries (transformers' tokenize)."""
        return self._tok.encode(check_text(text), add_special_tokens=add_special_tokens).tokens

    def get_vocab(self) -> dict[str, int]:
        """{token: id}, added tokens included (transformers' get_vocab)."""
        return self._tok.get_vocab(with_added_tokens=True)

    # ---- the special tokens, as transformers names them (a token the folder does not set: None)
    bos_token_id = _TokenId()
    eos_token_id = _TokenId()
    unk_token_id = _TokenId()
    sep_token_id = _TokenId()
    pad_token_id = _TokenId()
    cls_token_id = _TokenId()
    mask_token_id = _TokenId()

    def _token_id(self, token: str | None) -> int | None:
        return None if token is None else self._tok.token_to_id(token)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", ...}: the named special tokens that are set."""
        return {key: getattr(self, key) for key in NAMED_SPECIAL_TOKENS if getattr(self, key) is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then extra_special_tokens, each once (transformers' order)."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int | None]:
        """all_special_tokens' ids, in the same order."""
        return self.convert_tokens_to_ids(self.all_special_tokens)

    @property
    def max_token_id(self) -> int:
        """The largest id in the vocabulary (vLLM's get_tokenizer() has it)."""
        return max(self._tok.get_vocab(with_added_tokens=True).values())

    def __call__(self, text, add_special_tokens: bool = True, return_tensors: str | None = None, **unsupported):
        """transformers' tokenizer(text) for a string or a list of strings -> {"input_ids", "attention_mask"}
        (also as attributes: enc.input_ids), lists of ints, or with return_tensors="pt" tensors (the texts
        must then give equal lengths: minillm does not pad)."""
        if unsupported:
            raise ValueError(f"minillm's tokenizer(...) takes text, add_special_tokens and return_tensors ('pt' or "
                             f"None), not {sorted(unsupported)}; for padding or truncation use transformers' "
                             f"AutoTokenizer on the same folder")
        if return_tensors not in (None, "pt"):
            raise ValueError(f"return_tensors must be None (lists) or 'pt' (torch tensors), got {return_tensors!r}")
        one = isinstance(text, str)
        if not one and not (isinstance(text, (list, tuple)) and all(isinstance(t, str) for t in text)):
            raise ValueError(f"tokenizer(text): text must be a string or a list of strings, got {describe(text)}; "
                             f"token ids are already tokenized")
        ids = [self.encode(t, add_special_tokens=add_special_tokens) for t in ([text] if one else text)]
        if return_tensors == "pt":
            if len({len(i) for i in ids}) > 1:
                raise ValueError("return_tensors='pt' needs texts of equal token length (minillm's tokenizer does "
                                 "not pad): tokenize them one at a time, or pad the lists yourself")
            import torch
            input_ids = torch.tensor(ids, dtype=torch.long)
            return Encoding(input_ids=input_ids, attention_mask=torch.ones_like(input_ids))
        masks = [[1] * len(i) for i in ids]
        return Encoding(input_ids=ids[0], attention_mask=masks[0]) if one else Encoding(input_ids=ids,
                                                                                         attention_mask=masks)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True,
                            chat_template: str | None = None, continue_final_message: bool = False,
                            tools: list[dict] | None = None, tokenize: bool = False, return_dict: bool = False,
                            **template_kwargs) -> str | list[int] | Encoding:
        """Render a conversation [{"role", "content"}, ...] to the prompt text the model was tuned on, as
        transformers' apply_chat_template(..., tokenize=False) does: chat_template replaces the
        tokenizer's own; continue_final_message leaves the last message open (no end-of-turn after
        it) for the model to continue; tools (JSON-schema dicts) and template_kwargs (e.g.
        enable_thinking=False for Qwen3) are passed to the template. tokenize=True returns that text's
        token ids instead (transformers' default is True; minillm's, the text, is what vLLM code asks
        for with tokenize=False), and with return_dict=True {"input_ids", "attention_mask"} (transformers
        5's default with tokenize=True; minillm's is the list). Two defaults differ from transformers':
        add_generation_prompt is True here (as vLLM's LLM.chat has it) and False there. transformers'
        options that pad, truncate or make tensors are refused (TRANSFORMERS_ONLY_CHAT_OPTIONS)."""
        for name, value in (("tokenize", tokenize), ("return_dict", return_dict)):
            if not isinstance(value, bool):
                raise ValueError(f"{name} must be True or False, got {describe(value)}")
        refused = sorted(set(template_kwargs) & TRANSFORMERS_ONLY_CHAT_OPTIONS)
        if refused:
            raise ValueError(f"minillm's apply_chat_template does not take {refused} (transformers' padding, "
                             f"truncation and tensors): call it with tokenize=True for the ids, or use transformers' "
                             f"AutoTokenizer on the same folder")
        if tokenize:
            ids = self.encode_chat(messages, add_generation_prompt=add_generation_prompt, chat_template=chat_template,
                                   continue_final_message=continue_final_message, tools=tools, **template_kwargs)
            return Encoding(input_ids=ids, attention_mask=[1] * len(ids)) if return_dict else ids
        template = self.chat_template if chat_template is None else chat_template
        if not template:
            raise ValueError("this tokenizer has no chat template; use generate() with plain text instead, "
                             "or pass chat_template")
        if add_generation_prompt and continue_final_message:
            raise ValueError("add_generation_prompt and continue_final_message cannot both be True: the first "
                             "opens a new assistant turn, the second continues the last message")
        if tools is not None and not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise ValueError(f"tools must be a list of JSON-schema dicts, got {type(tools).__name__}")
        check_messages(messages)
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise ValueError(f"chat template: {msg}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw)
        env.globals["raise_exception"] = raise_exception
        try:
            text = env.from_string(template).render(
                **template_kwargs, messages=messages, add_generation_prompt=add_generation_prompt, tools=tools,
                bos_token=self.bos_token or "", eos_token=self.eos_token or "")
        except TemplateError as e:
            whose = "of this tokenizer" if chat_template is None else "given as chat_template"
            raise ValueError(f"the chat template {whose} fails: {type(e).__name__}: {e}") from None
        if continue_final_message:  # cut after the last message's text: what the template closes it with goes
            final = messages[-1]["content"].strip()
            if final not in text:
                raise ValueError("continue_final_message: the template does not write the last message's "
                                 "content verbatim, so it cannot be left open")
            text = text[:text.rindex(final) + len(final)]
        return text

    def encode_chat(self, messages: list[dict], **template_options) -> list[int]:
        """apply_chat_template(messages, **template_options), tokenized."""
        # the rendered template already holds every special token: add none
        return self.encode(self.apply_chat_template(messages, **template_options, tokenize=False),
                           add_special_tokens=False)


# transformers' named special tokens (its SPECIAL_TOKENS_ATTRIBUTES), in its order: all_special_tokens lists them
# first, then the extra ones
NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


# transformers' apply_chat_template options that minillm's does not do (it neither pads nor truncates nor
# makes tensors): refused rather than handed to the template as variables
TRANSFORMERS_ONLY_CHAT_OPTIONS = {"padding", "truncation", "max_length", "return_tensors",
                                  "return_assistant_tokens_mask", "tokenizer_kwargs"}


def id_list(ids) -> list[int]:
    """Token ids as decode takes them from transformers' callers: a list, a 1-D tensor or array, or one int."""
    if is_integer(ids):
        return [int(ids)]
    return ids.tolist() if hasattr(ids, "tolist") else ids


# names the template renders with that chat_template_kwargs may not override (each is an option of its own)
RESERVED_TEMPLATE_NAMES = {"messages", "tools", "add_generation_prompt", "bos_token", "eos_token", "chat_template",
                           "continue_final_message", "tokenize"}


def chat_template_options(chat_template: str | None = None, chat_template_kwargs: dict | None = None,
                          add_generation_prompt: bool = True, continue_final_message: bool = False,
                          tools: list[dict] | None = None) -> dict:
    """The template options of LLM.chat and of the server's chat requests (vLLM's names), checked:
    -> keyword arguments for Tokenizer.apply_chat_template. A bad one raises ValueError naming it."""
    if chat_template is not None and not isinstance(chat_template, str):
        raise ValueError(f"chat_template must be a Jinja template string or None, got {describe(chat_template)}")
    if chat_template_kwargs is not None and not (isinstance(chat_template_kwargs, dict) and all(
            isinstance(k, str) for k in chat_template_kwargs)):
        raise ValueError(f"chat_template_kwargs must be a dict of str keys or None, got {describe(chat_template_kwargs)}")
    taken = set(chat_template_kwargs or {}) & RESERVED_TEMPLATE_NAMES
    if taken:
        raise ValueError(f"chat_template_kwargs may not set {sorted(taken)}: each is an option of its own")
    for name, flag in (("add_generation_prompt", add_generation_prompt),
                       ("continue_final_message", continue_final_message)):
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {describe(flag)}")
    return dict(chat_template_kwargs or {}, chat_template=chat_template, tools=tools,
                add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message)


def text_content(content, where: str = "content") -> str:
    """A chat message's content as a string: a string as it is, or OpenAI's list of text parts
    [{"type": "text", "text": ...}, ...] joined by newlines, as vLLM joins them (`serve` and LLM.chat
    both take it). Raise
    ValueError, naming `where`, for anything else (images and other parts are not supported)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "\n".join(p["text"] for p in content)
    raise ValueError(f"{where} must be a string or a list of text parts ({{\"type\": \"text\", \"text\": ...}}; "
                     f"no other kind of part is supported), got {describe(content)}")


def template_fields(m: dict, where: str = "message") -> dict:
    """The fields of messages[i] besides role and content that vLLM hands the chat template: a string `name`;
    an assistant's `tool_calls` (each function's JSON `arguments` string parsed to an object, as
    transformers' templates expect; not JSON: {}) and `reasoning` (also `reasoning_content`, both keys set); a
    tool message's `tool_call_id`. where: the message's name in errors ("messages[2]"); a malformed
    tool_calls or reasoning is a ValueError."""
    fields = {}
    if isinstance(m.get("name"), str):
        fields["name"] = m["name"]
    if m["role"] == "assistant":
        calls = m.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list) or not all(isinstance(c, dict) and isinstance(c.get("function"), dict)
                                                      and isinstance(c["function"].get("name"), str) for c in calls):
                raise ValueError(f"{where}.tool_calls must be a list of {{\"id\", \"type\": \"function\", "
                                 f"\"function\": {{\"name\", \"arguments\"}}}} objects, got {describe(calls)}")
            if calls:  # an empty list is dropped: the template takes the plain assistant path
                fields["tool_calls"] = [{**c, "function": {**c["function"], "arguments": _arguments(c["function"])}}
                                        for c in calls]
        reasoning = m.get("reasoning", m.get("reasoning_content"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise ValueError(f"{where}.reasoning must be a string, got {describe(reasoning)}")
            fields["reasoning"] = fields["reasoning_content"] = reasoning
    elif m["role"] == "tool" and "tool_call_id" in m:
        fields["tool_call_id"] = m["tool_call_id"]
    return fields


def _arguments(function: dict):
    """A tool call's arguments as the template reads them: the JSON string parsed (vLLM's rule: not JSON, or
    neither a string nor an object/list, is {})."""
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            return json.loads(args)
        except json.JSONDecodeError:
            return {}
    return args if isinstance(args, (dict, list)) else {}


def check_messages(messages) -> None:
    """Raise ValueError unless `messages` is a non-empty list of {"role": str, "content": str} dicts."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"messages must be a non-empty list of {{'role': ..., 'content': ...}} dicts, "
                         f"got {type(messages).__name__}")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ValueError(f"messages[{i}] must be a {{'role': ..., 'content': ...}} dict, got {m!r:.80}")
        for key in ("role", "content"):
            check_text(m[key], f"messages[{i}]['{key}']")


def _chat_template(template, source: str) -> str | None:
    """tokenizer_config.json's chat_template: a string, or transformers' list of named templates."""
    if isinstance(template, list):  # [{"name": "default", "template": "..."}, {"name": "tool_use", ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{source}: chat_template must be a string (or a list of named templates), "
                         f"got {type(template).__name__}")
    return template


def _token_str(tok, key: str, source: str) -> str | None:
    """A special token as tokenizer_config.json writes it: "<s>", {"content": "<s>", ...} or null."""
    text = tok.get("content") if isinstance(tok, dict) else tok
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{source}: {key} must be a string, {{\"content\": string}} or null, got {tok!r:.80}")
    return text


def _extra_special_tokens(cfg: dict, source: str) -> list[str]:
    """tokenizer_config.json's further special tokens: transformers 5's extra_special_tokens (a list, or a dict of
    named ones) or else transformers 4's additional_special_tokens (a list); each "<tok>" or {"content": "<tok>"}."""
    key = "extra_special_tokens" if "extra_special_tokens" in cfg else "additional_special_tokens"  # as 5 does
    tokens = cfg.get(key) or []
    if isinstance(tokens, dict):
        tokens = list(tokens.values())
    if not isinstance(tokens, list):
        raise ValueError(f"{source}: {key} must be a list of tokens, got {type(tokens).__name__}")
    texts = [_token_str(t, key, source) for t in tokens]
    return [t for t in texts if t is not None]


# >>> exercise 6.2 | notebooks/06_serving.ipynb | 2. Streaming text: incremental detokenization
def detokenize_incrementally(tokenizer: Tokenizer, ids: list[int], prefix_offset: int, read_offset: int,
                             skip_special_tokens: bool = True) -> tuple[str, int, int]:
    """The text that the newest tokens complete (vLLM's detokenize_incrementally).

    ids: every token of the completion so far (the newest at the end); text before read_offset has
    been emitted; prefix_offset <= read_offset starts the decode window. Decode only the window
    ids[prefix_offset:] (with tokenizer.decode(ids, skip_special_tokens)), so that a step costs the
    window, not the whole text; the window's first read_offset - prefix_offset tokens are context
    whose text was emitted already.
    -> (new text, new prefix_offset, new read_offset):
      - while the window's text ends in U+FFFD ("\ufffd", what decoding gives for a character whose
        UTF-8 bytes are split across tokens and not all there yet), or has not grown past the text
        of ids[prefix_offset:read_offset]: nothing new, ("", prefix_offset, read_offset) unchanged;
      - else the window's text past that prefix's text, and the window slides: the new
        prefix_offset is the old read_offset, the new read_offset is len(ids) (all of it emitted).

    Hints: decode the prefix ids[prefix_offset:read_offset] and the whole window; compare lengths.
    Byte-level BPE (Qwen, Llama 3, GPT-2) splits an emoji into up to 4 tokens.
    """
    prefix = tokenizer.decode(ids[prefix_offset:read_offset], skip_special_tokens)
    window = tokenizer.decode(ids[prefix_offset:], skip_special_tokens)
    # a trailing U+FFFD is half a character: its other bytes are still to come, so nothing is emitted
    # (the window's text is not comparable with the prefix's while it ends in one)
    if len(window) > len(prefix) and not window.endswith("\ufffd"):
        return window[len(prefix):], read_offset, len(ids)
    return "", prefix_offset, read_offset
# <<< exercise 6.2


class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas, never emitting half a UTF-8 character
    (detokenize_incrementally holds the newest tokens' text back while it ends in U+FFFD).

    Byte-level BPE tokens can split a character (an emoji is often 2-4 tokens). Decoding only a
    short window (prefix_offset..) keeps each step O(window), not O(length).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the decode window
        self.read_offset = 0  # tokens before this have been emitted
        self.text = ""

    def add(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (possibly "")."""
        self.ids.extend(token_ids)
        # a module-level call, so a student's version swapped into this module (use_my_code) runs here
        delta, self.prefix_offset, self.read_offset = detokenize_incrementally(
            self.tok, self.ids, self.prefix_offset, self.read_offset, self.skip)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end of a request: whatever is still held back (a truncated character shows as U+FFFD)."""
        full = self.tok.decode(self.ids[self.prefix_offset:], self.skip)
        prefix = self.tok.decode(self.ids[self.prefix_offset:self.read_offset], self.skip)
        delta = full[len(prefix):]
        self.prefix_offset = self.read_offset = len(self.ids)
        self.text += delta
        return delta
