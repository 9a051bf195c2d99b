"""One training loop (accelerate) and thin entry scripts per method."""
