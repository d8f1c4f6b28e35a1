//! [`Store`]: where the limiter's state lives, as the calls it runs. Redis
//! in the product ([`RedisStore`](super::RedisStore)); the simulation's
//! in-memory Redis and fault-injecting wrappers in tests. The calls are
//! data (`script.rs`), their replies too (`reply.rs`): a store only moves
//! them.

use std::future::Future;

use super::learn::Blocked;
use super::reply::{JobsReply, RollbackFound};
use super::script::{BlockAt, BlockCall, JobsCall, RefundCall, RestoreCall};
use super::shape::Shape;

/// Where the limiter's state lives.
pub trait Store: Clone + Send + Sync + 'static {
    type Error: std::error::Error + Send + Sync + 'static;

    /// Whether a failed call may have run on the server all the same, its
    /// reply lost on the way back (a timeout, a dropped connection): the
    /// limiter then gives back what a jobs call charged
    /// ([`cancel_jobs`](Self::cancel_jobs)). A store whose failures always
    /// come before the script runs says no (the default).
    fn may_have_run(_e: &Self::Error) -> bool {
        false
    }

    /// Gives back units of an earlier jobs request ([`RefundCall`]);
    /// returns the units asked back.
    fn refund(&self, call: &RefundCall) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// Runs one jobs call: one reply per request, in order.
    fn run_jobs(
        &self,
        call: &JobsCall,
    ) -> impl Future<Output = Result<Vec<JobsReply>, Self::Error>> + Send;

    /// Gives back slots of `max_in_flight` (`leases` of the sorted set at
    /// `key`); returns how many were still held (not lapsed or given back).
    fn release(
        &self,
        key: &str,
        leases: &[String],
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;
    /// Cancels a jobs call whose answer never reached its caller (see
    /// [`JobsCall::cancel_args`]): one integer per request, the units given
    /// back, -1 for a tombstone left before the call ran, 0 for nothing
    /// done. A store that records no calls cancels nothing (the default).
    fn cancel_jobs(
        &self,
        call: &JobsCall,
    ) -> impl Future<Output = Result<Vec<i64>, Self::Error>> + Send {
        let n = call.requests.len();
        async move { Ok(vec![0; n]) }
    }

    /// The limiter's epoch at `key` (`lua/jobs.lua`): the instant its
    /// state was last found lost, 0 for "never", `None` while it is gone.
    /// A store that loses nothing has none (the default).
    fn read_epoch(
        &self,
        _key: &str,
    ) -> impl Future<Output = Result<Option<u64>, Self::Error>> + Send {
        async { Ok(None) }
    }

    /// The finds of partial losses listed at `key` after `after_us` (the
    /// rollbacks key, `rollback_hold` in `lua/common.lua`), oldest first. A
    /// store that loses nothing lists none (the default).
    fn read_rollbacks(
        &self,
        _key: &str,
        _after_us: u64,
    ) -> impl Future<Output = Result<Vec<RollbackFound>, Self::Error>> + Send {
        async { Ok(Vec::new()) }
    }

    /// Writes back a replica's part of a seller's state after a loss
    /// (`lua/restore.lua`): per rule, the units charged, -1 when the epoch
    /// names another loss, -2 when this replica restored it already. A
    /// store that loses nothing restores nothing (the default).
    fn restore(
        &self,
        call: &RestoreCall,
    ) -> impl Future<Output = Result<Vec<i64>, Self::Error>> + Send {
        let n = call.rules.len();
        async move { Ok(vec![0; n]) }
    }

    /// Makes ready the generated functions of `shapes` (`limiter::shape`)
    /// before a call needs one: at startup and after a reload of the
    /// limits. A store without them does nothing (the default).
    /// Writes a new install's epoch ("never lost") when it is missing,
    /// with the server key when given ('install', `lua/limiter.lua`).
    /// Returns whether it wrote it. The stores of tests that never guard
    /// against a loss write nothing.
    fn begin_install(
        &self,
        _epoch: &str,
        _server: Option<&str>,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send {
        async { Ok(false) }
    }

    fn prepare_shapes(
        &self,
        _shapes: &[Shape],
    ) -> impl Future<Output = Result<(), Self::Error>> + Send {
        async { Ok(()) }
    }

    /// The store's clock at `now` (this host's monotonic instant), as last
    /// learnt: Redis' `TIME` run forward on the monotonic clock, which no
    /// step of the host's wall clock moves. `None` until learnt, and for a
    /// store with no clock of its own (the default).
    fn unix_us_at(&self, _now: tokio::time::Instant) -> Option<u64> {
        None
    }

    /// Blocks the seller whose block is at `at` for `dur_us` from now
    /// (never shortening a longer block); returns when the block ends (µs).
    fn block(
        &self,
        at: &BlockAt,
        now_us: Option<u64>,
        dur_us: u64,
    ) -> impl Future<Output = Result<u64, Self::Error>> + Send;

    /// [`Store::block`] with the drop of the seller's learnt limit a 429
    /// brings (`limits.learn`, `lua/block.lua`'s `ARGV[4]`). A store that
    /// learns nothing blocks only (the default).
    fn block_learning(
        &self,
        at: &BlockAt,
        call: &BlockCall,
    ) -> impl Future<Output = Result<Blocked, Self::Error>> + Send {
        async move {
            let until_us = self.block(at, call.now_us, call.dur_us).await?;
            Ok(Blocked {
                until_us,
                learnt: None,
            })
        }
    }
}
