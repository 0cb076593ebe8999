"""FlexAttention backend (``flex``): score_mod/mask_mod problems on CUDA through torch's compiled
FlexAttention, with haloattn's pattern as exact lookup tables and a tiled token order."""
