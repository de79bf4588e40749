"""Evaluation harnesses (LoCoMo evidence recall, reader F1/BLEU-1)."""
