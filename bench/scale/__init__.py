"""``python -m bench.scale``: what a new host, a storm, a reload and idleness cost at scale.

The scenarios, each measured against real HAProxy, agent and Redis processes on
loopback, every figure the median of repeats with its spread (``--only`` takes
their names; each is a module, the two recycle scenarios share :mod:`.recycles`):

* ``capacity``: K = 1k, 10k, 100k slots full, then cold hosts that each
  recycle a slot: CPU per recycle (HAProxy worker and agent), cold handshake
  latency added over a warm one, memory of HAProxy, agent and Redis;
* ``new_host``: CPU per new host, first handshake included, ECDSA and RSA-2048
  leaves with a key of their own each;
* ``storm``: 1,000 never-seen hosts within 1 s at capacity 500;
* ``reload``: an HAProxy reload under steady traffic over 2,000 hot hosts;
* ``idle``: agent + HAProxy worker (+ Redis) CPU per second at rest;
* ``idle_ha``: the same on a Sentinel-watched Redis and on a Redis Cluster;
* ``store_kinds``: the capacity scenario's recycles at one K on one Redis, on
  Sentinel and on Cluster, every store process counted, as ratios to one Redis;
* ``hit_ratio``: the sampled victim choice against exact LRU, simulated.
"""
