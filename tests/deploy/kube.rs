//! `deploy/kubernetes/`: the manifests held against the binary (command
//! line, config keys, listen port, shutdown timeout, memory bound) and
//! against each other (names, labels, ports, Secret keys): the files of
//! `base/` as written, and each overlay as `kubectl kustomize` renders it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use throttle_worker::config::Settings;

use super::dockerfile::{self, Dockerfile};
use super::env::{self, Mounts};
use super::{at, cli, scalar, yaml_docs};

/// One manifest: its file and document.
#[derive(Debug, Clone)]
pub struct Manifest {
    pub file: String,
    pub doc: Value,
}

impl Manifest {
    pub fn kind(&self) -> &str {
        at(&self.doc, "kind").as_str().unwrap_or("")
    }
    pub fn name(&self) -> &str {
        at(&self.doc, "metadata.name").as_str().unwrap_or("")
    }
}

/// Every document of every `.yaml` file of `dir`, by file name.
pub fn load_dir(dir: &Path) -> Result<Vec<Manifest>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let name = f.file_name().expect("file").to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{name}: {e}"))?;
        out.extend(load_text(&name, &text)?);
    }
    Ok(out)
}

pub fn load_text(file: &str, text: &str) -> Result<Vec<Manifest>, String> {
    Ok(yaml_docs(text)
        .map_err(|e| format!("{file}: not YAML: {e}"))?
        .into_iter()
        .map(|doc| Manifest {
            file: file.to_owned(),
            doc,
        })
        .collect())
}

/// A pod name as the Deployment's pods get them, for `metadata.name`.
pub const SAMPLE_POD_NAME: &str = "throttle-worker-7d9c6b5f4-x2k8q";

/// RSS beyond `worker.max_buffered_bytes` (docs/src/concepts/guarantees.md):
/// librdkafka's buffers at their defaults (`queued.max.messages.kbytes`
/// 64 MiB + `fetch.max.bytes` 50 MiB) plus about 30 MiB of the process.
pub const RSS_OVERHEAD_BYTES: u64 = (64 + 50 + 30) << 20;

/// What the checks learnt, for the tests' own assertions.
#[derive(Default)]
pub struct Learnt {
    pub settings: Option<Settings>,
    pub deployment: String,
    /// The ScaledObjects' files.
    pub scalers: Vec<String>,
    /// Prometheus queries of ScaledObjects: (file, query).
    pub scaler_queries: Vec<(String, String)>,
    /// `Deployment` or `StatefulSet`.
    pub workload_kind: String,
}

/// The kinds that run the worker's pods.
pub const WORKLOAD_KINDS: &[&str] = &["Deployment", "StatefulSet"];

fn find<'a>(all: &'a [Manifest], kind: &str, name: &str) -> Option<&'a Manifest> {
    all.iter().find(|m| m.kind() == kind && m.name() == name)
}

/// A quantity such as `384Mi`, `1Gi`, `500M` in bytes.
pub fn bytes(q: &str) -> Option<u64> {
    let units: [(&str, u64); 8] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
    ];
    for (u, m) in units {
        if let Some(n) = q.strip_suffix(u) {
            return n.parse::<u64>().ok().map(|n| n * m);
        }
    }
    q.parse().ok()
}

/// The checks. `tmp` receives the ConfigMaps and Secrets the pod mounts,
/// so the worker's loader can read them as the pod would.
pub fn check(
    all: &[Manifest],
    df: &Dockerfile,
    kustomization: Option<&Value>,
    dir: &Path,
    tmp: &Path,
) -> (Vec<String>, Learnt) {
    let mut problems = Vec::new();
    let mut learnt = Learnt::default();
    // kustomization: every resource exists and parses.
    if let Some(k) = kustomization {
        for r in at(k, "resources")
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if !dir.join(r).is_file() {
                problems.push(format!("kustomization.yaml: resource {r} does not exist"));
            }
        }
    }
    let workloads: Vec<&Manifest> = all
        .iter()
        .filter(|m| WORKLOAD_KINDS.contains(&m.kind()))
        .collect();
    let [dep] = workloads.as_slice() else {
        return (
            vec![format!(
                "deploy/kubernetes: expected one Deployment or StatefulSet, found {}",
                workloads.len()
            )],
            learnt,
        );
    };
    let what = format!("{}: {} {}", dep.file, dep.kind(), dep.name());
    learnt.deployment = dep.name().to_owned();
    learnt.workload_kind = dep.kind().to_owned();
    let pod = at(&dep.doc, "spec.template");
    let pod_labels = at(pod, "metadata.labels").clone();
    let selector = at(&dep.doc, "spec.selector.matchLabels");
    if !labels_match(selector, &pod_labels) {
        problems.push(format!(
            "{what}: spec.selector does not match the pod template's labels"
        ));
    }
    let containers = at(pod, "spec.containers")
        .as_array()
        .cloned()
        .unwrap_or_default();
    let Some(c) = containers.first() else {
        return (vec![format!("{what}: no container")], learnt);
    };
    let cname = at(c, "name").as_str().unwrap_or("?");
    let what_c = format!("{what}: container {cname}");
    // Command line: the image's entrypoint (unless `command` replaces it)
    // and `args` (or the image's CMD).
    let image = df.final_stage();
    let entrypoint = super::compose::words(at(c, "command"))
        .or_else(|| image.exec_form("ENTRYPOINT").and_then(Result::ok))
        .unwrap_or_default();
    let args = super::compose::words(at(c, "args"))
        .or_else(|| image.exec_form("CMD").and_then(Result::ok))
        .unwrap_or_default();
    let argv = cli::argv(&entrypoint, &args);
    let parsed = match cli::parse(&argv) {
        Ok(p) if p.subcommand == "run" => p,
        Ok(p) => {
            problems.push(format!("{what_c}: runs `{}`, not `run`", p.subcommand));
            return (problems, learnt);
        }
        Err(e) => {
            problems.push(format!("{what_c}: {argv:?} does not parse: {e}"));
            return (problems, learnt);
        }
    };
    // Volumes: ConfigMaps and Secrets written out where the pod sees them.
    let mut mounts = Vec::new();
    let volumes = at(pod, "spec.volumes")
        .as_array()
        .cloned()
        .unwrap_or_default();
    for vm in at(c, "volumeMounts").as_array().into_iter().flatten() {
        let vname = at(vm, "name").as_str().unwrap_or("");
        let mount_path = at(vm, "mountPath").as_str().unwrap_or("").to_owned();
        let Some(vol) = volumes
            .iter()
            .find(|v| at(v, "name").as_str() == Some(vname))
        else {
            problems.push(format!("{what_c}: volumeMount {vname}: no such volume"));
            continue;
        };
        let (kind, src_name, data_key) = if !at(vol, "configMap").is_null() {
            (
                "ConfigMap",
                at(vol, "configMap.name").as_str().unwrap_or(""),
                "data",
            )
        } else if !at(vol, "secret").is_null() {
            (
                "Secret",
                at(vol, "secret.secretName").as_str().unwrap_or(""),
                "stringData",
            )
        } else {
            continue;
        };
        if kind == "ConfigMap" && !at(vm, "subPath").is_null() {
            problems.push(format!(
                "{what_c}: volumeMount {vname} uses subPath: a subPath mount never receives ConfigMap updates, so limits would not reload"
            ));
        }
        let Some(src) = find(all, kind, src_name) else {
            problems.push(format!("{what_c}: volume {vname}: no {kind} {src_name}"));
            continue;
        };
        let data = at(&src.doc, data_key)
            .as_object()
            .cloned()
            .unwrap_or_default();
        // `items` picks keys (and renames them); without it, every key.
        let items: Vec<(String, String)> = match at(
            vol,
            if kind == "Secret" {
                "secret.items"
            } else {
                "configMap.items"
            },
        ) {
            Value::Array(a) => a
                .iter()
                .map(|i| {
                    (
                        at(i, "key").as_str().unwrap_or("").to_owned(),
                        at(i, "path").as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect(),
            _ => data.keys().map(|k| (k.clone(), k.clone())).collect(),
        };
        let local = tmp.join(vname);
        std::fs::create_dir_all(&local).expect("temp dir");
        for (key, path) in items {
            match data.get(&key).and_then(scalar) {
                Some(text) => std::fs::write(local.join(&path), text).expect("write mounted file"),
                None => problems.push(format!(
                    "{what_c}: volume {vname}: {kind} {src_name} has no key {key}"
                )),
            }
        }
        let sub = at(vm, "subPath").as_str().map(str::to_owned);
        mounts.push((mount_path, sub.map_or(local.clone(), |s| local.join(s))));
    }
    let mounts = Mounts(mounts);
    // Environment: the image's, then the container's, values resolved.
    let mut e: BTreeMap<String, String> = image.env();
    for var in at(c, "env").as_array().into_iter().flatten() {
        let name = at(var, "name").as_str().unwrap_or("").to_owned();
        let value = if let Some(v) = scalar(at(var, "value")) {
            Some(v)
        } else if let Some(field) = at(var, "valueFrom.fieldRef.fieldPath").as_str() {
            match field {
                "metadata.name" => Some(SAMPLE_POD_NAME.to_owned()),
                "metadata.namespace" => Some("default".to_owned()),
                other => {
                    problems.push(format!(
                        "{what_c}: env {name}: fieldRef {other} not simulated"
                    ));
                    None
                }
            }
        } else if !at(var, "valueFrom.secretKeyRef").is_null()
            || !at(var, "valueFrom.configMapKeyRef").is_null()
        {
            let (kind, r) = if at(var, "valueFrom.secretKeyRef").is_null() {
                ("ConfigMap", at(var, "valueFrom.configMapKeyRef"))
            } else {
                ("Secret", at(var, "valueFrom.secretKeyRef"))
            };
            let (src, key) = (
                at(r, "name").as_str().unwrap_or(""),
                at(r, "key").as_str().unwrap_or(""),
            );
            let data_key = if kind == "Secret" {
                "stringData"
            } else {
                "data"
            };
            match find(all, kind, src).and_then(|m| at(&m.doc, data_key).get(key).and_then(scalar))
            {
                Some(v) => Some(v),
                None => {
                    problems.push(format!(
                        "{what_c}: env {name}: {kind} {src} has no key {key}"
                    ));
                    None
                }
            }
        } else {
            problems.push(format!(
                "{what_c}: env {name}: neither value nor a known valueFrom"
            ));
            None
        };
        if let Some(v) = value {
            e.insert(name, v);
        }
    }
    let group_instance = at(c, "env")
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| at(v, "name").as_str() == Some("THROTTLE__KAFKA__GROUP_INSTANCE_ID"));
    if group_instance
        .is_none_or(|v| at(v, "valueFrom.fieldRef.fieldPath").as_str() != Some("metadata.name"))
    {
        problems.push(format!("{what_c}: THROTTLE__KAFKA__GROUP_INSTANCE_ID does not come from the pod name (metadata.name)"));
    }
    let checked = match env::check(&what_c, &e, parsed.config.as_deref(), &mounts) {
        Ok(c) => c,
        Err(err) => {
            problems.push(err);
            return (problems, learnt);
        }
    };
    if let Some(file) = &checked.limits_file {
        if let Err(err) = env::check_limits_file(&what_c, file) {
            problems.push(err);
        }
    }
    let s = checked.settings;
    // Ports and probes.
    let listen_port = s.http.listen.port();
    let ports: Vec<(Option<String>, u64)> = at(c, "ports")
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            (
                at(p, "name").as_str().map(str::to_owned),
                at(p, "containerPort").as_u64().unwrap_or(0),
            )
        })
        .collect();
    let resolve_port = |p: &Value| -> Option<u64> {
        match p {
            Value::Number(n) => n.as_u64(),
            Value::String(name) => ports
                .iter()
                .find(|(n, _)| n.as_deref() == Some(name))
                .map(|(_, p)| *p),
            _ => None,
        }
    };
    if !ports.iter().any(|(_, p)| *p == u64::from(listen_port)) {
        problems.push(format!(
            "{what_c}: no containerPort {listen_port} (http.listen {})",
            s.http.listen
        ));
    }
    if !s.http.listen.ip().is_unspecified() {
        problems.push(format!(
            "{what_c}: http.listen {} is not reachable by the kubelet's probes",
            s.http.listen
        ));
    }
    for (probe, path) in [
        ("readinessProbe", "/readyz"),
        ("livenessProbe", "/healthz"),
        ("startupProbe", "/healthz"),
    ] {
        let p = at(c, probe);
        if p.is_null() {
            if probe != "startupProbe" {
                problems.push(format!("{what_c}: no {probe}"));
            }
            continue;
        }
        if at(p, "httpGet.path").as_str() != Some(path) {
            problems.push(format!(
                "{what_c}: {probe} asks {:?}, not {path}",
                at(p, "httpGet.path")
            ));
        }
        if resolve_port(at(p, "httpGet.port")) != Some(u64::from(listen_port)) {
            problems.push(format!(
                "{what_c}: {probe} port {} is not the listen port {listen_port}",
                at(p, "httpGet.port")
            ));
        }
    }
    // Shutdown: the grace period outlasts the worker's own drain.
    let grace = at(pod, "spec.terminationGracePeriodSeconds")
        .as_u64()
        .unwrap_or(30);
    if grace <= s.worker.shutdown_timeout.as_secs() {
        problems.push(format!(
            "{what}: terminationGracePeriodSeconds {grace} is not longer than worker.shutdown_timeout {:?}",
            s.worker.shutdown_timeout
        ));
    }
    // Security: non-root (the image's uid), read-only root, no capabilities.
    let psc = at(pod, "spec.securityContext");
    let csc = at(c, "securityContext");
    let pick = |k: &str| {
        if at(csc, k).is_null() {
            at(psc, k)
        } else {
            at(csc, k)
        }
    };
    if pick("runAsNonRoot").as_bool() != Some(true) {
        problems.push(format!("{what_c}: runAsNonRoot is not true"));
    }
    let uid = pick("runAsUser").as_u64();
    match (uid, dockerfile::user_id(image)) {
        (Some(0), _) => problems.push(format!("{what_c}: runAsUser 0 is root")),
        (Some(u), Ok(img)) if u != u64::from(img) => problems.push(format!(
            "{what_c}: runAsUser {u} is not the image's USER {img}"
        )),
        _ => {}
    }
    if at(csc, "readOnlyRootFilesystem").as_bool() != Some(true) {
        problems.push(format!("{what_c}: readOnlyRootFilesystem is not true"));
    }
    if at(csc, "allowPrivilegeEscalation").as_bool() != Some(false) {
        problems.push(format!("{what_c}: allowPrivilegeEscalation is not false"));
    }
    let drops: Vec<&str> = at(csc, "capabilities.drop")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !drops.contains(&"ALL") {
        problems.push(format!("{what_c}: capabilities.drop does not include ALL"));
    }
    // Resources: requests and a memory limit that holds the worker's bound.
    if at(c, "resources.requests.cpu").is_null() || at(c, "resources.requests.memory").is_null() {
        problems.push(format!("{what_c}: no cpu and memory requests"));
    }
    let need = s.worker.max_buffered_bytes as u64 + RSS_OVERHEAD_BYTES;
    match at(c, "resources.limits.memory").as_str().and_then(bytes) {
        Some(limit) if limit >= need => {}
        Some(limit) => problems.push(format!(
            "{what_c}: memory limit {} MiB is under worker.max_buffered_bytes plus librdkafka's buffers ({} MiB): the worker would be OOM-killed",
            limit >> 20,
            need >> 20
        )),
        None => problems.push(format!("{what_c}: no memory limit")),
    }
    // Service and PodMonitor reach the metrics port of these pods.
    let named_metrics = |port: &Value| resolve_port(port) == Some(u64::from(listen_port));
    for m in all.iter().filter(|m| m.kind() == "Service") {
        if !labels_match(at(&m.doc, "spec.selector"), &pod_labels) {
            problems.push(format!(
                "{}: Service {}: selector does not match the pods",
                m.file,
                m.name()
            ));
        }
        let ok = at(&m.doc, "spec.ports")
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| {
                at(p, "name").as_str() == Some("metrics")
                    && at(p, "port").as_u64() == Some(u64::from(listen_port))
                    && named_metrics(at(p, "targetPort"))
            });
        if !ok {
            problems.push(format!(
                "{}: Service {}: no port `metrics` {listen_port} to the container's",
                m.file,
                m.name()
            ));
        }
    }
    for m in all.iter().filter(|m| m.kind() == "PodMonitor") {
        if !labels_match(at(&m.doc, "spec.selector.matchLabels"), &pod_labels) {
            problems.push(format!(
                "{}: PodMonitor {}: selector does not match the pods",
                m.file,
                m.name()
            ));
        }
        let ok = at(&m.doc, "spec.podMetricsEndpoints")
            .as_array()
            .into_iter()
            .flatten()
            .any(|ep| {
                named_metrics(at(ep, "port"))
                    && at(ep, "path").as_str().is_none_or(|p| p == "/metrics")
            });
        if !ok {
            problems.push(format!(
                "{}: PodMonitor {}: no endpoint on the metrics port and /metrics",
                m.file,
                m.name()
            ));
        }
    }
    // Secrets hold placeholders only.
    for m in all.iter().filter(|m| m.kind() == "Secret") {
        for (k, v) in at(&m.doc, "stringData").as_object().into_iter().flatten() {
            let v = scalar(v).unwrap_or_default();
            let sensitive = |s: &str| {
                ["password", "username", "url"]
                    .iter()
                    .any(|w| s.contains(w))
            };
            // A whole value (`redis-url`), or each credential line of a
            // file held in the Secret (`kafka.toml`).
            let unmarked = if sensitive(k) {
                !v.contains("CHANGE-ME")
            } else {
                v.lines().any(|l| sensitive(l) && !l.contains("CHANGE-ME"))
            };
            if unmarked {
                problems.push(format!("{}: Secret {}: {k} is not a CHANGE-ME placeholder: never commit a real credential", m.file, m.name()));
            }
        }
        if !at(&m.doc, "data").is_null() {
            problems.push(format!(
                "{}: Secret {}: use stringData (placeholders readable in review), not data",
                m.file,
                m.name()
            ));
        }
    }
    // KEDA: the Deployment, the group and topic the worker uses.
    for m in all.iter().filter(|m| m.kind() == "ScaledObject") {
        let w = format!("{}: ScaledObject {}", m.file, m.name());
        learnt.scalers.push(m.file.clone());
        let target = at(&m.doc, "spec.scaleTargetRef");
        // KEDA's default kind is Deployment.
        if at(target, "name").as_str() != Some(dep.name())
            || at(target, "kind").as_str().unwrap_or("Deployment") != dep.kind()
        {
            problems.push(format!(
                "{w}: scaleTargetRef {target} is not {} {}",
                dep.kind(),
                dep.name()
            ));
        }
        for t in at(&m.doc, "spec.triggers").as_array().into_iter().flatten() {
            match at(t, "type").as_str() {
                Some("kafka") => {
                    let md = at(t, "metadata");
                    // Lag no replica can move must not scale out: stuck
                    // partitions and those whose every job waits for a
                    // limit (docs/src/deploy/autoscaling.md).
                    for (key, want) in [
                        ("excludePersistentLag", "true"),
                        ("limitToPartitionsWithLag", "true"),
                        ("allowIdleConsumers", "false"),
                    ] {
                        if at(md, key).as_str() != Some(want) {
                            problems.push(format!(
                                "{w}: kafka trigger {key} is {}, not \"{want}\"",
                                at(md, key)
                            ));
                        }
                    }
                    for (key, want) in [
                        ("consumerGroup", s.kafka.group_id.as_str()),
                        ("topic", s.kafka.topic.as_str()),
                        ("bootstrapServers", s.kafka.brokers.as_str()),
                    ] {
                        if at(md, key).as_str() != Some(want) {
                            problems.push(format!(
                                "{w}: kafka trigger {key} {} is not the worker's {want}",
                                at(md, key)
                            ));
                        }
                    }
                    if let Some(auth) = at(t, "authenticationRef.name").as_str() {
                        match find(all, "TriggerAuthentication", auth) {
                            Some(ta) => {
                                for r in at(&ta.doc, "spec.secretTargetRef")
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                {
                                    let (sn, key) = (
                                        at(r, "name").as_str().unwrap_or(""),
                                        at(r, "key").as_str().unwrap_or(""),
                                    );
                                    if find(all, "Secret", sn).is_none_or(|sec| {
                                        at(&sec.doc, "stringData").get(key).is_none()
                                    }) {
                                        problems.push(format!("{}: TriggerAuthentication {auth}: Secret {sn} has no key {key}", ta.file));
                                    }
                                }
                            }
                            None => problems.push(format!("{w}: no TriggerAuthentication {auth}")),
                        }
                    }
                }
                Some("prometheus") => match at(t, "metadata.query").as_str() {
                    Some(q) => learnt.scaler_queries.push((m.file.clone(), q.to_owned())),
                    None => problems.push(format!("{w}: prometheus trigger without a query")),
                },
                other => problems.push(format!("{w}: trigger type {other:?} not checked")),
            }
        }
    }
    problems.extend(check_statefulset(all, dep, &pod_labels));
    problems.extend(check_disruption_budget(all, &pod_labels));
    problems.extend(check_network_policy(all, &s, &pod_labels, listen_port));
    learnt.settings = Some(s);
    (problems, learnt)
}

/// A StatefulSet's `serviceName` is a headless Service of its pods (the
/// pods' DNS names come from it; the API refuses a StatefulSet without).
fn check_statefulset(all: &[Manifest], sts: &Manifest, pod_labels: &Value) -> Vec<String> {
    if sts.kind() != "StatefulSet" {
        return Vec::new();
    }
    let w = format!("{}: StatefulSet {}", sts.file, sts.name());
    let Some(name) = at(&sts.doc, "spec.serviceName").as_str() else {
        return vec![format!("{w}: no spec.serviceName")];
    };
    match find(all, "Service", name) {
        None => vec![format!("{w}: serviceName {name}: no such Service")],
        Some(svc) if at(&svc.doc, "spec.clusterIP").as_str() != Some("None") => {
            vec![format!(
                "{w}: Service {name} is not headless (clusterIP: None)"
            )]
        }
        Some(svc) if !labels_match(at(&svc.doc, "spec.selector"), pod_labels) => {
            vec![format!("{w}: Service {name} does not select the pods")]
        }
        Some(_) => Vec::new(),
    }
}

/// One PodDisruptionBudget covers the pods and lets at least one go.
fn check_disruption_budget(all: &[Manifest], pod_labels: &Value) -> Vec<String> {
    let pdbs: Vec<&Manifest> = all
        .iter()
        .filter(|m| m.kind() == "PodDisruptionBudget")
        .collect();
    let [pdb] = pdbs.as_slice() else {
        return vec![format!(
            "deploy/kubernetes: expected one PodDisruptionBudget, found {}",
            pdbs.len()
        )];
    };
    let w = format!("{}: PodDisruptionBudget {}", pdb.file, pdb.name());
    let mut problems = Vec::new();
    if !labels_match(at(&pdb.doc, "spec.selector.matchLabels"), pod_labels) {
        problems.push(format!("{w}: selector does not match the pods"));
    }
    // minAvailable would block every drain of a single replica; a
    // maxUnavailable of 0 blocks all of them.
    match at(&pdb.doc, "spec.maxUnavailable").as_u64() {
        Some(n) if n >= 1 => {}
        _ => problems.push(format!(
            "{w}: maxUnavailable {} lets no pod be evicted: node drains would hang",
            at(&pdb.doc, "spec.maxUnavailable")
        )),
    }
    problems
}

/// The NetworkPolicy covers the pods, admits scrapes on the metrics port,
/// and lets out DNS and the ports of Kafka, Redis and the downstream the
/// container's settings name.
fn check_network_policy(
    all: &[Manifest],
    s: &Settings,
    pod_labels: &Value,
    listen_port: u16,
) -> Vec<String> {
    let nps: Vec<&Manifest> = all.iter().filter(|m| m.kind() == "NetworkPolicy").collect();
    let [np] = nps.as_slice() else {
        return vec![format!(
            "deploy/kubernetes: expected one NetworkPolicy, found {}",
            nps.len()
        )];
    };
    let w = format!("{}: NetworkPolicy {}", np.file, np.name());
    let mut problems = Vec::new();
    if !labels_match(at(&np.doc, "spec.podSelector.matchLabels"), pod_labels) {
        problems.push(format!("{w}: podSelector does not match the pods"));
    }
    let types: Vec<&str> = at(&np.doc, "spec.policyTypes")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if types != ["Ingress", "Egress"] {
        problems.push(format!("{w}: policyTypes {types:?}, not [Ingress, Egress]"));
    }
    // Ports of one direction's rules, as (port, protocol); a named port is
    // the container's `metrics`.
    let ports = |dir: &str| -> Vec<(String, String)> {
        at(&np.doc, &format!("spec.{dir}"))
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|rule| at(rule, "ports").as_array().cloned().unwrap_or_default())
            .map(|p| {
                let port = match at(&p, "port") {
                    Value::String(n) if n == "metrics" => listen_port.to_string(),
                    other => scalar(other).unwrap_or_default(),
                };
                let proto = at(&p, "protocol").as_str().unwrap_or("TCP").to_owned();
                (port, proto)
            })
            .collect()
    };
    let ingress = ports("ingress");
    if ingress != [(listen_port.to_string(), "TCP".to_owned())] {
        problems.push(format!(
            "{w}: ingress ports {ingress:?}: want the metrics port {listen_port}/TCP only"
        ));
    }
    let egress = ports("egress");
    let broker = s.kafka.brokers.split(',').next().unwrap_or("");
    for (what, addr) in [
        ("kafka.brokers", broker),
        ("redis.url", s.redis.url.as_str()),
        ("downstream.url", s.downstream.url.as_str()),
    ] {
        let Some(port) = super::port_of(addr) else {
            problems.push(format!("{w}: {what} names no port"));
            continue;
        };
        if !egress.contains(&(port.to_string(), "TCP".to_owned())) {
            problems.push(format!(
                "{w}: no egress to port {port}/TCP ({what}); egress ports: {egress:?}"
            ));
        }
    }
    if !egress.contains(&("53".to_owned(), "UDP".to_owned())) {
        problems.push(format!("{w}: no egress to DNS (53/UDP)"));
    }
    problems
}

/// Every label of `selector` is on the pod with the same value.
fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}
