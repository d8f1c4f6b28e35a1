//! The metrics a worker serves: a scrape, and bounded cardinality.

mod cardinality;
mod scrape;
