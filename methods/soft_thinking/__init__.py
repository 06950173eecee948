"""Stochastic Soft Thinking (paper 2): soft, Dirichlet and Gumbel decoding through the shared
sampler (`decode.py`), and the JS probes (`probes.py`)."""
