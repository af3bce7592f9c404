"""Thin kopf handlers wiring api, render, k8s, metrics and policy together."""
