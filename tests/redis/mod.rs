//! Redis as it runs in production: ACLs, TLS, a Redis Cluster, faults and outages under a running worker.

mod acl;
mod cluster;
mod faults;
mod outage;
mod tls;
