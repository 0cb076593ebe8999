"""Pure-PyTorch reference backend: every feature of SEMANTICS.md, any device, any floating dtype."""
