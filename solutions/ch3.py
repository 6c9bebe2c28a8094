"""Chapter 3 solutions. GENERATED from minillm/ by `python -m minillm.course.exercises`:
do not edit by hand.

Exercise 3.1: slot_mapping_for  (notebooks/03_paged_kv_cache.ipynb, section '2. Block tables and slot mapping')
"""
from __future__ import annotations

import numpy as np


# ---- Exercise 3.1 (notebooks/03_paged_kv_cache.ipynb, section '2. Block tables and slot mapping'), from minillm.engine.model_runner ----
def slot_mapping_for(block_table: np.ndarray, start: int, end: int, block_size: int) -> np.ndarray:
    """The flat cache slots of token positions start..end-1 of one sequence.

    block_table: [num_blocks] physical block ids of the sequence -> [end - start] int64,
    slot = block_table[pos // block_size] * block_size + pos % block_size.
    """
    pos = np.arange(start, end, dtype=np.int64)
    return block_table[pos // block_size].astype(np.int64) * block_size + pos % block_size
