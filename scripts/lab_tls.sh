#!/usr/bin/env bash
# lab_tls.sh DIR IP...: this lab run's TLS material for the controller, in DIR:
#   ca.pem          a throwaway CA, valid 2 days; its key is deleted once it has signed, so
#                   nothing else can ever be signed by it (clients trust only this run's switch)
#   controller.pem  the controller's certificate, subjectAltName localhost and every IP given
#   controller.key  its key (mode 0600)
# scripts/lab.sh serves the controller with the last two and hands the hosts ca.pem
# ($NR_CONTROLLER_CA), so the lab's token secret never crosses the lab's links in the clear.
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 DIR IP..." >&2; exit 2; }
dir=$1; shift
san="DNS:localhost"
for ip in "$@"; do san+=",IP:$ip"; done
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
key=(-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes)
openssl req -x509 "${key[@]}" -days 2 -subj "/CN=netreduce lab CA" \
  -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
openssl req "${key[@]}" -subj "/CN=netreduce lab controller" \
  -keyout "$work/controller.key" -out "$work/controller.csr" 2>/dev/null
printf 'subjectAltName=%s\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n' \
  "$san" > "$work/ext"
openssl x509 -req -in "$work/controller.csr" -CA "$work/ca.pem" -CAkey "$work/ca.key" \
  -CAcreateserial -days 2 -extfile "$work/ext" -out "$work/controller.pem" 2>/dev/null
chmod 644 "$work/ca.pem" "$work/controller.pem"
mv -f "$work/ca.pem" "$work/controller.pem" "$work/controller.key" "$dir/"
