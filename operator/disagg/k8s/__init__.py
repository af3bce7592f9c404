"""Kubernetes I/O only: server-side apply, status patches, Events."""
