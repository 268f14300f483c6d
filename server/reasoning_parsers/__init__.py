"""Reasoning parsers: a model's reasoning split off its output as ``reasoning_content``,
whole or streamed; one module per format, named as vLLM's ``--reasoning-parser`` names it.
"""

from kvserve.server.reasoning_parsers.base import ReasoningParser
from kvserve.server.reasoning_parsers.openai_gptoss import GptOssReasoningParser

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "openai_gptoss": GptOssReasoningParser,
}
