"""Environment verification: is a host's GPU stack sound? Checks with evidence and remedies.

`checks.CHECKS` lists every check; `runner` runs them on hosts; `output` prints the reports.
"""
