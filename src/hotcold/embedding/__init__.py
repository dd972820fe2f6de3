"""Embedding stores, one module per technique; ``hotcold.methods`` names each one."""
