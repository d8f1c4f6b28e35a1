//! A real Redis Cluster for the tests: `masters` cluster-enabled
//! `redis-server`s on free loopback ports, joined with
//! `redis-cli --cluster create`, stopped and removed on drop. A test can
//! add a master later (`redis-cli --cluster add-node`) and move slots
//! between masters while clients run.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisCluster {
    pub ports: Vec<u16>,
    servers: Vec<Child>,
    dir: std::path::PathBuf,
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// What [`RedisCluster::migrate_slot`] did.
#[derive(Debug, Clone)]
pub struct Migration {
    pub slot: u16,
    pub from: usize,
    pub to: usize,
    /// Keys moved (those that expired on the way are not counted).
    pub keys: usize,
    /// From `SETSLOT IMPORTING` to the last `SETSLOT NODE`.
    pub took: Duration,
}

impl RedisCluster {
    /// Starts the nodes, assigns all 16384 slots over them and waits until
    /// every node reports `cluster_state:ok`.
    pub fn start(masters: usize) -> RedisCluster {
        let dir = std::env::temp_dir().join(format!("tw-cluster-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let mut cluster = RedisCluster {
            ports: Vec::new(),
            servers: Vec::new(),
            dir,
        };
        for _ in 0..masters {
            cluster.spawn_node();
        }
        let nodes: Vec<String> = cluster
            .ports
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(nodes.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "0", "--cluster-yes"]);
        let out = Command::new("redis-cli")
            .args(&args)
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        for &port in &cluster.ports {
            cluster.wait(&format!("node {port} reports cluster_state:ok"), || {
                cli(port, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
            });
        }
        cluster
    }

    /// Starts one more cluster-enabled `redis-server`, not yet in the
    /// cluster; waits until it answers PING and returns its index.
    ///
    /// A node listens on two ports: its client port and its cluster bus
    /// (by default the client port + 10,000, which may be taken, or above
    /// 65,535). Both are picked free and the bus is named with
    /// `--cluster-port`. A port can still be taken between the pick and
    /// the server's bind (other tests pick at the same time): a server that
    /// exits at start is started again on new ports.
    fn spawn_node(&mut self) -> usize {
        for _attempt in 0..5 {
            let (port, bus) = super::free_port_pair();
            let node_dir = self.dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let mut server = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--cluster-port", &bus.to_string()])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            let start = Instant::now();
            loop {
                if cli(port, &["PING"]).trim() == "PONG" {
                    self.ports.push(port);
                    self.servers.push(server);
                    return self.ports.len() - 1;
                }
                if let Some(status) = server.try_wait().expect("node status") {
                    eprintln!(
                        "cluster node on ports {port}/{bus} exited at start ({status}); new ports"
                    );
                    break;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(20),
                    "node {port} answers PING: not within 20 s"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        panic!("no cluster node started in 5 attempts (ports taken?)");
    }

    /// A new, empty master joins the running cluster
    /// (`redis-cli --cluster add-node`): no slots, no scripts. Returns its
    /// index once every node knows it and it reports `cluster_state:ok`.
    pub fn add_master(&mut self) -> usize {
        let node = self.spawn_node();
        let new = format!("127.0.0.1:{}", self.ports[node]);
        let existing = format!("127.0.0.1:{}", self.ports[0]);
        let out = Command::new("redis-cli")
            .args(["--cluster", "add-node", &new, &existing])
            .output()
            .expect("redis-cli --cluster add-node");
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let id = self.node_id(node);
        for other in 0..self.ports.len() {
            self.wait(&format!("node {other} knows every node"), || {
                let nodes = self.cli(other, &["CLUSTER", "NODES"]);
                let linked = nodes
                    .lines()
                    .map(|l| l.split_whitespace().collect::<Vec<_>>())
                    .filter(|f| f.len() > 7 && !f[2].contains("handshake") && f[7] == "connected")
                    .count();
                linked == self.ports.len() && nodes.contains(&id)
            });
        }
        self.wait("the new master reports cluster_state:ok", || {
            self.cli(node, &["CLUSTER", "INFO"])
                .contains("cluster_state:ok")
        });
        node
    }

    /// A new node joins as a replica of `master` (`redis-cli --cluster
    /// add-node --cluster-slave`); returns its index once its replication
    /// link is up (it then holds the master's data and Functions).
    pub fn add_replica(&mut self, master: usize) -> usize {
        let node = self.spawn_node();
        let new = format!("127.0.0.1:{}", self.ports[node]);
        let existing = format!("127.0.0.1:{}", self.ports[master]);
        let master_id = self.node_id(master);
        let out = Command::new("redis-cli")
            .args(["--cluster", "add-node", &new, &existing])
            .args(["--cluster-slave", "--cluster-master-id", &master_id])
            .output()
            .expect("redis-cli --cluster add-node --cluster-slave");
        assert!(
            out.status.success(),
            "redis-cli --cluster add-node --cluster-slave failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        self.wait("the replica's link to its master is up", || {
            self.cli(node, &["INFO", "replication"])
                .contains("master_link_status:up")
        });
        node
    }

    /// `CLUSTER FAILOVER` on a replica: it becomes the master of its
    /// master's slots. Returns once it says so (`ROLE`) and node 0 agrees.
    pub fn failover(&self, replica: usize) {
        let reply = self.cli(replica, &["CLUSTER", "FAILOVER"]);
        assert_eq!(reply.trim(), "OK", "CLUSTER FAILOVER: {reply}");
        let id = self.node_id(replica);
        self.wait("the replica took over as master", || {
            self.cli(replica, &["ROLE"]).starts_with("master")
                && self.cli(0, &["CLUSTER", "NODES"]).lines().any(|l| {
                    l.starts_with(&id)
                        && l.split_whitespace()
                            .nth(2)
                            .is_some_and(|f| f.contains("master"))
                })
        });
    }

    /// `CLIENT PAUSE` on one node for `dur`: it stops answering its
    /// clients (their commands wait in its buffers and run when the pause
    /// ends) while the cluster bus goes on, so the cluster does not fail
    /// it over: a master that hangs for a while.
    pub fn pause(&self, node: usize, dur: Duration) {
        let ms = dur.as_millis().to_string();
        let reply = self.cli(node, &["CLIENT", "PAUSE", &ms, "ALL"]);
        assert_eq!(reply.trim(), "OK", "CLIENT PAUSE on node {node}: {reply}");
    }

    /// The node's cluster id (`CLUSTER MYID`).
    pub fn node_id(&self, node: usize) -> String {
        self.cli(node, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// The hash slot of `key`, as Redis computes it.
    pub fn keyslot(&self, key: &str) -> u16 {
        let out = self.cli(0, &["CLUSTER", "KEYSLOT", key]);
        out.trim()
            .parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {out}"))
    }

    /// The master that serves `slot`, as node 0 sees the cluster.
    pub fn owner(&self, slot: u16) -> usize {
        let nodes = self.cli(0, &["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                // Ranges "a-b" or single slots; "[slot->-id]" entries are
                // migrations in progress, not ownership.
                let mut ends = range.splitn(2, '-');
                match (ends.next().map(str::parse::<u16>), ends.next()) {
                    (Some(Ok(a)), None) => a == slot,
                    (Some(Ok(a)), Some(b)) => b.parse().is_ok_and(|b: u16| a <= slot && slot <= b),
                    _ => false,
                }
            });
            if serves {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("node address");
                return self
                    .ports
                    .iter()
                    .position(|&p| p == port)
                    .expect("owner is one of ours");
            }
        }
        panic!("no master serves slot {slot}:\n{nodes}");
    }

    /// Moves `slot` to master `to` by hand, the way
    /// `redis-cli --cluster reshard` does, but one key per MIGRATE with
    /// `pace` between keys, so that clients meet the slot half moved for a
    /// while: `CLUSTER SETSLOT IMPORTING` on the target, `MIGRATING` on the
    /// source, `MIGRATE` each key, then `SETSLOT NODE` on the target, the
    /// source and every other master.
    pub fn migrate_slot(&self, slot: u16, to: usize, pace: Duration) -> Migration {
        let from = self.owner(slot);
        assert_ne!(from, to, "slot {slot} is already on node {to}");
        let started = Instant::now();
        let slot_s = slot.to_string();
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let ok = |node: usize, args: &[&str]| {
            let out = self.cli(node, args);
            assert_eq!(out.trim(), "OK", "node {node}: {args:?}: {out}");
        };
        ok(to, &["CLUSTER", "SETSLOT", &slot_s, "IMPORTING", &from_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot_s, "MIGRATING", &to_id]);
        let to_port = self.ports[to].to_string();
        let mut keys = 0;
        loop {
            let batch = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot_s, "100"]);
            let batch: Vec<&str> = batch.lines().filter(|k| !k.is_empty()).collect();
            if batch.is_empty() {
                break;
            }
            for key in batch {
                let out = self.cli(
                    from,
                    &[
                        "MIGRATE",
                        "127.0.0.1",
                        &to_port,
                        "",
                        "0",
                        "5000",
                        "KEYS",
                        key,
                    ],
                );
                // NOKEY: the key expired (or was deleted) since it was listed.
                assert!(matches!(out.trim(), "OK" | "NOKEY"), "MIGRATE {key}: {out}");
                keys += usize::from(out.trim() == "OK");
                std::thread::sleep(pace);
            }
        }
        ok(to, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
        ok(from, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
        for other in (0..self.ports.len()).filter(|&n| n != from && n != to) {
            ok(other, &["CLUSTER", "SETSLOT", &slot_s, "NODE", &to_id]);
        }
        Migration {
            slot,
            from,
            to,
            keys,
            took: started.elapsed(),
        }
    }

    /// Error replies counted by every node since it started or since
    /// [`RedisCluster::reset_stats`] (`INFO errorstats`), summed by prefix:
    /// `MOVED`, `ASK`, `TRYAGAIN`, `NOSCRIPT`, `ERR`…
    pub fn error_stats(&self) -> std::collections::BTreeMap<String, u64> {
        let mut sum = std::collections::BTreeMap::new();
        for node in 0..self.ports.len() {
            for line in self.cli(node, &["INFO", "errorstats"]).lines() {
                let Some((name, rest)) = line.trim().split_once(":count=") else {
                    continue;
                };
                let name = name.trim_start_matches("errorstat_").to_owned();
                *sum.entry(name).or_insert(0) += rest.parse::<u64>().unwrap_or(0);
            }
        }
        sum
    }

    /// `CONFIG RESETSTAT` on every node.
    pub fn reset_stats(&self) {
        for node in 0..self.ports.len() {
            self.cli(node, &["CONFIG", "RESETSTAT"]);
        }
    }

    /// `redis-cli --cluster check`: every slot covered, no slot left open,
    /// every node agreeing on the configuration.
    pub fn check(&self) -> Result<(), String> {
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "check",
                &format!("127.0.0.1:{}", self.ports[0]),
            ])
            .output()
            .expect("redis-cli --cluster check");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !text.contains("[WARNING]") && !text.contains("[ERR]") {
            Ok(())
        } else {
            Err(text)
        }
    }

    fn wait(&self, what: &str, mut ok: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ok() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "{what}: not within 20 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://` URL of one node, e.g. as `redis.url`.
    pub fn url(&self, node: usize) -> String {
        format!("redis://127.0.0.1:{}", self.ports[node])
    }

    /// Keys held by each node.
    pub fn keys_per_node(&self) -> Vec<u64> {
        self.ports
            .iter()
            .map(|&p| cli(p, &["DBSIZE"]).trim().parse().unwrap_or(0))
            .collect()
    }

    /// `redis-cli` against one node, for the tests' own checks.
    pub fn cli(&self, node: usize, args: &[&str]) -> String {
        cli(self.ports[node], args)
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for s in &mut self.servers {
            let _ = s.kill();
            let _ = s.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
