"""Prompt sources, self-distillation by the target, datasets and feature caches."""
