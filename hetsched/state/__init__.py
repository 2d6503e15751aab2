"""Persistent state: the SQLite store (plans, submissions, events) and the profile history."""
