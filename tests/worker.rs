//! Test target `worker`: the worker end to end (`worker::`), dead-letter
//! replay (`dlq::`) and the metrics it serves (`metrics::`), on
//! librdkafka's mock broker, a real Redis and a recording downstream.

mod common;
mod dlq;
mod metrics;
#[path = "worker/mod.rs"]
mod worker;
