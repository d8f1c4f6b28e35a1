//! A real Prometheus (Debian's `prometheus` package) run on what ships:
//! `deploy/prometheus/prometheus.yml` with its scrape targets replaced by
//! the loopback addresses of running workers, and its rule files. The
//! dashboard's, the scaler's and the alerts' queries then go through its
//! HTTP API (`/api/v1/query`), which says whether they are valid PromQL and
//! whether they return series.
//!
//! It binds 127.0.0.1 only, keeps its data in a temporary directory, and
//! is killed (SIGKILL, then reaped) when dropped, test failure included.
//! A missing `prometheus` binary fails the test: scripts/install-deps.sh
//! installs it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{at, repo, yaml_file};
use crate::common::procs::Proc;

pub struct Prometheus {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The config it runs, as written (JSON, which is YAML).
    pub config: Value,
    proc: Proc,
    // Dropped after `proc`: the directory outlives the process using it.
    _dir: tempfile::TempDir,
}

/// The shipped `prometheus.yml` made to scrape `targets`: each scrape job
/// keeps its name, path and intervals, its service discovery becomes a
/// static list, and rule files are made absolute (they are relative to the
/// config file, which moves to a temporary directory).
pub fn rewrite_config(shipped: &Value, targets: &[String]) -> Value {
    let mut config = shipped.clone();
    let jobs = config["scrape_configs"]
        .as_array_mut()
        .expect("prometheus.yml has scrape_configs");
    for job in jobs.iter_mut() {
        let job = job.as_object_mut().expect("a scrape job is a map");
        job.retain(|k, _| !k.ends_with("_sd_configs") && k != "static_configs");
        job.insert("static_configs".into(), json!([{ "targets": targets }]));
    }
    let dir = repo().join("deploy/prometheus");
    if let Some(files) = config["rule_files"].as_array_mut() {
        for f in files.iter_mut() {
            let rel = f.as_str().expect("a rule file is a path").to_owned();
            *f = Value::String(dir.join(rel).display().to_string());
        }
    }
    config
}

impl Prometheus {
    /// Starts `prometheus` on a free loopback port, scraping `targets`
    /// (`host:port`) with the shipped config and rules.
    pub fn start(targets: &[String]) -> Prometheus {
        let shipped = yaml_file("deploy/prometheus/prometheus.yml");
        let config = rewrite_config(&shipped, targets);
        let dir = tempfile::Builder::new()
            .prefix("throttle-prometheus-")
            .tempdir()
            .expect("temp dir");
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, serde_json::to_string_pretty(&config).unwrap()).unwrap();
        let port = crate::common::free_port();
        let listen = format!("127.0.0.1:{port}");
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={listen}"))
            .arg("--log.level=warn");
        let proc = spawn(cmd, dir.path());
        Prometheus {
            url: format!("http://{listen}"),
            config,
            proc,
            _dir: dir,
        }
    }

    /// Waits for `/-/ready`; panics with the server's log on a timeout.
    pub async fn wait_ready(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(r) = reqwest::get(format!("{}/-/ready", self.url)).await {
                if r.status().is_success() {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "prometheus not ready on {} after {timeout:?}:\n{}",
                self.url,
                self.proc.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), params)
            .map_err(|e| format!("{path}: {e}"))?;
        let r = reqwest::get(url)
            .await
            .map_err(|e| format!("{path}: {e}"))?;
        let text = r.text().await.map_err(|e| format!("{path}: {e}"))?;
        let body: Value =
            serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))?;
        if at(&body, "status").as_str() == Some("success") {
            Ok(at(&body, "data").clone())
        } else {
            Err(format!(
                "{} ({})",
                at(&body, "error").as_str().unwrap_or("?"),
                at(&body, "errorType").as_str().unwrap_or("?")
            ))
        }
    }

    /// An instant query: its series, or Prometheus' error (a parse error
    /// for invalid PromQL).
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/query", &[("query", expr)]).await?;
        Ok(at(&data, "result").as_array().cloned().unwrap_or_default())
    }

    /// `/api/v1/label/LABEL/values?match[]=SELECTOR`: what Grafana's
    /// `label_values(SELECTOR, LABEL)` lists.
    pub async fn label_values(&self, label: &str, selector: &str) -> Result<Vec<String>, String> {
        let data = self
            .api(
                &format!("/api/v1/label/{label}/values"),
                &[("match[]", selector)],
            )
            .await?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect())
    }

    /// `/api/v1/rules`: every rule loaded, as (group, rule) JSON.
    pub async fn rules(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/rules", &[]).await?;
        Ok(at(&data, "groups")
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|g| at(g, "rules").as_array().cloned().unwrap_or_default())
            .collect())
    }

    /// `/api/v1/targets`: the active targets' (scrapeUrl, health).
    pub async fn targets(&self) -> Result<Vec<(String, String)>, String> {
        let data = self.api("/api/v1/targets", &[]).await?;
        Ok(at(&data, "activeTargets")
            .as_array()
            .into_iter()
            .flatten()
            .map(|t| {
                (
                    at(t, "scrapeUrl").as_str().unwrap_or("").to_owned(),
                    at(t, "health").as_str().unwrap_or("").to_owned(),
                )
            })
            .collect())
    }

    /// The server's log so far (for failure messages).
    pub fn log_text(&self) -> String {
        self.proc.log_text()
    }
}

fn spawn(cmd: Command, dir: &Path) -> Proc {
    if Command::new("prometheus")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("no `prometheus` binary: run scripts/install-deps.sh (Debian package prometheus)");
    }
    Proc::spawn("prometheus", cmd, dir, false)
}

/// A dashboard query as Grafana would send it with every variable at
/// "All": `$job` is the shipped scrape job, the other variables match
/// anything, `$__rate_interval` is Grafana's 4 × the datasource's
/// `timeInterval` (5s).
pub fn as_grafana_sends(expr: &str, job: &str) -> String {
    expr.replace("$__rate_interval", "20s")
        .replace("${job}", job)
        .replace("$job", job)
        .replace("$group", ".*")
        .replace("$seller", ".*")
}

/// `label_values(SELECTOR, LABEL)` → (SELECTOR, LABEL).
pub fn label_values_call(q: &str) -> Option<(String, String)> {
    let inner = q.trim().strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim().to_owned(), label.trim().to_owned()))
}

#[test]
fn rewrite_keeps_the_job_and_makes_rule_files_absolute() {
    let shipped = yaml_file("deploy/prometheus/prometheus.yml");
    let c = rewrite_config(&shipped, &["127.0.0.1:1234".to_owned()]);
    let job = &c["scrape_configs"][0];
    assert_eq!(job["job_name"], shipped["scrape_configs"][0]["job_name"]);
    assert!(job.get("dns_sd_configs").is_none(), "{job}");
    assert_eq!(job["static_configs"][0]["targets"][0], "127.0.0.1:1234");
    assert_eq!(c["global"], shipped["global"], "intervals as shipped");
    let rule = c["rule_files"][0].as_str().unwrap();
    assert!(Path::new(rule).is_file(), "rule file {rule} does not exist");
    assert_eq!(
        label_values_call("label_values(x{job=~\"$job\"}, seller)"),
        Some(("x{job=~\"$job\"}".to_owned(), "seller".to_owned()))
    );
}
