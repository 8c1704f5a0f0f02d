"""``python -m bench.issuance``: what on-demand issuance costs a first connection.

Real HAProxy, Redis and ``certagent run`` against Debian's pebble on loopback
(``PEBBLE_VA_NOSLEEP=1``, no nonce rejection, no authorization reuse: the CA at
its fastest), on-demand issuance allowed by a suffix rule, HTTP-01 answered by
HAProxy's ``fe_http``.  Per repeat and per variant (one client at a time, and
``--workers`` clients at once):

* **first connection**: N never-seen names, each timed from ``connect()`` to a
  TLS handshake verified against pebble's root with the hostname checked (the
  connection is held while the agent orders, stores and loads the certificate);
* **the CA alone**: N direct orders with the agent's own ACME client
  (:mod:`certagent.acme`), HTTP-01 answered by the same HAProxy's challenge map
  through its runtime API, timed from newOrder to the downloaded chain.

The difference of the two (p50 and p99, within one repeat) is what the agent
adds per issuance; the CPU of the agent, the HAProxy worker, Redis and pebble
is read from /proc per issuance.  Medians of ``--repeats`` with min and max.
"""
