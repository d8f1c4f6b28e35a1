//! The deployment files checked against the repository and the binary
//! (issue 9). There is no Docker engine or Kubernetes cluster here, so the
//! Dockerfile, `docker-compose.yml`, the Prometheus and Grafana files and
//! `deploy/kubernetes/` are parsed and held against what the binary really
//! accepts and exports: its config structs (`config::load_from`, unknown
//! keys refused), its command line (`cli::Cli`), its metrics (a scrape of a
//! running worker). Each checker is also shown a broken copy of a file and
//! must reject it for the right reason. Checkers: `tests/deploy/`.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::compose::{self, Compose};
use super::dockerfile::{self, Dockerfile};
use super::kube::{self, Manifest};
use super::prometheus::Prometheus;
use super::promql::{self, Exposition};
use super::{at, env, read, repo};
use crate::common::worker::{job, job_of_cost, Arrival, Bench, Downstream, Running};
use crate::common::{free_port, rule};
use axum::http::StatusCode;
use throttle_worker::config::SellerConfig;

fn dockerfile_of(text: &str) -> Dockerfile {
    Dockerfile::parse(text).unwrap_or_else(|e| panic!("Dockerfile: {e}"))
}

fn compose_of(text: &str) -> Compose {
    Compose::parse(text, &repo()).unwrap_or_else(|e| panic!("{e}"))
}

fn assert_none(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

/// Every compose-side check at once: services, topics, Prometheus, Grafana.
fn compose_problems(c: &Compose, df: &Dockerfile) -> (Vec<String>, compose::Learnt) {
    let (mut problems, learnt) = compose::check(c, df);
    if let Some(w) = &learnt.worker {
        problems.extend(compose::check_topics(c, w));
        match compose::prometheus_config(c) {
            Ok(prom) => problems.extend(compose::check_prometheus(
                c,
                &prom,
                &[("worker", w.http.listen.port())],
            )),
            Err(e) => problems.push(e),
        }
    }
    problems.extend(compose::check_grafana(c).0);
    (problems, learnt)
}

fn kube_problems(all: &[Manifest], df: &Dockerfile, tmp: &Path) -> (Vec<String>, kube::Learnt) {
    let dir = repo().join("deploy/kubernetes/base");
    let kustomization = all
        .iter()
        .find(|m| m.kind() == "Kustomization")
        .map(|m| m.doc.clone());
    kube::check(all, df, kustomization.as_ref(), &dir, tmp)
}

#[test]
fn dockerfile_builds_from_the_repository_and_runs_unprivileged() {
    let df = dockerfile_of(&read("Dockerfile"));
    let problems = dockerfile::check(
        &df,
        &read(".dockerignore"),
        &read("scripts/install-deps.sh"),
        &repo(),
    );
    assert_none("Dockerfile", &problems);
    let run = df.final_stage();
    assert_eq!(dockerfile::user_id(run), Ok(10001));
    assert_eq!(
        run.env().get("THROTTLE__HTTP__LISTEN").map(String::as_str),
        Some("0.0.0.0:9898")
    );
    // The CMD is a command line the binary accepts.
    let argv = super::cli::argv(
        &run.exec_form("ENTRYPOINT").unwrap().unwrap(),
        &run.exec_form("CMD").unwrap().unwrap(),
    );
    assert_eq!(
        super::cli::parse(&argv).map(|p| p.subcommand),
        Ok("run".to_owned())
    );
}

/// The run stage installs a package for every shared library the binary
/// links, beyond libc6 and libgcc-s1 (in debian:bookworm-slim already).
/// Read from `ldd` of the test build and `dpkg -S` on this Debian host, the
/// image's own base; skipped (with a note) where either tool is missing.
#[test]
fn image_installs_every_library_the_binary_links() {
    let bin = crate::common::procs::BIN;
    let ldd = match std::process::Command::new("ldd").arg(bin).output() {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => return eprintln!("skipped: no ldd"),
    };
    let libs: Vec<String> = ldd
        .lines()
        .filter_map(|l| {
            l.split("=>")
                .nth(1)?
                .split_whitespace()
                .next()
                .map(str::to_owned)
        })
        .filter(|p| p.starts_with('/'))
        .collect();
    assert!(!libs.is_empty(), "ldd listed no library:\n{ldd}");
    let df = dockerfile_of(&read("Dockerfile"));
    let installed = df.final_stage().apt_packages();
    const IN_BASE: &[&str] = &["libc6", "libgcc-s1"];
    for lib in libs {
        // dpkg knows a file by the path its package ships it at, which on
        // a merged-/usr system may be the /lib or the /usr/lib spelling.
        let real =
            std::fs::canonicalize(&lib).map_or_else(|_| lib.clone(), |p| p.display().to_string());
        let mut candidates = vec![lib.clone(), real.clone()];
        for p in [&lib, &real] {
            match p.strip_prefix("/usr") {
                Some(rest) => candidates.push(rest.to_owned()),
                None => candidates.push(format!("/usr{p}")),
            }
        }
        let mut package = None;
        for path in &candidates {
            let Ok(owner) = std::process::Command::new("dpkg")
                .arg("-S")
                .arg(path)
                .output()
            else {
                return eprintln!("skipped: no dpkg");
            };
            let text = String::from_utf8_lossy(&owner.stdout);
            if owner.status.success() {
                package = text.split(':').next().map(|p| p.trim().to_owned());
                break;
            }
        }
        let package = package
            .unwrap_or_else(|| panic!("no Debian package owns {lib} (tried {candidates:?})"));
        assert!(
            IN_BASE.contains(&package.as_str()) || installed.contains(&package),
            "the binary links {lib} from package {package}, which the run stage does not install (it installs {installed:?})"
        );
    }
}

#[test]
fn compose_references_exist_and_agree_with_the_binary() {
    let df = dockerfile_of(&read("Dockerfile"));
    let c = compose_of(&read("docker-compose.yml"));
    let (problems, learnt) = compose_problems(&c, &df);
    assert_none("docker-compose.yml", &problems);
    let worker = learnt.worker.expect("the worker service loads");
    assert_eq!(learnt.worker_replicas, Some(3), "deploy.replicas");
    assert_eq!(worker.http.listen.port(), 9898);
    assert_eq!(worker.downstream.url, "http://stub:8080/registrations");
    assert_eq!(worker.kafka.brokers, "kafka:9092");
}

#[test]
fn compose_creates_exactly_the_workers_topics() {
    let c = compose_of(&read("docker-compose.yml"));
    let created = compose::created_topics(&c, "kafka-init").expect("kafka-init's topics");
    let mut names: Vec<&str> = created.iter().map(|(t, _)| t.as_str()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "product-registrations",
            "product-registrations.dlq",
            "product-registrations.retry.10m",
            "product-registrations.retry.1h",
            "product-registrations.retry.1m",
            "product-registrations.retry.5s",
        ]
    );
    assert!(created.contains(&("product-registrations".to_owned(), 6)));
    let df = dockerfile_of(&read("Dockerfile"));
    let worker = compose::check(&c, &df).1.worker.expect("worker settings");
    assert_none("kafka-init", &compose::check_topics(&c, &worker));
}

#[test]
fn prometheus_scrapes_every_worker_replica() {
    let c = compose_of(&read("docker-compose.yml"));
    let prom = compose::prometheus_config(&c).expect("prometheus.yml through its mount");
    assert_none(
        "prometheus.yml",
        &compose::check_prometheus(&c, &prom, &[("worker", 9898)]),
    );
    assert_eq!(
        at(&prom, "scrape_configs.0.dns_sd_configs.0.names.0").as_str(),
        Some("worker")
    );
}

#[test]
fn grafana_provisions_the_datasource_and_the_dashboard() {
    let c = compose_of(&read("docker-compose.yml"));
    let (problems, dashboards) = compose::check_grafana(&c);
    assert_none("grafana", &problems);
    let names: Vec<String> = dashboards
        .iter()
        .map(|(p, _)| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["throttle-worker.json"]);
    let d = &dashboards[0].1;
    let titles: BTreeSet<String> = compose::panels(d)
        .iter()
        .filter_map(|p| at(p, "title").as_str().map(str::to_owned))
        .collect();
    let ids: Vec<u64> = compose::panels(d)
        .iter()
        .filter_map(|p| at(p, "id").as_u64())
        .collect();
    assert_eq!(
        ids.len(),
        ids.iter().collect::<BTreeSet<_>>().len(),
        "panel ids are unique"
    );
    // The panels the issue asks for.
    for want in [
        "Consumer lag per partition (messages)",
        "Consumer lag per partition (seconds)",
        "Backlog: limit-bound vs capacity-bound",
        "Decisions per second by result",
        "Refusals per second by rule",
        "Retry-after given to refused sellers",
        "Downstream answers per second by class",
        "Downstream latency",
        "Redis call latency",
        "Limiter errors per second by kind",
        "Rebalances",
        "Jobs done and dead-lettered per second",
        "In flight / waiting / parked",
        // Issue 23: the alerts' signals, the limiter's savings, dead letters.
        "Replicas scraped and ready",
        "Buffered bytes / max_buffered_bytes",
        "Failure ratios: limiter and downstream",
        "Limiter calls avoided per second by seller",
        "Asks per limiter call (coalescing)",
        "Dead letters by reason (last 10 minutes)",
        "Group lag trend and backlog cause",
    ] {
        assert!(
            titles.contains(want),
            "no panel {want:?}; panels: {titles:?}"
        );
    }
    // Every panel, rows included, says what it shows.
    for p in compose::panels(d) {
        let desc = at(p, "description").as_str().unwrap_or("");
        assert!(
            desc.len() > 20,
            "panel {:?} has no description",
            at(p, "title")
        );
    }
    // Template variables: the datasource, the scrape job, the group, the
    // named sellers (from label_values, so the lists follow the data).
    let vars: Vec<(&str, &str)> = at(d, "templating.list")
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                at(v, "name").as_str().unwrap_or(""),
                at(v, "type").as_str().unwrap_or(""),
            )
        })
        .collect();
    assert_eq!(
        vars,
        [
            ("datasource", "datasource"),
            ("job", "query"),
            ("group", "query"),
            ("seller", "query"),
        ]
    );
    for v in at(d, "templating.list").as_array().unwrap().iter().skip(1) {
        let q = at(v, "query.query").as_str().unwrap_or("");
        assert!(
            super::prometheus::label_values_call(q).is_some(),
            "variable {}: {q:?} is not label_values(...)",
            at(v, "name")
        );
    }
    // Every query follows $job; the lag panels $group; the per-seller ones $seller.
    let queries = compose::queries(d);
    for (title, expr) in &queries {
        assert!(
            expr.contains("job=~\"$job\""),
            "panel {title:?}: `{expr}` ignores $job"
        );
        if expr.contains("throttle_consumer_") {
            assert!(
                expr.contains("group=~\"$group\""),
                "panel {title:?}: `{expr}` ignores $group"
            );
        }
    }
    for title in [
        "Limit-bound backlog by named seller",
        "Decisions per second by named seller",
        "Limiter calls avoided per second by seller",
    ] {
        assert!(
            queries
                .iter()
                .any(|(t, e)| t == title && e.contains("seller=~\"$seller\"")),
            "panel {title:?} ignores $seller"
        );
    }
}

#[test]
fn kubernetes_manifests_agree_with_the_binary() {
    let df = dockerfile_of(&read("Dockerfile"));
    let all = kube::load_dir(&repo().join("deploy/kubernetes/base")).expect("manifests parse");
    let tmp = tempfile::tempdir().unwrap();
    let (problems, learnt) = kube_problems(&all, &df, tmp.path());
    assert_none("deploy/kubernetes/base", &problems);
    let s = learnt.settings.expect("the container's settings load");
    assert_eq!(
        s.kafka.group_instance_id,
        kube::SAMPLE_POD_NAME,
        "static membership from the pod name"
    );
    assert_eq!(s.http.listen.port(), 9898);
    assert_eq!(
        s.kafka
            .consumer_config()
            .get("sasl.mechanism")
            .map(String::as_str),
        Some("SCRAM-SHA-512"),
        "the Secret's kafka.toml reaches librdkafka"
    );
    // Both ScaledObjects (the lag one and the Prometheus alternative)
    // target the Deployment; they share a name, so only one can exist.
    let mut scalers = learnt.scalers.clone();
    scalers.sort();
    assert_eq!(
        scalers,
        [
            "keda-scaledobject-prometheus.yaml",
            "keda-scaledobject.yaml"
        ]
    );
    let names: BTreeSet<&str> = all
        .iter()
        .filter(|m| m.kind() == "ScaledObject")
        .map(Manifest::name)
        .collect();
    assert_eq!(
        names.len(),
        1,
        "the alternative ScaledObject replaces the lag one: same name"
    );
    assert_eq!(learnt.scaler_queries.len(), 1);
    assert!(
        learnt.scaler_queries[0].1.contains("cause=\"capacity\""),
        "{:?}",
        learnt.scaler_queries
    );
    // kustomization lists every manifest but the alternative.
    let k = all
        .iter()
        .find(|m| m.kind() == "Kustomization")
        .expect("kustomization.yaml");
    let listed: BTreeSet<&str> = at(&k.doc, "resources")
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    let files: BTreeSet<&str> = all
        .iter()
        .map(|m| m.file.as_str())
        .filter(|f| *f != "kustomization.yaml" && *f != "keda-scaledobject-prometheus.yaml")
        .collect();
    assert_eq!(listed, files);
}

/// The kubectl that renders the overlays: `$KUBECTL` if set, else the
/// pinned one scripts/check-deploy.sh installs into its virtualenv (run by
/// scripts/test.sh before the tests), else the first on `PATH`.
fn kubectl() -> std::path::PathBuf {
    if let Some(k) = std::env::var_os("KUBECTL") {
        return k.into();
    }
    let pinned = repo().join("target/deploy-venv/bin/kubectl");
    if pinned.exists() {
        return pinned;
    }
    "kubectl".into()
}

/// `kubectl kustomize deploy/kubernetes/overlays/NAME`, as manifests named
/// `overlays/NAME`. kubectl is required (scripts/check-deploy.sh installs
/// it): a missing one fails the test rather than skipping it.
fn render_overlay(name: &str) -> Vec<Manifest> {
    let dir = repo().join("deploy/kubernetes/overlays").join(name);
    let kubectl = kubectl();
    let out = std::process::Command::new(&kubectl)
        .arg("kustomize")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "{} kustomize {}: {e} (kubectl 1.21 or later is needed to render the overlays: scripts/check-deploy.sh installs one)",
                kubectl.display(),
                dir.display()
            )
        });
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    kube::load_text(
        &format!("overlays/{name}"),
        &String::from_utf8_lossy(&out.stdout),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// Each overlay, as kustomize renders it, passes every check the base's
/// files do; the StatefulSet runs exactly the Deployment's pods, with the
/// scaler and the governing Service following it.
#[test]
fn kubernetes_overlays_render_and_agree_with_the_binary() {
    let df = dockerfile_of(&read("Dockerfile"));
    let mut overlays: Vec<String> = std::fs::read_dir(repo().join("deploy/kubernetes/overlays"))
        .expect("deploy/kubernetes/overlays")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    overlays.sort();
    assert_eq!(overlays, ["deployment", "statefulset"]);
    let base = kube::load_dir(&repo().join("deploy/kubernetes/base")).unwrap();
    let base_dep = base
        .iter()
        .find(|m| m.kind() == "Deployment")
        .expect("the base Deployment");
    for (overlay, kind) in [("deployment", "Deployment"), ("statefulset", "StatefulSet")] {
        let all = render_overlay(overlay);
        let tmp = tempfile::tempdir().unwrap();
        let dir = repo().join("deploy/kubernetes/base");
        let (problems, learnt) = kube::check(&all, &df, None, &dir, tmp.path());
        assert_none(&format!("overlay {overlay}"), &problems);
        assert_eq!(learnt.workload_kind, kind, "overlay {overlay}");
        let s = learnt.settings.expect("the container's settings load");
        assert_eq!(
            s.kafka.group_instance_id,
            kube::SAMPLE_POD_NAME,
            "overlay {overlay}: static membership from the pod name"
        );
        let kinds: BTreeSet<&str> = all.iter().map(Manifest::kind).collect();
        for want in [
            "PodDisruptionBudget",
            "NetworkPolicy",
            "PrometheusRule",
            "PodMonitor",
            "ScaledObject",
        ] {
            assert!(
                kinds.contains(want),
                "overlay {overlay}: no {want} in {kinds:?}"
            );
        }
        let workload = all.iter().find(|m| m.kind() == kind).unwrap();
        assert_eq!(
            at(&workload.doc, "spec.template"),
            at(&base_dep.doc, "spec.template"),
            "overlay {overlay}: the pod template is the base Deployment's"
        );
    }
    // The StatefulSet check refuses a governing Service that is not headless.
    let mut all = render_overlay("statefulset");
    for m in all.iter_mut() {
        if m.name() == "throttle-worker-headless" {
            m.doc["spec"]["clusterIP"] = serde_json::Value::String("10.0.0.1".into());
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let (problems, _) = kube::check(
        &all,
        &df,
        None,
        &repo().join("deploy/kubernetes/base"),
        tmp.path(),
    );
    assert!(
        problems.iter().any(|p| p.contains("is not headless")),
        "{problems:?}"
    );
}

/// The alert names of a rules file's groups, in order.
fn alert_rules(groups: &serde_json::Value) -> Vec<serde_json::Value> {
    groups
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| at(g, "rules").as_array().cloned().unwrap_or_default())
        .filter(|r| !at(r, "alert").is_null())
        .collect()
}

/// The PrometheusRule is the alerts file, each alert has a severity, a
/// summary and a runbook page in the book (docs/src/operate/alerts/), and the promtool unit
/// test makes each one fire (promtool itself checks that it does:
/// scripts/check-deploy.sh).
#[test]
fn alerts_ship_alike_with_runbooks_and_firing_tests() {
    let file = super::yaml_file("deploy/prometheus/alerts.yml");
    let rule = super::yaml_file("deploy/kubernetes/base/prometheusrule.yaml");
    assert_eq!(at(&rule, "kind").as_str(), Some("PrometheusRule"));
    assert_eq!(
        at(&rule, "spec.groups"),
        at(&file, "groups"),
        "deploy/kubernetes/base/prometheusrule.yaml's spec.groups differ from deploy/prometheus/alerts.yml's groups: edit both"
    );
    let alerts = alert_rules(at(&file, "groups"));
    assert!(alerts.len() >= 10, "{} alerts", alerts.len());
    // One runbook page per alert in the book, named after it.
    let runbooks = repo().join("docs/src/operate/alerts");
    let pages: BTreeSet<String> = std::fs::read_dir(&runbooks)
        .expect("docs/src/operate/alerts")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let index = read("docs/src/operate/alerts.md");
    let tests = super::yaml_file("deploy/prometheus/alerts.test.yml");
    let cases: Vec<&serde_json::Value> = at(&tests, "tests")
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| at(t, "alert_rule_test").as_array().into_iter().flatten())
        .collect();
    let mut names = BTreeSet::new();
    for a in &alerts {
        let name = at(a, "alert").as_str().unwrap();
        assert!(names.insert(name), "alert {name} twice");
        let severity = at(a, "labels.severity").as_str();
        assert!(
            matches!(severity, Some("critical" | "warning" | "info")),
            "{name}: severity {severity:?}"
        );
        let summary = at(a, "annotations.summary").as_str().unwrap_or("");
        // absent() has no series, so no labels to name.
        let absent = at(a, "expr")
            .as_str()
            .unwrap_or("")
            .trim()
            .starts_with("absent(");
        assert!(
            absent || summary.contains("{{ $labels."),
            "{name}: summary {summary:?} names no label"
        );
        let url = at(a, "annotations.runbook_url").as_str().unwrap_or("");
        let page = format!("docs/src/operate/alerts/{name}.md");
        assert!(
            url.ends_with(&page),
            "{name}: runbook_url {url:?} is not the book's {page}"
        );
        assert!(
            read(&page).starts_with(&format!("# {name}\n")),
            "{name}: {page} does not start with `# {name}`"
        );
        assert!(
            index.contains(&format!("(alerts/{name}.md)")),
            "{name}: not in the alert index, docs/src/operate/alerts.md"
        );
        let fires = cases.iter().any(|c| {
            at(c, "alertname").as_str() == Some(name)
                && at(c, "exp_alerts")
                    .as_array()
                    .is_some_and(|e| !e.is_empty())
        });
        assert!(fires, "{name}: no promtool test case where it fires");
    }
    // No runbook for an alert that no longer exists.
    for page in &pages {
        let alert = page.trim_end_matches(".md");
        assert!(
            names.contains(alert),
            "docs/src/operate/alerts/{page} is a runbook for no alert"
        );
    }
}

#[test]
fn limits_files_load_as_valid_limits() {
    let example = repo().join("config/limits.example.toml");
    let policy = env::check_limits_file("config/limits.example.toml", &example)
        .unwrap_or_else(|e| panic!("{e}"));
    // A default rule, a bulk tier, named sellers, one of them unlimited.
    assert!(
        matches!(policy.resolve("any-unnamed-seller"), throttle_worker::limiter::Resolved::Limited { seller, .. } if !seller.is_empty()),
        "a default rule"
    );
    assert!(policy.tiers().any(|(t, _)| t == "bulk"), "a bulk tier");
    let named: Vec<&str> = policy.named_sellers().collect();
    assert!(named.len() >= 2, "named sellers: {named:?}");
    assert!(
        named.iter().any(|s| matches!(
            policy.resolve(s),
            throttle_worker::limiter::Resolved::Unlimited
        )),
        "one unlimited seller: {named:?}"
    );
    // The ConfigMap's limits.toml, as the pod reads it.
    let all = kube::load_dir(&repo().join("deploy/kubernetes/base")).unwrap();
    let cm = all
        .iter()
        .find(|m| m.kind() == "ConfigMap")
        .expect("a ConfigMap");
    let text = cm.doc["data"]["limits.toml"]
        .as_str()
        .expect("limits.toml in the ConfigMap");
    let tmp = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
    std::fs::write(tmp.path(), text).unwrap();
    env::check_limits_file("configmap.yaml", tmp.path()).unwrap_or_else(|e| panic!("{e}"));
    // And a broken one is refused with the key.
    std::fs::write(tmp.path(), text.replacen("limit = 100", "limit = 0", 1)).unwrap();
    let err = env::check_limits_file("configmap.yaml", tmp.path()).expect_err("limit 0");
    assert!(err.contains("limits.default[0].limit"), "{err}");
}

/// A mutation: in a copy of `file`, `from` (which must occur) becomes `to`,
/// and the checkers must report a problem containing `expect`.
struct Mutation {
    row: u32,
    file: &'static str,
    from: &'static str,
    to: &'static str,
    expect: &'static str,
}

/// All problems the checkers find with `file` replaced by `text`.
fn problems_with(file: &str, text: &str) -> Vec<String> {
    let (df_text, ignore) = match file {
        "Dockerfile" => (text.to_owned(), read(".dockerignore")),
        ".dockerignore" => (read("Dockerfile"), text.to_owned()),
        _ => (read("Dockerfile"), read(".dockerignore")),
    };
    let df = match Dockerfile::parse(&df_text) {
        Ok(df) => df,
        Err(e) => return vec![e],
    };
    let mut problems = dockerfile::check(&df, &ignore, &read("scripts/install-deps.sh"), &repo());
    if let Some(k8s) = file.strip_prefix("deploy/kubernetes/base/") {
        let mut all: Vec<Manifest> = kube::load_dir(&repo().join("deploy/kubernetes/base"))
            .unwrap()
            .into_iter()
            .filter(|m| m.file != k8s)
            .collect();
        match kube::load_text(k8s, text) {
            Ok(ms) => all.extend(ms),
            Err(e) => return vec![e],
        }
        let tmp = tempfile::tempdir().unwrap();
        problems.extend(kube_problems(&all, &df, tmp.path()).0);
        return problems;
    }
    let c = if file == "docker-compose.yml" {
        match Compose::parse(text, &repo()) {
            Ok(c) => c,
            Err(e) => return vec![e],
        }
    } else {
        compose_of(&read("docker-compose.yml"))
    };
    if file == "deploy/prometheus/prometheus.yml" {
        let prom = super::yaml_docs(text).unwrap().remove(0);
        problems.extend(compose::check_prometheus(&c, &prom, &[("worker", 9898)]));
        return problems;
    }
    problems.extend(compose_problems(&c, &df).0);
    problems
}

#[test]
fn checkers_reject_broken_copies() {
    let rows = [
        Mutation {
            row: 1,
            file: "docker-compose.yml",
            from: "THROTTLE__KAFKA__BROKERS: kafka:9092",
            to: "THROTTLE__KAFKA__BROKERZ: kafka:9092",
            expect: "brokerz",
        },
        Mutation {
            row: 2,
            file: "docker-compose.yml",
            from: "http://stub:8080/registrations",
            to: "http://stub:8081/registrations",
            expect: "--listen port",
        },
        Mutation {
            row: 3,
            file: "docker-compose.yml",
            from: "\"--rate\", \"500\"",
            to: "\"--rates\", \"500\"",
            expect: "does not parse",
        },
        Mutation {
            row: 4,
            file: "docker-compose.yml",
            from: "stop_grace_period: 45s",
            to: "stop_grace_period: 10s",
            expect: "stop_grace_period",
        },
        Mutation {
            row: 5,
            file: "docker-compose.yml",
            from: "retry.1m --partitions 6",
            to: "retry.1m --partitions 3",
            expect: "kafka-init creates",
        },
        Mutation {
            row: 6,
            file: "docker-compose.yml",
            from: "\"noeviction\"",
            to: "\"allkeys-lru\"",
            expect: "noeviction",
        },
        Mutation {
            row: 7,
            file: "docker-compose.yml",
            from: "./config:/etc/throttle-worker:ro",
            to: "./configs:/etc/throttle-worker:ro",
            expect: "does not exist",
        },
        Mutation {
            row: 8,
            file: "docker-compose.yml",
            from: "    healthcheck:\n      disable: true\n    restart: on-failure",
            to: "    restart: on-failure",
            expect: "inherits the image's healthcheck",
        },
        Mutation {
            row: 9,
            file: "docker-compose.yml",
            from: "THROTTLE__REDIS__URL: redis://redis:6379",
            to: "THROTTLE__REDIS__URL: redis://cache:6379",
            expect: "no service cache",
        },
        Mutation {
            row: 10,
            file: "docker-compose.yml",
            from: "THROTTLE__LIMITS__FILE: /etc/throttle-worker/limits.example.toml",
            to: "THROTTLE__LIMITS__FILE: /etc/throttle-worker/limits.toml",
            expect: "no such file",
        },
        Mutation {
            row: 11,
            file: "docker-compose.yml",
            from: "/var/lib/grafana/dashboards/throttle-worker.json",
            to: "/var/lib/grafana/dashboards/worker.json",
            expect: "does not exist",
        },
        Mutation {
            row: 12,
            file: "deploy/prometheus/prometheus.yml",
            from: "port: 9898",
            to: "port: 9899",
            expect: "no dns_sd_configs job scrapes service worker",
        },
        Mutation {
            row: 13,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "terminationGracePeriodSeconds: 45",
            to: "terminationGracePeriodSeconds: 15",
            expect: "terminationGracePeriodSeconds 15",
        },
        Mutation {
            row: 14,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "path: /readyz",
            to: "path: /ready",
            expect: "readinessProbe asks",
        },
        Mutation {
            row: 15,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "containerPort: 9898",
            to: "containerPort: 9899",
            expect: "no containerPort 9898",
        },
        Mutation {
            row: 16,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "runAsUser: 10001",
            to: "runAsUser: 0",
            expect: "is root",
        },
        Mutation {
            row: 17,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "readOnlyRootFilesystem: true",
            to: "readOnlyRootFilesystem: false",
            expect: "readOnlyRootFilesystem",
        },
        Mutation {
            row: 18,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "mountPath: /etc/throttle-worker/limits\n",
            to: "mountPath: /etc/throttle-worker/limits\n              subPath: limits.toml\n",
            expect: "subPath",
        },
        Mutation {
            row: 19,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "value: \"134217728\"",
            to: "value: \"536870912\"",
            expect: "memory limit",
        },
        Mutation {
            row: 20,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "name: THROTTLE__REDIS__URL",
            to: "name: THROTTLE__REDIS__URI",
            expect: "uri",
        },
        Mutation {
            row: 21,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "fieldPath: metadata.name",
            to: "fieldPath: metadata.namespace",
            expect: "pod name",
        },
        Mutation {
            row: 22,
            file: "deploy/kubernetes/base/deployment.yaml",
            from: "key: redis-url",
            to: "key: redis-uri",
            expect: "has no key redis-uri",
        },
        Mutation {
            row: 23,
            file: "deploy/kubernetes/base/keda-scaledobject.yaml",
            from: "consumerGroup: throttle-worker ",
            to: "consumerGroup: throttle-workers ",
            expect: "consumerGroup",
        },
        Mutation {
            row: 24,
            file: "deploy/kubernetes/base/keda-scaledobject.yaml",
            from: "    name: throttle-worker\n  minReplicaCount",
            to: "    name: throttle-workers\n  minReplicaCount",
            expect: "scaleTargetRef",
        },
        Mutation {
            row: 25,
            file: "deploy/kubernetes/base/configmap.yaml",
            from: "limit = 100, period = \"1m\" }]\n",
            to: "limit = 0, period = \"1m\" }]\n",
            expect: "limit must be at least 1",
        },
        Mutation {
            row: 26,
            file: "deploy/kubernetes/base/secret.yaml",
            from: "\"sasl.password\" = \"CHANGE-ME\"",
            to: "\"sasl.password\" = \"hunter2\"",
            expect: "placeholder",
        },
        Mutation {
            row: 27,
            file: "deploy/kubernetes/base/service.yaml",
            from: "targetPort: metrics",
            to: "targetPort: http",
            expect: "no port `metrics`",
        },
        Mutation {
            row: 34,
            file: "deploy/kubernetes/base/pdb.yaml",
            from: "maxUnavailable: 1",
            to: "maxUnavailable: 0",
            expect: "lets no pod be evicted",
        },
        Mutation {
            row: 35,
            file: "deploy/kubernetes/base/networkpolicy.yaml",
            from: "port: 6379",
            to: "port: 6380",
            expect: "no egress to port 6379/TCP (redis.url)",
        },
        Mutation {
            row: 36,
            file: "deploy/kubernetes/base/networkpolicy.yaml",
            from: "port: metrics",
            to: "port: 9090",
            expect: "want the metrics port 9898/TCP only",
        },
        Mutation {
            row: 37,
            file: "deploy/kubernetes/base/networkpolicy.yaml",
            from:
                "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: throttle-worker\n",
            to: "  podSelector:\n    matchLabels:\n      app.kubernetes.io/name: throttle\n",
            expect: "podSelector does not match the pods",
        },
        Mutation {
            row: 38,
            file: "deploy/kubernetes/base/keda-scaledobject.yaml",
            from: "excludePersistentLag: \"true\"",
            to: "excludePersistentLag: \"false\"",
            expect: "excludePersistentLag",
        },
        Mutation {
            row: 28,
            file: "Dockerfile",
            from: "USER 10001:10001",
            to: "USER throttle",
            expect: "not numeric",
        },
        Mutation {
            row: 29,
            file: "Dockerfile",
            from: "zlib1g-dev python3",
            to: "zlib1g-dev",
            expect: "does not install python3",
        },
        Mutation {
            row: 30,
            file: "Dockerfile",
            from: "COPY lua ./lua\n",
            to: "",
            expect: "lua/common.lua",
        },
        Mutation {
            row: 31,
            file: "Dockerfile",
            from: "ENV THROTTLE__HTTP__LISTEN=0.0.0.0:9898",
            to: "ENV THROTTLE__HTTP__LISTEN=127.0.0.1:9898",
            expect: "not reachable",
        },
        Mutation {
            row: 32,
            file: "Dockerfile",
            from: "COPY --chmod=0755 deploy",
            to: "COPY deploy",
            expect: "--chmod",
        },
        Mutation {
            row: 39,
            file: "Dockerfile",
            from: "cargo build --release --locked --no-default-features",
            to: "cargo build --release --locked",
            expect: "the production image would ship the dev tools",
        },
        Mutation {
            row: 40,
            file: "Dockerfile",
            from: "COPY --from=build-dev /usr/local/bin/throttle-worker",
            to: "COPY --from=build /usr/local/bin/throttle-worker",
            expect: "not built with the default features",
        },
        Mutation {
            row: 41,
            file: "Dockerfile",
            from: "FROM runtime AS dev",
            to: "FROM runtime AS tools",
            expect: "no stage named `dev`",
        },
        Mutation {
            row: 42,
            file: "docker-compose.yml",
            from: "build: *throttle-dev-build\n    image: throttle-worker:dev\n    command: [\"stub\"",
            to: "build: *throttle-build\n    image: throttle-worker:local\n    command: [\"stub\"",
            expect: "`stub` is a dev tool",
        },
        Mutation {
            row: 43,
            file: "docker-compose.yml",
            from: "build: *throttle-build\n    image: throttle-worker:local\n    command: [\"run\"]",
            to: "build: *throttle-dev-build\n    image: throttle-worker:local\n    command: [\"run\"]",
            expect: "`run` runs the production image",
        },
        Mutation {
            row: 44,
            file: "docker-compose.yml",
            from: "build: *throttle-dev-build\n    image: throttle-worker:dev\n    command: [\"produce\"",
            to: "build: *throttle-dev-build\n    image: throttle-worker:local\n    command: [\"produce\"",
            expect: "give each target its own tag",
        },
        Mutation {
            row: 33,
            file: ".dockerignore",
            from: "!lua\n",
            to: "",
            expect: "COPY lua: excluded by .dockerignore",
        },
    ];
    for m in rows {
        let original = read(m.file);
        assert!(
            original.contains(m.from),
            "row {}: {} no longer contains {:?}: update the row",
            m.row,
            m.file,
            m.from
        );
        let broken = original.replacen(m.from, m.to, 1);
        let problems = problems_with(m.file, &broken);
        assert!(
            problems.iter().any(|p| p.contains(m.expect)),
            "row {}: {}: {:?} → {:?} was not reported as {:?}; problems:\n  {}",
            m.row,
            m.file,
            m.from,
            m.to,
            m.expect,
            problems.join("\n  ")
        );
    }
}

/// One scrape of the worker's `/metrics`; `None` before it listens.
async fn scrape(url: &str) -> Option<String> {
    let r = reqwest::get(url).await.ok()?;
    (r.status() == 200).then_some(())?;
    r.text().await.ok()
}

/// Every PromQL query the deployment ships: the dashboard's and the
/// Prometheus-triggered ScaledObject's, as (where, expr).
fn shipped_queries() -> Vec<(String, String)> {
    let d: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/throttle-worker.json"))
            .expect("dashboard JSON");
    let mut qs: Vec<(String, String)> = compose::queries(&d)
        .into_iter()
        .map(|(title, e)| (format!("dashboard panel {title:?}"), e))
        .collect();
    let df = dockerfile_of(&read("Dockerfile"));
    let all = kube::load_dir(&repo().join("deploy/kubernetes/base")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    qs.extend(kube_problems(&all, &df, tmp.path()).1.scaler_queries);
    qs
}

fn query_problems(queries: &[(String, String)], expo: &Exposition) -> Vec<String> {
    queries
        .iter()
        .flat_map(|(what, e)| promql::check(what, e, expo))
        .collect()
}

/// Runs `deploy/docker/healthcheck.sh` as the image's HEALTHCHECK does,
/// with the image's THROTTLE__HTTP__LISTEN on `port`.
fn healthcheck(port: u16) -> (bool, String) {
    let out = std::process::Command::new("bash")
        .arg(repo().join("deploy/docker/healthcheck.sh"))
        .env("THROTTLE__HTTP__LISTEN", format!("0.0.0.0:{port}"))
        .output()
        .expect("bash runs");
    let mut err = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() {
        err.push_str(&format!(" ({})", out.status));
    }
    (out.status.success(), err)
}

/// A one-answer HTTP server on a loopback port that replies 503 to the
/// first request, then stops: the healthcheck must fail on it.
fn serve_503_once() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            use std::io::{Read, Write};
            // Read the request's head, as an HTTP server does (bash
            // writes it a line at a time).
            let mut head = Vec::new();
            let mut buf = [0u8; 256];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            let _ = s.write_all(b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    port
}

/// Every metric, label and label value the dashboard and the Prometheus
/// scaler query is one the running replicas export (a fast check of the
/// names), then Debian's Prometheus, scraping both replicas with the
/// shipped config and alerts, evaluates every panel, variable, scaler and
/// alert query ([`prometheus_checks`]). Two replicas: one in this process,
/// one the binary as a child process. The run makes the event-driven series
/// appear: a named seller held to its limit (limit-bound backlog, refusals,
/// retry-afters, calls avoided), a job over the rule's capacity (`never`, a
/// dead letter), a malformed record, a downstream 429, a slow downstream
/// with two slots (capacity-bound backlog), lag statistics. The image's
/// healthcheck script is run against the in-process worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_scaler_and_healthcheck_hold_against_a_running_worker() {
    let started = Instant::now();
    let queries = shipped_queries();
    assert!(queries.len() > 30, "{} queries", queries.len());
    let bench = Bench::new("deploy", 2);
    let down = Downstream::start(Arc::new(|a: &Arrival, earlier: usize| {
        if a.seller == "held" && earlier == 0 {
            (StatusCode::TOO_MANY_REQUESTS, Some("1".to_owned()))
        } else {
            (StatusCode::OK, None)
        }
    }))
    .await;
    down.set_delay(Duration::from_millis(100));
    let mut settings = bench.settings(&down.url);
    let port = free_port();
    settings.http.listen = format!("127.0.0.1:{port}").parse().unwrap();
    settings.downstream.concurrency = 2;
    settings
        .kafka
        .consumer_properties
        .insert("statistics.interval.ms".to_owned(), "300".to_owned());
    let policy = crate::common::policy_with_sellers(
        vec![rule("fixed_window", 1000, "1s", None)],
        vec![(
            "hot",
            SellerConfig {
                rules: Some(vec![rule("fixed_window", 3, "1s", None)]),
                ..Default::default()
            },
        )],
    );
    // A Redis failure is not part of this run: the limiter-error family
    // gets zero series so its label names (from its label type) show, and
    // the `shadow` kind the alerts and the dashboard leave out.
    for kind in ["timeout", "shadow"] {
        drop(
            throttle_worker::telemetry::metrics::metrics()
                .limiter_errors
                .get_or_create(&throttle_worker::telemetry::metrics::KindLabel { kind }),
        );
    }
    let worker = Running::start(settings, policy);
    // A second replica: the binary, as a child process in the same group
    // with the same limits (the Redis key prefix is shared, so `hot` has
    // one limit for both). Killed when the test ends.
    let scratch = crate::common::procs::Scratch::new("deploy-prometheus");
    let port2 = free_port();
    let limits = r#"[{ algorithm = "fixed_window", limit = 1000, period = "1s" }]

[limits.sellers]
"hot" = { rules = [{ algorithm = "fixed_window", limit = 3, period = "1s" }] }"#;
    let config = crate::common::procs::WorkerConfig {
        bootstrap: &bench.bootstrap(),
        group: &bench.group,
        jobs_topic: &bench.topics.jobs,
        retry_topic: &bench.topics.retry,
        dlq_topic: &bench.topics.dlq,
        key_prefix: &bench.prefix,
        rules: limits,
        shutdown_timeout: "5s",
    }
    .write(scratch.path(), "replica-2");
    let mut cmd = std::process::Command::new(crate::common::procs::BIN);
    cmd.arg("run")
        .arg("--config")
        .arg(&config)
        .env("THROTTLE__HTTP__LISTEN", format!("127.0.0.1:{port2}"))
        .env("THROTTLE__DOWNSTREAM__URL", &down.url);
    let _replica2 = crate::common::procs::Proc::spawn("replica-2", cmd, scratch.path(), false);
    // A real Prometheus scrapes both replicas from the start, with the
    // shipped prometheus.yml (its DNS discovery replaced by their
    // addresses) and the shipped alerts.
    let prom = Prometheus::start(&[format!("127.0.0.1:{port}"), format!("127.0.0.1:{port2}")]);
    let mut records: Vec<_> = (0..12).map(|i| job(&format!("hot-{i}"), "hot")).collect();
    records.push(job_of_cost("hot-heavy", "hot", 50));
    records.extend((0..40).map(|i| job(&format!("cold-{i}"), &format!("cold-{}", i % 10))));
    records.extend((0..2).map(|i| job(&format!("held-{i}"), "held")));
    records.push((None, b"{not json".to_vec()));
    bench.produce(&records).await;

    // The fleet's exposition: both replicas' scrapes merged (the group's
    // partitions, and so the events, are split between them).
    let urls = [port, port2].map(|p| format!("http://127.0.0.1:{p}/metrics"));
    let mut expo = Exposition::default();
    let deadline = Instant::now() + Duration::from_secs(45);
    let mut scrapes = 0;
    // `hot` gets a job a turn until a job arrives while it is refused and
    // joins its queue without a limiter call (calls avoided): records
    // fetched together with the first wave are all queued before its first
    // call, so only a later one shows it.
    let mut trickle = 0;
    let problems = loop {
        for url in &urls {
            if let Some(text) = scrape(url).await {
                expo.add(&text);
                scrapes += 1;
            }
        }
        if !expo
            .samples
            .contains_key("throttle_limiter_calls_avoided_total")
            && trickle < 60
        {
            bench
                .produce(&[job(&format!("hot-late-{trickle}"), "hot")])
                .await;
            trickle += 1;
        }
        let problems = query_problems(&queries, &expo);
        if problems.is_empty() || Instant::now() > deadline {
            break problems;
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    };
    assert_none(
        &format!("queries against {scrapes} scrapes of two running replicas"),
        &problems,
    );

    // The image's healthcheck: 200 from a live worker, not a 503, not a
    // closed port.
    let (ok, err) = healthcheck(port);
    assert!(ok, "healthcheck failed on a live worker: {err}");
    let (ok, err) = healthcheck(serve_503_once());
    assert!(
        !ok && err.contains("503"),
        "healthcheck passed a 503 (ok {ok}): {err}"
    );
    let (ok, err) = healthcheck(free_port());
    assert!(
        !ok && err.contains("nothing listens"),
        "healthcheck passed a closed port: {err}"
    );
    let prom_checked = prometheus_checks(&prom, 2, &queries).await;
    worker.stop().await;
    drop(prom);

    // The checker rejects what a typo would ship.
    let rows: [(u32, &str, &str, &str); 5] = [
        (
            1,
            "throttle_jobs_done_total",
            "throttle_jobs_finished_total",
            "exports no metric throttle_jobs_finished_total",
        ),
        (2, "by (class)", "by (klass)", "groups by"),
        (
            3,
            "cause=\"capacity\"",
            "cause=\"capacty\"",
            "never exported cause=\"capacty\"",
        ),
        (
            4,
            " cause=\"limit\"}",
            " caus=\"limit\"}",
            "has no label caus",
        ),
        (
            5,
            "throttle_consumer_lag_seconds",
            "throttle_consumer_lag_second",
            "exports no metric throttle_consumer_lag_second",
        ),
    ];
    for (row, from, to, expect) in rows {
        let mutated: Vec<(String, String)> = queries
            .iter()
            .map(|(w, e)| (w.clone(), e.replacen(from, to, 1)))
            .collect();
        assert_ne!(mutated, queries, "row {row}: no query contains {from:?}");
        let problems = query_problems(&mutated, &expo);
        assert!(
            problems.iter().any(|p| p.contains(expect)),
            "row {row}: {from:?} → {to:?} not reported as {expect:?}: {problems:?}"
        );
    }
    eprintln!(
        "{} queries checked against {scrapes} scrapes, {prom_checked} through Prometheus, in {:.1?}",
        queries.len(),
        started.elapsed()
    );
}

/// The selector of every series an alert reads, and of every label it
/// matches on (`count(name{label!=""})`), target labels aside: each must
/// return something from the running worker, or the alert watches nothing.
fn alert_series_queries(expr: &str) -> Vec<String> {
    let refs = promql::refs(expr).unwrap_or_else(|e| panic!("alert `{expr}`: {e}"));
    let mut out = Vec::new();
    for sel in refs.selectors {
        out.push(format!("count({})", sel.name));
        for (label, _, _) in &sel.matchers {
            if !promql::TARGET_LABELS.contains(&label.as_str()) {
                out.push(format!("count({}{{{label}!=\"\"}})", sel.name));
            }
        }
    }
    out
}

/// What the real Prometheus must show while the workers run: every
/// replica's target up, every rule of the shipped alerts loaded and
/// evaluated without error, every alert expression valid and every series
/// it reads present,
/// every dashboard panel, scaler query and template variable returning
/// series. Retried until all hold or a minute passes (rates need a few
/// scrapes at the shipped 5 s interval). Returns how many queries it ran.
async fn prometheus_checks(
    prom: &Prometheus,
    replicas: usize,
    queries: &[(String, String)],
) -> usize {
    prom.wait_ready(Duration::from_secs(30)).await;
    let job = at(&prom.config, "scrape_configs.0.job_name")
        .as_str()
        .expect("a job_name")
        .to_owned();
    let alerts = alert_rules(at(
        &super::yaml_file("deploy/prometheus/alerts.yml"),
        "groups",
    ));
    let dashboard: serde_json::Value =
        serde_json::from_str(&read("deploy/grafana/dashboards/throttle-worker.json")).unwrap();
    let variables: Vec<(String, String)> = at(&dashboard, "templating.list")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let q = at(v, "query.query").as_str()?;
            Some((at(v, "name").as_str()?.to_owned(), q.to_owned()))
        })
        .collect();
    assert!(variables.len() >= 3, "template variables: {variables:?}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut problems = Vec::new();
        let mut ran = 0;
        match prom.targets().await {
            Ok(t) if t.len() == replicas && t.iter().all(|(_, h)| h == "up") => {}
            other => problems.push(format!("not {replicas} targets up: {other:?}")),
        }
        match prom.rules().await {
            Ok(rules) => {
                if rules.len() != alerts.len() {
                    problems.push(format!(
                        "Prometheus loaded {} rules, alerts.yml has {}",
                        rules.len(),
                        alerts.len()
                    ));
                }
                for r in &rules {
                    if at(r, "health").as_str() != Some("ok") {
                        problems.push(format!(
                            "rule {}: health {} ({})",
                            at(r, "name"),
                            at(r, "health"),
                            at(r, "lastError")
                        ));
                    }
                }
            }
            Err(e) => problems.push(format!("/api/v1/rules: {e}")),
        }
        for a in &alerts {
            let name = at(a, "alert").as_str().unwrap();
            let expr = at(a, "expr").as_str().unwrap();
            ran += 1;
            if let Err(e) = prom.query(expr).await {
                problems.push(format!("alert {name}: invalid: {e}"));
            }
            for q in alert_series_queries(expr) {
                ran += 1;
                match prom.query(&q).await {
                    Ok(r) if !r.is_empty() => {}
                    Ok(_) => problems.push(format!("alert {name}: `{q}` is empty")),
                    Err(e) => problems.push(format!("alert {name}: `{q}`: {e}")),
                }
            }
        }
        for (what, expr) in queries {
            let q = super::prometheus::as_grafana_sends(expr, &job);
            ran += 1;
            match prom.query(&q).await {
                Ok(r) if !r.is_empty() => {}
                Ok(_) => problems.push(format!("{what}: `{q}` returned no series")),
                Err(e) => problems.push(format!("{what}: `{q}`: {e}")),
            }
        }
        for (name, q) in &variables {
            let (selector, label) = super::prometheus::label_values_call(q).unwrap_or_else(|| {
                panic!("variable {name}: {q} is not label_values(SELECTOR, LABEL)")
            });
            let selector = super::prometheus::as_grafana_sends(&selector, &job);
            ran += 1;
            match prom.label_values(&label, &selector).await {
                Ok(v) if !v.is_empty() => {}
                Ok(_) => problems.push(format!("variable {name}: {q} lists nothing")),
                Err(e) => problems.push(format!("variable {name}: {q}: {e}")),
            }
        }
        if problems.is_empty() {
            return ran;
        }
        assert!(
            Instant::now() < deadline,
            "through Prometheus ({}), {} problem(s):\n  {}\n--- prometheus log:\n{}",
            prom.url,
            problems.len(),
            problems.join("\n  "),
            prom.log_text()
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// The Prometheus checks can fail: a broken query is refused, a misspelt
/// metric returns nothing; and the shipped alerts load into it, with
/// ThrottleWorkerReplicaDown's expression selecting a target that is down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_reports_broken_queries() {
    // Nothing to scrape: a closed loopback port.
    let prom = Prometheus::start(&[format!("127.0.0.1:{}", free_port())]);
    prom.wait_ready(Duration::from_secs(30)).await;
    let err = prom
        .query("sum by (class (rate(throttle_downstream_requests_total[20s]))")
        .await
        .expect_err("an unclosed parenthesis");
    assert!(err.contains("bad_data"), "{err}");
    let r = prom
        .query("sum(throttle_jobs_finished_total)")
        .await
        .unwrap();
    assert!(r.is_empty(), "{r:?}");
    // The alerts load: every rule of alerts.yml, none with an error.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let rules = prom.rules().await.unwrap();
        let n = alert_rules(at(
            &super::yaml_file("deploy/prometheus/alerts.yml"),
            "groups",
        ))
        .len();
        if rules.len() == n && rules.iter().all(|r| !at(r, "health").is_null()) {
            // The target is down: ThrottleWorkerReplicaDown's expression
            // selects it (it fires after its `for`).
            let up = prom
                .query(r#"up{job=~"(.+/)?throttle-worker"} == 0"#)
                .await
                .unwrap();
            if !up.is_empty() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "rules {rules:?}\n{}",
            prom.log_text()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
