"""Turn external datasets and files into events."""
