"""Tests of the real node (scripts/kube-node.sh) and of what it runs."""
