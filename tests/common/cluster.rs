//! A real Redis Cluster for the tests: `masters` cluster-enabled
//! `redis-server`s on free loopback ports, joined with
//! `redis-cli --cluster create`, stopped and removed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisCluster {
    pub ports: Vec<u16>,
    servers: Vec<Child>,
    dir: std::path::PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli must be installed");
    String::from_utf8_lossy(&out.stdout).into_owned()
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
            let port = free_port();
            let node_dir = cluster.dir.join(port.to_string());
            std::fs::create_dir_all(&node_dir).expect("node dir");
            let server = Command::new("redis-server")
                .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&node_dir)
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            cluster.ports.push(port);
            cluster.servers.push(server);
        }
        for &port in &cluster.ports {
            cluster.wait(&format!("node {port} answers PING"), || {
                cli(port, &["PING"]).trim() == "PONG"
            });
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
