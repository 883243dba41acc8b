"""Composition: the processes (app), their health endpoint and the embedded PostgreSQL."""
