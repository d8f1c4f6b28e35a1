//! What the tests see of the events: while a [`Capture`] guard is held,
//! every event emitted on its thread is recorded, by [`Event::NAME`] and
//! `Debug` rendering, so a test can assert that an occurrence was told
//! (and how) instead of reading the global metrics, which every test of
//! the process shares.
//!
//! Thread-local: tests run in parallel on threads of their own, and none
//! sees another's events. An event emitted on another thread (a spawned
//! one, a worker of a multi-threaded runtime) is not seen either; a
//! `#[tokio::test]`'s default runtime runs its tasks on the test's thread.
//!
//! Built only for tests (`cfg(test)`, or the `testkit` feature the
//! integration tests turn on), never in the product.

use std::cell::RefCell;
use std::rc::Rc;

use super::Event;

/// One event as a [`Capture`] saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The event's [`Event::NAME`], its type's name.
    pub name: &'static str,
    /// The event's `{:?}`: its name and fields.
    pub debug: String,
}

type Sink = Rc<RefCell<Vec<Captured>>>;

thread_local! {
    /// The captures held on this thread, outermost first.
    static SINKS: RefCell<Vec<Sink>> = const { RefCell::new(Vec::new()) };
}

/// Captures this thread's events until the guard drops. Captures nest:
/// each held guard sees every event emitted while it is held.
pub fn capture() -> Capture {
    let sink = Sink::default();
    SINKS.with(|sinks| sinks.borrow_mut().push(sink.clone()));
    Capture { sink }
}

/// Hands `event` to the captures held on this thread. With none (nearly
/// always) it costs a thread-local read: the event is rendered only when
/// someone looks.
pub(super) fn record<E: Event + ?Sized>(event: &E) {
    // try_with: an event emitted while the thread's locals are torn down
    // (from another local's destructor) is simply not captured.
    let _ = SINKS.try_with(|sinks| {
        let sinks = sinks.borrow();
        if sinks.is_empty() {
            return;
        }
        let captured = Captured {
            name: E::NAME,
            debug: format!("{event:?}"),
        };
        for sink in sinks.iter() {
            sink.borrow_mut().push(captured.clone());
        }
    });
}

/// The events emitted on this thread since [`capture`] returned it.
/// Not `Send`: it sees the events of the thread that made it.
#[must_use = "the capture stops when the guard drops"]
pub struct Capture {
    sink: Sink,
}

impl Capture {
    /// Every event so far, in the order emitted.
    pub fn events(&self) -> Vec<Captured> {
        self.sink.borrow().clone()
    }

    /// The names of the events so far, in the order emitted.
    pub fn names(&self) -> Vec<&'static str> {
        self.sink.borrow().iter().map(|c| c.name).collect()
    }

    /// The events of type `E` so far, as their `Debug` renderings.
    pub fn of<E: Event>(&self) -> Vec<String> {
        self.sink
            .borrow()
            .iter()
            .filter(|c| c.name == E::NAME)
            .map(|c| c.debug.clone())
            .collect()
    }

    /// How many events of type `E` were emitted so far.
    pub fn count<E: Event>(&self) -> usize {
        self.sink
            .borrow()
            .iter()
            .filter(|c| c.name == E::NAME)
            .count()
    }

    /// Forgets the events so far, and keeps capturing.
    pub fn clear(&self) {
        self.sink.borrow_mut().clear();
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        let _ = SINKS.try_with(|sinks| {
            sinks
                .borrow_mut()
                .retain(|sink| !Rc::ptr_eq(sink, &self.sink));
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::events::JobDone;

    /// An event that records into this thread's `RECORDED` instead of
    /// the global metrics, which other tests read.
    #[derive(Debug)]
    struct Probe(u32);

    thread_local! {
        static RECORDED: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
    }

    impl Event for Probe {
        const NAME: &'static str = "Probe";

        fn record(&self) {
            RECORDED.with(|r| r.borrow_mut().push(self.0));
        }
    }

    #[test]
    fn a_capture_sees_the_events_emitted_while_it_is_held() {
        Probe(0).emit();
        let cap = capture();
        Probe(1).emit();
        JobDone {
            job_id: "job-7",
            attempts: 2,
        }
        .emit();
        Probe(2).emit();
        assert_eq!(cap.names(), ["Probe", "JobDone", "Probe"]);
        assert_eq!(cap.count::<Probe>(), 2);
        assert_eq!(cap.of::<Probe>(), ["Probe(1)", "Probe(2)"]);
        assert_eq!(
            cap.of::<JobDone>(),
            [r#"JobDone { job_id: "job-7", attempts: 2 }"#],
            "the inherent emit() call sites use goes through the capture"
        );
        cap.clear();
        assert!(cap.events().is_empty());
        drop(cap);
        // Nothing held: nothing recorded, nothing left for the next guard.
        Probe(3).emit();
        assert!(capture().events().is_empty());
        assert_eq!(
            RECORDED.with(|r| r.borrow().clone()),
            [0, 1, 2, 3],
            "every emit records, captured or not"
        );
    }

    #[test]
    fn captures_nest() {
        let outer = capture();
        Probe(1).emit();
        {
            let inner = capture();
            Probe(2).emit();
            assert_eq!(inner.of::<Probe>(), ["Probe(2)"]);
        }
        Probe(3).emit();
        assert_eq!(outer.of::<Probe>(), ["Probe(1)", "Probe(2)", "Probe(3)"]);
    }

    /// Parallel tests run on threads of their own: a capture must not see
    /// another thread's events, even one emitted while it is held.
    #[test]
    fn a_capture_does_not_see_another_thread_s_events() {
        let cap = capture();
        let (there, ready) = (
            std::sync::Barrier::new(2),
            std::sync::atomic::AtomicBool::new(false),
        );
        std::thread::scope(|s| {
            s.spawn(|| {
                let theirs = capture();
                there.wait();
                for n in 100..200 {
                    Probe(n).emit();
                }
                ready.store(true, std::sync::atomic::Ordering::SeqCst);
                assert_eq!(theirs.count::<Probe>(), 100, "the thread's own capture");
            });
            there.wait();
            Probe(1).emit();
        });
        assert!(ready.load(std::sync::atomic::Ordering::SeqCst));
        assert_eq!(
            cap.of::<Probe>(),
            ["Probe(1)"],
            "only this thread's event, none of the other's 100"
        );
    }
}
