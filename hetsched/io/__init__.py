"""File formats: jobs and cluster YAML, profile CSV, Gavel's data, traces, plan JSON.

Readers return core types and raise one-line :class:`~hetsched.errors.InputError`.
"""
