"""Peers: models written the plain way from PyTorch modules, for benchmarks to compare against."""
