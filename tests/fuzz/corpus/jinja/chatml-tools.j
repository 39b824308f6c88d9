{%- if tools %}
{{- '<|im_start|>system\n' }}{% if messages[0].role == 'system' %}{{ messages[0].content + '\n\n' }}{% endif %}
{{- "# Tools\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools><|im_end|>\n" }}
{%- endif %}
{%- for message in messages %}
  {%- if message.role == "assistant" and message.tool_calls is defined and message.tool_calls %}
    {{- '<|im_start|>assistant' }}{% if message.content %}{{ '\n' + message.content }}{% endif %}
    {%- for tool_call in message.tool_calls %}
      {%- set tc = tool_call.function if tool_call.function is defined else tool_call %}
      {{- '\n<tool_call>\n{"name": "' }}{{ tc.name }}{{ '", "arguments": ' }}{{ tc.arguments | tojson }}{{ '}\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
  {%- elif message.role == "tool" %}
    {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{% endif %}
    {{- '\n<tool_response>\n' ~ message.content ~ '\n</tool_response>' }}
    {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\n' }}{% endif %}
  {%- else %}
    {{- '<|im_start|>' + message.role + '\n' + message.content | default('', true) | trim + '<|im_end|>\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\n<think>\n' if enable_thinking is not defined or enable_thinking else '<|im_start|>assistant\n' }}{% endif %}
