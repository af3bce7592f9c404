"""Prometheus signals: PromQL per deployment and role, read into an Observation."""
