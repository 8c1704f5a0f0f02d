# pebble (a test ACME CA) and pebble-challtestsrv (its DNS) for the docker-compose demo, from
# Debian 13's package on the same base as every other image of the demo. docker/pebble.sh
# starts both; never a CA for real use.
FROM debian:13-slim
LABEL org.certagent.demo=pebble
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pebble openssl \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
 && groupadd --system --gid 10002 pebble \
 && useradd --system --uid 10002 --gid pebble --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin pebble \
 && install -d -o pebble -g pebble -m 0755 /pebble
COPY pebble.sh /usr/local/bin/pebble-entrypoint
USER pebble:pebble
# the ACME directory, and the management API (pebble's roots)
EXPOSE 14000 15000
# a whole TLS handshake with the ACME endpoint, verified (a bare connect makes pebble log a
# handshake error at every check)
HEALTHCHECK --interval=5s --timeout=5s --start-period=20s --retries=3 \
    CMD ["sh", "-c", "openssl s_client -verify_return_error -CAfile /pebble/endpoint-ca.pem -connect 127.0.0.1:14000 </dev/null >/dev/null 2>&1"]
ENTRYPOINT ["/usr/local/bin/pebble-entrypoint"]
