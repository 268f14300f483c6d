"""Which user-chosen strings the operator can put where Kubernetes limits them.

The API server accepts any DNS-1123 subdomain as a custom resource's name (``1model``,
``with.dot``, 253 characters), but every child is named after its LLMDeployment, and a Service's
name must be a DNS-1035 label: a lowercase letter, then lowercase letters, digits and ``-``,
not ending in ``-``, at most 63 characters (which also keeps the ``kvserve.io/llmdeployment``
label value, and every label selector built from it, valid). The endpoint picker a pool names
is a Service too. A spec's ``gpuProduct`` and ``nodeSelector`` values become a pod's
``nodeSelector``, whose values are label values. A v1.20 CRD cannot express all of this, so the
operator checks it before applying anything; each message names the limit.
"""

import re

_DNS_1035_LABEL = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
MAX_NAME_LENGTH = 63
MAX_LABEL_VALUE_LENGTH = 63


def is_service_name(name: str) -> bool:
    return len(name) <= MAX_NAME_LENGTH and _DNS_1035_LABEL.fullmatch(name) is not None


def service_name_problem(field: str, name: str) -> str | None:
    """Why ``name`` (the value of ``field``) cannot name a Service, or None when it can."""
    if is_service_name(name):
        return None
    return (
        f"{field} {name!r} cannot name a Service: use a DNS-1035 label (a lowercase "
        f"letter, then lowercase letters, digits or '-', not ending in '-', at most "
        f"{MAX_NAME_LENGTH} characters)"
    )


def name_problem(name: str) -> str | None:
    """Why the LLMDeployment ``name`` cannot be served, or None when it can."""
    return service_name_problem("metadata.name", name)


def label_value_problem(field: str, value: str) -> str | None:
    """Why ``value`` (the value of ``field``) cannot be a label value, or None when it can."""
    if len(value) <= MAX_LABEL_VALUE_LENGTH and _LABEL_VALUE.fullmatch(value) is not None:
        return None
    return (
        f"{field} {value!r} cannot be a label value: use at most {MAX_LABEL_VALUE_LENGTH} "
        "letters, digits, '-', '_' or '.', beginning and ending with a letter or digit"
    )
