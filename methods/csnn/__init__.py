"""Cooperative sheaf neural networks (paper 15), in progress."""
