"""LLMEngine: requests in, tokens out. One `step()` = schedule -> run the model -> append tokens."""
from __future__ import annotations

import time

from minillm.config import EngineConfig, ModelConfig
from minillm.engine.model_runner import ModelRunner
from minillm.engine.scheduler import Scheduler
from minillm.engine.sequence import Sequence
from minillm.sampling_params import SamplingParams
from minillm.tokenizer import IncrementalDetokenizer, Tokenizer


class LLMEngine:
    def __init__(self, model_path: str, config: EngineConfig):
        self.model_config = ModelConfig.from_folder(model_path)
        config.validate(self.model_config)
        self.config = config
        # a folder without tokenizer.json still runs token-id prompts (text outputs are then "")
        self.tokenizer = Tokenizer(model_path) if Tokenizer.available(model_path) else None
        eos = list(self.model_config.eos_token_id)
        if self.tokenizer and self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.model_runner = self._make_runner(model_path)
        self.scheduler = Scheduler(config, self.model_runner.num_kvcache_blocks)
        self.detokenizers: dict[int, IncrementalDetokenizer] = {}  # requests with stop strings
        self.eos_token_ids = set(eos)
        # async scheduling needs a runner that can launch without waiting (one process)
        self.async_scheduling = config.async_scheduling and config.tensor_parallel_size == 1
        self.pending = None  # the launched step not yet read back
        self.num_prefill_tokens = self.num_decode_tokens = 0
        # wall seconds of step() calls per phase, charged to the batch each call waited for: on a GPU
        # with async scheduling the one it read back (launched the call before), else the one it launched
        self.phase_seconds = {"prefill": 0.0, "decode": 0.0}

    def _make_runner(self, model_path: str):
        if self.config.tensor_parallel_size > 1:
            from minillm.engine.tp import TPModelRunner
            return TPModelRunner(self.config, self.model_config, model_path)
        return ModelRunner(self.config, self.model_config, model_path)

    # ---- requests -----------------------------------------------------------------------------
    def check_prompt(self, token_ids) -> list[int]:
        """Raise ValueError for a prompt the engine cannot run; -> the ids as a list of ints."""
        if not isinstance(token_ids, (list, tuple)) or not token_ids:
            raise ValueError("the prompt is empty: give a non-empty string or list of token ids")
        if not all(isinstance(t, int) for t in token_ids):
            raise ValueError("a token-id prompt must be a list of Python ints")
        vocab = self.model_config.vocab_size
        bad = [t for t in token_ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, {vocab})")
        limit = self.config.max_model_len
        if len(token_ids) >= limit:
            raise ValueError(f"the prompt has {len(token_ids)} tokens but max_model_len is {limit}: the prompt "
                             f"plus at least one generated token must fit; shorten it or raise max_model_len")
        return list(token_ids)

    def add_request(self, token_ids: list[int], params: SamplingParams) -> Sequence:
        seq = Sequence(self.check_prompt(token_ids), params, self.config.kvcache_block_size)
        if params.stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this model folder has no tokenizer.json")
            self.detokenizers[seq.seq_id] = IncrementalDetokenizer(self.tokenizer)
        self.scheduler.add(seq)
        return seq

    def abort_all(self) -> None:
        """Finish every unfinished request (after an error or an interrupt): the engine stays usable."""
        if self.pending is not None:
            try:
                self.model_runner.resolve(self.pending)  # let the device finish what it was given
            finally:
                self.pending = None
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self.scheduler.finish(seq, "abort")
        self.detokenizers.clear()

    # ---- the loop -----------------------------------------------------------------------------
    # A step is launched on the device and its tokens are read back one step later (async
    # scheduling): while the GPU runs step n, the CPU reads step n-1's tokens, finishes requests and
    # schedules step n+1. A launched sequence gets a placeholder token (-1) at once, so lengths,
    # block tables and max_tokens stay exact; only a stop *token* (EOS, stop ids, stop strings) is
    # seen one step late, and the one extra token computed for that request is dropped.
    def step(self) -> tuple[list[Sequence], list[Sequence]]:
        """Launch one batch, then read back the previous one.
        -> (the sequences whose new token was read back now, those of them that finished)."""
        t0 = time.perf_counter()
        finished: list[Sequence] = []
        launched = None
        if not self.scheduler.is_finished():
            seqs, is_prefill = self.scheduler.schedule()
            if not seqs:
                raise RuntimeError("the scheduler found nothing to run although requests are pending; this is a bug")
            prev = self.pending if self.async_scheduling else None
            launched = self.model_runner.launch(seqs, is_prefill, prev)
            if is_prefill:
                self.num_prefill_tokens += sum(s.num_tokens - s.num_cached_tokens for s in seqs)
            else:
                self.num_decode_tokens += len(seqs)
            launched.positions = self._append_placeholders(seqs, finished)
            launched.is_prefill = is_prefill
        if not self.async_scheduling:  # read this step back now
            self.pending, launched = launched, None
        ran = []
        if self.pending is not None:
            ran = self.pending.seqs
            self._fill_tokens(self.pending, self.model_runner.resolve(self.pending), finished)
        waited = self.pending if self.async_scheduling and self.model_runner.device.type == "cuda" else launched
        if waited is not None:
            self.phase_seconds["prefill" if waited.is_prefill else "decode"] += time.perf_counter() - t0
        self.pending = launched
        return ran, finished

    def _append_placeholders(self, seqs: list[Sequence], finished: list[Sequence]) -> list[int]:
        """Give every launched sequence a placeholder for its coming token; finish those that reach
        max_tokens or max_model_len with it. -> the placeholders' positions."""
        positions = []
        for seq in seqs:
            positions.append(seq.num_tokens)
            seq.append_token(-1)
            if seq.num_completion_tokens >= seq.params.max_tokens or seq.num_tokens >= self.config.max_model_len:
                self.scheduler.finish(seq, "length")
                finished.append(seq)
        return positions

    def _fill_tokens(self, pending, token_ids: list[int], finished: list[Sequence]) -> None:
        """Write a read-back step's tokens over their placeholders; stop at stop tokens and stop strings."""
        for seq, pos, tok in zip(pending.seqs, pending.positions, token_ids):
            if pos >= seq.num_tokens or seq.token_ids[pos] != -1:
                continue  # the request already stopped before this token: drop it
            seq.token_ids[pos] = tok
            p = seq.params
            stop = (not p.ignore_eos and tok in self.eos_token_ids) or tok in p.stop_token_ids
            detok = self.detokenizers.get(seq.seq_id)
            if detok is not None and not stop:
                detok.add([tok])
                stop = any(s in detok.text for s in p.stop)
            if stop:
                del seq.token_ids[pos + 1:]  # a placeholder launched after this token is void
                if not seq.is_finished:
                    finished.append(seq)
                seq.finish_reason = "stop"
                if not seq.is_finished:
                    self.scheduler.finish(seq, "stop")

    def is_finished(self) -> bool:
        return self.scheduler.is_finished() and self.pending is None

    def output(self, seq: Sequence) -> dict:
        """The result of a finished request: text, token_ids, finish_reason."""
        text = self.tokenizer.decode(seq.completion_token_ids) if self.tokenizer else ""
        detok = self.detokenizers.pop(seq.seq_id, None)
        if detok is not None:
            cut = [text.find(s) for s in seq.params.stop if s in text]
            if cut:
                text = text[:min(cut)]
        return {"text": text, "token_ids": seq.completion_token_ids, "finish_reason": seq.finish_reason}

    def shutdown(self) -> None:
        close = getattr(self.model_runner, "shutdown", None)
        if close:
            close()
