"""Recording and replay: the fleet's readings, findings, alerts and actions in a SQLite file.

``recorder`` writes (a thread of its own, commits at most once a second), ``reader`` reads,
``replay`` turns a recording into a telemetry source with a time cursor, ``retention`` keeps the
file bounded. ``codec`` is the compact encoding of one reading; ``schema`` the file's layout.
"""
