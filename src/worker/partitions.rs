//! The jobs topic's partitions held here: this replica's share of a limit
//! under `redis.on_error = "local"` is their fraction of the topic's.

use std::collections::BTreeSet;

use crate::kafka::consumer::TopicPartition;

#[derive(Debug)]
pub(super) struct Partitions {
    jobs_topic: String,
    /// Partitions of the jobs topic in all.
    total: usize,
    /// Those assigned here.
    assigned: BTreeSet<i32>,
}

impl Partitions {
    pub(super) fn new(jobs_topic: &str, total: usize) -> Partitions {
        Partitions {
            jobs_topic: jobs_topic.to_owned(),
            total,
            assigned: BTreeSet::new(),
        }
    }

    pub(super) fn assign(&mut self, parts: &[TopicPartition]) {
        let jobs = parts.iter().filter(|tp| *tp.topic == *self.jobs_topic);
        self.assigned.extend(jobs.map(|tp| tp.partition));
    }

    pub(super) fn revoke(&mut self, parts: &[TopicPartition]) {
        for tp in parts.iter().filter(|tp| *tp.topic == *self.jobs_topic) {
            self.assigned.remove(&tp.partition);
        }
    }

    /// The fraction of the jobs topic held here: at least one partition's
    /// worth, so a replica that holds none yet still admits something.
    pub(super) fn share(&self) -> f64 {
        self.assigned.len().max(1) as f64 / self.total.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(topic: &str, partition: i32) -> TopicPartition {
        TopicPartition::new(topic, partition)
    }

    #[test]
    fn the_share_counts_only_the_jobs_topic() {
        // (assigned, revoked, share of 8 partitions)
        type Parts = &'static [(&'static str, i32)];
        let cases: &[(Parts, Parts, f64)] = &[
            (&[], &[], 1.0 / 8.0),
            (&[("jobs", 0), ("jobs", 1)], &[], 2.0 / 8.0),
            (&[("jobs", 0), ("retry-1m", 1)], &[], 1.0 / 8.0),
            (&[("jobs", 0), ("jobs", 1)], &[("jobs", 1)], 1.0 / 8.0),
            (&[("jobs", 0), ("jobs", 0)], &[], 1.0 / 8.0),
            (&[("jobs", 3)], &[("retry-1m", 3)], 1.0 / 8.0),
            (
                (&[("jobs", 0), ("jobs", 1), ("jobs", 2), ("jobs", 3)]),
                &[],
                0.5,
            ),
        ];
        for (assigned, revoked, share) in cases {
            let mut p = Partitions::new("jobs", 8);
            let a: Vec<_> = assigned.iter().map(|(t, n)| tp(t, *n)).collect();
            let r: Vec<_> = revoked.iter().map(|(t, n)| tp(t, *n)).collect();
            p.assign(&a);
            p.revoke(&r);
            assert_eq!(p.share(), *share, "{assigned:?} - {revoked:?}");
        }
    }

    #[test]
    fn a_topic_of_no_partitions_reads_as_one() {
        let p = Partitions::new("jobs", 0);
        assert_eq!(p.share(), 1.0);
    }
}
