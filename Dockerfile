# certagent next to HAProxy 2.6 (Debian 12), for the docker-compose demo.
FROM debian:12-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      haproxy python3 python3-venv openssl ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY haproxy ./haproxy
COPY lua ./lua
RUN python3 -m venv /opt/certagent \
 && /opt/certagent/bin/pip install --no-cache-dir . \
 && ln -s /opt/certagent/bin/certagent /usr/local/bin/certagent
COPY docker/entrypoint.sh /usr/local/bin/certagent-entrypoint
EXPOSE 8443 8089
ENTRYPOINT ["/usr/local/bin/certagent-entrypoint"]
