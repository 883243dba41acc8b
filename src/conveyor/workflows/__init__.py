"""Workflows: the language (spec, parsing, validation, expressions) and the conductor.

Everything here is pure -- no database, no clock, no I/O -- so that what a workflow does
next is a function of its definition and its rows, applied by the executor inside the
one transaction that holds the workflow's lock (executor/workflows.py).
"""
