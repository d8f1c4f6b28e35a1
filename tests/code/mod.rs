//! The source's shape: which module may import what.

mod module_graph;
