"""``python -m bench.http3``: HTTP/3 served by certagent against HAProxy preloading, one run.

CPU per keep-alive request and per full handshake over HTTP/3 (QUIC), with the TCP
figures beside them, for a ``certagent init --http3`` stack and for the same HAProxy
binary preloading the same certificates on a TCP and a QUIC bind (its own process),
in alternating phases, repeated; ratios are taken within each repeat.
"""
