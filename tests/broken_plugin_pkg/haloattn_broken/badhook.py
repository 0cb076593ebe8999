"""A plugin that imports fine but whose registration hook raises."""

from haloattn import hookimpl


@hookimpl
def haloattn_register_backends(registry):
    raise RuntimeError("toy_badhook failed while registering")
