# certagent next to HAProxy 2.6 (Debian 12), for the docker-compose demo.
# HAProxy and the agent run side by side as one unprivileged user, certagent (uid 10001): they
# share unix sockets of mode 0600, and the public port 8443 needs no privilege.
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
# The user, and the directories it writes: the configuration (a volume), the unix sockets, and
# the fleet's shared data key (a volume). A new named volume takes the owner of its directory.
RUN groupadd --system --gid 10001 certagent \
 && useradd --system --uid 10001 --gid certagent --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin certagent \
 && install -d -o certagent -g certagent -m 0700 /etc/certagent /run/certagent /fleet
COPY docker/entrypoint.sh /usr/local/bin/certagent-entrypoint
COPY docker/healthcheck.sh /usr/local/bin/certagent-healthcheck
USER certagent:certagent
EXPOSE 8443 8089
# Healthy when the agent's /readyz answers 200 (HAProxy and the store usable); without an API
# token (API off) when `certagent check` passes. No curl needed: python3 is in the image.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/certagent-healthcheck"]
ENTRYPOINT ["/usr/local/bin/certagent-entrypoint"]
