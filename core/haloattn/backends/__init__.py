"""haloattn's built-in backends. Their sources live in the repository's top-level backends/ folder
and are installed here; each registers itself through the ``haloattn.backends`` entry-point
group, exactly as a third-party backend package would."""

import sys as _sys
import types as _types


class _CallableModule(_types.ModuleType):
    """Importing this subpackage (plugin loading does) rebinds the attribute ``haloattn.backends``
    from the function :func:`haloattn.api.backends` to this module; calling the module keeps
    ``haloattn.backends()`` working either way."""

    def __call__(self, all: bool = False):
        from ..api import backends

        return backends(all=all)


_sys.modules[__name__].__class__ = _CallableModule
