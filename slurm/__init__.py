"""Batch script templates; installed as the package data `launcher.templates`."""
