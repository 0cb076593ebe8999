"""haloattn's built-in backends. Their sources live in the repository's top-level backends/ folder
and are installed here; each registers itself through the ``haloattn.backends`` entry-point
group, exactly as a third-party backend package would."""
