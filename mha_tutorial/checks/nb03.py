"""Checks for the exercises of notebook 03."""

__all__: list[str] = []
