"""Course tooling beside the engine (never imported by it): the exercise generator and grading
switch, the slide builder, and the helpers only the notebooks, exercises and tests use (chapter 1's
runtime_v0, ranks.run_on_ranks, tp_tools for a tensor-parallel engine). Timers live in minillm.timing."""
