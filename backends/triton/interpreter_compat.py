"""Makes Triton's CPU interpreter (``TRITON_INTERPRET=1``, used by the CPU tests) robust.

Two problems of Triton 3.6's interpreter are worked around; nothing here runs on GPUs.

* Whether ``@triton.jit`` builds an interpreted function is decided when the function is
  defined. ``triton.language`` (``tl.cdiv``, ``tl.max``, ``tl.sum``...) is usually imported long
  before a test switches the interpreter on, so its helpers are compiled-mode ``JITFunction``\\ s
  that refuse to be called. ``kernel()`` interprets a compiled-mode kernel, and ``install()`` lets
  compiled-mode device functions be called from interpreted code.
* The interpreter stores scalars as 1-element NumPy arrays and converts them with
  ``int(array)``, which NumPy >= 2.4 refuses for arrays that are not 0-dimensional; every
  ``for j in range(0, n)`` with an in-kernel ``n`` then fails. ``__index__`` takes the element.
"""

import functools

_interpreted = {}


def _as_interpreted(fn):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if not isinstance(fn, JITFunction):
        return fn
    # Keyed by id: hashing a JITFunction computes its compile cache key, which fails mid-interpretation.
    key = id(fn)
    if key not in _interpreted:
        _interpreted[key] = (fn, InterpretedFunction(fn.fn))
    return _interpreted[key][1]


def install() -> None:
    from triton.runtime import interpreter
    from triton.runtime.jit import JITFunction

    original = interpreter._patch_lang_tensor
    if getattr(original, "_haloattn_compat", False):
        return

    @functools.wraps(original)
    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._haloattn_compat = True
    interpreter._patch_lang_tensor = patched
    JITFunction.__call__ = lambda self, *args, **kwargs: _as_interpreted(self)(*args, **kwargs)


def kernel(fn):
    """``fn`` ready to launch in the interpreter (installing the workarounds first)."""
    install()
    return _as_interpreted(fn)
