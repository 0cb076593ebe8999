"""Drop-in adapters that make third-party models run their attention on haloattn
(``haloattn.integrations.timm.patch_swin``). Each adapter imports its library lazily."""
