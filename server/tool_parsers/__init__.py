"""Tool-call parsers: a model's output text to OpenAI ``tool_calls``, whole or streamed.

One module per output format, named as vLLM's ``--tool-call-parser`` names it.
"""

from kvserve.server.tool_parsers.base import ToolParser
from kvserve.server.tool_parsers.hermes import HermesToolParser
from kvserve.server.tool_parsers.llama3_json import Llama3JsonToolParser
from kvserve.server.tool_parsers.openai import OpenAIToolParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "openai": OpenAIToolParser,
}
