"""Prometheus both ways: the exporter, and the alert rules and dashboard for a Prometheus server.

The submodules that serve HTTP import prometheus-client; `dcgm` (the metric names) does not.
"""
