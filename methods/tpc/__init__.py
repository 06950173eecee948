"""TPC (paper 18): truncated polynomial classifiers for activation monitoring.

`minilm.py`: the all-MiniLM-L6-v2 sentence encoder in Flax, whose per-layer activations the
probes read.
"""
