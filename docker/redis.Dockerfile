# Redis for the docker-compose demo, from Debian 13's package on the same base as every other
# image of the demo (scripts/docker-base.sh makes it where no registry is reachable).
FROM debian:13-slim
LABEL org.certagent.demo=redis
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
 && install -d -o redis -g redis -m 0750 /data
USER redis:redis
WORKDIR /data
EXPOSE 6379
# PONG once the data set is loaded (a LOADING reply is not)
HEALTHCHECK --interval=5s --timeout=5s --start-period=30s --retries=3 \
    CMD ["sh", "-c", "[ \"$(redis-cli ping)\" = PONG ]"]
# reachable from the other containers of the network only (nothing publishes the port);
# append-only file in the /data volume
CMD ["redis-server", "--appendonly", "yes", "--dir", "/data", "--protected-mode", "no"]
