"""Test-only haloattn backend package."""
