"""The vLLM-shaped front door: LLM(model, **engine_args).generate / chat / stream."""
from __future__ import annotations

import time
from typing import Iterator

from tqdm.auto import tqdm

from minillm.config import EngineConfig
from minillm.engine.llm_engine import LLMEngine
from minillm.model_zoo import resolve_model
from minillm.sampling_params import SamplingParams
from minillm.tokenizer import IncrementalDetokenizer


class LLM:
    """An engine over one model.

    model: an embedded name (smollm2-135m, qwen3-tiny, qwen3-0.6b-random), a local folder with
    config.json + *.safetensors + tokenizer.json, or a hub id where the hub is reachable.
    engine_args: the fields of EngineConfig (max_num_seqs, max_model_len, attention_backend, ...).
    """

    def __init__(self, model: str = "smollm2-135m", **engine_args):
        unknown = set(engine_args) - set(EngineConfig.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown engine arguments {sorted(unknown)}; valid ones: "
                             f"{sorted(set(EngineConfig.__dataclass_fields__) - {'model'})}")
        self.model_path = resolve_model(model)
        self.engine = LLMEngine(self.model_path, EngineConfig(model=model, **engine_args))
        self.tokenizer = self.engine.tokenizer
        self.config = self.engine.config

    # ---- inputs ------------------------------------------------------------------------------
    def _need_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError(f"{self.model_path!r} has no tokenizer.json: give prompts as lists of token ids")
        return self.tokenizer

    def _prompt_ids(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty: give a non-empty string or list of token ids")
            self._need_tokenizer()
            return self.engine.check_prompt(self.tokenizer.encode(prompt))
        return self.engine.check_prompt(prompt)

    @staticmethod
    def _params_list(params, n: int) -> list[SamplingParams]:
        params = SamplingParams() if params is None else params
        if isinstance(params, SamplingParams):
            return [params] * n
        if len(params) != n:
            raise ValueError(f"got {len(params)} SamplingParams for {n} prompts; give one, or one per prompt")
        return list(params)

    # ---- generation --------------------------------------------------------------------------
    def generate(self, prompts, sampling_params=None, use_tqdm: bool = True) -> list[dict]:
        """prompts: a string, a list of token ids, or a list of either; sampling_params: one or one per prompt.
        -> one dict per prompt, in input order: {"text", "token_ids", "finish_reason"}."""
        single = isinstance(prompts, str) or (isinstance(prompts, list) and prompts and isinstance(prompts[0], int))
        prompts = [prompts] if single else list(prompts)
        if not prompts:
            raise ValueError("no prompts given")
        ids = [self._prompt_ids(p) for p in prompts]  # every check before any work
        params = self._params_list(sampling_params, len(ids))
        engine = self.engine
        seqs = [engine.add_request(p, sp) for p, sp in zip(ids, params)]
        bar = tqdm(total=len(seqs), desc="Generating", disable=not use_tqdm, dynamic_ncols=True)
        try:
            t0, p0, d0 = time.perf_counter(), engine.num_prefill_tokens, engine.num_decode_tokens
            while not engine.is_finished():
                _, finished = engine.step()
                if finished:
                    dt = time.perf_counter() - t0
                    bar.set_postfix(prefill=f"{(engine.num_prefill_tokens - p0) / dt:.0f}tok/s",
                                    decode=f"{(engine.num_decode_tokens - d0) / dt:.0f}tok/s")
                    bar.update(len(finished))
        except BaseException:
            engine.abort_all()  # nothing half-done is left behind: the engine stays usable
            raise
        finally:
            bar.close()
        outputs = [engine.output(s) for s in seqs]
        return outputs[0] if single else outputs

    def chat(self, messages, sampling_params=None, use_tqdm: bool = False):
        """messages: one conversation [{"role", "content"}, ...] or a list of them -> one dict or a list."""
        single = isinstance(messages, list) and messages and isinstance(messages[0], dict)
        convs = [messages] if single else list(messages)
        prompts = [self._need_tokenizer().encode_chat(c) for c in convs]
        outputs = self.generate(prompts, sampling_params, use_tqdm=use_tqdm)
        return outputs[0] if single else outputs

    def stream(self, prompt, sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one request as it is generated (prompt: text, token ids, or a conversation)."""
        tok = self._need_tokenizer()
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
            prompt = tok.encode_chat(prompt)
        seq = self.engine.add_request(self._prompt_ids(prompt), sampling_params or SamplingParams())
        detok = IncrementalDetokenizer(tok)
        emitted = 0
        try:
            while True:
                self.engine.step()
                new = seq.resolved_completion()[emitted:]
                emitted += len(new)
                delta = detok.add(new) if new else ""
                if delta:
                    yield delta
                if seq.is_finished and -1 not in seq.token_ids:
                    break
            self.last_output = self.engine.output(seq)
            tail = detok.flush()
            if tail:
                yield tail
        except BaseException:
            self.engine.abort_all()
            raise

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
