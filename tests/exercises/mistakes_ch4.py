"""Chapter 4's known wrong versions (see mistakes.py)."""
from __future__ import annotations

from mistakes import Mistake

MISTAKES: list[Mistake] = []
