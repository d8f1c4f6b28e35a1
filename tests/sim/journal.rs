//! What the world saw, for the invariants: every downstream call, every
//! dead letter and retry copy, every delivery and commit. Jobs are known by
//! their index in the scenario (`JobId`), found from a record's value.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use bytes::Bytes;

use throttle_worker::kafka::done_ranges::Ranges;

use super::broker::{LostCommit, SimRecord, Tp};

pub type JobId = usize;

/// One downstream call as the downstream saw it.
#[derive(Debug, Clone)]
pub struct Call {
    /// The process that made it (its incarnation's number).
    pub process: u64,
    pub job: JobId,
    pub seller: String,
    pub cost: u64,
    /// Virtual ms since the start, when the call arrived.
    pub at_ms: u64,
    /// The store's clock (µs) when the call arrived: `at_ms` to the µs.
    /// Virtual time moves in µs (a pacer's interval, a wait to the µs), and
    /// rules are judged at the µs where a grant has no instant of its own
    /// (`check::limits`, `local`'s admissions).
    pub at_us: u64,
    /// `X-Granted-At` (µs, the limiter's clock), if any.
    pub granted_at_us: Option<u64>,
    /// The answer's class: "2xx", "429", "5xx", "timeout", "refused", "4xx".
    pub class: &'static str,
    /// Virtual ms when the answer left.
    pub end_ms: u64,
}

/// One limiter call of the engine's, from its start to its answer: the
/// downstream slots it holds meanwhile (one per job asked about).
#[derive(Debug, Clone)]
pub struct Ask {
    pub from_ms: u64,
    /// `None`: never answered (the process died).
    pub to_ms: Option<u64>,
    pub jobs: usize,
    pub seller: String,
}

#[derive(Debug, Default)]
pub struct Log {
    /// Instants (virtual ms) the engine got a decision from its limiter
    /// (not an error): under `redis.on_error = "local"` each one drops
    /// what the in-memory limits counted (`worker::admission`).
    pub limiter_answered_ms: Vec<u64>,
    /// Each charging call that wrote the loss guard's epoch (it found it
    /// gone): virtual ms, and whether it wrote it as a new install's
    /// (nothing lost) rather than as a loss.
    pub epochs_written: Vec<(u64, bool)>,
    /// Record value → job, for every record the scenario produced.
    pub by_value: HashMap<Bytes, JobId>,
    pub by_job_id: HashMap<String, JobId>,
    pub calls: Vec<Call>,
    /// Calls that reached the downstream and have not been answered, by
    /// the number `call_started` gave them: job and virtual ms of arrival.
    /// What is left at the run's end are the calls of killed processes
    /// (never answered, never in `calls`); each held a downstream slot
    /// of its process until the kill.
    pub unanswered: BTreeMap<u64, (JobId, u64)>,
    /// The engine's limiter calls.
    pub asks: Vec<Ask>,
    /// Each pacer's grant, by seller: its first unit's go-at, interval,
    /// units and when the limiter decided it (µs on its clock): a paced call's
    /// `X-Granted-At` is its unit's go-at, up to `burst` intervals after
    /// the decision, and a loss of Redis' data between the two leaves the
    /// decision on the old state's side.
    pub paced: HashMap<String, Vec<(u64, u64, u64, u64)>>,
    /// Charged job-list script calls Redis ran (one coalesced call of many
    /// sellers' asks is one): what the batching guard counts.
    pub jobs_calls: u64,
    /// The engine's requests to the limiter port: each carries the asks
    /// of one turn of its loop, sent as one group.
    pub limiter_requests: u64,
    /// Virtual ms of each process start (a restart has slots of its own).
    pub starts: Vec<u64>,
    /// When a process was killed (kill -9), in virtual ms.
    pub kills: Vec<u64>,
    /// When a graceful stop abandoned work under way at its timeout.
    pub abandoned: Vec<u64>,
    /// When a process ended, killed or stopped (its grants, kept in its
    /// memory to restore after a loss of Redis' data, gone with it).
    pub ends: Vec<u64>,
    /// When a revoke stopped waiting for its partitions' work under way at
    /// `worker.revoke_wait` (virtual ms), and the partitions.
    pub bound_passed: Vec<(u64, Vec<Tp>)>,
    /// Jobs whose finished record was delivered again after a graceful
    /// handoff that could not carry it (the broker refused the revoke's
    /// commit, and the ledger was not written or not read): invariant 12
    /// excuses the redelivery, invariant 16 the second success.
    pub uncarried: std::collections::BTreeSet<JobId>,
    /// When each record was finished by the process it was last delivered
    /// to (a journal sequence number); cleared at each delivery.
    pub finished: BTreeMap<(Tp, i64), u64>,
    /// Each graceful handoff of a partition: when (a sequence number),
    /// whether the broker took the revoke's commit, and whether the handoff
    /// ledger was written (with how many Redis data losses had happened).
    pub handoffs: BTreeMap<Tp, Vec<(u64, bool, Option<usize>)>>,
    /// Each assignment of a partition: when, and whether the new owner
    /// could read the handoff ledger (with the losses by then).
    pub assignments: BTreeMap<Tp, Vec<(u64, Option<usize>)>>,
    /// Jobs answered 2xx, with the sequence number of the first.
    pub done: BTreeMap<JobId, u64>,
    /// Dead letters: job and reason.
    pub dead: Vec<(JobId, String)>,
    /// Retry copies written: job → sequence numbers.
    pub retried: BTreeMap<JobId, Vec<u64>>,
    /// Retry copies written: (virtual ms, job).
    pub retried_at: Vec<(u64, JobId)>,
    /// When each job's first retry copy began to be written (virtual ms).
    pub retry_begun: BTreeMap<JobId, u64>,
    /// Writes to a retry tier or the dead-letter topic that failed:
    /// (virtual ms, job; `usize::MAX` for a record of no job).
    pub write_failures: Vec<(u64, JobId)>,
    /// Last delivery of each position: its sequence number.
    pub delivered: BTreeMap<(Tp, i64), u64>,
    /// Every call that reached the downstream, answered or not (a kill
    /// cuts some short), as the downstream saw it.
    pub arrivals: Vec<Arrival>,
    /// What the limiter (the store, not the engine) released: per charged
    /// grant, its units' instants.
    pub released: Vec<Release>,
    /// Grants of `released` whose reply came back slowly
    /// (`Faults::redis_slow`), with how long after the script decided it
    /// arrived (µs): the engine could not call on them before, and times a
    /// pacer's units from the reply's arrival (`worker::scheduler`), so
    /// each unit goes that much after its go-at.
    pub learnt_late: Vec<(Release, u64)>,
    /// How often the run reached the states that matter (see
    /// `check::reach`): what the ports count as it happens.
    pub reach: Reach,
    /// Violations found while running (commits past unfinished records).
    pub violations: Vec<String>,
    /// Each commit the broker took, by partition: when (a sequence
    /// number) and its offset.
    pub commits: BTreeMap<Tp, Vec<(u64, i64)>>,
    /// Each commit the broker lost (`Faults::lost_commits`), by
    /// partition: when (a sequence number), the offset it went back to,
    /// and the records it had said were finished that the older commit
    /// it went back to does not.
    pub lost_commits: BTreeMap<Tp, Vec<(u64, i64, Ranges)>>,
    /// Jobs whose record was delivered again because the broker lost the
    /// commit that passed it, none since passing it again (invariant 12's
    /// and 16's excuse for them).
    pub dropped_by_lost_commit: std::collections::BTreeSet<JobId>,
    /// Assignments (partition, sequence number) whose ledger entry was
    /// not read against the broker's commit, which a lost commit had put
    /// below what the entry's writer saw accepted.
    pub ledger_behind: std::collections::BTreeSet<(Tp, u64)>,
    /// Each stall of a process past the session timeout (a fleet's,
    /// `Scenario::stalls`), for invariant 20.
    pub stalls: Vec<Stalled>,
    /// Each live edit of `[limits]` a process applied: the edit's index in
    /// `Scenario::edits`, and when (virtual ms).
    pub edits_applied: Vec<(usize, u64)>,
    /// A digest of the run's events, to check that a seed replays exactly.
    pub trace: Vec<String>,
    seq: u64,
    /// Numbers `unanswered`'s calls.
    started: u64,
}

/// What a graceful handoff could carry of a record delivered again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Carry {
    /// Nothing to carry: not finished, or no handoff since its finish.
    Nothing,
    /// Carried (invariant 12 reports the redelivery).
    Carried,
    /// Neither the commit nor the ledger could carry it.
    Uncarried,
    /// It could, and a commit the broker lost since undid that.
    Lost,
}

/// A process stalled past its session timeout.
#[derive(Debug, Clone)]
pub struct Stalled {
    /// The process (`Call::process`).
    pub process: u64,
    /// When it stalled and resumed (virtual ms).
    pub from_ms: u64,
    pub to_ms: u64,
    /// When the group expired its session and gave its partitions to
    /// the others, and how many it held then.
    pub expired_ms: Option<u64>,
    pub held: usize,
    /// When a rebalance assigned it again after it rejoined: its
    /// ownership confirmed.
    pub confirmed_ms: Option<u64>,
}

/// Counts of states a run reached, summed over many seeds: a CI run that
/// reaches one zero times tests nothing of it (`check::reach`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reach {
    /// The limiter refused a charged request (a wait).
    pub denials: u64,
    /// A loss of Redis' data found by the loss guard (its epoch gone).
    pub losses_found: u64,
    /// A first deploy's first call found no epoch and wrote it as never
    /// lost (issue 52): no seller waited.
    pub new_installs: u64,
    /// A job held past `worker.max_inline_delay`: sent round a retry tier.
    pub held_past_inline: u64,
    /// A limiter call under way when its partition was revoked.
    pub revoked_during_ask: u64,
    /// A paced job (a leaky bucket's) that reached the downstream.
    pub paced_calls: u64,
    /// A call under way at the downstream when its process was killed.
    pub calls_cut_by_kill: u64,
    /// A record its partition's previous owner had finished, skipped on
    /// receipt (the commit's metadata or the handoff ledger named it).
    pub inherited_skips: u64,
    /// A jobs call whose script ran and whose reply was lost (a hang after
    /// it ran): the limiter cancels it.
    pub lost_replies: u64,
    /// Not a state to reach, a cost to watch: jobs the downstream answered
    /// with a success twice, with no kill (see
    /// `check::second_successes_without_a_kill`).
    pub again_without_kill: u64,
    /// A call the downstream shed for its hidden capacity.
    pub shed_calls: u64,
    /// A seller's learnt limit lowered by a 429 (`limits.learn`).
    pub learnt_drops: u64,
    /// A record finished (a success, or a write acknowledged) while its
    /// partition's revoke waited for the work under way (issue 53): the
    /// revoke commits it, where it used to be done again by the next owner.
    pub finished_in_revoke_wait: u64,
    /// Not a state to reach, a cost to watch: jobs the downstream answered
    /// with a success twice, excused only because a revoke's wait reached
    /// its bound (`worker.revoke_wait`) before the first answer.
    pub again_past_bound: u64,
    /// Not a state to reach: jobs answered 2xx twice, with no kill, whose
    /// record was handed over by a handoff that could carry nothing
    /// (commit refused, ledger unwritten or unread).
    pub again_uncarried: u64,
    /// A call of a seller's partition that started while another of the
    /// same seller and partition was out (keys side by side, issue 50).
    pub partition_side_by_side: u64,
    /// A job held by its key (an earlier job of its key out) while a job
    /// of another key of its seller and partition started.
    pub key_held_while_others_ran: u64,
    /// A call answered 503 with a useful `Retry-After` (a planned
    /// maintenance): the client holds the downstream that long.
    pub maintenance_calls: u64,
    /// A call the downstream registered after the client gave up on it
    /// at its timeout.
    pub gave_up_calls: u64,
    /// A job registered again after its client gave up on an earlier
    /// registration and never saw a success (invariant 16's excuse,
    /// counted).
    pub again_after_gave_up: u64,
    /// A call of a seller held to a `sliding_window_counter`.
    pub window_counter_calls: u64,
    /// A call of a seller held to a `burst_fill`.
    pub burst_fill_calls: u64,
    /// A call of a seller held to several rules at once.
    pub several_rules_calls: u64,
    /// A call of a limited seller in a world with global rules.
    pub global_rule_calls: u64,
    /// A call admitted by the in-memory limits of `local` while Redis
    /// failed.
    pub local_calls: u64,
    /// A call admitted unchecked (`fail_open`) while Redis failed.
    pub fail_open_calls: u64,
    /// Not a state to reach: a limiter decision while Redis returned
    /// errors, so made without it (a job over its rules' capacity), which
    /// the engine takes for Redis answering again and so drops what
    /// `local` counted (see `check::limits`).
    pub local_dropped_without_redis: u64,
    /// Not a state to reach: a loss of Redis' data that a replica's first
    /// call took for a new install (see `check::losses_taken_for_new`).
    pub losses_taken_for_new: u64,
    /// Hashes a replica wrote back after a loss of Redis' data
    /// (`Limiter::watch_epoch`).
    pub restores: u64,
    /// Units those restores and the partial ones charged back.
    pub units_restored: u64,
    /// A partial loss applied: sellers' state put back to an older copy.
    pub rollbacks_applied: u64,
    /// A failover applied: every key went back to an older copy, under
    /// another run of the server.
    pub failovers_applied: u64,
    /// A call that found a partial loss (`EpochFound::RolledBack`).
    pub rollbacks_found: u64,
    /// Hashes a replica wrote back after a partial loss's find
    /// (`Limiter::watch_rollbacks`).
    pub partial_restores: u64,
    /// Not a state to reach: a loss of Redis' data after which some
    /// replica's grants could not be restored (see
    /// `check::losses_unrestored`).
    pub losses_unrestored: u64,
    /// A record the broker delivered again within its assignment (a fetch
    /// retried, `Faults::redeliveries`), to a consumer that had received it.
    pub redelivered_in_assignment: u64,
    /// A write to a retry tier or the dead-letter topic refused by a
    /// produce outage (`Faults::produce_outages`).
    pub writes_in_produce_outage: u64,
    /// A Redis call answered after a slow round trip
    /// (`Faults::redis_slow`), within the timeout.
    pub slow_answers: u64,
    /// A Redis call whose script ran in a slow window but whose reply came
    /// back past the timeout: its caller saw a timeout.
    pub slow_replies_lost: u64,
    /// A Redis call given up at its timeout before a slow Redis read it.
    pub slow_timeouts: u64,
    /// A Redis call of one replica refused or hung while the others' were
    /// answered (`Faults::replica_redis`, fleets only).
    pub replica_cut_offs: u64,
    /// A replica stalled past its session timeout while it held
    /// partitions, which the group gave to the others (issue 53, item 2).
    pub stalled_holding: u64,
    /// A record delivered again because the broker lost the commit that
    /// passed it (`Faults::lost_commits`, issue 53, item 4).
    pub redelivered_after_lost_commit: u64,
    /// A record fetched by a replica the group had already expelled (a
    /// stall past its session timeout), before it found its session lost.
    pub delivered_to_expelled: u64,
    /// A call of a seller with a shadow rule (its own, its tier's or a
    /// global one) in force.
    pub shadow_rule_calls: u64,
    /// A seller whose calls a shadow rule of its would have refused, had
    /// it been enforced (judged per seller and era): the rule mattered.
    pub shadow_would_refuse: u64,
    /// A call of a seller under a tier (`limits.sellers.X.tier`).
    pub tier_calls: u64,
    /// A live edit of `[limits]` applied while a limiter call was under
    /// way (it finishes with the old policy).
    pub edits_under_way: u64,
    /// A call of a seller whose rules an edit changed, granted after the
    /// edit and judged against the new rules.
    pub calls_after_edit: u64,
}

impl Log {
    /// Records a broken invariant once.
    fn violate(&mut self, v: String) {
        if !self.violations.contains(&v) {
            self.violations.push(v);
        }
    }
}

impl Reach {
    pub fn add(&mut self, o: &Reach) {
        self.denials += o.denials;
        self.losses_found += o.losses_found;
        self.new_installs += o.new_installs;
        self.held_past_inline += o.held_past_inline;
        self.revoked_during_ask += o.revoked_during_ask;
        self.paced_calls += o.paced_calls;
        self.calls_cut_by_kill += o.calls_cut_by_kill;
        self.inherited_skips += o.inherited_skips;
        self.lost_replies += o.lost_replies;
        self.again_without_kill += o.again_without_kill;
        self.shed_calls += o.shed_calls;
        self.learnt_drops += o.learnt_drops;
        self.partition_side_by_side += o.partition_side_by_side;
        self.key_held_while_others_ran += o.key_held_while_others_ran;
        self.finished_in_revoke_wait += o.finished_in_revoke_wait;
        self.again_past_bound += o.again_past_bound;
        self.again_uncarried += o.again_uncarried;
        self.maintenance_calls += o.maintenance_calls;
        self.gave_up_calls += o.gave_up_calls;
        self.again_after_gave_up += o.again_after_gave_up;
        self.window_counter_calls += o.window_counter_calls;
        self.burst_fill_calls += o.burst_fill_calls;
        self.several_rules_calls += o.several_rules_calls;
        self.global_rule_calls += o.global_rule_calls;
        self.local_calls += o.local_calls;
        self.fail_open_calls += o.fail_open_calls;
        self.local_dropped_without_redis += o.local_dropped_without_redis;
        self.losses_taken_for_new += o.losses_taken_for_new;
        self.restores += o.restores;
        self.units_restored += o.units_restored;
        self.rollbacks_applied += o.rollbacks_applied;
        self.failovers_applied += o.failovers_applied;
        self.rollbacks_found += o.rollbacks_found;
        self.partial_restores += o.partial_restores;
        self.losses_unrestored += o.losses_unrestored;
        self.redelivered_in_assignment += o.redelivered_in_assignment;
        self.writes_in_produce_outage += o.writes_in_produce_outage;
        self.slow_answers += o.slow_answers;
        self.slow_replies_lost += o.slow_replies_lost;
        self.slow_timeouts += o.slow_timeouts;
        self.replica_cut_offs += o.replica_cut_offs;
        self.stalled_holding += o.stalled_holding;
        self.redelivered_after_lost_commit += o.redelivered_after_lost_commit;
        self.delivered_to_expelled += o.delivered_to_expelled;
        self.shadow_rule_calls += o.shadow_rule_calls;
        self.shadow_would_refuse += o.shadow_would_refuse;
        self.tier_calls += o.tier_calls;
        self.edits_under_way += o.edits_under_way;
        self.calls_after_edit += o.calls_after_edit;
    }

    /// Each count by name.
    pub fn named(&self) -> [(&'static str, u64); 43] {
        [
            ("a limiter refusal", self.denials),
            ("a loss of Redis' data found", self.losses_found),
            ("a new install's first call", self.new_installs),
            ("a hold past max_inline_delay", self.held_past_inline),
            ("a revoke during a limiter call", self.revoked_during_ask),
            ("a paced call", self.paced_calls),
            ("a call cut short by a kill", self.calls_cut_by_kill),
            (
                "a record skipped as finished by its last owner",
                self.inherited_skips,
            ),
            ("a reply lost after its script ran", self.lost_replies),
            ("a call shed for the downstream's capacity", self.shed_calls),
            ("a learnt limit lowered by a 429", self.learnt_drops),
            (
                "calls of one seller and partition side by side",
                self.partition_side_by_side,
            ),
            (
                "a key held while another of its seller ran",
                self.key_held_while_others_ran,
            ),
            (
                "a record finished while its revoke waited",
                self.finished_in_revoke_wait,
            ),
            ("a 503 with Retry-After", self.maintenance_calls),
            (
                "a success registered after the client gave up",
                self.gave_up_calls,
            ),
            (
                "a job called again after a success its client never saw",
                self.again_after_gave_up,
            ),
            (
                "a call under a sliding_window_counter",
                self.window_counter_calls,
            ),
            ("a call under a burst_fill", self.burst_fill_calls),
            ("a call under several rules", self.several_rules_calls),
            ("a call under a global rule", self.global_rule_calls),
            (
                "a call admitted by local limits while Redis failed",
                self.local_calls,
            ),
            (
                "a call admitted unchecked while Redis failed",
                self.fail_open_calls,
            ),
            ("a hash restored after a loss", self.restores),
            ("a unit restored", self.units_restored),
            ("a partial loss applied", self.rollbacks_applied),
            ("a failover applied", self.failovers_applied),
            ("a partial loss found", self.rollbacks_found),
            (
                "a hash restored after a partial loss",
                self.partial_restores,
            ),
            (
                "a record delivered again in its assignment",
                self.redelivered_in_assignment,
            ),
            (
                "a write refused by a produce outage",
                self.writes_in_produce_outage,
            ),
            ("a call answered by a slow Redis", self.slow_answers),
            (
                "a reply of a slow Redis past the timeout",
                self.slow_replies_lost,
            ),
            (
                "a call given up before a slow Redis read it",
                self.slow_timeouts,
            ),
            (
                "a limiter call refused to one replica only",
                self.replica_cut_offs,
            ),
            (
                "a replica stalled past its session holding partitions",
                self.stalled_holding,
            ),
            (
                "a record delivered again after the broker lost its commit",
                self.redelivered_after_lost_commit,
            ),
            (
                "a record fetched by a replica the group expelled",
                self.delivered_to_expelled,
            ),
            ("a call under a shadow rule", self.shadow_rule_calls),
            (
                "a shadow rule that would have refused",
                self.shadow_would_refuse,
            ),
            ("a call under a tier", self.tier_calls),
            (
                "a limits edit while a limiter call was under way",
                self.edits_under_way,
            ),
            (
                "a call granted after an edit, judged by the new rules",
                self.calls_after_edit,
            ),
        ]
    }
}

/// A call as it reached the downstream.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub job: JobId,
    pub seller: String,
    pub cost: u64,
    /// The store's clock (µs), which every replica's limiter shares.
    pub at_us: u64,
    /// `X-Granted-At` (µs): which of the store's grants the call spends.
    pub granted_at_us: Option<u64>,
}

/// A grant as the store charged it: `units` units, the first free to go
/// at `first_us` (the store's clock), each next one `interval_us` later (a
/// pacer's; 0 for every other rule).
#[derive(Debug, Clone)]
pub struct Release {
    pub seller: String,
    pub first_us: u64,
    pub units: u64,
    pub interval_us: u64,
}

impl Release {
    /// Whether one of its units goes at `at_us`.
    pub fn spans(&self, at_us: u64) -> bool {
        let last = self.first_us + self.units.saturating_sub(1) * self.interval_us;
        (self.first_us..=last).contains(&at_us)
            && (self.interval_us == 0 || (at_us - self.first_us) % self.interval_us == 0)
    }
}

#[derive(Debug, Default)]
pub struct Journal(Mutex<Log>);

impl Journal {
    pub fn with<R>(&self, f: impl FnOnce(&mut Log) -> R) -> R {
        let mut log = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut log)
    }

    fn next(log: &mut Log) -> u64 {
        log.seq += 1;
        log.seq
    }

    /// A record skipped on receipt because its partition's previous owner
    /// finished it: its job must be finished (done, dead-lettered, or
    /// copied to a retry tier), or the skip lost it.
    pub fn skipped(&self, tp: &Tp, offset: i64, value: &Bytes) {
        self.with(|log| {
            log.reach.inherited_skips += 1;
            let Some(&job) = log.by_value.get(value) else {
                return;
            };
            log.trace.push(format!("s{}:{}:{offset}:{job}", tp.0, tp.1));
            let finished = log.done.contains_key(&job)
                || log.dead.iter().any(|(j, _)| *j == job)
                || log.retried.contains_key(&job);
            if !finished {
                let v = format!(
                    "{}:{} offset {offset} (job {job}) skipped as finished by the last owner, but it is not",
                    tp.0, tp.1
                );
                log.violate(v);
            }
        });
    }

    /// Invariant 18 (issue 53, item 4): the broker delivered the record at
    /// `offset` again within its assignment, to the consumer that had
    /// received it (a fetch retried). That consumer holds it or finished
    /// it, so it must not take it as work again (`taken`): a second call
    /// of a job under way, or of one done, that it could have known.
    pub fn delivered_again(&self, tp: &Tp, offset: i64, taken: bool) {
        self.with(|log| {
            log.reach.redelivered_in_assignment += 1;
            if taken {
                let v = format!(
                    "18. {}:{} offset {offset} delivered again within its assignment and taken as work a second time",
                    tp.0, tp.1
                );
                log.violate(v);
            }
        });
    }

    /// The owner of `tp` finished the record at `offset`.
    pub fn finished(&self, tp: &Tp, offset: i64) {
        self.with(|log| {
            let seq = Journal::next(log);
            log.finished.entry((tp.clone(), offset)).or_insert(seq);
        });
    }

    /// A revoke of `tps` stopped waiting for their work under way at its
    /// bound, at `at_ms`.
    pub fn bound_passed(&self, tps: &[Tp], at_ms: u64) {
        self.with(|log| log.bound_passed.push((at_ms, tps.to_vec())));
    }

    /// `tps` were given up gracefully: the broker took the commit or not,
    /// the ledger was written or not.
    pub fn handed_over(&self, tps: &[Tp], committed: bool, ledger: Option<usize>) {
        self.with(|log| {
            let seq = Journal::next(log);
            for tp in tps {
                log.handoffs
                    .entry(tp.clone())
                    .or_default()
                    .push((seq, committed, ledger));
            }
        });
    }

    /// `tps` were assigned; the new owner read the ledger or not. Those
    /// of `behind` had a ledger entry whose writer saw the broker accept
    /// more than its commit now holds: the broker lost a commit, and the
    /// entry is not read against it.
    pub fn assigned(&self, tps: &[Tp], ledger: Option<usize>, behind: &[Tp]) {
        self.with(|log| {
            let seq = Journal::next(log);
            for tp in tps {
                log.assignments
                    .entry(tp.clone())
                    .or_default()
                    .push((seq, ledger));
                if behind.contains(tp) {
                    log.ledger_behind.insert((tp.clone(), seq));
                }
            }
        });
    }

    /// Invariant 12: a record finished before a graceful handoff of its
    /// partition is not delivered to the next owner as work, when the
    /// handoff could carry it: the broker took the revoke's commit (with
    /// its metadata), or the ledger was written at the revoke and read at
    /// the next assignment. Only a kill, or a handoff that neither could
    /// carry, may make a finished job be done again. Returns whether the
    /// record was finished and handed over by a handoff that could not
    /// carry it, or `Carry::Lost` when a commit the broker lost explains
    /// it.
    fn check_redelivery(log: &mut Log, tp: &Tp, offset: i64) -> Carry {
        let Some(&finished) = log.finished.get(&(tp.clone(), offset)) else {
            return Carry::Nothing;
        };
        // The first handoff after the finish: the finishing owner's. A
        // later owner that never received the record (fleet seed 2233: it
        // stopped before its first poll) cannot carry what that handoff
        // did not, whatever its own commit takes; one that received it
        // again finished it anew (or redid it).
        let Some(&(at, committed, written)) = log
            .handoffs
            .get(tp)
            .and_then(|h| h.iter().find(|(at, _, _)| *at > finished))
        else {
            return Carry::Nothing;
        };
        // The ledger carries it when read, after the handoff, with no loss
        // of Redis' data between the write and the read, and when a lost
        // commit did not put the broker's below what its writer saw
        // accepted (then the ledger is not read against it).
        let last = log
            .assignments
            .get(tp)
            .and_then(|a| a.last())
            .filter(|(seq, _)| *seq > at)
            .copied();
        let read = last.and_then(|(_, read)| read);
        let behind = last.is_some_and(|(seq, _)| log.ledger_behind.contains(&(tp.clone(), seq)));
        let through_ledger = written.is_some() && written == read && !behind;
        // The broker lost a commit that passed the record, and no commit
        // since passes it again: after the handoff, when the handing owner
        // finished the record (its revoke commits it again, lost or not);
        // after the finish, when an earlier owner did (the handing owner
        // never had it to commit: seed 1574, a loss between a restart's
        // assignment and its revoke). Excused, and counted
        // (`dropped_by_lost_commit`).
        let handing_owner_finished = log
            .assignments
            .get(tp)
            .and_then(|a| a.iter().rev().find(|(seq, _)| *seq < at))
            .is_some_and(|(seq, _)| finished > *seq);
        let since = if handing_owner_finished { at } else { finished };
        let lost = Journal::lost_since(log, tp, offset, since)
            || (!committed && behind && written.is_some() && written == read);
        if (committed || through_ledger) && !lost {
            let v = format!(
                "12. {}:{} offset {offset} was finished (journal {finished}) before a graceful handoff (journal {at}; commit taken: {committed}, ledger written and read: {through_ledger}) and delivered again",
                tp.0, tp.1
            );
            log.violate(v);
        }
        if lost {
            Carry::Lost
        } else if committed || through_ledger {
            Carry::Carried
        } else {
            Carry::Uncarried
        }
    }

    /// Whether the broker lost, after journal `since`, a commit that said
    /// the record at `offset` of `tp` was finished, and no commit it took
    /// since passes it again.
    fn lost_since(log: &Log, tp: &Tp, offset: i64, since: u64) -> bool {
        let Some(lost) = log.lost_commits.get(tp) else {
            return false;
        };
        lost.iter().any(|(at, _, dropped)| {
            *at > since
                && dropped.iter().any(|(lo, hi)| (*lo..=*hi).contains(&offset))
                && !log
                    .commits
                    .get(tp)
                    .is_some_and(|c| c.iter().any(|(s, o)| s > at && *o > offset))
        })
    }

    /// The broker lost these commits (`Broker::lose_commits`).
    pub fn lost_commits(&self, lost: &[LostCommit]) {
        self.with(|log| {
            let seq = Journal::next(log);
            for l in lost {
                log.trace.push(format!(
                    "l{}:{}:{}>{}",
                    l.tp.0, l.tp.1, l.lost.0, l.back_to.0
                ));
                log.lost_commits.entry(l.tp.clone()).or_default().push((
                    seq,
                    l.back_to.0,
                    l.dropped(),
                ));
            }
        });
    }

    /// The broker handed the record at `offset` to a process. `expelled`:
    /// to a member whose session the group already expired (a stall past
    /// its timeout, prefetched or fetched before its first heartbeat is
    /// refused; a fetch is not fenced by the group). That copy is no
    /// delivery of the partition's: the partition is another's, the
    /// member's fence keeps it from work, its commits are refused, and
    /// what the owner's commits pass is judged by the owner's deliveries.
    pub fn delivered(&self, tp: &Tp, offset: i64, value: &Bytes, expelled: bool) {
        self.with(|log| {
            if expelled {
                log.reach.delivered_to_expelled += 1;
                log.trace.push(format!("d!{}:{}:{offset}", tp.0, tp.1));
                return;
            }
            // Delivered before, and passed since by a commit the broker
            // lost: at-least-once, the lost commit's doing.
            let lost = log
                .delivered
                .get(&(tp.clone(), offset))
                .is_some_and(|&before| Journal::lost_since(log, tp, offset, before));
            if lost {
                log.reach.redelivered_after_lost_commit += 1;
            }
            let carry = Journal::check_redelivery(log, tp, offset);
            let lost = lost || carry == Carry::Lost;
            let uncarried = carry == Carry::Uncarried;
            // Work again for whoever holds it now.
            log.finished.remove(&(tp.clone(), offset));
            let seq = Journal::next(log);
            log.delivered.insert((tp.clone(), offset), seq);
            if let Some(&job) = log.by_value.get(value) {
                log.trace.push(format!("d{}:{}:{offset}:{job}", tp.0, tp.1));
                if uncarried {
                    log.uncarried.insert(job);
                }
                if lost {
                    log.dropped_by_lost_commit.insert(job);
                }
            }
        });
    }

    /// A call reached the downstream: unanswered until `call` (given the
    /// number returned here) records its answer.
    pub fn call_started(&self, job: JobId, at_ms: u64, arrival: Arrival) -> u64 {
        self.with(|log| {
            log.arrivals.push(arrival);
            log.started += 1;
            log.unanswered.insert(log.started, (job, at_ms));
            log.started
        })
    }

    /// A call answered; `started` is its number from `call_started`.
    pub fn call(&self, started: u64, call: Call) {
        self.with(|log| {
            log.unanswered.remove(&started);
            let seq = Journal::next(log);
            log.trace.push(format!(
                "c{}:{}:{}:{:?}",
                call.job, call.at_ms, call.class, call.granted_at_us
            ));
            if call.class == "2xx" {
                log.done.entry(call.job).or_insert(seq);
            }
            log.calls.push(call);
        });
    }

    pub fn dead_letter(&self, value: &Bytes, reason: &str) {
        self.with(|log| {
            let job = log.by_value.get(value).copied().unwrap_or(usize::MAX);
            log.trace.push(format!("x{job}"));
            Journal::next(log);
            log.dead.push((job, reason.to_owned()));
        });
    }

    /// A retry copy's write began (it lands, or fails and is tried again,
    /// later): the job has left its process's memory for a tier. Only the
    /// first is kept. Touches no sequence number (a seed's replay digest
    /// is what it was).
    pub fn retry_begun(&self, value: &Bytes, at_ms: u64) {
        self.with(|log| {
            if let Some(&job) = log.by_value.get(value) {
                log.retry_begun.entry(job).or_insert(at_ms);
            }
        });
    }

    /// A write of the record `value` to a retry tier or the dead-letter
    /// topic failed at `at_ms`, in a produce outage or not. Touches no
    /// sequence number (a seed's replay digest is what it was).
    pub fn write_failed(&self, value: &Bytes, at_ms: u64, in_outage: bool) {
        self.with(|log| {
            let job = log.by_value.get(value).copied().unwrap_or(usize::MAX);
            log.write_failures.push((at_ms, job));
            if in_outage {
                log.reach.writes_in_produce_outage += 1;
            }
        });
    }

    pub fn retried(&self, value: &Bytes, at_ms: u64) {
        self.with(|log| {
            let seq = Journal::next(log);
            if let Some(&job) = log.by_value.get(value) {
                log.trace.push(format!("r{job}"));
                log.retried.entry(job).or_default().push(seq);
                log.retried_at.push((at_ms, job));
            }
        });
    }

    /// Invariant 6: a commit at `offset` says every record below it is
    /// finished. Each must be done, dead-lettered, or copied to a retry
    /// tier after it was delivered.
    pub fn check_commit(&self, tp: &Tp, offset: i64, log_records: &[SimRecord]) {
        self.with(|log| {
            log.trace.push(format!("k{}:{}:{offset}", tp.0, tp.1));
            let seq = Journal::next(log);
            log.commits.entry(tp.clone()).or_default().push((seq, offset));
            for (o, rec) in log_records.iter().enumerate().take(offset.max(0) as usize) {
                let Some(&job) = log.by_value.get(&rec.value) else {
                    continue;
                };
                let Some(&seen) = log.delivered.get(&(tp.clone(), o as i64)) else {
                    // Committed before this consumer saw it: an earlier
                    // commit covered it already.
                    continue;
                };
                let safe = log.done.contains_key(&job)
                    || log.dead.iter().any(|(j, _)| *j == job)
                    || log
                        .retried
                        .get(&job)
                        .is_some_and(|seqs| seqs.iter().any(|&s| s > seen));
                if !safe {
                    let v = format!(
                        "commit of {}:{} at {offset} passes offset {o} (job {job}), which is not finished",
                        tp.0, tp.1
                    );
                    log.violate(v);
                }
            }
        });
    }
}
