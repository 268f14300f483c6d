"""Which LLMDeployment names the operator can serve.

The API server accepts any DNS-1123 subdomain as a custom resource's name (``1model``,
``with.dot``, 253 characters), but every child is named after its LLMDeployment, and a Service's
name must be a DNS-1035 label: a lowercase letter, then lowercase letters, digits and ``-``,
not ending in ``-``, at most 63 characters (which also keeps the ``kvserve.io/llmdeployment``
label value valid). A v1.20 CRD cannot express this, so the operator checks it before applying
anything.
"""

import re

_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
MAX_NAME_LENGTH = 63


def is_service_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and _DNS_1035_LABEL.fullmatch(name) is not None


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be served, or None when it can."""
    if is_service_name(name):
        return None
    return (
        f"metadata.name {name!r} cannot name a Service: use a DNS-1035 label (a lowercase "
        f"letter, then lowercase letters, digits or '-', not ending in '-', at most "
        f"{MAX_NAME_LENGTH} characters)"
    )
