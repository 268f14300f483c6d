"""The API's OpenAPI 3.1 document, served at ``/openapi.json`` (where vLLM serves its own).

The request schemas are the pydantic models the server validates with, so the document
cannot drift from what the server accepts; every error answers with ``Error``.
"""

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from kvserve.server.protocol.chat import ChatCompletionRequest
from kvserve.server.protocol.completions import CompletionRequest
from kvserve.server.protocol.tokens import DetokenizeRequest, TokenizeRequest

REQUESTS: dict[str, type[BaseModel]] = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/tokenize": TokenizeRequest,
    "/detokenize": DetokenizeRequest,
}
_NULLABLE_TEXT = {"type": ["string", "null"]}
ERROR = {
    "type": "object",
    "required": ["error"],
    "additionalProperties": False,
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "additionalProperties": False,
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": _NULLABLE_TEXT,
                "code": _NULLABLE_TEXT,
            },
        }
    },
}


def openapi_document(version: str) -> dict[str, Any]:
    _, schemas = models_json_schema(
        [(model, "validation") for model in REQUESTS.values()],
        ref_template="#/components/schemas/{model}",
    )
    error = {"description": "an OpenAI-shaped error", "content": _json("Error")}
    paths = {
        path: {
            "post": {
                "operationId": path.strip("/").replace("/", "_").replace("v1_", ""),
                "requestBody": {"required": True, "content": _json(model.__name__)},
                "responses": {"200": {"description": "the result"}, "4XX": error, "5XX": error},
            }
        }
        for path, model in REQUESTS.items()
    }
    return {
        "openapi": "3.1.0",
        "info": {"title": "kvserve", "version": version},
        "paths": paths,
        "components": {
            "schemas": schemas["$defs"] | {"Error": ERROR},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }


def _json(name: str) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{name}"}}}
