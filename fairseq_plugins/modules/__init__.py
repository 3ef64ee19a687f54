"""Reusable layers shared by the model families."""
