"""Kernels: Triton where it pays on CUDA, each with the torch reference beside it.

On a machine without CUDA, Triton kernels run in Triton's interpreter (TRITON_INTERPRET=1) on CPU
tensors. The variable must be set before any @triton.jit function is defined, so it is set here,
when this package is first imported, unless the user chose a value.
"""
import os

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
