"""Validates rendered Kubernetes manifests offline (scripts/check-deploy.sh
runs it on `kubectl kustomize` of each overlay).

Built-in kinds go through kubernetes-validate (the API's OpenAPI schemas,
shipped with the package: no cluster, no network), strict: an unknown field
fails. Custom resources are not in those schemas: KEDA's ScaledObject and
TriggerAuthentication and the Prometheus Operator's PodMonitor and
PrometheusRule are checked against the minimal schemas below (the fields
this repository uses and their types, unknown top-level spec fields
refused). Any other kind fails: add a schema for it.

Usage: python validate-k8s.py KUBERNETES_VERSION FILE...
"""

import sys

import jsonschema
import kubernetes_validate
import yaml

STR = {"type": "string"}
INT = {"type": "integer"}
STR_MAP = {"type": "object", "additionalProperties": STR}
METADATA = {
    "type": "object",
    "required": ["name"],
    "properties": {"name": STR, "labels": STR_MAP, "namespace": STR},
}


def crd(spec):
    return {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": STR,
            "kind": STR,
            "metadata": METADATA,
            "spec": spec,
        },
    }


# keda.sh/v1alpha1: https://keda.sh/docs/latest/reference/scaledobject-spec/
SCALED_OBJECT = crd({
    "type": "object",
    "required": ["scaleTargetRef", "triggers"],
    "additionalProperties": False,
    "properties": {
        "scaleTargetRef": {
            "type": "object",
            "required": ["name"],
            "additionalProperties": False,
            "properties": {"apiVersion": STR, "kind": STR, "name": STR},
        },
        "minReplicaCount": INT,
        "maxReplicaCount": INT,
        "pollingInterval": INT,
        "cooldownPeriod": INT,
        "idleReplicaCount": INT,
        "advanced": {"type": "object"},
        "fallback": {"type": "object"},
        "triggers": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["type", "metadata"],
                "additionalProperties": False,
                "properties": {
                    "type": STR,
                    "name": STR,
                    # KEDA reads every trigger parameter as a string.
                    "metadata": STR_MAP,
                    "authenticationRef": {
                        "type": "object",
                        "required": ["name"],
                        "properties": {"name": STR, "kind": STR},
                    },
                    "metricType": STR,
                },
            },
        },
    },
})

TRIGGER_AUTHENTICATION = crd({
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "secretTargetRef": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["parameter", "name", "key"],
                "additionalProperties": False,
                "properties": {"parameter": STR, "name": STR, "key": STR},
            },
        },
        "env": {"type": "array"},
    },
})

# monitoring.coreos.com/v1
POD_MONITOR = crd({
    "type": "object",
    "required": ["selector", "podMetricsEndpoints"],
    "additionalProperties": False,
    "properties": {
        "selector": {"type": "object", "properties": {"matchLabels": STR_MAP}},
        "namespaceSelector": {"type": "object"},
        "jobLabel": STR,
        "podMetricsEndpoints": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "port": STR,
                    "path": STR,
                    "interval": STR,
                    "scrapeTimeout": STR,
                    "relabelings": {"type": "array"},
                    "metricRelabelings": {"type": "array"},
                },
            },
        },
    },
})

RULE = {
    "type": "object",
    "required": ["expr"],
    "additionalProperties": False,
    "properties": {
        "alert": STR,
        "record": STR,
        "expr": STR,
        "for": STR,
        "labels": STR_MAP,
        "annotations": STR_MAP,
    },
    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
}

PROMETHEUS_RULE = crd({
    "type": "object",
    "required": ["groups"],
    "additionalProperties": False,
    "properties": {
        "groups": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "rules"],
                "additionalProperties": False,
                "properties": {
                    "name": STR,
                    "interval": STR,
                    "rules": {"type": "array", "minItems": 1, "items": RULE},
                },
            },
        }
    },
})

CUSTOM = {
    ("keda.sh/v1alpha1", "ScaledObject"): SCALED_OBJECT,
    ("keda.sh/v1alpha1", "TriggerAuthentication"): TRIGGER_AUTHENTICATION,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("monitoring.coreos.com/v1", "PrometheusRule"): PROMETHEUS_RULE,
}


def main():
    version, files = sys.argv[1], sys.argv[2:]
    if not files:
        sys.exit("usage: validate-k8s.py KUBERNETES_VERSION FILE...")
    failures = 0
    for path in files:
        with open(path) as f:
            docs = [d for d in yaml.safe_load_all(f) if d]
        if not docs:
            print(f"{path}: no manifest")
            failures += 1
        for doc in docs:
            key = (doc.get("apiVersion"), doc.get("kind"))
            what = f"{path}: {key[1]} {doc.get('metadata', {}).get('name')}"
            try:
                if key in CUSTOM:
                    jsonschema.validate(doc, CUSTOM[key])
                    print(f"ok   {what} (own schema of the custom resource)")
                else:
                    kubernetes_validate.validate(doc, version, strict=True)
                    print(f"ok   {what} (Kubernetes {version}, strict)")
            except kubernetes_validate.SchemaNotFoundError:
                print(f"FAIL {what}: no schema for {key[0]} {key[1]}: add one to {sys.argv[0]}")
                failures += 1
            except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as e:
                print(f"FAIL {what}: {e.message if hasattr(e, 'message') else e}")
                failures += 1
    if failures:
        sys.exit(f"{failures} manifest(s) invalid")


if __name__ == "__main__":
    main()
