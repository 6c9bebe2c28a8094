"""Solutions of the minillm course (generated)."""
