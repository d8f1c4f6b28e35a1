//! `throttle-worker limits reset S`: a seller that used up its
//! limit and is under a 429 block gets a full allowance back, on every
//! replica (the state lives in Redis); other sellers keep theirs.

use std::process::Command;
use std::time::Duration;

use crate::common::{rule, unique_prefix};
use throttle_worker::limiter::{Decision, Mode};

fn granted(d: &Decision) -> bool {
    matches!(d, Decision::Granted(_))
}

#[tokio::test]
async fn reset_clears_a_sellers_state_and_block_and_nothing_else() {
    let prefix = unique_prefix("reset");
    let limiter = crate::common::limiter(
        &prefix,
        crate::common::policy(vec![rule("fixed_window", 3, "1m", None)], vec![]),
    )
    .await;
    for seller in ["spent", "other"] {
        for _ in 0..3 {
            assert!(granted(
                &limiter
                    .acquire(seller, 1, Mode::AllOrNothing)
                    .await
                    .unwrap()
            ));
        }
        assert!(!granted(
            &limiter
                .acquire(seller, 1, Mode::AllOrNothing)
                .await
                .unwrap()
        ));
    }
    limiter
        .block("spent", Duration::from_secs(600))
        .await
        .unwrap();

    let dir = tempfile::tempdir().unwrap();
    // The limiter above keeps state v1 (`KeySpace::new`): the command runs
    // the layout the config names.
    let config = dir.path().join("limits.toml");
    std::fs::write(
        &config,
        format!(
            "[redis]\nurl = \"{}\"\nkey_prefix = \"{prefix}\"\n\n[limits]\ndefault = [{{ algorithm = \"fixed_window\", limit = 3, period = \"1m\" }}]\n",
            crate::common::redis_url()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-worker"))
        .args(["limits", "reset", "spent", "--yes", "--config"])
        .arg(&config)
        .output()
        .expect("run throttle-worker");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        // Its hash (rules and block) held state; it has no slots.
        stdout.contains("reset spent: 1 of its 2 keys held state"),
        "{stdout}"
    );

    for _ in 0..3 {
        assert!(
            granted(
                &limiter
                    .acquire("spent", 1, Mode::AllOrNothing)
                    .await
                    .unwrap()
            ),
            "after the reset the seller has its whole limit and no block"
        );
    }
    assert!(
        !granted(
            &limiter
                .acquire("other", 1, Mode::AllOrNothing)
                .await
                .unwrap()
        ),
        "another seller's state is untouched"
    );
}
