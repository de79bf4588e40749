"""Adapters that implement the ports in schemas/ports, one module per backend, plus the
registry that picks them from URLs and the settings that configure them. Adapters never import
each other."""
