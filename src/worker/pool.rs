//! The downstream's slots (`downstream.concurrency`): how many calls this
//! replica may have out at once. A slot is taken for a limiter call's
//! heads before the call (so a grant is used at once) and travels with its
//! job until the job's answer; [`Slots`] give theirs back when dropped,
//! wherever that happens (an answer, a chain that stops, a refusal, a
//! revoke, shutdown), so no path can forget one. Taking more than is free
//! or giving back more than was taken is a bookkeeping error: it fails a
//! `debug_assert!` in tests instead of being clamped away.
//!
//! The count is shared with the tokens (an atomic, since a token may be
//! dropped in a run's task); whoever waits for a slot is the scheduler's
//! business, not the pool's.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[derive(Debug)]
struct Shared {
    size: usize,
    free: AtomicUsize,
}

/// The pool: `size` slots, each either free or held by a [`Slots`].
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
    pub(super) fn new(size: usize) -> SlotPool {
        SlotPool {
            shared: Arc::new(Shared {
                size,
                free: AtomicUsize::new(size),
            }),
        }
    }

    pub(super) fn size(&self) -> usize {
        self.shared.size
    }

    pub(super) fn free(&self) -> usize {
        self.shared.free.load(Ordering::Acquire)
    }

    /// Slots held, by calls out or about to go out.
    pub(super) fn taken(&self) -> usize {
        self.size() - self.free()
    }

    /// Takes up to `max` free slots (none when none is free).
    pub(super) fn take_up_to(&self, max: usize) -> Slots {
        let mut taken = 0;
        let _ = self
            .shared
            .free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |free| {
                taken = free.min(max);
                Some(free - taken)
            });
        Slots {
            n: taken,
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

    /// Joins `other`'s slots to these (of the same pool).
    pub(crate) fn join(&mut self, mut other: Slots) {
        debug_assert!(
            Arc::ptr_eq(&self.pool, &other.pool),
            "slots of two pools joined"
        );
        self.n += std::mem::take(&mut other.n);
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
        let before = self.pool.free.fetch_add(self.n, Ordering::AcqRel);
        debug_assert!(
            before + self.n <= self.pool.size,
            "{} slots went back to a pool of {} with {before} free: a slot was given back twice",
            self.n,
            self.pool.size
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
            let pool = SlotPool::new(size);
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
        let pool = SlotPool::new(2);
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
        let pool = SlotPool::new(5);
        let mut a = pool.take_up_to(2);
        let b = pool.take_up_to(2);
        a.join(b);
        assert_eq!((a.len(), pool.free()), (4, 1));
        drop(a);
        assert_eq!(pool.free(), 5);
    }

    #[test]
    fn an_empty_split_takes_nothing() {
        let pool = SlotPool::new(1);
        let mut none = pool.take_up_to(0);
        assert_eq!(none.len(), 0);
        assert!(none.split_one().is_none());
        assert_eq!(pool.free(), 1);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "given back twice")]
    fn a_slot_given_back_twice_fails_loudly() {
        let pool = SlotPool::new(1);
        let forged = Slots {
            n: 1,
            pool: pool.shared.clone(),
        };
        drop(forged);
    }
}
