//! The demo's worker replicas: child processes of this same binary
//! (`run --config FILE`), each logging to its own file, that never outlive
//! the demo.
//!
//! Three things see to that: [`Replicas::stop`] at the end (SIGTERM, a
//! grace period, then SIGKILL); `Drop` on every other way out, a panic
//! included; and `PR_SET_PDEATHSIG`, so that the kernel kills them if the
//! demo itself is killed (SIGKILL leaves no time for the other two).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// One replica.
#[derive(Debug)]
pub struct Replica {
    /// 1-based, as the view shows it.
    pub number: usize,
    pub log: PathBuf,
    /// `http://127.0.0.1:PORT` of its `/metrics`, `/readyz`.
    pub base_url: String,
    child: Child,
    exited: Option<ExitStatus>,
}

impl Replica {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited (reaped here).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exited.is_none() {
            self.exited = self.child.try_wait().ok().flatten();
        }
        self.exited
    }

    fn signal(&self, signal: libc::c_int) {
        if self.exited.is_some() {
            return;
        }
        // SAFETY: kill(2) has no memory effects; the pid is our own child,
        // not yet reaped (`exited` is None), so it cannot have been reused.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, signal);
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// Every replica of one demo run.
#[derive(Debug, Default)]
pub struct Replicas {
    pub list: Vec<Replica>,
}

/// One replica to start.
pub struct Launch<'a> {
    pub config: &'a Path,
    pub listen: std::net::SocketAddr,
}

impl Replicas {
    /// Starts `exe run --config FILE` for each launch, logs in `dir`.
    /// Must be called from the thread that outlives the children (the
    /// demo's main thread): `PR_SET_PDEATHSIG` fires when the *thread* that
    /// forked a child exits.
    pub fn spawn(exe: &Path, launches: &[Launch<'_>], dir: &Path) -> std::io::Result<Replicas> {
        let mut replicas = Replicas::default();
        for (i, l) in launches.iter().enumerate() {
            let number = i + 1;
            let log = dir.join(format!("replica-{number}.log"));
            let file = std::fs::File::create(&log)?;
            let mut cmd = Command::new(exe);
            cmd.arg("run")
                .arg("--config")
                .arg(l.config)
                .stdin(Stdio::null())
                .stdout(file.try_clone()?)
                .stderr(file);
            // The demo's config is the whole truth: no THROTTLE__* from the
            // caller's environment may redirect a replica elsewhere.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("THROTTLE__") {
                    cmd.env_remove(k);
                }
            }
            let parent = std::process::id() as libc::pid_t;
            // SAFETY: runs in the forked child before exec; prctl, getppid
            // and _exit are async-signal-safe, and nothing is allocated.
            unsafe {
                use std::os::unix::process::CommandExt;
                cmd.pre_exec(move || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // The demo died between fork and prctl: no signal will
                    // come, so do not start.
                    if libc::getppid() != parent {
                        libc::_exit(1);
                    }
                    Ok(())
                });
            }
            let child = cmd.spawn()?;
            replicas.list.push(Replica {
                number,
                log,
                base_url: format!("http://{}", l.listen),
                child,
                exited: None,
            });
        }
        Ok(replicas)
    }

    /// Replicas that have exited, with their status.
    pub fn exited(&mut self) -> Vec<(usize, ExitStatus)> {
        self.list
            .iter_mut()
            .filter_map(|r| r.try_exit().map(|s| (r.number, s)))
            .collect()
    }

    /// SIGTERM to every replica, then waits up to `grace` for them to exit
    /// (a worker finishes its calls and commits), then SIGKILL. Returns each
    /// replica's exit status (`None`: it had to be killed).
    pub async fn stop(&mut self, grace: Duration) -> Vec<(usize, Option<ExitStatus>)> {
        for r in &self.list {
            r.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + grace;
        while self.list.iter_mut().any(|r| r.try_exit().is_none()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut out = Vec::new();
        for r in &mut self.list {
            let status = r.try_exit();
            if status.is_none() {
                r.signal(libc::SIGKILL);
                r.exited = r.child.wait().ok();
            }
            out.push((r.number, status));
        }
        out
    }
}

impl Drop for Replicas {
    /// The way out when [`Replicas::stop`] was not reached (an error, a
    /// panic): SIGTERM, two seconds, then SIGKILL, and every child reaped.
    fn drop(&mut self) {
        for r in &self.list {
            r.signal(libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(2);
        while self.list.iter_mut().any(|r| r.try_exit().is_none()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for r in &mut self.list {
            if r.try_exit().is_none() {
                r.signal(libc::SIGKILL);
                r.exited = r.child.wait().ok();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `sleep` stands in for a worker: the guard must end it.
    fn sleeper(dir: &Path) -> Replicas {
        let mut r = Replicas::default();
        let log = dir.join("replica-1.log");
        let child = Command::new("sleep").arg("30").spawn().unwrap();
        r.list.push(Replica {
            number: 1,
            log,
            base_url: String::new(),
            child,
            exited: None,
        });
        r
    }

    fn alive(pid: u32) -> bool {
        // SAFETY: signal 0 only checks that the process exists.
        unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    #[tokio::test]
    async fn stop_terminates_and_reaps() {
        let dir = tempfile::tempdir().unwrap();
        let mut r = sleeper(dir.path());
        let pid = r.list[0].pid();
        let started = Instant::now();
        let out = r.stop(Duration::from_secs(5)).await;
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(out.len(), 1);
        let status = out[0].1.expect("exited on SIGTERM");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(!alive(pid), "reaped and gone");
    }

    #[test]
    fn drop_ends_the_children() {
        let dir = tempfile::tempdir().unwrap();
        let r = sleeper(dir.path());
        let pid = r.list[0].pid();
        assert!(alive(pid));
        drop(r);
        assert!(!alive(pid));
    }
}
