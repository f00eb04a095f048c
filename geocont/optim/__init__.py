"""Optimizers for packed trials (K same-shape trials stepped as one): see batched.py."""
