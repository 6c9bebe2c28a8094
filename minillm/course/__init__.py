"""Course tooling beside the engine (never imported by it): the exercise generator and grading
switch, timing and roofline helpers for the notebooks, and the slide builder."""
