//! Redis over TLS (issue 11): a private `redis-server` on a TLS-only port
//! that requires client certificates, with a CA, server and client
//! certificates made by `openssl` for the test. The limiter works through
//! `rediss://` with `redis.tls_ca_file` and the client certificate; without
//! the client certificate, or trusting only the system's store, startup
//! fails with the cause.


use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::rule;
use throttle_worker::config::{load_from, Topology};
use throttle_worker::limiter::{Decision, KeySpace, Limiter, Mode, RedisStore};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl must be installed");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate.
fn certificates(dir: &Path) {
    let days = ["-days", "2"];
    openssl(
        dir,
        &[
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-subj",
                "/CN=throttle-worker test CA",
            ][..],
            &days,
        ]
        .concat(),
    );
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .unwrap();
    for (name, ext) in [("server", Some("server.ext")), ("client", None)] {
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.crt");
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        );
        let mut args = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
        ];
        if let Some(e) = ext {
            args.extend(["-extfile", e]);
        }
        openssl(dir, &args);
    }
}

struct TlsRedis {
    port: u16,
    child: Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_tls_redis(dir: &Path) -> TlsRedis {
    let port = crate::common::free_port();
    let child = Command::new("redis-server")
        .args([
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
        ])
        .args([
            "--tls-cert-file",
            "server.crt",
            "--tls-key-file",
            "server.key",
        ])
        .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "yes"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .current_dir(dir)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed");
    let server = TlsRedis { port, child };
    let start = Instant::now();
    loop {
        let out = Command::new("redis-cli")
            .args([
                "--tls",
                "--cacert",
                "ca.crt",
                "--cert",
                "client.crt",
                "--key",
                "client.key",
            ])
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "PING"])
            .current_dir(dir)
            .output()
            .expect("redis-cli");
        if String::from_utf8_lossy(&out.stdout).trim() == "PONG" {
            return server;
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the TLS redis-server did not answer: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

async fn open(port: u16, files: &[(&str, PathBuf)]) -> Result<RedisStore, String> {
    let mut env = vec![
        (
            "THROTTLE__REDIS__URL".to_owned(),
            format!("rediss://127.0.0.1:{port}"),
        ),
        ("THROTTLE__REDIS__TIMEOUT".to_owned(), "2s".to_owned()),
    ];
    for (key, path) in files {
        env.push((
            format!("THROTTLE__REDIS__{}", key.to_uppercase()),
            path.display().to_string(),
        ));
    }
    let settings = load_from(None, env).map_err(|e| e.to_string())?.settings;
    RedisStore::open(&settings.redis)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_limiter_runs_over_tls_with_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    certificates(dir.path());
    let server = start_tls_redis(dir.path());
    let file = |name: &str| dir.path().join(name);

    let store = open(
        server.port,
        &[
            ("tls_ca_file", file("ca.crt")),
            ("tls_cert_file", file("client.crt")),
            ("tls_key_file", file("client.key")),
        ],
    )
    .await
    .expect("TLS with the CA and a client certificate");
    let limiter = Limiter::new(
        store,
        KeySpace::new("tls"),
        crate::common::policy(vec![rule("fixed_window", 2, "1m", None)], vec![]),
        Topology::Single,
    );
    for _ in 0..2 {
        let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
        assert!(matches!(d, Decision::Granted(_)), "{d:?}");
    }
    let d = limiter.acquire("s", 1, Mode::AllOrNothing).await.unwrap();
    assert!(matches!(d, Decision::Denied(_)), "{d:?}");

    // The server wants a client certificate: without one, no connection.
    let Err(e) = open(server.port, &[("tls_ca_file", file("ca.crt"))]).await else {
        panic!("a server requiring client certificates accepted none");
    };
    assert!(
        e.contains("rediss://127.0.0.1"),
        "the error names the server: {e}"
    );
    // The system's trust store does not know the test CA.
    let Err(e) = open(
        server.port,
        &[
            ("tls_cert_file", file("client.crt")),
            ("tls_key_file", file("client.key")),
        ],
    )
    .await
    else {
        panic!("a server certificate from an unknown CA was trusted");
    };
    assert!(e.contains("rediss://127.0.0.1"), "{e}");
    // A TLS file with a plain URL is a config error naming the key.
    let env = vec![
        (
            "THROTTLE__REDIS__URL".to_owned(),
            "redis://127.0.0.1:6379".to_owned(),
        ),
        (
            "THROTTLE__REDIS__TLS_CA_FILE".to_owned(),
            file("ca.crt").display().to_string(),
        ),
    ];
    let e = load_from(None, env).err().unwrap();
    assert_eq!(e.key, "redis.tls_ca_file", "{e}");
}
