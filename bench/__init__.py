"""Benchmarks for GitHub issue 4: HAProxy preloading every certificate vs certagent.

``python -m bench [--smoke] [--rsa] [--out bench/results]`` starts its own Redis,
HAProxy and agent processes on loopback (through :mod:`certagent.testing`), runs the
five scenarios and the hop variants, prints the results as JSON and writes
``<out>/<date>.json``, ``<out>/<date>.md`` and ``<out>/<date>.png``.
"""
