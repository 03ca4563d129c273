"""Fixtures of the kind-based end-to-end tests (defined in tests/e2e/kind.py)."""

from tests.e2e.kind import images, installed, kind_cluster

__all__ = ["images", "installed", "kind_cluster"]
