#!/usr/bin/env bash
# Test PKI for the TLS stream listener of the 4.3 broker, generated with openssl.
#
#   scripts/tls.sh [DIR]      (default: $STREAMLEDGER_HOME/tls)
#
# Writes, once (idempotent: an existing complete set is kept so running brokers and
# clients keep trusting each other):
#   ca.pem / ca.key            the CA the broker and the clients trust
#   server.pem / server.key    CN=localhost, SAN DNS:localhost + IP:127.0.0.1, signed by ca
#   client.pem / client.key    CN=streamledger-client (the user SASL EXTERNAL logs in as)
#   wrong-ca.pem / wrong-ca.key  an unrelated CA, for "the server is not who we think" tests
# Set TLS_FORCE=1 to regenerate everything.
set -euo pipefail

SL_HOME=${STREAMLEDGER_HOME:-/var/tmp/streamledger}
DIR=${1:-$SL_HOME/tls}
DAYS=${TLS_DAYS:-3650}
CLIENT_CN=streamledger-client
FILES=(ca.pem ca.key server.pem server.key client.pem client.key wrong-ca.pem wrong-ca.key)

complete() {
  local f
  for f in "${FILES[@]}"; do [ -s "$DIR/$f" ] || return 1; done
}

if [ "${TLS_FORCE:-0}" != 1 ] && complete; then
  echo "tls: certificates already present in $DIR"
  exit 0
fi

mkdir -p "$DIR"
chmod 0755 "$DIR"
tmp=$(mktemp -d "$DIR/.gen.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A self-signed CA with the extensions OpenSSL 3 and Python's ssl module expect of a CA.
make_ca() { # name subject
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days "$DAYS" \
    -keyout "$tmp/$1.key" -out "$tmp/$1.pem" -subj "$2" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
}

# A leaf key + certificate signed by ca; $3 = extensions for the leaf.
make_leaf() { # name subject extfile-text
  openssl req -new -newkey rsa:2048 -nodes -sha256 -keyout "$tmp/$1.key" -out "$tmp/$1.csr" \
    -subj "$2" 2>/dev/null
  printf '%s\n' "$3" > "$tmp/$1.ext"
  openssl x509 -req -sha256 -days "$DAYS" -in "$tmp/$1.csr" -CA "$tmp/ca.pem" -CAkey "$tmp/ca.key" \
    -CAcreateserial -out "$tmp/$1.pem" -extfile "$tmp/$1.ext" 2>/dev/null
}

make_ca ca "/CN=streamledger test CA"
make_ca wrong-ca "/CN=streamledger unrelated CA"
make_leaf server "/CN=localhost" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,IP:127.0.0.1"
make_leaf client "/CN=$CLIENT_CN" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

openssl verify -CAfile "$tmp/ca.pem" "$tmp/server.pem" "$tmp/client.pem" >/dev/null

for f in "${FILES[@]}"; do
  case $f in *.key) mode=0600 ;; *) mode=0644 ;; esac
  install -m "$mode" "$tmp/$f" "$DIR/$f"
done
echo "tls: generated CA, server (localhost, 127.0.0.1), client (CN=$CLIENT_CN) and wrong CA in $DIR"
