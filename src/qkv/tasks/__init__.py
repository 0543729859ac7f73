"""The jobs the source text names, each on the core model and the one training loop."""
