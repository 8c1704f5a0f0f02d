#!/usr/bin/env bash
# pebble and pebble-challtestsrv for the docker-compose demo (docker/pebble.Dockerfile).
#
# - pebble's own HTTPS endpoint gets a throwaway CA and a certificate for "pebble" (the compose
#   service) made here once, in $PEBBLE_DIR (a volume the nodes mount read-only): the nodes
#   trust endpoint-ca.pem (CERTAGENT_ACME_CA_FILE). Debian's package ships none.
# - Every name resolves to the address of $PEBBLE_TARGET (node1): challtestsrv, pebble's DNS,
#   answers it for any name, so any allowed name's HTTP-01 challenge is validated against
#   node1's fe_http (every node of the fleet answers every challenge). challtestsrv starts
#   once that service resolves; its own challenge responders (and DNS-over-HTTPS) are off.
# - pebble's settings come from the environment (docker-compose.yml): PEBBLE_VA_NOSLEEP etc.
# Stops both when either exits.
set -euo pipefail
dir=${PEBBLE_DIR:-/pebble}
target=${PEBBLE_TARGET:-node1}
http_port=${PEBBLE_HTTP_PORT:-8080}
tls_port=${PEBBLE_TLS_PORT:-8443}
say() { printf 'pebble-entrypoint: %s\n' "$*"; }

if [ ! -s "$dir/endpoint-ca.pem" ]; then
    work="$(mktemp -d "$dir/.new.XXXXXX")"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=certagent demo pebble endpoint CA" -keyout "$work/ca.key" -out "$work/ca.pem" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        2>/dev/null
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=pebble" \
        -keyout "$work/endpoint-key.pem" -out "$work/endpoint.csr" 2>/dev/null
    # Python 3.13 verifies strictly: the leaf needs its Authority Key Identifier
    printf '%s\n' "subjectAltName=DNS:pebble,DNS:localhost,IP:127.0.0.1" \
        "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
        "extendedKeyUsage=serverAuth" "subjectKeyIdentifier=hash" \
        "authorityKeyIdentifier=keyid" >"$work/leaf.ext"
    openssl x509 -req -in "$work/endpoint.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
        -CAcreateserial -days 3650 -extfile "$work/leaf.ext" -out "$work/endpoint-cert.pem" 2>/dev/null
    chmod 600 "$work/endpoint-key.pem"
    mv "$work/endpoint-cert.pem" "$work/endpoint-key.pem" "$dir/"
    mv "$work/ca.pem" "$dir/endpoint-ca.pem"  # last: its presence means "made"
    rm -rf "$work"
    say "made pebble's endpoint CA ($dir/endpoint-ca.pem) and its certificate for \"pebble\""
fi

cat >"$dir/pebble-config.json" <<JSON
{"pebble": {
  "listenAddress": "0.0.0.0:14000",
  "managementListenAddress": "0.0.0.0:15000",
  "certificate": "$dir/endpoint-cert.pem",
  "privateKey": "$dir/endpoint-key.pem",
  "httpPort": $http_port,
  "tlsPort": $tls_port,
  "ocspResponderURL": "",
  "externalAccountBindingRequired": false
}}
JSON

(
    until address="$(getent ahostsv4 "$target" | awk 'NR == 1 { print $1 }')" && [ -n "$address" ]; do
        sleep 1
    done
    say "every name resolves to $address ($target) for the CA's validation"
    exec pebble-challtestsrv -dns01 127.0.0.1:8053 -http01 "" -https01 "" -tlsalpn01 "" -doh "" \
        -management 127.0.0.1:8055 -defaultIPv4 "$address" -defaultIPv6 ""
) &
dns_pid=$!
pebble -config "$dir/pebble-config.json" -dnsserver 127.0.0.1:8053 -strict=false &
pebble_pid=$!
trap 'kill -TERM "$dns_pid" "$pebble_pid" 2>/dev/null' TERM INT
wait -n "$dns_pid" "$pebble_pid"
kill -TERM "$dns_pid" "$pebble_pid" 2>/dev/null || true
wait
