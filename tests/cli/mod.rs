//! The binary's command line: the demo, `dlq`, `limits` and `produce`.

mod companions;
mod demo;
mod dlq;
mod operator;
mod produce;
