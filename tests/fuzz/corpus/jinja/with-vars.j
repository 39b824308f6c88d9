{{ messages|tojson(indent=2) }}{{ x.y is defined }}
#####
{"messages": [{"role": "user", "content": "x"}], "x": {"y": [1, 2.5, null]}}