"""minillm: a small, fast, vLLM-style LLM inference engine, rebuilt chapter by chapter."""
__all__ = ["LLM", "SamplingParams", "RequestOutputKind"]


def __getattr__(name: str):
    # The engine (and torch) load on first use, not at `import minillm`: `python -m minillm` then
    # starts inside the CLI's error handling, so even Ctrl-C during start-up exits quietly.
    if name == "LLM":
        from minillm.llm import LLM
        return LLM
    if name in ("SamplingParams", "RequestOutputKind"):
        from minillm import sampling_params
        return getattr(sampling_params, name)
    raise AttributeError(f"module 'minillm' has no attribute {name!r}")
