"""Checks for the exercises of notebook 02."""

__all__: list[str] = []
