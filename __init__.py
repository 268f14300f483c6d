"""kvserve: a paged-KV LLM serving engine, its OpenAI-compatible server and its Kubernetes operator."""
