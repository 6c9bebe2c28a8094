"""Exercises of the minillm course (generated)."""
