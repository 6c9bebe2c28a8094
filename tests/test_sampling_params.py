"""SamplingParams' temperature floor, as vLLM's SamplingParams has it (vllm/sampling_params.py, _MAX_TEMP = 1e-2):
a temperature in (0, 0.01) is raised to 0.01 with a logged warning; 0 stays greedy."""
from __future__ import annotations

import dataclasses
import logging
import re

import numpy as np
import pytest

from helpers import one_torch_thread, ref_path, small_engine_args  # noqa: F401 (one_torch_thread: an autouse fixture)
from minillm import LLM, SamplingParams
from minillm.sampling_params import MIN_TEMPERATURE

LOGGER = "minillm.sampling_params"
PROMPTS = [[1, 2, 3, 4], [7, 8, 9, 10, 11, 12]]  # token ids of tiny-qwen3 (vocabulary 512)


@pytest.mark.parametrize("given, kept", [(0, 0.0), (0.0, 0.0), (1e-6, 0.01), (0.005, 0.01), (np.float32(1e-6), 0.01),
                                         (0.01, 0.01), (0.5, 0.5), (1.0, 1.0), (2, 2.0)])
def test_a_temperature_below_001_is_raised_to_it_and_0_stays_greedy(caplog, given, kept):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        params = SamplingParams(temperature=given)
    assert params.temperature == kept and type(params.temperature) is float
    raised = 0 < given < MIN_TEMPERATURE
    warnings = [r for r in caplog.records if r.name == LOGGER]
    assert len(warnings) == raised
    if raised:
        assert warnings[0].levelno == logging.WARNING
        assert f"temperature {given!s} is below 0.01" in warnings[0].getMessage()
        assert "raised to 0.01" in warnings[0].getMessage()


def test_a_copy_of_raised_params_warns_no_more_and_a_later_change_is_raised_too(caplog):
    """The engine checks a copy of each request's params (dataclasses.replace): one warning for the
    object, none for its copies; a temperature set after the object was made is raised in the copy."""
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        params = SamplingParams(temperature=1e-6)
        copy = dataclasses.replace(params)
        assert len(caplog.records) == 1 and copy.temperature == 0.01
        params.temperature = 1e-4
        assert dataclasses.replace(params).temperature == 0.01 and len(caplog.records) == 2


def test_negative_and_non_finite_temperatures_are_still_refused():
    for bad in (-1e-6, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="SamplingParams.temperature must be a finite number >= 0"):
            SamplingParams(temperature=bad)


@pytest.fixture(scope="module")
def llm():
    engine = LLM(ref_path("tiny-qwen3"), logprobs_mode="processed_logprobs", **small_engine_args())
    yield engine
    engine.shutdown()


def test_generate_at_1e_6_is_generate_at_001(llm):
    """Same seed, same tokens and the same processed logprobs: logits / 0.01 (the rank-3 token reads about -75
    in tiny-qwen3), not logits / 1e-6 (about -7.5e6). A temperature set on the params after they were made
    is raised as well."""
    def run(temperature: float) -> list:
        params = SamplingParams(temperature=0.5, seed=0, max_tokens=8, ignore_eos=True, logprobs=3)
        params.temperature = temperature  # past __post_init__: the engine's own check raises it
        return [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]

    tiny, floor = run(1e-6), run(MIN_TEMPERATURE)
    assert [o.token_ids for o in tiny] == [o.token_ids for o in floor]
    assert [o.logprobs for o in tiny] == [o.logprobs for o in floor]
    lowest = min(lp.logprob for o in tiny for position in o.logprobs for lp in position.values())
    assert -1e3 < lowest < -10  # logits / 0.01: far apart, yet finite and not blown up


@pytest.mark.parametrize("args", [(2,), (0.5, 0.9)])
def test_positional_arguments_are_refused(args):
    """vLLM's first field is n, minillm's temperature: SamplingParams(2) would mean n=2 there, so it is an
    error here, not temperature=2.0."""
    with pytest.raises(TypeError, match="keyword arguments only"):
        SamplingParams(*args)


def test_clone_is_a_deep_copy_with_equal_fields():
    params = SamplingParams(temperature=0.5, stop=["\n"], stop_token_ids=[7], logit_bias={3: 1.0}, bad_words=["x"],
                            allowed_token_ids=[1, 2], seed=4)
    copy = params.clone()
    assert type(copy) is SamplingParams and copy is not params and copy == params
    copy.stop.append("END")
    copy.stop_token_ids.append(8)
    copy.logit_bias[5] = -1.0
    copy.bad_words.append("y")
    copy.allowed_token_ids.append(3)
    assert (params.stop, params.stop_token_ids, params.logit_bias, params.bad_words, params.allowed_token_ids) == \
        (["\n"], [7], {3: 1.0}, ["x"], [1, 2])


def test_priority_0_or_none_is_accepted_and_any_other_refused(llm):
    want = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False)
    for priority in (None, 0, [0, 0]):
        got = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False, priority=priority)
        assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]
    for bad in (1, -1, [0, 2], 0.0, True, "0"):
        with pytest.raises(ValueError, match="first come, first served.*priority must be None, 0 or a list of 0s"):
            llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=3), use_tqdm=False, priority=bad)
    sched = llm.engine.scheduler
    assert not sched.waiting and not sched.running


@pytest.mark.parametrize("stop, where", [("a\ud800", "SamplingParams.stop"), (["ok", "\udc80x"], "SamplingParams.stop[1]")])
def test_a_stop_string_that_is_not_valid_unicode_is_refused(stop, where):
    """A lone surrogate (invalid UTF-8 decoded with surrogateescape) could never match the decoded text:
    refused as the tokenizer refuses it in a prompt, offline as on the server."""
    with pytest.raises(ValueError, match=rf"^{re.escape(where)} is not valid Unicode: it holds a lone surrogate"):
        SamplingParams(stop=stop)
