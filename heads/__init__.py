"""Draft heads: Medusa heads and EAGLE feature drafters. Torch modules only; no training loops."""
