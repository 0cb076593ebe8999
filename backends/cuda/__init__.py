"""Compiled CUDA/CUTLASS backend (``cuda``): Python side of the ``haloattn_cuda._C`` module."""
