"""Adapters."""
