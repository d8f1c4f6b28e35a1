//! Offset commits that never block the poll thread.
//!
//! A synchronous commit waits for the broker's answer, and a broker may hold
//! that answer for seconds: librdkafka's mock cluster answers only once a
//! rebalance is over, and a real group holds commits while its coordinator
//! moves to another broker. Made on the poll thread, such a commit stopped
//! record intake for the whole wait, though the cooperative protocol keeps
//! the worker's partitions through a rebalance (seen as a 1.6 s gap without
//! a grant in `worker::flow`'s precision test). The periodic commit is
//! therefore sent without waiting: its answer comes back on a queue of its
//! own, which the poll thread reads between polls, and only then do its
//! offsets count as committed.
//!
//! Sent from the poll thread, it still reaches librdkafka in order with the
//! synchronous commit a revoke makes there, so a late periodic commit can
//! never move a partition's committed offset back.
//!
//! rust-rdkafka's `commit(.., CommitMode::Async)` hands the result to no one
//! (its commit callback serves only the automatic commit), so this file
//! calls librdkafka's `rd_kafka_commit_queue` itself.

use std::ffi::CStr;
use std::ptr::NonNull;
use std::sync::Arc;

use rdkafka::bindings as rd;
use rdkafka::consumer::Consumer as _;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::TopicPartitionList;

use super::WorkerConsumer;
use crate::kafka::session::Answer;

/// A queue that receives the answers of this consumer's asynchronous
/// commits.
pub(super) struct CommitQueue {
    /// Keeps the librdkafka handle alive as long as its queue.
    consumer: Arc<WorkerConsumer>,
    queue: NonNull<rd::rd_kafka_queue_t>,
}

// SAFETY: librdkafka's queues are thread-safe, and this one is used by the
// poll thread alone.
unsafe impl Send for CommitQueue {}

impl CommitQueue {
    pub fn new(consumer: Arc<WorkerConsumer>) -> CommitQueue {
        // SAFETY: the handle is valid while `consumer` lives, and the queue
        // is destroyed (Drop) before the Arc is released.
        let raw = unsafe { rd::rd_kafka_queue_new(consumer.client().native_ptr()) };
        let queue = NonNull::new(raw).expect("rd_kafka_queue_new returns a queue");
        CommitQueue { consumer, queue }
    }

    /// Sends the commit of `offsets`; returns at once. Its answer comes out
    /// of [`answers`](Self::answers).
    pub fn send(&self, offsets: &TopicPartitionList) -> Result<(), KafkaError> {
        // SAFETY: both pointers are valid for the call; librdkafka copies
        // the list.
        let err = unsafe {
            rd::rd_kafka_commit_queue(
                self.consumer.client().native_ptr(),
                offsets.ptr(),
                self.queue.as_ptr(),
                None,
                std::ptr::null_mut(),
            )
        };
        if err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Ok(())
        } else {
            Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::from(err)))
        }
    }

    /// The answers that arrived since the last call; never waits.
    pub fn answers(&self) -> Vec<Answer> {
        let mut out = Vec::new();
        loop {
            // SAFETY: the queue is valid; a non-null event is ours to
            // destroy, and nothing read from it outlives this iteration.
            let event = unsafe { rd::rd_kafka_queue_poll(self.queue.as_ptr(), 0) };
            if event.is_null() {
                break;
            }
            if unsafe { rd::rd_kafka_event_type(event) } == rd::RD_KAFKA_EVENT_OFFSET_COMMIT {
                out.push(unsafe { answer_of(event) });
            }
            unsafe { rd::rd_kafka_event_destroy(event) };
        }
        out
    }
}

/// Reads an offset-commit event.
///
/// # Safety
/// `event` must be a live event of type `RD_KAFKA_EVENT_OFFSET_COMMIT`.
unsafe fn answer_of(event: *mut rd::rd_kafka_event_t) -> Answer {
    let code = unsafe { rd::rd_kafka_event_error(event) };
    let error = (code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
        .then(|| KafkaError::ConsumerCommit(RDKafkaErrorCode::from(code)).to_string());
    let mut refused = Vec::new();
    let list = unsafe { rd::rd_kafka_event_topic_partition_list(event) };
    if let Some(list) = unsafe { list.as_ref() } {
        for i in 0..list.cnt.max(0) as usize {
            let e = unsafe { &*list.elems.add(i) };
            if e.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                continue;
            }
            let topic = if e.topic.is_null() {
                String::new()
            } else {
                unsafe { CStr::from_ptr(e.topic) }
                    .to_string_lossy()
                    .into_owned()
            };
            refused.push((
                topic,
                e.partition,
                RDKafkaErrorCode::from(e.err).to_string(),
            ));
        }
    }
    Answer { error, refused }
}

impl Drop for CommitQueue {
    fn drop(&mut self) {
        // SAFETY: created by rd_kafka_queue_new, destroyed once; the handle
        // (held by `consumer`) is still alive.
        unsafe { rd::rd_kafka_queue_destroy(self.queue.as_ptr()) };
    }
}
