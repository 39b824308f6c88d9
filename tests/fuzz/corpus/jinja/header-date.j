{{- bos_token }}
{%- set date_string = strftime_now("%d %b %Y") if strftime_now is defined else "26 Jul 2024" %}
{%- if messages[0]['role'] == 'system' %}{% set system_message = messages[0]['content']|trim %}{% set messages = messages[1:] %}{% else %}{% set system_message = "" %}{% endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\nToday Date: " + date_string + "\n\n" + system_message + "<|eot_id|>" }}
{%- for message in messages %}
  {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}
  {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + (message['content'] | string) | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
