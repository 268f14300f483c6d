"""kvserve's own ``custom.metrics.k8s.io`` server: per-pod queue depth for the HPA, nothing else.

An aggregated API server (``python -m kvserve.operator.metrics_api``) that the kube-apiserver
proxies the HPA controller's metric reads to. It scrapes the Ready pods of LLMDeployments on
``/metrics`` and answers in the custom metrics API's own shapes (v1beta1 and v1beta2).
"""
