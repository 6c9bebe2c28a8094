"""Kernels: Triton where it pays on CUDA, each with the torch reference beside it."""
