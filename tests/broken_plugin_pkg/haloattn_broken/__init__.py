"""Test-only broken haloattn backend plugins."""
