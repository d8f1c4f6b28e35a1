//! The worker end to end: in-process workers and worker processes on the mock broker, a real Redis and a recording downstream.

mod backpressure;
mod basic;
mod broker_faults;
mod capacity;
mod cheap_while_blocked;
mod costs;
mod fair_shares;
mod flow;
mod handoff;
mod hostile_downstream;
mod in_flight;
mod memory;
mod no_leak;
mod pause;
mod poison_at_scale;
mod processes;
mod rebalance;
mod reload;
mod restart;
mod retry_tiers;
mod revoked_writes;
mod startup;
mod state_loss;
mod stuck_head;
mod traces;
