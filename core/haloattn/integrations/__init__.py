"""Adapters for code written against other libraries: ``timm.patch_swin`` runs timm's Swin window
attention on haloattn, ``natten`` offers NATTEN's functional API (fused and unfused). Each adapter
imports its library lazily, if at all."""
