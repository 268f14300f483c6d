"""``/v1/completions``' body."""

from pydantic import Field, model_validator

from kvserve.server.errors import bad_request
from kvserve.server.protocol.sampling import MAX_LOGPROBS, SamplingBody


class CompletionRequest(SamplingBody):
    UNSUPPORTED = ("best_of", "suffix")

    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)

    @model_validator(mode="after")
    def _check_prompt(self) -> "CompletionRequest":
        if self.prompt == [] or self.prompt == "" or any(p in ("", []) for p in self.prompts):
            raise bad_request("'prompt' must not be empty", "prompt")
        return self

    @property
    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (text or token ids)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if p and all(isinstance(x, int) for x in p):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]
