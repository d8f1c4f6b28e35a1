//! What one worker holds in memory, in jobs and in bytes, and when fetching
//! must pause. Counting bytes as well as jobs is what bounds the process:
//! 10,000 jobs of 1 MiB each are 10 GiB, 10,000 of 200 bytes are 2 MB.

/// Bytes counted for a job beyond its record's key and value: the job's
/// ids, its place in the queues and its bookkeeping, rounded up.
pub const JOB_OVERHEAD_BYTES: usize = 256;

/// Jobs and bytes in memory (waiting, delayed, parked, in flight, being
/// written), against the configured bounds.
#[derive(Debug)]
pub struct Memory {
    jobs: usize,
    bytes: usize,
    max_jobs: usize,
    max_bytes: usize,
    paused: bool,
}

/// What fetching should do after a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pressure {
    Pause,
    Resume,
}

impl Memory {
    pub fn new(max_jobs: usize, max_bytes: usize) -> Memory {
        Memory {
            jobs: 0,
            bytes: 0,
            max_jobs,
            max_bytes,
            paused: false,
        }
    }

    /// A job of `bytes` entered memory.
    pub fn add(&mut self, bytes: usize) {
        self.jobs += 1;
        self.bytes += bytes;
    }

    /// A job of `bytes` left memory (finished, dropped or handed on): the
    /// same `bytes` its [`Memory::add`] counted (a `Pending` carries them).
    /// Removing more than was added is a bookkeeping bug: a debug build
    /// fails here rather than clamp it to zero, which would hide a job
    /// counted twice and let memory grow past its bound.
    pub fn remove(&mut self, bytes: usize) {
        debug_assert!(
            self.jobs > 0 && self.bytes >= bytes,
            "a job of {bytes} bytes left memory holding {} jobs of {} bytes",
            self.jobs,
            self.bytes
        );
        self.jobs -= 1;
        self.bytes -= bytes;
    }

    pub fn jobs(&self) -> usize {
        self.jobs
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// At either bound: no more records should be taken in this turn.
    pub fn is_full(&self) -> bool {
        self.jobs >= self.max_jobs || self.bytes >= self.max_bytes
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Pause at either bound; resume once both are below 90 % of theirs, so
    /// that fetching does not flap around the bound.
    pub fn pressure(&mut self) -> Option<Pressure> {
        let over = self.jobs >= self.max_jobs || self.bytes >= self.max_bytes;
        let under = self.jobs < self.max_jobs - self.max_jobs / 10
            && self.bytes < self.max_bytes - self.max_bytes / 10;
        if !self.paused && over {
            self.paused = true;
            Some(Pressure::Pause)
        } else if self.paused && under {
            self.paused = false;
            Some(Pressure::Resume)
        } else {
            None
        }
    }

    /// Forgets a pause: the partitions it applied to are gone (all revoked).
    pub fn unpause(&mut self) {
        self.paused = false;
    }
}

/// The bytes a job of this record holds in memory.
pub fn weight(key: Option<&[u8]>, value: &[u8]) -> usize {
    JOB_OVERHEAD_BYTES + key.map_or(0, <[u8]>::len) + value.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_at_either_bound_and_resumes_below_ninety_percent_of_both() {
        let mut m = Memory::new(10, 10_000);
        for _ in 0..9 {
            m.add(100);
        }
        assert_eq!(m.pressure(), None);
        m.add(100);
        assert_eq!(m.pressure(), Some(Pressure::Pause), "10 jobs");
        m.remove(100);
        assert_eq!(m.pressure(), None, "9 jobs is not under 90 %");
        m.remove(100);
        assert_eq!(m.pressure(), Some(Pressure::Resume));
        // Bytes alone: two jobs of 5,000 bytes.
        let mut m = Memory::new(10, 10_000);
        m.add(5_000);
        m.add(5_000);
        assert_eq!(m.pressure(), Some(Pressure::Pause), "10,000 bytes");
        m.remove(5_000);
        assert_eq!(m.pressure(), Some(Pressure::Resume));
        assert_eq!((m.jobs(), m.bytes()), (1, 5_000));
    }

    #[test]
    fn every_add_removed_leaves_nothing() {
        let mut m = Memory::new(10, 10_000);
        for b in [1, 300, 7_000] {
            m.add(b);
        }
        for b in [300, 7_000, 1] {
            m.remove(b);
        }
        assert_eq!((m.jobs(), m.bytes()), (0, 0));
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "left memory holding 1 jobs of 100 bytes")]
    fn removing_more_than_was_added_fails_loudly() {
        let mut m = Memory::new(10, 10_000);
        m.add(100);
        m.remove(200);
    }
}
