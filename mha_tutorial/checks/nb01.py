"""Checks for the exercises of notebook 01."""

__all__: list[str] = []
