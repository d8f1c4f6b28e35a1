//! `docker-compose.yml` and the files it mounts (`deploy/prometheus`,
//! `deploy/grafana`), held against the repository and the binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use throttle_worker::config::Settings;

use super::dockerfile::Dockerfile;
use super::env::{self, Mounts};
use super::{at, cli, host_of, port_of, resolve, scalar, yaml_docs};

/// A parsed compose file and the directory its relative paths start from.
pub struct Compose {
    pub doc: Value,
    pub dir: PathBuf,
}

/// What the checks learnt about the worker service, for the tests' own
/// assertions.
#[derive(Default)]
pub struct Learnt {
    pub worker: Option<Settings>,
    pub worker_replicas: Option<u64>,
}

impl Compose {
    pub fn parse(text: &str, dir: &Path) -> Result<Compose, String> {
        let mut docs = yaml_docs(text).map_err(|e| format!("docker-compose.yml: not YAML: {e}"))?;
        if docs.len() != 1 {
            return Err("docker-compose.yml: expected one YAML document".into());
        }
        Ok(Compose {
            doc: docs.remove(0),
            dir: dir.to_path_buf(),
        })
    }

    pub fn services(&self) -> Vec<(&str, &Value)> {
        match at(&self.doc, "services") {
            Value::Object(m) => m.iter().map(|(k, v)| (k.as_str(), v)).collect(),
            _ => Vec::new(),
        }
    }

    pub fn service(&self, name: &str) -> Option<&Value> {
        at(&self.doc, "services").get(name)
    }

    /// Bind mounts of a service: (local source, container target).
    pub fn binds(&self, svc: &Value) -> Vec<(PathBuf, String)> {
        let Value::Array(vols) = at(svc, "volumes") else {
            return Vec::new();
        };
        vols.iter()
            .filter_map(|v| match v {
                Value::String(s) => {
                    let mut parts = s.split(':');
                    let (src, dst) = (parts.next()?, parts.next()?);
                    (src.starts_with('.') || src.starts_with('/'))
                        .then(|| (resolve(&self.dir, src), dst.to_owned()))
                }
                Value::Object(_) if at(v, "type").as_str() == Some("bind") => Some((
                    resolve(&self.dir, at(v, "source").as_str()?),
                    at(v, "target").as_str()?.to_owned(),
                )),
                _ => None,
            })
            .collect()
    }

    pub fn mounts(&self, svc: &Value) -> Mounts {
        Mounts(
            self.binds(svc)
                .into_iter()
                .map(|(src, dst)| (dst, src))
                .collect(),
        )
    }

    /// Whether the service runs this repository's image (built from its
    /// Dockerfile).
    pub fn ours(&self, svc: &Value) -> bool {
        let build = at(svc, "build");
        let context = build.as_str().or_else(|| at(build, "context").as_str());
        context.is_some_and(|c| resolve(&self.dir, c) == self.dir)
    }
}

/// `environment:` as a map (compose takes a map or a `K=V` list).
pub fn env_of(svc: &Value) -> BTreeMap<String, String> {
    match at(svc, "environment") {
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| (k.clone(), scalar(v).unwrap_or_default()))
            .collect(),
        Value::Array(a) => a
            .iter()
            .filter_map(|e| {
                e.as_str()?
                    .split_once('=')
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
            })
            .collect(),
        _ => BTreeMap::new(),
    }
}

/// `command:` as words (a list, or a string split on whitespace as compose
/// does for a string without quotes).
pub fn words(v: &Value) -> Option<Vec<String>> {
    match v {
        Value::Array(a) => Some(a.iter().filter_map(scalar).collect()),
        Value::String(s) => Some(s.split_whitespace().map(str::to_owned).collect()),
        _ => None,
    }
}

/// `45s`, `1m30s` (compose durations).
fn compose_duration(v: &Value) -> Option<Duration> {
    humantime::parse_duration(&scalar(v)?.replace(' ', "")).ok()
}

/// Container ports a service exposes (`expose`, and the container side of
/// `ports`).
fn container_ports(svc: &Value) -> Vec<u16> {
    let mut out = Vec::new();
    if let Value::Array(a) = at(svc, "expose") {
        out.extend(a.iter().filter_map(|p| scalar(p)?.parse::<u16>().ok()));
    }
    if let Value::Array(a) = at(svc, "ports") {
        out.extend(a.iter().filter_map(|p| {
            let p = scalar(p)?;
            p.rsplit(':').next()?.split('/').next()?.parse::<u16>().ok()
        }));
    }
    out
}

/// The subcommands built with the `dev-tools` feature only: absent from
/// the production image (the Dockerfile's last stage), present in its
/// `dev` stage.
pub const DEV_TOOLS: &[&str] = &["demo", "limiter-demo", "stub", "produce", "dev-broker"];

/// A service of our image builds the stage its subcommand is in: a dev
/// tool the `dev` target, anything else (the worker, the operator
/// commands) the production image, the default target. The two stages
/// share their runtime stage (checked with the Dockerfile), so the
/// environment, entrypoint and healthcheck read from the last stage hold
/// for both.
fn check_target(what: &str, svc: &Value, subcommand: &str, df: &Dockerfile) -> Vec<String> {
    let target = at(at(svc, "build"), "target").as_str();
    if let Some(t) = target {
        if df.stage(t).is_none() {
            return vec![format!(
                "{what}.build.target: no stage {t} in the Dockerfile"
            )];
        }
    }
    let tool = DEV_TOOLS.contains(&subcommand);
    match (tool, target) {
        (true, Some("dev")) | (false, None) => Vec::new(),
        (true, t) => vec![format!(
            "{what}: `{subcommand}` is a dev tool, absent from the production image: build target dev (not {t:?})"
        )],
        (false, Some(t)) => vec![format!(
            "{what}: `{subcommand}` runs the production image: no build target (not {t})"
        )],
    }
}

/// Every check of the compose file that needs only the repository and the
/// binary's definitions.
pub fn check(c: &Compose, df: &Dockerfile) -> (Vec<String>, Learnt) {
    let mut problems = Vec::new();
    let mut learnt = Learnt::default();
    let image_env = df.final_stage().env();
    let entrypoint = match df.final_stage().exec_form("ENTRYPOINT") {
        Some(Ok(w)) => w,
        _ => {
            return (
                vec!["Dockerfile: no exec-form ENTRYPOINT to run compose commands with".into()],
                learnt,
            )
        }
    };
    let image_health = match df.final_stage().healthcheck() {
        Some(Ok(w)) => w,
        _ => Vec::new(),
    };
    let names: Vec<&str> = c.services().iter().map(|(n, _)| *n).collect();
    for want in [
        "kafka",
        "kafka-init",
        "redis",
        "worker",
        "stub",
        "produce",
        "prometheus",
        "grafana",
    ] {
        if !names.contains(&want) {
            problems.push(format!("docker-compose.yml: no service {want}"));
        }
    }
    // The subcommand each service of our image runs.
    let mut runs: BTreeMap<&str, (Vec<String>, cli::Parsed)> = BTreeMap::new();
    // The build target of each image tag of ours: one tag, one image.
    let mut tags: BTreeMap<String, (Option<String>, &str)> = BTreeMap::new();
    for (name, svc) in c.services() {
        let what = format!("docker-compose.yml: services.{name}");
        // Build context and Dockerfile.
        let build = at(svc, "build");
        if !build.is_null() {
            let context = build
                .as_str()
                .or_else(|| at(build, "context").as_str())
                .unwrap_or(".");
            let dir = resolve(&c.dir, context);
            let dockerfile = at(build, "dockerfile").as_str().unwrap_or("Dockerfile");
            if !dir.is_dir() {
                problems.push(format!(
                    "{what}.build: context {context} is not a directory"
                ));
            } else if !dir.join(dockerfile).is_file() {
                problems.push(format!("{what}.build: no {dockerfile} in {context}"));
            }
        } else if at(svc, "image").as_str().is_none() {
            problems.push(format!("{what}: neither build nor image"));
        }
        // Bind mount sources exist.
        for (src, dst) in c.binds(svc) {
            if !src.exists() {
                problems.push(format!(
                    "{what}.volumes: {} (mounted at {dst}) does not exist",
                    src.display()
                ));
            }
        }
        // Container paths named in the environment or the command exist
        // in the mount that provides them.
        let mounts = c.mounts(svc);
        let cmd = words(at(svc, "command")).unwrap_or_default();
        let mut paths: Vec<String> = env_of(svc).into_values().collect();
        paths.extend(
            cmd.iter()
                .map(|w| w.split_once('=').map_or(w.as_str(), |(_, v)| v).to_owned()),
        );
        for p in paths.iter().filter(|p| p.starts_with('/')) {
            if let Some(local) = mounts.local(p) {
                if !local.exists() {
                    problems.push(format!(
                        "{what}: {p} is mounted from {}, which does not exist",
                        local.display()
                    ));
                }
            }
        }
        // depends_on names services.
        let deps: Vec<String> = match at(svc, "depends_on") {
            Value::Array(a) => a.iter().filter_map(scalar).collect(),
            Value::Object(m) => m.keys().cloned().collect(),
            _ => Vec::new(),
        };
        for d in deps {
            if !names.contains(&d.as_str()) {
                problems.push(format!("{what}.depends_on: no service {d}"));
            }
        }
        if !c.ours(svc) {
            continue;
        }
        // Our image: the command line parses with the binary's CLI.
        let command = if cmd.is_empty() {
            df.final_stage()
                .exec_form("CMD")
                .and_then(Result::ok)
                .unwrap_or_default()
        } else {
            cmd
        };
        let argv = cli::argv(&entrypoint, &command);
        match cli::parse(&argv) {
            Ok(parsed) => {
                // The image's healthcheck asks a worker's /healthz: any
                // other role must turn it off (or bring its own).
                let health = at(svc, "healthcheck");
                let disabled = at(health, "disable").as_bool() == Some(true);
                let own = words(at(health, "test")).unwrap_or_default();
                if parsed.subcommand == "run" {
                    if disabled {
                        problems.push(format!("{what}.healthcheck: disabled on a worker"));
                    } else if !own.is_empty()
                        && !own.contains(&image_health.first().cloned().unwrap_or_default())
                    {
                        problems.push(format!(
                            "{what}.healthcheck: {own:?} is not the image's {image_health:?}"
                        ));
                    }
                } else if !disabled && own.is_empty() {
                    problems.push(format!(
                        "{what}: `{}` inherits the image's healthcheck (a worker's /healthz), which it does not serve: disable it",
                        parsed.subcommand
                    ));
                }
                problems.extend(check_target(&what, svc, &parsed.subcommand, df));
                if let Some(tag) = at(svc, "image").as_str() {
                    let target = at(at(svc, "build"), "target").as_str().map(str::to_owned);
                    match tags.get(tag) {
                        Some((t, other)) if *t != target => problems.push(format!(
                            "{what}: image {tag} is built with target {target:?} here, {t:?} by services.{other}: give each target its own tag"
                        )),
                        Some(_) => {}
                        None => {
                            tags.insert(tag.to_owned(), (target, name));
                        }
                    }
                }
                runs.insert(name, (argv, parsed));
            }
            Err(e) => problems.push(format!("{what}.command: {argv:?} does not parse: {e}")),
        }
    }
    // Environment of every service of our image, loaded as the binary would.
    let mut settings: BTreeMap<&str, Settings> = BTreeMap::new();
    for (name, (_, parsed)) in &runs {
        let svc = c.service(name).expect("listed");
        let what = format!("docker-compose.yml: services.{name}");
        let mut e = image_env.clone();
        e.extend(env_of(svc));
        match env::check(&what, &e, parsed.config.as_deref(), &c.mounts(svc)) {
            Ok(checked) => {
                if let Some(file) = &checked.limits_file {
                    if let Err(err) = env::check_limits_file(&what, file) {
                        problems.push(err);
                    }
                }
                settings.insert(name, checked.settings);
            }
            Err(err) => problems.push(err),
        }
    }
    let workers: Vec<&str> = runs
        .iter()
        .filter(|(_, (_, p))| p.subcommand == "run")
        .map(|(n, _)| *n)
        .collect();
    if workers.is_empty() {
        problems.push("docker-compose.yml: no service runs `throttle-worker run`".into());
    }
    for name in &workers {
        let svc = c.service(name).expect("listed");
        let what = format!("docker-compose.yml: services.{name}");
        let Some(s) = settings.get(name) else {
            continue;
        };
        let port = s.http.listen.port();
        if !container_ports(svc).contains(&port) {
            problems.push(format!(
                "{what}: http.listen {} is not among the exposed ports {:?}",
                s.http.listen,
                container_ports(svc)
            ));
        }
        if !s.http.listen.ip().is_unspecified() {
            problems.push(format!(
                "{what}: http.listen {} is not reachable from other containers",
                s.http.listen
            ));
        }
        if !at(svc, "ports").is_null() {
            problems.push(format!("{what}.ports: a fixed host port can be bound by one replica only (scale breaks): use expose"));
        }
        match at(svc, "deploy.replicas").as_u64() {
            Some(n) if n >= 1 => learnt.worker_replicas = Some(n),
            _ => problems.push(format!("{what}.deploy.replicas: missing")),
        }
        match compose_duration(at(svc, "stop_grace_period")) {
            Some(g) if g > s.worker.shutdown_timeout => {}
            g => problems.push(format!(
                "{what}.stop_grace_period: {g:?} is not longer than worker.shutdown_timeout {:?} (Docker's default is 10s)",
                s.worker.shutdown_timeout
            )),
        }
        for (dep, cond) in [
            ("kafka-init", "service_completed_successfully"),
            ("redis", "service_healthy"),
        ] {
            if at(svc, &format!("depends_on.{dep}.condition")).as_str() != Some(cond) {
                problems.push(format!("{what}.depends_on.{dep}: want condition {cond}"));
            }
        }
        // The downstream is the stub, on the port it listens on.
        let url = &s.downstream.url;
        let host = host_of(url).unwrap_or_default();
        match runs.get(host.as_str()) {
            Some((argv, p)) if p.subcommand == "stub" => {
                let listen = cli::flag(argv, "--listen").and_then(|l| port_of(&l));
                if listen != port_of(url) {
                    problems.push(format!("{what}: downstream.url {url} and the stub's --listen port {listen:?} differ"));
                }
                let stub = c.service(&host).expect("listed");
                if let Some(p) = listen.filter(|p| !container_ports(stub).contains(p)) {
                    problems.push(format!("docker-compose.yml: services.{host}: listens on {p}, which it does not expose"));
                }
            }
            _ => problems.push(format!(
                "{what}: downstream.url {url}: no service {host} runs the stub"
            )),
        }
        // Kafka: each bootstrap address is one the broker advertises.
        check_brokers(c, &what, &s.kafka.brokers, &mut problems);
        // Redis: the service, with noeviction.
        let rhost = host_of(&s.redis.url).unwrap_or_default();
        match c.service(&rhost) {
            Some(r) => {
                let cmd = words(at(r, "command")).unwrap_or_default().join(" ");
                if !cmd.contains("--maxmemory-policy noeviction") {
                    problems.push(format!("docker-compose.yml: services.{rhost}: no --maxmemory-policy noeviction (an evicted limiter key resets a seller's limit early)"));
                }
                if !cmd.contains("--maxmemory ") {
                    problems.push(format!("docker-compose.yml: services.{rhost}: no --maxmemory (noeviction needs a bound to refuse at)"));
                }
            }
            None => problems.push(format!(
                "{what}: redis.url {}: no service {rhost}",
                s.redis.url
            )),
        }
        learnt.worker = Some(s.clone());
    }
    for (name, (_, p)) in &runs {
        if p.subcommand == "produce" {
            if let Some(s) = settings.get(name) {
                check_brokers(
                    c,
                    &format!("docker-compose.yml: services.{name}"),
                    &s.kafka.brokers,
                    &mut problems,
                );
            }
        }
    }
    (problems, learnt)
}

fn check_brokers(c: &Compose, what: &str, brokers: &str, problems: &mut Vec<String>) {
    for b in brokers.split(',').map(str::trim) {
        let host = host_of(b).unwrap_or_default();
        match c.service(&host) {
            Some(k) => {
                let advertised = env_of(k)
                    .get("KAFKA_ADVERTISED_LISTENERS")
                    .cloned()
                    .unwrap_or_default();
                if !advertised
                    .split(',')
                    .any(|l| l.split("://").nth(1) == Some(b))
                {
                    problems.push(format!("{what}: kafka.brokers {b} is not an advertised listener of {host} ({advertised})"));
                }
            }
            None => problems.push(format!("{what}: kafka.brokers {b}: no service {host}")),
        }
    }
}

/// `--create` lines of the topic-creating service: (topic, partitions).
pub fn created_topics(c: &Compose, service: &str) -> Result<Vec<(String, i32)>, String> {
    let svc = c
        .service(service)
        .ok_or_else(|| format!("docker-compose.yml: no service {service}"))?;
    let script = words(at(svc, "command")).unwrap_or_default().join("\n");
    let mut out = Vec::new();
    for line in script.lines().filter(|l| l.contains("--create")) {
        let w: Vec<&str> = line.split_whitespace().collect();
        let value = |flag: &str| {
            w.iter()
                .position(|x| *x == flag)
                .and_then(|i| w.get(i + 1))
                .map(|s| s.to_string())
        };
        if !w.contains(&"--if-not-exists") {
            return Err(format!(
                "services.{service}: `{line}`: no --if-not-exists (a second `up` would fail)"
            ));
        }
        let topic =
            value("--topic").ok_or_else(|| format!("services.{service}: `{line}`: no --topic"))?;
        let partitions = value("--partitions")
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("services.{service}: `{line}`: no numeric --partitions"))?;
        out.push((topic, partitions));
    }
    Ok(out)
}

/// The topics kafka-init creates are exactly the worker's
/// (`KafkaSettings::topic_specs` with the jobs topic's partition count).
pub fn check_topics(c: &Compose, worker: &Settings) -> Vec<String> {
    let created = match created_topics(c, "kafka-init") {
        Ok(t) => t,
        Err(e) => return vec![format!("docker-compose.yml: {e}")],
    };
    let Some((_, jobs_partitions)) = created.iter().find(|(t, _)| *t == worker.kafka.topic) else {
        return vec![format!(
            "docker-compose.yml: kafka-init does not create the jobs topic {}",
            worker.kafka.topic
        )];
    };
    let mut want = worker.kafka.topic_specs(*jobs_partitions);
    let mut have = created.clone();
    want.sort();
    have.sort();
    if want == have {
        Vec::new()
    } else {
        vec![format!(
            "docker-compose.yml: kafka-init creates {have:?}, the worker needs {want:?}"
        )]
    }
}

/// Prometheus scrapes every worker service by DNS, on its metrics port.
pub fn check_prometheus(c: &Compose, prom: &Value, workers: &[(&str, u16)]) -> Vec<String> {
    let mut problems = Vec::new();
    let Value::Array(jobs) = at(prom, "scrape_configs") else {
        return vec!["prometheus.yml: no scrape_configs".into()];
    };
    for (service, port) in workers {
        let found = jobs.iter().any(|j| {
            let path_ok = at(j, "metrics_path")
                .as_str()
                .is_none_or(|p| p == "/metrics");
            let Value::Array(sds) = at(j, "dns_sd_configs") else {
                return false;
            };
            path_ok
                && sds.iter().any(|sd| {
                    let names = words(at(sd, "names")).unwrap_or_default();
                    names.iter().any(|n| n == service)
                        && at(sd, "type").as_str() == Some("A")
                        && at(sd, "port").as_u64() == Some(u64::from(*port))
                })
        });
        if !found {
            problems.push(format!(
                "prometheus.yml: no dns_sd_configs job scrapes service {service} (type A, port {port}, /metrics)"
            ));
        }
    }
    // Every rule file reaches the container: Prometheus reads a relative
    // path from the config file's directory, so each must be mounted there.
    let rule_files = words(at(prom, "rule_files")).unwrap_or_default();
    if rule_files.is_empty() {
        problems.push("prometheus.yml: no rule_files: the alerts are not loaded".into());
    }
    if let Some(svc) = c.service("prometheus") {
        let mounts = c.mounts(svc);
        for f in &rule_files {
            let target = if f.starts_with('/') {
                f.clone()
            } else {
                format!("/etc/prometheus/{f}")
            };
            match mounts.local(&target) {
                Some(local) if local.is_file() => {}
                Some(local) => problems.push(format!(
                    "prometheus.yml: rule file {f}: {} does not exist",
                    local.display()
                )),
                None => problems.push(format!(
                    "prometheus.yml: rule file {f}: {target} is not mounted into the prometheus service"
                )),
            }
        }
    }
    // Every DNS name is a compose service.
    for j in jobs {
        if let Value::Array(sds) = at(j, "dns_sd_configs") {
            for n in sds
                .iter()
                .flat_map(|sd| words(at(sd, "names")).unwrap_or_default())
            {
                if c.service(&n).is_none() {
                    problems.push(format!(
                        "prometheus.yml: dns_sd_configs name {n} is no compose service"
                    ));
                }
            }
        }
    }
    problems
}

/// The prometheus service's config file, read through its mount.
pub fn prometheus_config(c: &Compose) -> Result<Value, String> {
    let svc = c
        .service("prometheus")
        .ok_or("docker-compose.yml: no service prometheus")?;
    let cmd = words(at(svc, "command")).unwrap_or_default();
    let target = cmd
        .iter()
        .find_map(|w| w.strip_prefix("--config.file="))
        .unwrap_or("/etc/prometheus/prometheus.yml");
    let local = c.mounts(svc).local(target).ok_or_else(|| {
        format!("services.prometheus: {target} is not mounted from the repository")
    })?;
    let text = std::fs::read_to_string(&local).map_err(|e| format!("{}: {e}", local.display()))?;
    let mut docs = yaml_docs(&text).map_err(|e| format!("{}: not YAML: {e}", local.display()))?;
    docs.pop()
        .ok_or_else(|| format!("{}: empty", local.display()))
}

/// Grafana's provisioning, read through its mounts: the datasource points
/// at the prometheus service, the dashboard provider's path holds the
/// dashboard, the dashboard's panels use the provisioned datasource.
/// Returns the dashboards found (file, JSON).
pub fn check_grafana(c: &Compose) -> (Vec<String>, Vec<(PathBuf, Value)>) {
    let mut problems = Vec::new();
    let mut dashboards = Vec::new();
    let Some(svc) = c.service("grafana") else {
        return (
            vec!["docker-compose.yml: no service grafana".into()],
            dashboards,
        );
    };
    let mounts = c.mounts(svc);
    let Some(prov) = mounts.local("/etc/grafana/provisioning") else {
        return (
            vec!["services.grafana: /etc/grafana/provisioning is not mounted".into()],
            dashboards,
        );
    };
    let yamls = |dir: PathBuf| -> Vec<(PathBuf, Value)> {
        let mut out = Vec::new();
        if let Ok(rd) = std::fs::read_dir(&dir) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "yml" || x == "yaml") {
                    let text = std::fs::read_to_string(&p).unwrap_or_default();
                    for d in yaml_docs(&text).unwrap_or_default() {
                        out.push((p.clone(), d));
                    }
                }
            }
        }
        out
    };
    let mut uids = Vec::new();
    let prom_port = 9090;
    for (file, doc) in yamls(prov.join("datasources")) {
        for ds in at(&doc, "datasources").as_array().into_iter().flatten() {
            let url = at(ds, "url").as_str().unwrap_or("");
            let host = host_of(url).unwrap_or_default();
            if at(ds, "type").as_str() == Some("prometheus") {
                if c.service(&host).is_none() || port_of(url) != Some(prom_port) {
                    problems.push(format!(
                        "{}: datasource url {url} is not the prometheus service on {prom_port}",
                        file.display()
                    ));
                }
                if let Some(uid) = at(ds, "uid").as_str() {
                    uids.push(uid.to_owned());
                }
            }
        }
    }
    if uids.is_empty() {
        problems.push("grafana provisioning: no Prometheus datasource with a uid".into());
    }
    let mut providers = 0;
    for (file, doc) in yamls(prov.join("dashboards")) {
        for p in at(&doc, "providers").as_array().into_iter().flatten() {
            providers += 1;
            let path = at(p, "options.path").as_str().unwrap_or("");
            let Some(local) = mounts.local(path) else {
                problems.push(format!(
                    "{}: provider path {path} is not mounted into grafana",
                    file.display()
                ));
                continue;
            };
            let jsons: Vec<PathBuf> = std::fs::read_dir(&local)
                .map(|rd| {
                    rd.flatten()
                        .map(|e| e.path())
                        .filter(|p| p.extension().is_some_and(|x| x == "json"))
                        .collect()
                })
                .unwrap_or_default();
            if jsons.is_empty() {
                problems.push(format!(
                    "{}: provider path {path} ({}) holds no dashboard",
                    file.display(),
                    local.display()
                ));
            }
            for j in jsons {
                match std::fs::read_to_string(&j)
                    .map_err(|e| e.to_string())
                    .and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| e.to_string()))
                {
                    Ok(d) => dashboards.push((j, d)),
                    Err(e) => problems.push(format!("{}: {e}", j.display())),
                }
            }
        }
    }
    if providers == 0 {
        problems.push("grafana provisioning: no dashboard provider".into());
    }
    for (file, d) in &dashboards {
        // `${datasource}`: the dashboard's datasource variable, whose
        // default must be a provisioned Prometheus.
        let var = at(d, "templating.list")
            .as_array()
            .into_iter()
            .flatten()
            .find(|v| at(v, "name").as_str() == Some("datasource"));
        let var_default = var.and_then(|v| {
            (at(v, "type").as_str() == Some("datasource")
                && at(v, "query").as_str() == Some("prometheus"))
            .then(|| at(v, "current.value").as_str().unwrap_or("").to_owned())
        });
        for (title, ds) in panel_datasources(d) {
            let ds = if ds == "${datasource}" || ds == "$datasource" {
                match &var_default {
                    Some(uid) => uid.clone(),
                    None => {
                        problems.push(format!("{}: panel {title:?} uses {ds} but the dashboard has no Prometheus datasource variable `datasource`", file.display()));
                        continue;
                    }
                }
            } else {
                ds
            };
            if !uids.contains(&ds) {
                problems.push(format!("{}: panel {title:?} uses datasource uid {ds:?}, not a provisioned one {uids:?}", file.display()));
            }
        }
    }
    (problems, dashboards)
}

/// (panel title, datasource uid) of every panel and target that names one.
fn panel_datasources(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        let title = at(p, "title").as_str().unwrap_or("").to_owned();
        if let Some(uid) = at(p, "datasource.uid").as_str() {
            out.push((title.clone(), uid.to_owned()));
        }
        for t in at(p, "targets").as_array().into_iter().flatten() {
            if let Some(uid) = at(t, "datasource.uid").as_str() {
                out.push((title.clone(), uid.to_owned()));
            }
        }
    }
    out
}

/// Every panel of a dashboard, rows' nested panels included.
pub fn panels(d: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in at(d, "panels").as_array().into_iter().flatten() {
        out.push(p);
        out.extend(at(p, "panels").as_array().into_iter().flatten());
    }
    out
}

/// (panel title, expr) of every query of a dashboard.
pub fn queries(d: &Value) -> Vec<(String, String)> {
    panels(d)
        .into_iter()
        .flat_map(|p| {
            let title = at(p, "title").as_str().unwrap_or("").to_owned();
            at(p, "targets")
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(move |t| Some((title.clone(), at(t, "expr").as_str()?.to_owned())))
        })
        .collect()
}
