//! The downstream's slots (at most `downstream.concurrency`): how many calls this
//! replica may have out at once. A slot is taken for a limiter call's
//! heads before the call (so a grant is used at once) and travels with its
//! job until the job's answer; [`Slots`] give theirs back when dropped,
//! wherever that happens (an answer, a chain that stops, a refusal, a
//! revoke, shutdown), so no path can forget one. Taking more than is free
//! or giving back more than was taken is a bookkeeping error: it fails a
//! `debug_assert!` in tests instead of being clamped away.
//!
//! How many may be taken at once is the pool's limit: the ceiling, or
//! what `super::concurrency` has learnt of the downstream.
//!
//! The count is shared with the tokens (an atomic, since a token may be
//! dropped in a run's task); whoever waits for a slot is the scheduler's
//! business, not the pool's.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
struct Shared {
    /// `downstream.concurrency`: the most the limit may ever be.
    ceiling: usize,
    /// Slots that may be taken now (the adaptive limit, or the ceiling).
    limit: AtomicUsize,
    taken: AtomicUsize,
}

/// The pool: up to `limit` slots taken at once, each held by a [`Slots`].
/// The limit may drop below what is taken (the downstream said it had too
/// much): no slot is taken back, none is handed out until enough are back.
#[derive(Debug)]
pub(super) struct SlotPool {
    shared: Arc<Shared>,
}

/// Slots taken from a pool; they go back when dropped.
pub(crate) struct Slots {
    n: usize,
    pool: Arc<Shared>,
}

impl SlotPool {
    /// A pool of `ceiling` slots, `limit` of which may be taken at first.
    pub(super) fn new(ceiling: usize, limit: usize) -> SlotPool {
        debug_assert!(limit <= ceiling, "a limit of {limit} over {ceiling}");
        SlotPool {
            shared: Arc::new(Shared {
                ceiling,
                limit: AtomicUsize::new(limit),
                taken: AtomicUsize::new(0),
            }),
        }
    }

    pub(super) fn limit(&self) -> usize {
        self.shared.limit.load(Ordering::Acquire)
    }

    /// Sets how many slots may be taken (at most the ceiling).
    pub(super) fn set_limit(&self, limit: usize) {
        debug_assert!(
            limit <= self.shared.ceiling,
            "a limit of {limit} over {}",
            self.shared.ceiling
        );
        self.shared
            .limit
            .store(limit.min(self.shared.ceiling), Ordering::Release);
    }

    /// Slots that may be taken now. Under the limit, not a bookkeeping
    /// clamp: a lowered limit leaves more taken than it allows.
    pub(super) fn free(&self) -> usize {
        self.limit().saturating_sub(self.taken())
    }

    /// Slots held, by calls out or about to go out.
    pub(super) fn taken(&self) -> usize {
        self.shared.taken.load(Ordering::Acquire)
    }

    /// Takes up to `max` free slots (none when none is free).
    pub(super) fn take_up_to(&self, max: usize) -> Slots {
        let limit = self.limit();
        let mut n = 0;
        let _ = self
            .shared
            .taken
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
                n = limit.saturating_sub(taken).min(max);
                Some(taken + n)
            });
        Slots {
            n,
            pool: self.shared.clone(),
        }
    }

    /// Takes one slot, if one is free.
    pub(super) fn take_one(&self) -> Option<Slots> {
        let one = self.take_up_to(1);
        (one.n == 1).then_some(one)
    }
}

impl Slots {
    pub(crate) fn len(&self) -> usize {
        self.n
    }

    /// Slots taken from their pool, these too: how many calls were out
    /// when one started (what the adaptive limit learns from).
    pub(crate) fn taken_in_pool(&self) -> usize {
        self.pool.taken.load(Ordering::Acquire)
    }

    /// Splits one slot off, if any is left.
    pub(crate) fn split_one(&mut self) -> Option<Slots> {
        if self.n == 0 {
            return None;
        }
        self.n -= 1;
        Some(Slots {
            n: 1,
            pool: self.pool.clone(),
        })
    }

    /// Joins `other`'s slots to these (of the same pool). Slots of
    /// another pool are a bug (a debug build fails here); a release build
    /// lets them go back to their own pool as they are dropped, so that
    /// neither pool's count goes wrong: each pool's `taken` is always the
    /// sum of its live [`Slots`], which is why the `fetch_sub` in `drop`
    /// cannot go below zero.
    pub(crate) fn join(&mut self, mut other: Slots) {
        let same = Arc::ptr_eq(&self.pool, &other.pool);
        debug_assert!(same, "slots of two pools joined");
        if same {
            self.n += std::mem::take(&mut other.n);
        }
    }
}

impl fmt::Debug for Slots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Slots").field(&self.n).finish()
    }
}

impl Drop for Slots {
    fn drop(&mut self) {
        if self.n == 0 {
            return;
        }
        let before = self.pool.taken.fetch_sub(self.n, Ordering::AcqRel);
        debug_assert!(
            before >= self.n,
            "{} slots went back to a pool of {} with {before} taken: a slot was given back twice",
            self.n,
            self.pool.ceiling
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_go_back_when_dropped_on_every_path() {
        let cases: &[(usize, usize, usize, usize, usize)] = &[
            // size, take_up_to, splits, free after splits dropped, free at end
            (4, 3, 0, 1, 4),
            (4, 3, 2, 3, 4),
            (4, 9, 4, 4, 4),
            (2, 0, 0, 2, 2),
            (0, 5, 0, 0, 0),
        ];
        for &(size, take, splits, after_splits, at_end) in cases {
            let pool = SlotPool::new(size, size);
            let mut held = pool.take_up_to(take);
            assert_eq!(held.len(), take.min(size), "{size}/{take}");
            for _ in 0..splits {
                drop(held.split_one().expect("a slot left to split"));
            }
            assert_eq!(pool.free(), after_splits, "{size}/{take}/{splits}");
            drop(held);
            assert_eq!(pool.free(), at_end, "{size}/{take}/{splits}");
        }
    }

    #[test]
    fn take_one_refuses_when_every_slot_is_held() {
        let pool = SlotPool::new(2, 2);
        let a = pool.take_one().expect("first");
        let b = pool.take_one().expect("second");
        assert!(pool.take_one().is_none());
        assert_eq!(pool.taken(), 2);
        drop(a);
        let c = pool.take_one().expect("one went back");
        assert_eq!(pool.free(), 0);
        drop((b, c));
        assert_eq!(pool.free(), 2);
    }

    #[test]
    fn joined_slots_go_back_together() {
        let pool = SlotPool::new(5, 5);
        let mut a = pool.take_up_to(2);
        let b = pool.take_up_to(2);
        a.join(b);
        assert_eq!((a.len(), pool.free()), (4, 1));
        drop(a);
        assert_eq!(pool.free(), 5);
    }

    #[test]
    fn a_lowered_limit_hands_out_nothing_until_enough_are_back() {
        let pool = SlotPool::new(8, 4);
        let held = pool.take_up_to(9);
        assert_eq!((held.len(), pool.free()), (4, 0), "only the limit");
        pool.set_limit(2);
        assert_eq!(pool.free(), 0);
        let mut held = held;
        drop(held.split_one());
        drop(held.split_one());
        assert_eq!((pool.taken(), pool.free()), (2, 0), "still at the limit");
        drop(held);
        assert_eq!(pool.free(), 2);
        pool.set_limit(8);
        assert_eq!(pool.take_up_to(9).len(), 8, "up to the ceiling");
    }

    #[test]
    fn an_empty_split_takes_nothing() {
        let pool = SlotPool::new(1, 1);
        let mut none = pool.take_up_to(0);
        assert_eq!(none.len(), 0);
        assert!(none.split_one().is_none());
        assert_eq!(pool.free(), 1);
    }

    /// Regression (issue 51): a join across two pools moved one pool's
    /// slots into the other's count, so one `fetch_sub` wrapped in a
    /// release build and its `free()` read 0 for good.
    #[test]
    #[cfg_attr(debug_assertions, should_panic(expected = "two pools joined"))]
    fn slots_of_two_pools_never_mix_their_counts() {
        let (one, two) = (SlotPool::new(2, 2), SlotPool::new(2, 2));
        let mut a = one.take_up_to(1);
        a.join(two.take_up_to(2));
        assert_eq!(
            (one.taken(), two.taken()),
            (1, 0),
            "the other pool's slots went home"
        );
        drop(a);
        assert_eq!((one.free(), two.free()), (2, 2));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "given back twice")]
    fn a_slot_given_back_twice_fails_loudly() {
        let pool = SlotPool::new(1, 1);
        let forged = Slots {
            n: 1,
            pool: pool.shared.clone(),
        };
        drop(forged);
    }
}
