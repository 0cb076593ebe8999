"""Triton backends: fused neighbourhood attention (``triton``) and short-window attention
(``triton_window``), forward and backward."""
