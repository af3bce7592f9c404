"""Pydantic models of the disagg.dev/v1alpha1 API: the single source of truth for the CRDs."""
