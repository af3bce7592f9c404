"""Conformance of the rendered manifests with the released engines and routers at the pinned versions.

``engines`` and ``routers`` read facts from the released wheels (``disagg.cluster.released``), cached
under ``<cache>/conformance/``; ``check`` compares rendered children with them and returns findings;
``metrics`` reads the Prometheus metric names the engines declare, against which the operator's queries
and the live twin's exposition are checked.
A flag renamed upstream fails ``tests/conformance`` instead of a user's pod.
"""
