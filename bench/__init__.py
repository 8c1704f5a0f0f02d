"""certagent's benchmarks, each a command that starts its own processes on loopback.

* ``python -m bench`` (:mod:`bench.versus_preload`): certagent against HAProxy
  preloading every certificate: startup, memory under churn, cold vs warm, a cold
  storm, and the cost of the hop; writes ``bench/results/<date>.{json,md,png}``.
* ``python -m bench.scale`` (:mod:`bench.scale`): a new host, a storm, a reload and
  idleness at K up to 100,000 slots, on one Redis, Sentinel and Cluster.
* ``python -m bench.profile_load``: what each runtime-API command and payload form
  costs HAProxy.
* ``python -m bench.profile_agent``: where the agent's CPU per recycle goes.
* ``python -m bench.import_rate``: ``certagent cert import`` into Redis.
* ``python -m bench.dirstore``: the directory store with many certbot lineages.

Shared pieces are the ``_`` modules: certificates (:mod:`._certs`), HAProxy
configurations (:mod:`._configs`), load generators (:mod:`._load`, :mod:`._native`),
``/proc`` readings (:mod:`._proc`), run metadata (:mod:`._runinfo`) and the runtime-API
commands the benches send (:mod:`._runtime_api`).  Results under ``bench/results/``
are history: no bench overwrites one.
"""
