"""disagg: a Kubernetes operator for prefill/decode disaggregated LLM serving."""

__version__ = "0.1.0"

GROUP = "disagg.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
