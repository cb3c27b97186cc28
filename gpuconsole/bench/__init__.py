"""Benchmark history: every recipe run kept in SQLite, judged against its own past and its peers."""
