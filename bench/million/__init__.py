"""``python -m bench.million``: 10^4 and 10^6 stored certificates in one run (issue 21).

See :mod:`bench.million.__main__` for the scenario; the pieces:
:mod:`~bench.million.generate` (the cached certificate set),
:mod:`~bench.million.store` (import, Redis memory, BGSAVE),
:mod:`~bench.million.start` (starts and floods), :mod:`~bench.million.serve`
(cold, warm, storms, ``cert ls``) and :mod:`~bench.million.report`.
"""
