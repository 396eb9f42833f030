#!/usr/bin/env bash
# The admission webhook's serving certificate, made with openssl, and deploy/kubernetes/webhook.yaml applied with
# the CA in its caBundle (docs/kubernetes.md, "Admission webhook").
#
#   deploy/kubernetes/webhook-certs.sh [namespace, default hcs-portal] [certificate days, default 825]
#
# Keeps the CA (10 years) under $OUT_DIR (default ./webhook-tls, mode 700) so that running it again renews the
# serving certificate without changing the caBundle. Creates or updates the Secret hcs-portal-webhook-tls and
# applies webhook.yaml; restart the webhook Deployment after a renewal. DRY_RUN=1 prints the manifests instead.
set -euo pipefail

NAMESPACE=${1:-hcs-portal}
DAYS=${2:-825}
OUT=${OUT_DIR:-./webhook-tls}
KUBECTL=${KUBECTL:-kubectl}
HERE=$(cd "$(dirname "$0")" && pwd)
HOST=hcs-portal-webhook.$NAMESPACE.svc

if [[ ! $NAMESPACE =~ ^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$ ]]; then
  echo "expected a namespace name (a DNS label), got '$NAMESPACE'" >&2
  exit 2
fi
if [[ ! $DAYS =~ ^[1-9][0-9]*$ ]]; then
  echo "expected the certificate's validity in days (a positive whole number), got '$DAYS'" >&2
  exit 2
fi

umask 077
mkdir -p "$OUT"
if [[ ! -f $OUT/ca.key ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -keyout "$OUT/ca.key" -out "$OUT/ca.crt" -subj "/CN=hcs-portal-webhook-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
fi
openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -keyout "$OUT/tls.key" -out "$OUT/tls.csr" -subj "/CN=$HOST" 2>/dev/null
printf 'subjectAltName=DNS:%s,DNS:%s.cluster.local\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n' \
  "$HOST" "$HOST" >"$OUT/server.ext"
openssl x509 -req -in "$OUT/tls.csr" -CA "$OUT/ca.crt" -CAkey "$OUT/ca.key" -CAcreateserial -days "$DAYS" -sha256 \
  -extfile "$OUT/server.ext" -out "$OUT/tls.crt" 2>/dev/null
openssl verify -CAfile "$OUT/ca.crt" "$OUT/tls.crt" >/dev/null

b64() { base64 <"$1" | tr -d '\n'; }
manifests=$(
  cat <<SECRET
apiVersion: v1
kind: Secret
metadata:
  name: hcs-portal-webhook-tls
  namespace: $NAMESPACE
  labels: {app.kubernetes.io/name: hcs-portal, app.kubernetes.io/component: webhook}
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "$OUT/tls.crt")
  tls.key: $(b64 "$OUT/tls.key")
---
SECRET
  sed -e "s|caBundle: CA_BUNDLE|caBundle: $(b64 "$OUT/ca.crt")|" \
    -e "s|\.hcs-portal\.svc|.$NAMESPACE.svc|g" \
    -e "s|namespace: hcs-portal,|namespace: $NAMESPACE,|" \
    -e "s|inject-ca-from: hcs-portal/|inject-ca-from: $NAMESPACE/|" \
    "$HERE/webhook.yaml"
)
if [[ ${DRY_RUN:-} == 1 ]]; then
  printf '%s\n' "$manifests"
else
  printf '%s\n' "$manifests" | "$KUBECTL" -n "$NAMESPACE" apply -f -
fi
