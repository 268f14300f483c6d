"""Request bodies of the OpenAI-compatible API, validated with pydantic, a module per
endpoint (``base`` holds what they share and ``parse_body``)."""
