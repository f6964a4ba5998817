"""Chat templates with tool support, shaped like the Qwen2.5 (Hermes JSON calls) and Qwen3.5 /
Qwen3-Coder (XML calls, a think block opened by the generation prompt) GGUF templates, for
tokenizers built on the tiny test vocabulary."""
from __future__ import annotations

import functools

from luce.testing.tiny_tokenizer import tiny_tokenizer_metadata
from luce.tokenizer import Tokenizer

QWEN25_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen.' }}{%- endif %}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- else %}{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>system\\nYou are Qwen.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) or "
    "(message.role == 'assistant' and not message.tool_calls) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- elif message.role == 'assistant' %}{{- '<|im_start|>' + message.role }}"
    "{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}"
    "{%- set tool_call = tool_call.function %}{%- endif %}"
    "{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}{{- '\", \"arguments\": ' }}"
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != 'tool') %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}"
    "{%- if loop.last or (messages[loop.index0 + 1].role != 'tool') %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

QWEN35_TOOLS = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n<function>\\n<name>' + tool.function.name + '</name>' }}"
    "{%- if tool.function.parameters is defined %}{{- '\\n<parameters>' + (tool.function.parameters | tojson) + "
    "'</parameters>' }}{%- endif %}{{- '\\n</function>' }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following format:\\n\\n<tool_call>\\n"
    "<function=example_function_name>\\n<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n"
    "</tool_call><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.reasoning_content %}{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}{%- endif %}"
    "{{- message.content }}"
    "{%- for tool_call in message.tool_calls or [] %}{%- set tc = tool_call.function %}"
    "{{- '\\n<tool_call>\\n<function=' + tc.name + '>\\n' }}"
    "{%- for name, value in tc.arguments | items %}{{- '<parameter=' + name + '>\\n' }}"
    "{%- if value is mapping or (value is sequence and value is not string) %}{{- value | tojson }}"
    "{%- else %}{{- value | string }}{%- endif %}{{- '\\n</parameter>\\n' }}{%- endfor %}"
    "{{- '</function>\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|im_start|>user\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


@functools.lru_cache(maxsize=4)
def tokenizer_with(template: str) -> Tokenizer:
    return Tokenizer.from_metadata({**tiny_tokenizer_metadata(), "tokenizer.chat_template": template})
