"""minillm: a small, fast, vLLM-style LLM inference engine, rebuilt chapter by chapter."""
__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):
    # The engine (and torch) load on first use, not at `import minillm`: `python -m minillm` then
    # starts inside the CLI's error handling, so even Ctrl-C during start-up exits quietly.
    if name == "LLM":
        from minillm.llm import LLM
        return LLM
    if name == "SamplingParams":
        from minillm.sampling_params import SamplingParams
        return SamplingParams
    raise AttributeError(f"module 'minillm' has no attribute {name!r}")
