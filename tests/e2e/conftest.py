"""The e2e tests reuse the operator tests' kubectl and helm (fetched once into the cache)."""

from k8s.conftest import kube_tools  # noqa: F401
