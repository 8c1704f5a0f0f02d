"""What each runtime-API command costs HAProxy 2.6, and what makes a certificate load cheaper.

``python -m bench.profile_load [--quick] [--k-large N] [--no-perf] [--budget S]``: prints
one JSON object on stdout, progress on stderr.  Standalone: it starts its own HAProxy (through
:mod:`certagent.testing`) on a free loopback port with a minimal ``mode tcp`` config,
talks to it over one prompt-mode admin connection (the agent's own
:class:`~certagent.runtime.client.RuntimeClient`), and stops it by PID at the end,
also on failure, Ctrl-C or SIGTERM.  It never starts the agent.

Method.  HAProxy's worker CPU is read from ``/proc/<worker>/task/*/schedstat`` (first
field: ns on CPU, all threads) just before and just after a batch of N identical
operations, pipelined the way the agent does it (one write per chunk of <= 128
commands / 64 KB, then read every reply, every reply checked); CPU / N is one sample.
Every measurement is repeated ``reps`` times, round-robin over the cases of a question
so that noise hits all cases alike; the JSON keeps every sample, the report gives the
median and the min-max.  Costs that cannot be sent alone (``commit`` needs a ``set``)
are differences of two batches measured in the same repetition.

Questions, each a module, under the JSON key the committed results use:

* ``q1`` (:mod:`.command_costs`): per-command cost for one load into a recycled slot
  (and for a new slot), and the map / stick-table commands, at a small and a large
  pool (K slots, K map entries, K table entries);
* ``q2`` (:mod:`.payload_costs`): ``set ssl cert`` (and set + commit + abort) by key
  encoding, chain length and block order;
* ``q3`` (:mod:`.handshakes`): HAProxy CPU of the first full handshake on a freshly
  committed certificate vs the second and third (ECDSA P-256, RSA-2048; TLS 1.3, no
  resumption);
* ``q4`` (:mod:`.perf_profiles`): ``perf record`` of the worker during a stream of
  loads, if ``perf`` works.

The HAProxy under test and its pool are in :mod:`.rig`, the connection and the CPU
meter in :mod:`.session`, sizes and the time budget in :mod:`.settings`.
"""
