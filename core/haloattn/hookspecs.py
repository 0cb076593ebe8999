"""The plugin contract, read as documentation.

A backend package exposes, under the entry-point group ``haloattn.backends``, a module (or object)
with a ``haloattn_register_backends`` hook implementation::

    # pyproject.toml of the plugin package
    [project.entry-points."haloattn.backends"]
    mybackend = "my_package.haloattn_plugin"

    # my_package/haloattn_plugin.py
    from haloattn import Backend, hookimpl

    class MyBackend(Backend):
        name = "mine"
        priority = 50
        def not_supported_reasons(self, problem): ...
        def forward(self, problem, inputs, config=None): ...
        def backward(self, problem, inputs, out, lse, grad_out, grad_lse, needs_grad, config=None): ...

    @hookimpl
    def haloattn_register_backends(registry):
        registry.add(MyBackend())

Plugins are loaded lazily, on the first call that needs a backend. One that fails to import or to
register is logged and skipped; ``haloattn info`` shows why. ``HALOATTN_DISABLED_PLUGINS`` (a comma
list of entry-point names) keeps named plugins from loading at all.
"""

import pluggy

PROJECT = "haloattn"
ENTRY_POINT_GROUP = "haloattn.backends"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpecs:
    @hookspec
    def haloattn_register_backends(self, registry):
        """Add backends: call ``registry.add(backend)`` once per :class:`haloattn.Backend`
        instance. Names must be unique across all plugins."""
