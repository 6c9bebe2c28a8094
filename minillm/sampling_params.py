"""SamplingParams: how one request picks its next tokens and when it stops (vLLM's names)."""
from __future__ import annotations

import copy
import enum
import functools
import logging
import math
import numbers
from dataclasses import dataclass, field, fields

import numpy as np

logger = logging.getLogger(__name__)

MAX_TEMPERATURE = 2.0  # vLLM's SamplingParams and OpenAI's API refuse a hotter one
SEED_NONE = -1  # vLLM's SamplingParams turns seed=-1 into None: no seed of its own
# Seeds, top-k and token ids end up in int64 tensors (or seed a torch.Generator): larger values overflow.
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def is_integer(x) -> bool:
    """A Python or numpy integer, but not a bool (True is an int to Python, never a count or an id here)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def is_real(x) -> bool:
    """A Python or numpy int or float, but not a bool."""
    return isinstance(x, numbers.Real) and not isinstance(x, (bool, np.bool_))


def describe(x) -> str:
    """`x` and its type, for an error message: "nan (float)"."""
    text = repr(x)
    return f"{text[:60]}... ({type(x).__name__})" if len(text) > 60 else f"{text} ({type(x).__name__})"


PENALTY_LIMIT = 2.0  # presence and frequency penalties lie in [-2, 2] (OpenAI's and vLLM's range)
LOGIT_BIAS_LIMIT = 100.0  # a logit bias is clamped to [-100, 100], as OpenAI's API does
MAX_N = 128  # completions per prompt: each is a running sequence
MAX_LOGPROBS = 20  # top tokens per position (OpenAI's API allows 20)
# the smallest temperature above 0 (vLLM's _MAX_TEMP): a lower one is raised to it, with a warning, since
# logits divided by it blow up (a processed logprob read -32254.7 at 1e-6; bf16 logits overflow); 0 stays greedy
MIN_TEMPERATURE = 1e-2
# a request's bad words as token sequences, and their tokens together: vLLM's defaults of
# VLLM_MAX_NUM_BAD_WORDS and VLLM_MAX_BAD_WORDS_TOTAL_TOKENS (each step's inputs grow with them)
MAX_BAD_WORDS = 128
MAX_BAD_WORDS_TOKENS = 1024

# vLLM's logprobs_mode (an engine argument): what `logprobs` and `prompt_logprobs` report. "raw": the model's
# logits as they come, before any logits processor, penalty, temperature, min_p, top-k or top-p (vLLM's
# default, raw_logprobs); "processed": what the token is drawn from, after all of them (tokens they drop
# at -inf); "logprobs": log_softmax of those logits, "logits": the logits themselves. A greedy request
# (temperature 0) is processed by its logits processors only: vLLM turns top-k, top-p and min_p off for
# it and divides by no temperature. Prompt tokens go through no processor: both "raw" and "processed"
# give the raw values for them.
LOGPROBS_MODES = ("raw_logprobs", "processed_logprobs", "raw_logits", "processed_logits")


class RequestOutputKind(enum.IntEnum):
    """What AsyncLLM.generate (and AsyncLLM.add_request's stream) yields for a request (vLLM's names and values)."""

    CUMULATIVE = 0  # at each step, everything so far (vLLM's default)
    DELTA = 1  # only what is new since the last output (what the server streams)
    FINAL_ONLY = 2  # one output, when the request has finished


@dataclass(kw_only=True)  # vLLM's first field is n and minillm's temperature: SamplingParams(2) must not mean either
class SamplingParams:
    """temperature 0 is greedy, one in (0, 0.01) is raised to 0.01 (MIN_TEMPERATURE) with a logged
    warning, and one above 2 (MAX_TEMPERATURE) is refused, as vLLM does; top_k -1 (or 0, vLLM's other
    spelling), top_p 1.0 and min_p 0.0 keep the whole vocabulary. n > 1 samples need a temperature above
    0: greedy samples would all be the same, and vLLM refuses them too (beam search keeps the n likeliest).

    `seed` gives the request its own random stream, so its tokens do not depend on what else is in
    the batch (-1, as in vLLM, is no seed). Generation stops at max_tokens (None: only max_model_len
    limits it), at an EOS token (unless ignore_eos), at any of stop_token_ids, or when the text produced
    contains one of `stop` (the text is cut before it, or after it with include_stop_str_in_output). The
    text leaves out the token that stopped it (EOS or a stop token id; token_ids keep it) unless
    include_stop_str_in_output, as vLLM's detokenizer does. min_tokens holds EOS and stop_token_ids back
    until that many tokens are out, and a stop string stops only where it ends past the text of those
    first min_tokens tokens (vLLM's rule: one wholly inside that text is ignored).

    Logits processors (vLLM's meaning; minillm.layers.logits_processors), applied to the logits in
    this order before temperature: logit_bias {token id: bias} added (clamped to [-100, 100]);
    allowed_token_ids (a non-empty list): every other token's logit set to -inf;
    min_tokens; repetition_penalty (> 1 discourages every token already in the prompt or the output:
    a positive logit is divided by it, a negative one multiplied); frequency_penalty (subtracted once
    per time a token was generated) and presence_penalty (subtracted once if it was), both in
    [-2, 2], over the output only. min_p, after temperature, drops tokens less likely than min_p x
    the most likely one. bad_words (vLLM's): a word's token sequence may not be completed: its last
    token is set to -inf whenever the tokens generated just before it are the rest of the sequence
    (a one-token word is never generated). Each word is tokenized as vLLM's update_from_tokenizer does
    (bad_words_token_ids): as given, leading spaces stripped, and after one space (the word inside a
    text) when that is another sequence of as many tokens. Only generated tokens count, as in vLLM: a
    prompt that ends in a word's first tokens does not ban its last (transformers' bad_words_ids do).
    Any of them makes the step sample outside the CUDA graph's fused sampler (the slower path: the
    logits go back through torch).
    truncate_prompt_tokens=k keeps only the prompt's last k tokens (left truncation) before the
    request is queued; RequestOutput.prompt_token_ids are the kept ones. -1 keeps what the context
    leaves beside max_tokens (max_model_len - max_tokens; max_tokens None: max_model_len - 1), and k
    may not be more than that (vLLM's TokenizeParams; the engine checks it, knowing max_model_len).
    n samples that many completions of the prompt: its prompt is computed once and its KV blocks
    are shared (forked) until a sample writes into a shared block (copy on write); with a seed,
    sample i uses seed + i. logprobs=k returns, per generated token, the log-probabilities of the k
    most likely tokens and of the sampled one; prompt_logprobs=k the same per prompt token. What they
    hold is the engine's logprobs_mode (LOGPROBS_MODES, vLLM's engine argument): by default, as in
    vLLM, log_softmax of the model's raw logits, before every logits processor, penalty, temperature,
    min_p, top-k and top-p; "processed_logprobs" after all of them. They make the step sample outside
    the fused sampler; a prompt_logprobs request skips the prefix cache (every position is computed).
    skip_special_tokens=False keeps special tokens' text (`<|im_end|>`, `<|endoftext|>`) in the output
    text, its stream and the stop-string search, as vLLM's detokenizer does; the default leaves it out.
    detokenize=False returns token ids only (text "", logprobs' decoded tokens None) and skips the
    detokenizer's cost; stop strings need the text, so they need detokenize=True (vLLM's rule).
    output_kind (vLLM's RequestOutputKind) says what AsyncLLM's streams yield: CUMULATIVE (the default)
    the whole output so far at every step, DELTA only the new tokens and text, FINAL_ONLY one output at
    the end. LLM.generate returns final outputs and LLM.stream text deltas whatever it holds.
    Every field is checked when the object is made and again when a request is submitted (a field
    changed in between is caught): a bad value raises ValueError naming the field and what it accepts.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = 64
    ignore_eos: bool = False
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    n: int = 1
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    skip_special_tokens: bool = True
    detokenize: bool = True
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE

    def __post_init__(self):
        self.validate()

    def clone(self) -> SamplingParams:
        """A deep copy (vLLM's SamplingParams.clone): changing the copy's lists or dicts leaves these alone."""
        return copy.deepcopy(self)

    def validate(self) -> None:
        """Raise ValueError for the first bad field. Then normalize: numbers become Python ints and
        floats, `stop` given as one string (or a tuple) a list, bad_words a list without repeats."""
        def need(ok: bool, name: str, accepts: str, value) -> None:
            if not ok:
                raise ValueError(f"SamplingParams.{name} must be {accepts}, got {describe(value)}")

        t, p, k = self.temperature, self.top_p, self.top_k
        need(is_real(t) and math.isfinite(t) and 0 <= t <= MAX_TEMPERATURE, "temperature",
             f"a finite number >= 0 and <= {MAX_TEMPERATURE:g} (0 means greedy; vLLM and OpenAI take at most "
             f"{MAX_TEMPERATURE:g})", t)
        if 0 < t < MIN_TEMPERATURE:
            logger.warning("SamplingParams.temperature %s is below %s, which may give nan or inf in the logits: "
                           "raised to %s, as vLLM does (0 is greedy)", t, MIN_TEMPERATURE, MIN_TEMPERATURE)
            t = MIN_TEMPERATURE
        need(is_real(p) and math.isfinite(p) and 0.0 < p <= 1.0, "top_p", "a number in (0, 1] (1 keeps every token)", p)
        need(is_integer(k) and -1 <= k <= INT64_MAX, "top_k", "-1 or 0 (off) or an integer in [1, 2**63 - 1]", k)
        k = -1 if k == 0 else k  # vLLM's two spellings of "off"; the sampler sees one
        need(self.max_tokens is None or (is_integer(self.max_tokens) and self.max_tokens >= 1), "max_tokens",
             "None (up to max_model_len) or an integer >= 1", self.max_tokens)
        need(isinstance(self.ignore_eos, bool), "ignore_eos", "True or False", self.ignore_eos)
        need(self.seed is None or (is_integer(self.seed) and INT64_MIN <= self.seed <= INT64_MAX), "seed",
             "None or an integer in [-2**63, 2**63 - 1] (int64, as vLLM's server takes it)", self.seed)
        if self.seed == SEED_NONE:  # vLLM's spelling of "no seed"
            self.seed = None
        ids = self.stop_token_ids = [] if self.stop_token_ids is None else self.stop_token_ids
        need(isinstance(ids, (list, tuple)) and all(is_integer(i) and 0 <= i <= INT64_MAX for i in ids),
             "stop_token_ids", "a list of token ids (integers in [0, 2**63 - 1])", ids)
        if isinstance(self.stop, str):  # a lone surrogate could never match: refused, as in a prompt
            check_text(self.stop, "SamplingParams.stop")
        elif isinstance(self.stop, (list, tuple)):
            for i, s in enumerate(self.stop):
                if isinstance(s, str):
                    check_text(s, f"SamplingParams.stop[{i}]")
        if self.stop is None or isinstance(self.stop, str):
            self.stop = [] if self.stop is None else [self.stop]
        need(isinstance(self.stop, (list, tuple)) and all(isinstance(s, str) and s for s in self.stop), "stop",
             "a non-empty string or a list of non-empty strings", self.stop)
        need(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output", "True or False",
             self.include_stop_str_in_output)
        need(is_integer(self.min_tokens) and 0 <= self.min_tokens <= (self.max_tokens or INT64_MAX), "min_tokens",
             f"an integer in [0, max_tokens={self.max_tokens}]" if self.max_tokens else "an integer >= 0",
             self.min_tokens)
        need(is_real(self.min_p) and 0.0 <= self.min_p <= 1.0, "min_p", "a number in [0, 1] (0 keeps every token)",
             self.min_p)
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            need(is_real(v) and -PENALTY_LIMIT <= v <= PENALTY_LIMIT, name, "a number in [-2, 2] (0 is off)", v)
        r = self.repetition_penalty
        need(is_real(r) and math.isfinite(r) and r > 0, "repetition_penalty", "a finite number > 0 (1 is off)", r)
        bias = self.logit_bias
        need(bias is None or (isinstance(bias, dict) and all(
            is_integer(k) and 0 <= k <= INT64_MAX and is_real(v) and math.isfinite(v) for k, v in bias.items())),
             "logit_bias", "None or a dict {token id: finite number}", bias)
        allowed = self.allowed_token_ids
        need(allowed is None or (isinstance(allowed, (list, tuple)) and len(allowed) > 0 and all(
            is_integer(i) and 0 <= i <= INT64_MAX for i in allowed)), "allowed_token_ids",
             "None or a non-empty list of token ids (integers in [0, 2**63 - 1])", allowed)
        self.allowed_token_ids = None if allowed is None else [int(i) for i in allowed]
        need(is_integer(self.n) and 1 <= self.n <= MAX_N, "n", f"an integer in [1, {MAX_N}]", self.n)
        if t == 0 and self.n > 1:  # vLLM's _verify_greedy_sampling
            raise ValueError(f"SamplingParams.n must be 1 when temperature is 0 (greedy: all {self.n} samples would "
                             f"be the same token for token), got n={self.n}: set a temperature above 0 for {self.n} "
                             f"different samples, or use beam search (LLM.beam_search; use_beam_search: true on "
                             f"the server) for the {self.n} likeliest sequences")
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            need(v is None or (is_integer(v) and 0 <= v <= MAX_LOGPROBS), name,
                 f"None or an integer in [0, {MAX_LOGPROBS}] (how many top tokens to return)", v)
            setattr(self, name, None if v is None else int(v))
        words = self.bad_words
        need(words is None or (isinstance(words, (list, tuple)) and all(
            isinstance(w, str) and w.strip() and _utf8(w) for w in words)), "bad_words",
             "None or a list of strings, each with a non-space character", words)
        self.bad_words = None if words is None else list(dict.fromkeys(words))  # vLLM drops repeats
        cut = self.truncate_prompt_tokens
        need(cut is None or (is_integer(cut) and (cut == -1 or 1 <= cut <= INT64_MAX)), "truncate_prompt_tokens",
             "None, -1 (what max_model_len leaves beside max_tokens) or an integer >= 1 (keep the prompt's last k "
             "tokens)", cut)
        self.truncate_prompt_tokens = None if cut is None else int(cut)
        for name in ("skip_special_tokens", "detokenize"):
            need(isinstance(getattr(self, name), bool), name, "True or False", getattr(self, name))
        kind = self.output_kind
        need(is_integer(kind) and kind in set(RequestOutputKind), "output_kind",
             "a RequestOutputKind (CUMULATIVE, DELTA or FINAL_ONLY)", kind)
        self.output_kind = RequestOutputKind(kind)
        if self.stop and not self.detokenize:
            raise ValueError(f"SamplingParams.stop needs detokenize=True: stop strings are matched on the text, and "
                             f"detokenize=False makes none (got stop={self.stop!r:.60}); use stop_token_ids for ids")
        self.n = int(self.n)
        self.temperature, self.top_p, self.top_k = float(t), float(p), int(k)
        self.max_tokens = None if self.max_tokens is None else int(self.max_tokens)
        self.seed = None if self.seed is None else int(self.seed)
        self.stop_token_ids, self.stop = [int(i) for i in ids], list(self.stop)
        self.min_tokens, self.min_p, self.repetition_penalty = int(self.min_tokens), float(self.min_p), float(r)
        self.presence_penalty, self.frequency_penalty = float(self.presence_penalty), float(self.frequency_penalty)
        self.logit_bias = None if not bias else {
            int(k): max(-LOGIT_BIAS_LIMIT, min(LOGIT_BIAS_LIMIT, float(v))) for k, v in bias.items()}

    @property
    def processes_logits(self) -> bool:
        """True when a logits processor before the temperature is on (see the class docstring)."""
        return bool(self.logit_bias or self.allowed_token_ids or self.min_tokens or self.presence_penalty
                    or self.frequency_penalty or self.repetition_penalty != 1.0 or self.bad_words)

    def bad_words_token_ids(self, tokenizer) -> list[list[int]]:
        """bad_words as token sequences, by vLLM's rule (SamplingParams.update_from_tokenizer): each word,
        its leading spaces stripped, encoded without special tokens; then " " + that word (the word
        inside a text), kept only when it gives as many tokens and another first token (Qwen's "Hello
        world" [9707, 1879] and " Hello world" [21927, 1879]: both are banned).
        tokenizer: has encode(text, add_special_tokens=False) -> ids. Raises ValueError past
        MAX_BAD_WORDS sequences or MAX_BAD_WORDS_TOKENS tokens. -> one list of token ids per sequence."""
        out: list[list[int]] = []
        total = 0
        for i, word in enumerate(self.bad_words or ()):
            word = word.lstrip()
            ids = tokenizer.encode(word, add_special_tokens=False)
            if not ids:
                raise ValueError(f"SamplingParams.bad_words must be words that tokenize to at least one token; "
                                 f"{word!r} gives none")
            spaced = tokenizer.encode(" " + word, add_special_tokens=False)
            kept = [ids, spaced] if len(spaced) == len(ids) and spaced[0] != ids[0] else [ids]
            out += kept
            total += len(ids) * len(kept)
            if len(out) > MAX_BAD_WORDS or total > MAX_BAD_WORDS_TOKENS:  # (a long list is not tokenized to its end)
                raise ValueError(f"SamplingParams.bad_words must give at most {MAX_BAD_WORDS} token sequences of "
                                 f"{MAX_BAD_WORDS_TOKENS} tokens in all once tokenized (vLLM's limits); the first "
                                 f"{i + 1} words give {len(out)} sequences of {total} tokens")
        return out

    def _stops(self, text: str, start: int) -> list[tuple[int, int, str]]:
        """(index, -length, stop string) of the first match of each stop string that ends past text[:start]."""
        found = []
        for s in self.stop:
            i = text.find(s, max(0, start - len(s) + 1))
            if i >= 0:
                found.append((i, -len(s), s))
        return found

    def first_stop(self, text: str, start: int = 0) -> str | None:
        """The stop string that ends text: the one found earliest (of two starting there, the longer),
        among matches that end past text[:start] (min_tokens: the text of the first min_tokens tokens)."""
        found = self._stops(text, start)
        return min(found)[2] if found else None

    def cut_at_stop(self, text: str, start: int = 0) -> str | None:
        """text cut at the first stop string in it that ends past text[:start] (kept when
        include_stop_str_in_output), or None when it holds none."""
        found = self._stops(text, start)
        if not found:
            return None
        i, minus_len, _ = min(found)
        return text[:i - minus_len] if self.include_stop_str_in_output else text[:i]


@dataclass
class BeamSearchParams:
    """What LLM.beam_search keeps and stops on (vLLM's fields and defaults, in vLLM's order):
    beam_width beams live at each step, each grown by one token up to max_tokens; a beam that emits an
    EOS token is finished (unless ignore_eos); beams are ranked by cum_logprob / length ** length_penalty,
    the length counting the prompt. A step's candidates for a beam are its 2 x beam_width likeliest next
    tokens by the engine's logprobs (raw logits by default, logprobs_mode), and the token sampled at
    `temperature` where that is not among them (at 0, the greedy token always is)."""

    beam_width: int
    max_tokens: int
    ignore_eos: bool = False
    temperature: float = 0.0
    length_penalty: float = 1.0
    include_stop_str_in_output: bool = False

    def __post_init__(self):
        def need(ok: bool, name: str, accepts: str) -> None:
            if not ok:
                raise ValueError(f"BeamSearchParams.{name} must be {accepts}, got {describe(getattr(self, name))}")

        # each step asks for 2 x beam_width logprobs, at most MAX_LOGPROBS (vLLM's max_logprobs, 20)
        need(is_integer(self.beam_width) and 1 <= self.beam_width <= MAX_LOGPROBS // 2, "beam_width",
             f"an integer in [1, {MAX_LOGPROBS // 2}]")
        need(is_integer(self.max_tokens) and self.max_tokens >= 1, "max_tokens", "an integer >= 1")
        need(isinstance(self.ignore_eos, bool), "ignore_eos", "True or False")
        need(is_real(self.temperature) and math.isfinite(self.temperature) and self.temperature >= 0, "temperature",
             "a finite number >= 0")
        need(is_real(self.length_penalty) and math.isfinite(self.length_penalty), "length_penalty",
             "a finite number (0: rank by the summed logprobs alone)")
        need(isinstance(self.include_stop_str_in_output, bool), "include_stop_str_in_output", "True or False")


def check_text(text, what: str = "the prompt") -> str:
    """Raise ValueError unless `text` is a str that UTF-8 can encode. -> text.
    (Invalid UTF-8 in a command line or a file decoded with surrogateescape arrives as lone surrogates.)"""
    if not isinstance(text, str):
        raise ValueError(f"{what} must be a string, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{what} is not valid Unicode: it holds a lone surrogate {text[e.start]!r} at "
                         f"index {e.start} (invalid UTF-8 in the input?)") from None
    return text


def _utf8(text: str) -> bool:
    """Whether UTF-8 can encode text (a lone surrogate cannot: the tokenizer would refuse it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _checked_init(init):
    """SamplingParams(unknown=...) raises a ValueError that lists the fields, not a bare TypeError;
    SamplingParams(0.5) a TypeError that says the fields are keywords."""
    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        names = [f.name for f in fields(SamplingParams)]
        if args:
            raise TypeError(f"SamplingParams takes keyword arguments only (SamplingParams(temperature=0.5), not "
                            f"SamplingParams(0.5); its fields are in another order than vLLM's), got "
                            f"{len(args)} positional: {', '.join(describe(a) for a in args)}")
        unknown = sorted(set(kwargs) - set(names))
        if unknown:
            raise ValueError(f"SamplingParams has no field {', '.join(unknown)}; its fields are {', '.join(names)}")
        init(self, *args, **kwargs)
    return __init__


SamplingParams.__init__ = _checked_init(SamplingParams.__init__)
