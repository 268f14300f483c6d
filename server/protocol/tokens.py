"""``/tokenize`` and ``/detokenize``' bodies."""

from pydantic import Field, model_validator

from kvserve.server.errors import bad_request
from kvserve.server.protocol.base import Body
from kvserve.server.protocol.chat import ChatMessage, Tool


class TokenizeRequest(Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1)
    tools: list[Tool] | None = None  # rendered with the messages, as in a chat request
    add_special_tokens: bool = True
    add_generation_prompt: bool = True

    @model_validator(mode="after")
    def _one_input(self) -> "TokenizeRequest":
        if (self.prompt is None) == (self.messages is None):
            raise bad_request("give exactly one of 'prompt' and 'messages'", "prompt")
        if self.tools is not None and self.messages is None:
            raise bad_request("'tools' are rendered with 'messages' only", "tools")
        return self


class DetokenizeRequest(Body):
    model: str | None = None
    tokens: list[int]
