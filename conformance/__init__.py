"""``kvserve conformance URL``: check a running model server against the model-server contract."""
