"""SamplingParams' temperature floor, as vLLM's SamplingParams has it (vllm/sampling_params.py, _MAX_TEMP = 1e-2):
a temperature in (0, 0.01) is raised to 0.01 with a logged warning; 0 stays greedy."""
from __future__ import annotations

import dataclasses
import logging

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
