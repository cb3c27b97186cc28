"""Alert rules with Prometheus-style ``for:`` durations, and the engine that evaluates them.

`rules` (the rule model and its checks), `expr` (the condition language and its PromQL),
`defaults` (the built-in rules), `config` (the user's alerts file), `engine` (the evaluation),
`alertmanager` (firing alerts sent to Alertmanager, and silences made there).
"""
