"""minillm: a small, fast, vLLM-style LLM inference engine, rebuilt chapter by chapter."""
from minillm.llm import LLM
from minillm.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]
