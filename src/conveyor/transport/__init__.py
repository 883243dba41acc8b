"""Transports: the doorbell between state changes and the processes that act on them."""
