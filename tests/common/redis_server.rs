//! A private `redis-server` process on a free loopback port that a test
//! may stop, restart on the same port, or freeze (SIGSTOP) and thaw
//! (SIGCONT): Redis faults as operators meet them. Killed on drop.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: std::path::PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// [`RedisServer::start`] with more `redis-server` arguments (e.g.
    /// `--loadmodule PATH`), kept for restarts.
    pub fn start_with(extra: &[String]) -> RedisServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("tw-redis-{port}-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let mut server = RedisServer {
            port,
            child: None,
            dir,
            extra: extra.to_vec(),
        };
        server.spawn();
        server
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--maxmemory-policy", "noeviction"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        self.child = Some(child);
        let start = Instant::now();
        while !self.answers() {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server on port {} did not answer PING within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn answers(&self) -> bool {
        Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "PING"])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().expect("running").id();
        let ok = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .expect("run kill(1)")
            .success();
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// Stops the server (its keys are gone: no persistence) and waits for
    /// it to exit; the port refuses connections until [`RedisServer::restart`].
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a running server");
        self.spawn();
    }

    /// Freezes the server (SIGSTOP): connections open and requests are
    /// accepted by the kernel, but nothing is answered.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Ends [`RedisServer::freeze`].
    pub fn thaw(&self) {
        self.signal("-CONT");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Limiter calls a server has run (`FCALL` and `EVALSHA` in `INFO
/// commandstats`, since the last `CONFIG RESETSTAT`).
pub fn limiter_calls(port: u16) -> u64 {
    limiter_stat(port, "calls=")
}

/// Redis' own µs in those calls (their inner commands included).
pub fn limiter_usec(port: u16) -> u64 {
    limiter_stat(port, "usec=")
}

/// One field of the `FCALL` and `EVALSHA` lines of `INFO commandstats`,
/// summed.
fn limiter_stat(port: u16, field: &str) -> u64 {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string(), "INFO", "commandstats"])
        .output()
        .expect("redis-cli");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("cmdstat_fcall:") || l.starts_with("cmdstat_evalsha:"))
        .filter_map(|l| {
            l.split([':', ','])
                .find_map(|kv| kv.strip_prefix(field))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .sum()
}
