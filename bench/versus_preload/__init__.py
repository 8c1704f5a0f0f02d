"""certagent against HAProxy preloading every certificate, measured in the same run.

``python -m bench [--smoke] [--rsa] [--out bench/results]`` starts its own Redis,
HAProxy and agent processes on loopback (through :mod:`certagent.testing`), runs the
five scenarios and the hop variants, prints the results as JSON and writes
``<out>/<date>.json``, ``<out>/<date>.md`` and ``<out>/<date>.png``
(docs/performance.md sections 1-5).
"""
