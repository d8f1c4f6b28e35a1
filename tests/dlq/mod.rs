//! Dead letters replayed to the jobs topic.

mod replay;
