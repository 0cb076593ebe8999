"""A plugin module that fails on import."""

raise RuntimeError("toy_broken exploded on import")
