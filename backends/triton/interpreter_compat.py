"""Lets Triton's CPU interpreter run loops whose bounds are computed inside a kernel.

The interpreter (Triton 3.6) stores scalars as 1-element NumPy arrays and converts them with
``int(array)``, which NumPy >= 2.4 refuses for arrays that are not 0-dimensional; every
``for j in range(0, n)`` with an in-kernel ``n`` then fails. This wraps the interpreter's tensor
patch so ``__index__`` takes the single element instead. It changes nothing on GPUs.
"""

import functools


def install() -> None:
    from triton.runtime import interpreter

    original = interpreter._patch_lang_tensor
    if getattr(original, "_haloattn_compat", False):
        return

    @functools.wraps(original)
    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._haloattn_compat = True
    interpreter._patch_lang_tensor = patched
