//! Tools to demo and test the product, not to run it.
//!
//! - [`demo`]: `throttle-worker demo` and `limits demo`.
//! - [`load`]: the load generator behind `throttle-worker produce`.
//! - [`stub`]: `throttle-worker stub`, the downstream stub.

pub mod demo;
pub mod load;
pub mod stub;
