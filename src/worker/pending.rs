//! A job in memory, with everything needed to finish its record: what
//! every component of the engine passes around.

use tokio::time::Instant;

use crate::job::Job;
use crate::kafka::consumer::Origin;
use crate::kafka::OriginalRecord;

use super::charges::Charge;
use super::ordering::{partition_lane, Lane};
use super::pool::Slots;
use super::slots::Lease;

/// A job in memory, with everything needed to finish its record.
#[derive(Debug)]
pub struct Pending {
    pub job: Job,
    pub origin: Origin,
    /// Its unit of order ([`super::ordering`]): no other job of its lane is
    /// out while it is, nor before it.
    pub lane: Lane,
    pub original: OriginalRecord,
    /// Downstream calls made so far, across retry-topic round trips.
    pub attempts: u32,
    /// What it holds in memory ([`super::memory::weight`]).
    pub bytes: usize,
    /// When this worker took the record (how long a partition's head waits).
    pub received_at: Instant,
    /// When its latest failed call came back (none since an answer or an
    /// outage hold): a call that reaches nothing spends an attempt only if
    /// the downstream answered another call since.
    pub last_failed_at: Option<Instant>,
    /// Failed calls in a row (spent attempts or not): the backoff grows
    /// with them, so a job that spends no attempt still backs off.
    pub failures_in_a_row: u32,
    /// The broker refused its retry copy as too large: it waits in memory
    /// instead of on a retry tier.
    pub too_large_to_copy: bool,
    /// Its slot of the seller's `max_in_flight`, from its grant until its
    /// call is answered or will not be made (`None`: uncapped, or not
    /// granted).
    pub lease: Option<Lease>,
    /// Its downstream slot (`downstream.concurrency`), from its grant
    /// until its answer, or until its run stops short of it.
    pub(crate) slot: Option<Slots>,
    /// The units its grant charged for it, from its grant until its call
    /// starts (spent then); dropped unspent, they go back to its seller's
    /// rules (`None`: not granted, or no store charged it).
    pub(crate) charge: Option<Charge>,
}

impl Pending {
    /// A job just taken from its record (or parsed again from it), in its
    /// partition's lane until [`Pending::in_lane`] says otherwise.
    pub fn new(
        job: Job,
        origin: Origin,
        original: OriginalRecord,
        attempts: u32,
        bytes: usize,
        now: Instant,
    ) -> Pending {
        Pending {
            job,
            lane: partition_lane(&original.origin),
            origin,
            original,
            attempts,
            bytes,
            received_at: now,
            last_failed_at: None,
            failures_in_a_row: 0,
            too_large_to_copy: false,
            lease: None,
            slot: None,
            charge: None,
        }
    }

    /// The job, in `lane`.
    pub fn in_lane(mut self, lane: Lane) -> Pending {
        self.lane = lane;
        self
    }

    /// Not called, and kept (a 429 put it back, a pause took it, a lapsed
    /// lease or a fence held it): its slots go back, and it is asked for
    /// again. Its units stay spent, as documented for a 429 and a pause
    /// (docs: "Shadow rules and pauses"): giving them back too would
    /// change what a 429's hold and a pause cost, which is not this
    /// change's to decide. A job dropped uncalled (a revoke, a shutdown)
    /// gives its units back instead, with its charge.
    pub(super) fn unclaimed(mut self) -> Pending {
        self.lease = None;
        self.slot = None;
        if let Some(charge) = self.charge.take() {
            charge.spend();
        }
        self
    }
}
