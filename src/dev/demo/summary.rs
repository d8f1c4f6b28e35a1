//! The summary at the end of a demo: each seller's busiest stretch at the
//! stub against its rule, every job accounted for, the dead letters by
//! reason, the drain and the replicas' exits; and the checks that failed.

use std::collections::BTreeMap;

use crate::dev::load;

use super::check::{self, Accounting, SellerVerdict};
use super::plan;
use super::run::{Outcome, Run, DRAIN_TIMEOUT, STOP_GRACE};

impl Run {
    /// The summary text and the failed checks (empty: all held).
    pub(super) fn summary(&self, o: &Outcome) -> (String, Vec<String>) {
        let stats = self.stub.stats();
        let mut failures = Vec::new();
        let mut out = String::new();
        let line = |out: &mut String, s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(
            &mut out,
            format!(
                "\nthrottle-worker demo: {} replicas, {} sellers, {} jobs at {:.0}/s over {:.0} s ({:.0}% malformed); {:.0} s in all",
                self.replicas.list.len(),
                self.plan.sellers.len(),
                o.written,
                self.plan.rate,
                o.load_time.as_secs_f64(),
                plan::MALFORMED * 100.0,
                self.started.elapsed().as_secs_f64()
            ),
        );

        // 1. Limits, from every call's arrival at the stub.
        line(
            &mut out,
            format!(
                "\nLimits (busiest stretch of each seller's calls at the stub, 429'd calls included; {} ms allowed from grant to arrival):",
                check::SLACK.as_millis()
            ),
        );
        let mut verdicts = Vec::new();
        let mut rules = BTreeMap::new();
        let mut table = vec![[
            "seller".to_owned(),
            "role".to_owned(),
            "rule".to_owned(),
            "calls".to_owned(),
            "429s".to_owned(),
            "busiest".to_owned(),
            "allowed".to_owned(),
            String::new(),
        ]];
        for s in &self.plan.sellers {
            let seen = stats.sellers.get(&s.id).cloned().unwrap_or_default();
            let result = check::busiest(&s.rule, &seen.arrivals_us);
            let rule = plan::describe(&s.rule)
                + &s.stub_throttle
                    .as_ref()
                    .map(|t| {
                        format!(
                            " (stub: {}/{})",
                            t.limit,
                            humantime::format_duration(t.period)
                        )
                    })
                    .unwrap_or_default();
            let (busiest, allowed, verdict) = match &result {
                Ok(b) => (
                    b.describe(),
                    b.allowed.to_string(),
                    if b.held() { "within" } else { "OVER" },
                ),
                Err(e) => (e.to_string(), String::new(), "UNCHECKED"),
            };
            table.push([
                s.id.clone(),
                s.role.label().to_owned(),
                rule,
                seen.calls.to_string(),
                seen.throttled.to_string(),
                busiest,
                allowed,
                verdict.to_owned(),
            ]);
            rules.insert(s.id.clone(), plan::describe(&s.rule));
            verdicts.push(SellerVerdict {
                seller: s.id.clone(),
                result,
            });
        }
        out.push_str(&columns(&table, &[3, 4, 6]));
        let over = check::limit_failures(&verdicts, &rules);
        let held = verdicts.len() - over.len();
        line(
            &mut out,
            format!("{held} of {} sellers within their limits", verdicts.len()),
        );
        failures.extend(over);

        // 2. Nothing lost: every produced id reached the stub or the DLQ.
        let jobs = self.stub.jobs();
        let ids = (0..o.written).map(|i| load::job_id(&self.run_id, i));
        let a: Accounting = check::account(ids, &jobs, &o.dead.job_ids);
        line(
            &mut out,
            format!(
                "\nNothing lost: {} produced = {} done (accepted by the stub) + {} dead-lettered + {} missing; {} done more than once (at-least-once)",
                a.produced, a.done, a.dead, a.missing_count, a.repeated
            ),
        );
        if a.missing_count > 0 {
            failures.push(format!(
                "{} of {} jobs are missing (neither accepted by the stub nor dead-lettered), e.g. {}",
                a.missing_count,
                a.produced,
                a.missing.join(", ")
            ));
        }
        line(
            &mut out,
            format!("Dead letters by reason ({}):", o.dead.total),
        );
        let mut reasons: Vec<_> = o.dead.by_reason.iter().collect();
        reasons.sort_by_key(|r| std::cmp::Reverse(*r.1));
        for (reason, n) in reasons {
            line(&mut out, format!("  {n:>6}  {reason}"));
        }

        // 3. Drained, and the replicas ran to the end.
        match &o.drained {
            Ok(took) => line(
                &mut out,
                format!(
                    "\nDrained {:.1} s after the live phase: no lag, nothing waiting, parked or in flight",
                    took.as_secs_f64()
                ),
            ),
            Err(state) => failures.push(format!(
                "the pipeline did not drain within {DRAIN_TIMEOUT:?} after the live phase: {state}"
            )),
        }
        failures.extend(o.early_exits.iter().cloned());
        for (n, status) in &o.stopped {
            match status {
                Some(s) if s.success() => {}
                Some(s) => failures.push(format!(
                    "replica {n} exited with {s} on SIGTERM (see replica-{n}.log)"
                )),
                None => failures.push(format!(
                    "replica {n} did not stop within {STOP_GRACE:?} of SIGTERM and was killed"
                )),
            }
        }
        if failures.is_empty() {
            line(
                &mut out,
                "\nAll checks hold: every seller within its limit, nothing lost, drained, replicas stopped cleanly.".to_owned(),
            );
        } else {
            line(&mut out, format!("\n{} check(s) FAILED:", failures.len()));
            for f in &failures {
                line(&mut out, format!("  - {f}"));
            }
        }
        (out, failures)
    }
}

/// Rows as aligned columns; `right` are the right-aligned ones.
fn columns<const N: usize>(rows: &[[String; N]], right: &[usize]) -> String {
    let mut widths = [0usize; N];
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if right.contains(&i) {
                    format!("{c:>w$}")
                } else {
                    format!("{c:<w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}
