"""Checks for the exercises of notebook 04."""

__all__: list[str] = []
