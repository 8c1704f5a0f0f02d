# certagent next to HAProxy 3.0 (Debian 13): the node image of the docker-compose demo; its
# one-shot seeding container runs the same image (docker/seed.py).
# HAProxy and the agent run side by side as one unprivileged user, certagent (uid 10001): they
# share unix sockets of mode 0600, and the ports 8443 and 8080 need no privilege.
#
# The base is made locally by scripts/docker-base.sh where no registry is reachable. Two stages:
# "build" makes the virtualenv from the lock (requirements/runtime.txt, hashes checked, wheels
# only) and certagent's wheel with the lock's setuptools (requirements/build.txt, no build
# isolation: nothing unpinned is fetched); the final image gets that virtualenv and Debian's
# HAProxy and Python, and no pip, compiler, build tools, caches or source tree.

FROM debian:13-slim AS build
# every image of the demo carries this label: scripts/test.sh's compose step prunes old
# untagged ones by it
LABEL org.certagent.demo=node-build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
# the system's trust store (with any local anchors the base brought along), not pip's own
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
COPY requirements/build.txt requirements/runtime.txt /src/requirements/
# /opt/build: pip and the lock's setuptools, to build the wheel; /opt/certagent: the runtime
# virtualenv, without pip (the build virtualenv's pip installs into it with --python)
RUN python3 -m venv /opt/build \
 && /opt/build/bin/pip install -q --require-hashes --no-deps --only-binary :all: \
      -r /src/requirements/build.txt \
 && python3 -m venv --without-pip /opt/certagent \
 && /opt/build/bin/pip --python /opt/certagent/bin/python install -q --require-hashes \
      --no-deps --only-binary :all: -r /src/requirements/runtime.txt
COPY pyproject.toml README.md /src/
# the package's templates are links to these two folders' files
COPY haproxy /src/haproxy
COPY lua /src/lua
COPY agent /src/agent
# certagent itself goes to /staging (its files under /opt/certagent, where the final image puts
# them): the final image copies the dependencies and certagent as two layers, so a change to
# the code rebuilds a layer of 3 MB instead of the whole 59 MB virtualenv. The package, put
# into the virtualenv, must write a configuration, or the build stops here.
RUN cd /src \
 && /opt/build/bin/pip wheel -q --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/build/bin/pip --python /opt/certagent/bin/python install -q --no-deps \
      --root /staging /wheels/*.whl \
 && PYTHONPATH="$(echo /staging/opt/certagent/lib/python3*/site-packages)" \
      /opt/certagent/bin/python -m certagent init /tmp/smoke --bind 127.0.0.1:8443 \
      --store /tmp/smoke/certs >/dev/null \
 && rm -rf /tmp/smoke

FROM debian:13-slim
LABEL org.certagent.demo=node
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      haproxy python3 openssl ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log
COPY --from=build /opt/certagent /opt/certagent
COPY --from=build /staging/opt/certagent /opt/certagent
# The user, and the directories it writes: the configuration (a volume), the unix sockets (a
# tmpfs in docker-compose.yml, whose root filesystem is read-only), and the fleet's shared
# data key (a volume). A new named volume takes the owner of its directory.
RUN ln -s /opt/certagent/bin/certagent /usr/local/bin/certagent \
 && groupadd --system --gid 10001 certagent \
 && useradd --system --uid 10001 --gid certagent --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin certagent \
 && install -d -o certagent -g certagent -m 0700 /etc/certagent /run/certagent /fleet /seed
COPY docker/entrypoint.sh /usr/local/bin/certagent-entrypoint
COPY docker/healthcheck.sh /usr/local/bin/certagent-healthcheck
COPY docker/seed.py /usr/local/bin/certagent-seed
USER certagent:certagent
EXPOSE 8443 8080 8089
# Healthy when the agent's /readyz answers 200 (HAProxy and the store usable); without an API
# token (API off) when `certagent check` passes. No curl needed: python3 is in the image.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30s --retries=3 \
    CMD ["/usr/local/bin/certagent-healthcheck"]
ENTRYPOINT ["/usr/local/bin/certagent-entrypoint"]
