"""The vLLM-shaped front door: LLM(model, **engine_args).generate / chat / stream.

Threads: one LLM may be shared by several threads. Every call checks all its input first, then
queues its requests at once; steps run one at a time under the engine's lock, and each step
advances every queued request, whichever call it came from, so concurrent calls are batched
together and each call returns exactly its own tokens. A stream holds no lock between its deltas.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
import warnings

from tqdm.auto import tqdm

from minillm.beam_search import BeamSearchOutput, beam_search
from minillm.config import VLLM_ALIASES, EngineConfig, engine_args_from_vllm, generation_defaults
from minillm.engine.llm_engine import LLMEngine
from minillm.engine.sequence import Sequence
from minillm.inputs import PROMPT_KEYS
from minillm.model_zoo import resolve_model
from minillm.outputs import RequestOutput
from minillm.sampling_params import BeamSearchParams, SamplingParams, describe, is_integer
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer, chat_template_options, template_fields, text_content


def _no_lora(lora_request) -> None:
    if lora_request is not None:
        raise ValueError(f"minillm serves no LoRA adapters: lora_request must be None, got {describe(lora_request)}; "
                         f"merge the adapter into the weights (peft's merge_and_unload) and load that folder")


def _no_priority(priority) -> None:
    # vLLM refuses a priority other than 0 too, unless scheduling_policy="priority", which minillm does not have
    values = priority if isinstance(priority, (list, tuple)) else [priority]
    if priority is not None and not all(is_integer(v) and v == 0 for v in values):
        raise ValueError(f"minillm schedules first come, first served (vLLM's default scheduling_policy 'fcfs'): "
                         f"priority must be None, 0 or a list of 0s, got {describe(priority)}")


def in_words_given(message: str, names: dict[str, str]) -> str:
    """An engine error with EngineConfig's field names replaced by the vLLM names the caller gave them under
    (names: field -> vLLM name), so that LLM(block_size=7)'s error says block_size."""
    return re.sub(r"\b(" + "|".join(map(re.escape, names)) + r")\b", lambda m: names[m.group(1)], message)


class LLM:
    """An engine over one model.

    model: an embedded name (smollm2-135m, qwen3-tiny, qwen3-0.6b-random), a local folder with
    config.json + *.safetensors + tokenizer.json, or a hub id where the hub is reachable.
    engine_args: the fields of EngineConfig (max_num_seqs, max_model_len, attention_backend, ...), or
    vLLM's names for three of them (block_size, kv_cache_memory_bytes, num_gpu_blocks_override: VLLM_ALIASES);
    tokenizer: another folder's (or embedded model's) tokenizer, as vLLM's LLM(tokenizer=...).
    """

    def __init__(self, model: str = "smollm2-135m", **engine_args):
        given_as_vllm = {VLLM_ALIASES[a]: a for a in engine_args if a in VLLM_ALIASES}  # errors speak these names
        engine_args = engine_args_from_vllm(engine_args)  # block_size=16 is kvcache_block_size=16
        unknown = set(engine_args) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown engine arguments {sorted(unknown)}; valid ones: "
                             f"{sorted(set(EngineConfig.__dataclass_fields__) - {'model'})}")
        if not isinstance(model, (str, os.PathLike)):
            raise ValueError(f"model must be a name or a folder path (str), got {describe(model)}")
        model = os.fspath(model)
        self.model_path = resolve_model(model)
        if isinstance(engine_args.get("tokenizer"), (str, os.PathLike)):  # a name or a folder, as for the model
            try:
                engine_args["tokenizer"] = resolve_model(os.fspath(engine_args["tokenizer"]))
            except ValueError as e:
                raise ValueError(f"tokenizer: {e}") from None
        try:
            self.engine = LLMEngine(self.model_path, EngineConfig(model=model, **engine_args))
        except ValueError as e:
            if not given_as_vllm:
                raise
            raise ValueError(in_words_given(str(e), given_as_vllm)) from None
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.config
        try:  # read once; a bad generation_config.json is reported now, not at generate
            # model_max_tokens: generation_config.json's max_new_tokens (None without), the server's chat default
            self._default_params, self.model_max_tokens = self._read_default_params()
        except ValueError:
            self.engine.shutdown()
            raise

    # ---- inputs ------------------------------------------------------------------------------
    def _need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path!r} has no tokenizer.json: give prompts as lists of token ids")
        return self.tokenizer

    def get_tokenizer(self) -> Tokenizer:
        """The tokenizer generate, chat and stream use (vLLM's LLM.get_tokenizer, there a transformers
        tokenizer): tokenizer(text) -> {"input_ids", "attention_mask"}, encode, decode, batch_decode,
        apply_chat_template (tokenize=True: ids), convert_tokens_to_ids, convert_ids_to_tokens, tokenize,
        get_vocab, len(), vocab_size (without added tokens), the special tokens and their ids, special_tokens_map,
        all_special_tokens/ids, as transformers' tokenizer of the same folder gives them."""
        return self._need_tokenizer()

    @staticmethod
    def _unwrap(prompt):
        """vLLM's prompt dicts, {"prompt": text} (TextPrompt) or {"prompt_token_ids": ids} (TokensPrompt)
        -> the text or the ids; any other prompt as it is."""
        if not isinstance(prompt, dict):
            return prompt
        keys = set(prompt)
        if keys & {"role", "content"}:
            raise ValueError(f"a prompt dict with keys {sorted(keys)} is a chat message: pass conversations to "
                             f"llm.chat(messages)")
        if len(keys) != 1 or not keys <= set(PROMPT_KEYS):
            raise ValueError(f"a prompt dict must hold exactly one of {list(PROMPT_KEYS)} (vLLM's TextPrompt or "
                             f"TokensPrompt); got keys {sorted(keys)}")
        key = keys.pop()
        value = prompt[key]
        if key == "prompt" and not isinstance(value, str):
            raise ValueError(f'{{"prompt": ...}} (a TextPrompt) holds text, got {describe(value)}; token ids go '
                             f'in {{"prompt_token_ids": [...]}}')
        if key == "prompt_token_ids" and (isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__")):
            raise ValueError(f'{{"prompt_token_ids": ...}} (a TokensPrompt) holds a list of token ids, got '
                             f'{describe(value)}; text goes in {{"prompt": ...}}')
        return value

    def _prompt_ids(self, prompt):
        """Text -> token ids (checked); any other prompt is passed on for the engine to check."""
        prompt = self._unwrap(prompt)
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty: give a non-empty string or list of token ids")
            return self._need_tokenizer().encode(prompt)
        return prompt

    @staticmethod
    def _prompt_list(prompts) -> list:
        """-> the prompts as a list (one prompt: a list of one)."""
        if hasattr(prompts, "tolist") and not isinstance(prompts, (list, tuple, str)):
            prompts = prompts.tolist()  # a numpy array or torch tensor: one prompt (1-D) or several (2-D)
        if isinstance(prompts, (str, dict)):
            return [prompts]
        if not isinstance(prompts, (list, tuple)):
            raise ValueError(f"prompts must be a string, a list of token ids, a prompt dict, or a list of those; "
                             f"got {describe(prompts)}")
        if not prompts:
            raise ValueError("no prompts given")
        if is_integer(prompts[0]) or isinstance(prompts[0], bool):  # token ids: one prompt
            return [prompts]
        return list(prompts)

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate, chat and stream sample with when given no SamplingParams: with
        generation_config="auto" (the default, as in vLLM) the temperature, top_p, top_k, min_p,
        repetition_penalty and max_new_tokens (as max_tokens) of the model's generation_config.json,
        SamplingParams' own defaults for the rest; with "vllm", SamplingParams(). A copy: yours to change."""
        return dataclasses.replace(self._default_params)

    def _read_default_params(self) -> tuple[SamplingParams, int | None]:
        if self.config.generation_config == "vllm":
            return SamplingParams(), None
        try:
            defaults = generation_defaults(self.model_path)
            return SamplingParams(**defaults), defaults.get("max_tokens")
        except ValueError as e:
            raise ValueError(f"{os.path.join(self.model_path, 'generation_config.json')}: {e}; fix the file, or "
                             f"create the LLM with generation_config='vllm' to ignore it") from None

    def _params_list(self, params, n: int) -> list[SamplingParams]:
        params = self.get_default_sampling_params() if params is None else params
        if isinstance(params, SamplingParams):
            return [params] * n
        if isinstance(params, BeamSearchParams):
            raise ValueError("BeamSearchParams go to llm.beam_search(prompts, params); generate takes SamplingParams")
        if not isinstance(params, (list, tuple)):
            raise ValueError(f"sampling_params must be a SamplingParams, a list of them (one per prompt) or None; "
                             f"got {describe(params)}")
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; give one, or one per prompt")
        return list(params)

    def _add(self, prompts: list, sampling_params) -> list[Sequence]:
        """Check every prompt and every SamplingParams, then queue them all (or nothing, on an error)."""
        ids = []
        for i, p in enumerate(prompts):
            try:
                ids.append(self._prompt_ids(p))
            except ValueError as e:
                raise (ValueError(f"prompt {i}: {e}") if len(prompts) > 1 else e) from None
        return self.engine.add_requests(ids, self._params_list(sampling_params, len(ids)))

    def _conversations(self, messages) -> list:
        """-> a list of conversations (one conversation: a list of one)."""
        if isinstance(messages, (list, tuple)) and messages and isinstance(messages[0], dict):
            return [messages]
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError(f"messages must be a conversation [{{'role': ..., 'content': ...}}, ...] or a "
                             f"non-empty list of them; got {describe(messages)}")
        return list(messages)

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True, lora_request=None,
                 priority=None) -> list[RequestOutput]:
        """prompts: a string, a list of token ids, a prompt dict ({"prompt": text} or {"prompt_token_ids":
        ids}, vLLM's TextPrompt / TokensPrompt), or a list of those; sampling_params: one or one per prompt.
        -> one RequestOutput per prompt, in input order (a list, also for one prompt, as vLLM's):
        out.outputs[i] is sample i (SamplingParams.n) with .text, .token_ids, .finish_reason ("stop",
        "length", or "abort" when an error elsewhere ended it early), .logprobs (minillm.outputs).
        lora_request: vLLM's; minillm has no LoRA adapters, so only None (what vLLM code passes without one).
        priority: vLLM's; minillm schedules first come, first served, so only None or 0 (one per prompt)."""
        _no_lora(lora_request)
        _no_priority(priority)
        return self._generate(self._prompt_list(prompts), sampling_params, use_tqdm)

    def _generate(self, prompts: list, sampling_params, use_tqdm: bool,
                  texts: list[str] | None = None) -> list[RequestOutput]:
        """generate's work; texts: each prompt's text for RequestOutput.prompt (chat: the rendered
        template, its prompts being token ids), else a prompt given as text."""
        seqs = self._add(prompts, sampling_params)
        engine = self.engine
        bar = tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm, dynamic_ncols=True)
        outputs: list[RequestOutput | None] = [None] * len(seqs)
        try:
            t0, p0, d0 = time.perf_counter(), engine.num_prefill_tokens, engine.num_decode_tokens
            unfinished = list(enumerate(seqs))
            while unfinished:
                engine.step()
                still = []
                for i, s in unfinished:
                    if not all(x.is_finished for x in s.samples):
                        still.append((i, s))
                    else:  # detokenized now, while the device runs the step just launched, not all at the end
                        text = texts[i] if texts is not None else self._unwrap(prompts[i])
                        outputs[i] = engine.request_output(s, text if isinstance(text, str) else None)
                done, unfinished = len(unfinished) - len(still), still
                if done:
                    dt = time.perf_counter() - t0
                    bar.set_postfix(prefill=f"{(engine.num_prefill_tokens - p0) / dt:.0f}tok/s",
                                    decode=f"{(engine.num_decode_tokens - d0) / dt:.0f}tok/s")
                    bar.update(done)
        except BaseException:
            # an error or an interrupt inside a step leaves that step half done: end every request
            engine.abort_all()
            raise
        finally:
            bar.close()
        return outputs

    def beam_search(self, prompts, params: BeamSearchParams, lora_request=None, use_tqdm: bool = False,
                    concurrency_limit: int | None = None) -> list[BeamSearchOutput]:
        """Beam search, as vLLM's LLM.beam_search (minillm.beam_search: one generate call a step, the
        prefix cache sharing the beams' blocks). prompts: as generate's; params: a BeamSearchParams;
        concurrency_limit: search at most this many prompts at once (vLLM's; None: all together);
        lora_request: vLLM's, None only (no LoRA adapters).
        -> one BeamSearchOutput per prompt: .sequences, the beam_width best, each with .tokens (the prompt's
        included), .cum_logprob, .logprobs, .finish_reason and .text, the whole sequence decoded with its
        special tokens (as vLLM's), a final EOS left out unless include_stop_str_in_output."""
        _no_lora(lora_request)
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"params must be a BeamSearchParams(beam_width=..., max_tokens=...), got "
                             f"{describe(params)}")
        if concurrency_limit is not None and not (is_integer(concurrency_limit) and concurrency_limit >= 1):
            raise ValueError(f"concurrency_limit must be an integer >= 1 (prompts searched at once) or None (all), "
                             f"got {describe(concurrency_limit)}")
        prompts = self._prompt_list(prompts)
        ids = []
        for i, p in enumerate(prompts):
            tokens = self.engine.checks.check_prompt(self._prompt_ids(p))
            if len(tokens) + params.max_tokens > self.config.max_model_len:
                raise ValueError(f"prompt {i} has {len(tokens)} tokens and max_tokens is {params.max_tokens}: "
                                 f"together more than max_model_len {self.config.max_model_len}; lower max_tokens "
                                 f"or raise max_model_len")
            ids.append(tokens)
        limit = concurrency_limit or len(ids)
        outputs = [out for start in range(0, len(ids), limit)
                   for out in beam_search(lambda batch, step: self._generate(batch, step, use_tqdm=False),
                                          ids[start:start + limit], params, self.engine.eos_token_ids, use_tqdm)]
        if self.tokenizer is not None:
            for beam in (b for out in outputs for b in out.sequences):
                keep = len(beam.tokens) - (beam.finish_reason == "stop" and not params.include_stop_str_in_output)
                beam.text = self.tokenizer.decode(beam.tokens[:keep], skip_special_tokens=False)
        return outputs

    def chat(self, messages, sampling_params=None, use_tqdm: bool = False, chat_template: str | None = None,
             chat_template_kwargs: dict | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict] | None = None, lora_request=None):
        """messages: one conversation [{"role", "content"}, ...] or a list of them -> one RequestOutput
        per conversation (a list, also for one, as vLLM's), its prompt the rendered template's text.
        A content is a string or OpenAI's list of text parts [{"type": "text", "text": ...}] (joined).
        The template options are transformers' and vLLM's: chat_template (a Jinja string) replaces the
        model's; chat_template_kwargs go to the template (Qwen3: {"enable_thinking": False});
        continue_final_message continues the last message instead of opening a new assistant turn
        (then add_generation_prompt=False); tools: JSON-schema tool definitions for the template."""
        _no_lora(lora_request)
        convs = self._conversations(messages)
        self._need_tokenizer()
        options = chat_template_options(chat_template, chat_template_kwargs, add_generation_prompt,
                                        continue_final_message, tools)
        texts, prompts = [], []
        for i, conv in enumerate(convs):
            try:
                text, ids = self._render_chat(conv, **options)
            except ValueError as e:
                raise (ValueError(f"conversation {i}: {e}") if len(convs) > 1 else e) from None
            texts.append(text)
            prompts.append(ids)
        return self._generate(prompts, sampling_params, use_tqdm, texts)  # prompt: the rendered text, as vLLM's

    def _render_chat(self, conversation, **template_options) -> tuple[str, list[int]]:
        """One conversation -> (the prompt text its chat template renders, that text's token ids). A
        message's content may be a string or OpenAI's list of text parts, as the server takes it."""
        tok = self._need_tokenizer()
        if isinstance(conversation, (list, tuple)):
            conversation = [self._template_message(m, i) for i, m in enumerate(conversation)]
        text = tok.apply_chat_template(conversation, **template_options)
        return text, tok.encode(text, add_special_tokens=False)  # the template wrote every special token

    @staticmethod
    def _template_message(m, i: int):
        """messages[i] as vLLM's LLM.chat hands it to the template: a list of text parts joined, an assistant's
        null content "" (a tool call's message has none), and tokenizer.template_fields' tool calls (their
        JSON arguments parsed) and reasoning; anything else is left for apply_chat_template to check."""
        if not (isinstance(m, dict) and isinstance(m.get("role"), str)):
            return m
        if "content" not in m and m["role"] != "assistant":
            return m
        content = m.get("content")
        if content is None and m["role"] == "assistant":
            content = ""
        elif isinstance(content, list):
            content = text_content(content, f"messages[{i}]['content']")
        # tool_calls only as template_fields gives them (parsed; an empty list dropped, as vLLM drops it)
        kept = {k: v for k, v in m.items() if k != "tool_calls"}
        return {**kept, "content": content, **template_fields(m, f"messages[{i}]")}

    def stream(self, prompt, sampling_params: SamplingParams | None = None) -> "RequestStream":
        """Queue one request (prompt: text, token ids, or a conversation) and return an iterator over its
        text as it is generated: `for delta in llm.stream(...)`. The deltas join to exactly the text
        generate() returns (stop strings are held back until they are ruled out). Closing the stream,
        or dropping it unfinished, aborts its request and nothing else."""
        if sampling_params is not None and not isinstance(sampling_params, SamplingParams):
            raise ValueError(f"sampling_params must be a SamplingParams or None, got {describe(sampling_params)}")
        if sampling_params is not None and sampling_params.n != 1:
            raise ValueError(f"stream() streams one sample; got SamplingParams.n={sampling_params.n}: "
                             f"use generate() for several")
        tok = self._need_tokenizer()
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], dict):  # a conversation
            text, ids = self._render_chat(prompt)
        else:
            prompt = self._unwrap(prompt)
            text, ids = (prompt if isinstance(prompt, str) else None), self._prompt_ids(prompt)
        seq = self.engine.add_request(ids, sampling_params or self.get_default_sampling_params())
        return RequestStream(self.engine, seq, tok, text)

    def reset_prefix_cache(self) -> bool:
        """Empty the prefix cache, as vLLM's LLM.reset_prefix_cache: the next prompts find no cached
        blocks (a cold-cache benchmark run, or after the weights changed) -> True. False, with a warning and
        nothing changed, while unfinished requests (streams) hold blocks."""
        if self.engine.reset_prefix_cache():
            return True
        warnings.warn("reset_prefix_cache: requests still hold KV-cache blocks; finish or close them first")
        return False

    def shutdown(self) -> None:
        """Free everything the engine holds on the device (weights, KV cache, CUDA graphs) and stop its
        tensor-parallel workers. Idempotent. `with LLM(...) as llm:` calls it when the block ends; an
        LLM dropped without it is freed the same way by the garbage collector."""
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class RequestStream:
    """The text of one queued request as it is generated: an iterator of str deltas.

    Each `next()` runs engine steps (advancing every queued request, not only this one) until this
    request has new text, and ends when the request is finished. `output` then holds its result
    (as generate returns it). `close()`, or dropping the stream unfinished (garbage collection),
    aborts this request only; an error or an interrupt inside a step aborts every request, and a
    stream whose request was aborted ends (its output's finish_reason is "abort").
    `output` is a RequestOutput, as generate returns for the prompt.
    """

    def __init__(self, engine: LLMEngine, seq: Sequence, tokenizer: Tokenizer, prompt: str | None = None):
        self.engine, self.seq, self.prompt = engine, seq, prompt
        self.output: RequestOutput | None = None
        self._text = TextDeltas(seq, tokenizer)
        self._closed = False

    def __iter__(self) -> "RequestStream":
        return self

    def __next__(self) -> str:
        while not self._closed and self.output is None:
            if not self.seq.is_finished:
                try:
                    self.engine.step()
                except BaseException:
                    self.engine.abort_all()  # a step half done: end every request (see generate)
                    raise
            delta = self._delta()
            if delta:
                return delta
        raise StopIteration

    def _delta(self) -> str:
        """The text not yet yielded (sets `output` when the request has finished)."""
        _, delta = self._text.advance(self.engine)
        if self.seq.is_finished:
            self.output = self.engine.request_output(self.seq, self.prompt)
        return delta

    def close(self) -> None:
        """Stop streaming; an unfinished request is aborted (only this one)."""
        if not self._closed:
            self._closed = True
            if not self.seq.is_finished:
                self.engine.abort(self.seq)

    def __enter__(self) -> "RequestStream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 -- at interpreter exit the engine may be half torn down
            pass


class TextDeltas:
    """One sample's tokens and text as they are generated, for streaming: each advance() returns what
    is new since the last. Stop strings are held back until ruled out, so the deltas join to exactly
    the text generate() returns; once the sample is finished the last delta completes that text.
    (llm.stream and the server's AsyncLLM both stream through it.)"""

    def __init__(self, seq: Sequence, tokenizer: Tokenizer | None):
        self.seq = seq
        # token ids only without a tokenizer or with detokenize=False; special tokens as the final text has them
        text = tokenizer is not None and seq.params.detokenize
        self.detok = IncrementalDetokenizer(tokenizer, seq.params.skip_special_tokens) if text else None
        self.num_read = 0  # completion tokens read (given to the detokenizer)
        self.num_sent = 0  # characters returned
        # a stop string may be starting in the newest characters: hold that many back until it is not
        self.hold = max((len(s) for s in seq.params.stop), default=1) - 1
        self.stop_start: int | None = None  # LLMEngine.stop_text_start, once known (it never changes)

    def advance(self, engine: LLMEngine) -> tuple[list[int], str]:
        """-> (the completion token ids read back since the last call, the text not yet returned)."""
        seq = self.seq
        # read before the tokens: another thread's step writes a stop token, then finishes its sequence
        finished = seq.is_finished
        new = seq.resolved_completion(self.num_read)  # only the new tokens: no copy of the whole completion
        if new and not finished and engine.is_stop_token(seq.params, new[-1]):
            new = new[:-1]  # its sequence is being finished: its text may not show (completion()); next call
        self.num_read += len(new)
        if finished:
            text = engine.completion(seq).text  # exactly generate()'s text
            end = len(text)
        elif self.detok is None:  # token ids only
            text, end = "", 0
        else:
            if new:
                self.detok.add(new)
            text = self.detok.text
            cut = None
            if seq.params.stop:
                if self.stop_start is None:
                    self.stop_start = engine.stop_text_start(seq.params, self.detok.ids)
                if self.stop_start is not None:
                    cut = seq.params.cut_at_stop(text, self.stop_start)
            end = len(cut) if cut is not None else max(0, len(text) - self.hold)
        # only the new characters are sliced: a copy of the whole text per token would grow with it
        delta = text[self.num_sent:end]
        self.num_sent += len(delta)
        return new, delta
