//! The replicas' `/metrics`, read the way Prometheus would and added up
//! over the fleet: a small parser of the text exposition's sample lines
//! (only what the demo shows is kept) and [`Fleet`], the sums.

use std::collections::BTreeMap;
use std::time::Duration;

/// One sample line: `name{label="value",...} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A line of the exposition that is not a sample the parser understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("metrics line {line}: {problem}: {text:?}")]
pub struct ParseError {
    pub line: usize,
    pub problem: &'static str,
    /// The line, cut to 120 characters.
    pub text: String,
}

/// Every sample of `text` (Prometheus text format or OpenMetrics):
/// comments and blank lines are skipped, a timestamp after the value is
/// ignored, and label values are unescaped (`\"`, `\\`, `\n`).
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'))
        .map(|(i, l)| {
            parse_line(l).map_err(|problem| ParseError {
                line: i + 1,
                problem,
                text: l.chars().take(120).collect(),
            })
        })
        .collect()
}

fn parse_line(line: &str) -> Result<Sample, &'static str> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .ok_or("no value")?;
    let name = &line[..name_end];
    if name.is_empty() {
        return Err("no metric name");
    }
    let mut rest = &line[name_end..];
    let mut labels = Vec::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, tail) = parse_labels(after)?;
        labels = parsed;
        rest = tail;
    }
    let value = rest.split_whitespace().next().ok_or("no value")?;
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse::<f64>().map_err(|_| "value is not a number")?,
    };
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

type Labels = Vec<(String, String)>;

/// `a="x",b="y"}` → the labels and what follows the `}`.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), &'static str> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start_matches([',', ' ']);
        if let Some(tail) = s.strip_prefix('}') {
            return Ok((labels, tail));
        }
        if s.is_empty() {
            return Err("labels not closed with '}'");
        }
        let eq = s.find('=').ok_or("label without '='")?;
        let key = s[..eq].trim().to_owned();
        s = s[eq + 1..]
            .strip_prefix('"')
            .ok_or("label value not quoted")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value"),
                },
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value"),
            }
        };
        labels.push((key, value));
        s = &s[end + 1..];
    }
}

/// What the demo shows, summed over the replicas that answered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fleet {
    /// Replicas whose `/metrics` answered.
    pub up: usize,
    /// `(replica, why)` of those that did not.
    pub down: Vec<(usize, String)>,
    /// `throttle_jobs_waiting`, per seller: (cause="limit", cause="capacity").
    pub waiting: BTreeMap<String, (f64, f64)>,
    /// `throttle_jobs_parked`: retry-tier records held until their release
    /// (not per seller: the series has no seller label).
    pub parked: f64,
    pub in_flight: f64,
    /// `throttle_jobs_to_retry_topic_total`.
    pub to_retry: f64,
    /// `throttle_jobs_dead_lettered_total` by reason.
    pub dead_lettered: BTreeMap<String, f64>,
    /// `throttle_consumer_topic_lag_messages`, per topic.
    pub lag_messages: BTreeMap<String, f64>,
    /// `throttle_consumer_lag_seconds`: the oldest per topic.
    pub lag_seconds: BTreeMap<String, f64>,
    /// `throttle_downstream_requests_total` by class.
    pub downstream: BTreeMap<String, f64>,
    /// `throttle_assigned_partitions` of each replica that answered.
    pub assigned: Vec<(usize, f64)>,
}

impl Fleet {
    /// Adds one replica's samples.
    pub fn add(&mut self, replica: usize, samples: &[Sample]) {
        self.up += 1;
        for s in samples {
            let label = |k| s.label(k).unwrap_or("").to_owned();
            match s.name.as_str() {
                "throttle_jobs_waiting" => {
                    let w = self.waiting.entry(label("seller")).or_default();
                    match s.label("cause") {
                        Some("limit") => w.0 += s.value,
                        _ => w.1 += s.value,
                    }
                }
                "throttle_jobs_parked" => self.parked += s.value,
                "throttle_jobs_in_flight" => self.in_flight += s.value,
                "throttle_jobs_to_retry_topic_total" => self.to_retry += s.value,
                "throttle_jobs_dead_lettered_total" => {
                    *self.dead_lettered.entry(label("reason")).or_default() += s.value
                }
                "throttle_consumer_topic_lag_messages" => {
                    *self.lag_messages.entry(label("topic")).or_default() += s.value
                }
                "throttle_consumer_lag_seconds" => {
                    let e = self.lag_seconds.entry(label("topic")).or_default();
                    *e = e.max(s.value);
                }
                "throttle_downstream_requests_total" => {
                    *self.downstream.entry(label("class")).or_default() += s.value
                }
                "throttle_assigned_partitions" => self.assigned.push((replica, s.value)),
                _ => {}
            }
        }
    }

    pub fn waiting_total(&self) -> f64 {
        self.waiting.values().fold(0.0, |a, (l, c)| a + l + c)
    }

    /// Lag of `topic` (0 when no replica reports it).
    pub fn lag_of(&self, topic: &str) -> f64 {
        self.lag_messages.get(topic).copied().unwrap_or(0.0)
    }

    /// Lag of every topic but `topic` (the retry tiers, for the jobs topic).
    pub fn lag_except(&self, topic: &str) -> f64 {
        self.lag_messages
            .iter()
            .filter(|(t, _)| *t != topic)
            .map(|(_, v)| v)
            // f64's sum of nothing is -0.0, shown as "-0".
            .fold(0.0, |a, b| a + b)
    }

    /// The pipeline holds nothing: no lag on any topic, nothing waiting,
    /// parked or in flight, and every replica answered.
    pub fn idle(&self, replicas: usize) -> bool {
        self.up == replicas
            && self.lag_messages.values().all(|v| *v == 0.0)
            && self.waiting_total() == 0.0
            && self.parked == 0.0
            && self.in_flight == 0.0
    }
}

/// Scrapes every `(replica, url)` at once and sums what answered.
pub async fn scrape(urls: &[(usize, String)], timeout: Duration) -> Fleet {
    let answers = futures::future::join_all(urls.iter().map(|(_, url)| async move {
        let text = crate::downstream::get_text(url, timeout)
            .await
            .map_err(|e| e.to_string())?;
        parse(&text).map_err(|e| e.to_string())
    }))
    .await;
    let mut fleet = Fleet::default();
    for ((i, _), answer) in urls.iter().zip(answers) {
        match answer {
            Ok(samples) => fleet.add(*i, &samples),
            Err(why) => fleet.down.push((*i, why)),
        }
    }
    fleet
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_lines() {
        let text = "# HELP throttle_jobs_parked Retry-tier records\n\
                    # TYPE throttle_jobs_parked gauge\n\
                    throttle_jobs_parked 3\n\
                    throttle_jobs_waiting{cause=\"limit\",seller=\"seller-0\"} 12\n\
                    throttle_consumer_lag_seconds{group=\"g\",topic=\"t\",partition=\"0\"} 1.5 1700000000\n\
                    odd{v=\"a \\\"quoted\\\" \\\\ back\\nslash, {x}\"} -Inf\n\
                    \n\
                    # EOF\n";
        let got = parse(text).unwrap();
        assert_eq!(got.len(), 4);
        assert_eq!(got[0].name, "throttle_jobs_parked");
        assert_eq!(got[0].value, 3.0);
        assert_eq!(got[1].label("seller"), Some("seller-0"));
        assert_eq!(got[1].label("cause"), Some("limit"));
        assert_eq!(got[2].value, 1.5, "timestamp ignored");
        assert_eq!(got[2].label("partition"), Some("0"));
        assert_eq!(got[3].label("v"), Some("a \"quoted\" \\ back\nslash, {x}"));
        assert_eq!(got[3].value, f64::NEG_INFINITY);
    }

    #[test]
    fn bad_lines_are_named() {
        let cases = [
            (1, "x{a=\"1\"", "labels not closed with '}'"),
            (7, "x{a=\"1} 2", "unterminated label value"),
            (2, "x{a=1} 2", "label value not quoted"),
            (3, "x{a} 2", "label without '='"),
            (4, "x 1.2.3", "value is not a number"),
            (5, "x", "no value"),
            (6, "{a=\"1\"} 2", "no metric name"),
        ];
        for (row, line, problem) in cases {
            let err = parse(&format!("ok 1\n{line}\n")).unwrap_err();
            assert_eq!((err.line, err.problem), (2, problem), "row {row}: {err}");
        }
    }

    #[test]
    fn the_fleet_sums_replicas() {
        let a = parse(
            "throttle_jobs_waiting{cause=\"limit\",seller=\"s\"} 2\n\
             throttle_jobs_waiting{cause=\"capacity\",seller=\"s\"} 1\n\
             throttle_consumer_topic_lag_messages{group=\"g\",topic=\"jobs\"} 5\n\
             throttle_consumer_lag_seconds{group=\"g\",topic=\"jobs\",partition=\"0\"} 0.5\n\
             throttle_jobs_dead_lettered_total{reason=\"not_json\"} 1\n\
             throttle_assigned_partitions 4\n",
        )
        .unwrap();
        let b = parse(
            "throttle_jobs_waiting{cause=\"limit\",seller=\"s\"} 3\n\
             throttle_consumer_topic_lag_messages{group=\"g\",topic=\"jobs\"} 1\n\
             throttle_consumer_topic_lag_messages{group=\"g\",topic=\"jobs.retry.5s\"} 2\n\
             throttle_consumer_lag_seconds{group=\"g\",topic=\"jobs\",partition=\"1\"} 2.5\n\
             throttle_jobs_dead_lettered_total{reason=\"not_json\"} 2\n\
             throttle_jobs_parked 7\n",
        )
        .unwrap();
        let mut f = Fleet::default();
        f.add(0, &a);
        f.add(1, &b);
        assert_eq!(f.up, 2);
        assert_eq!(f.waiting["s"], (5.0, 1.0));
        assert_eq!(f.lag_of("jobs"), 6.0);
        assert_eq!(f.lag_except("jobs"), 2.0);
        assert_eq!(f.lag_seconds["jobs"], 2.5);
        assert_eq!(f.dead_lettered["not_json"], 3.0);
        assert_eq!(f.parked, 7.0);
        assert_eq!(f.assigned, vec![(0, 4.0)]);
        assert!(!f.idle(2));
        let quiet = parse("throttle_consumer_topic_lag_messages{topic=\"jobs\"} 0\n").unwrap();
        let mut g = Fleet::default();
        g.add(0, &quiet);
        assert!(g.idle(1));
        assert!(!g.idle(2), "a replica that did not answer is not idle");
    }
}
