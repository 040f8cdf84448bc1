//! Memory per identity, as the resident set grows: 1 000 000 distinct `u64`
//! identities decided through an annotated fn on the in-memory limiter, and
//! the same through `governor` (keyed, `check_key`) for comparison. Each
//! side runs in its own process (this binary, re-run with an argument), so
//! neither sees memory the other freed.
//!
//! `cargo run --release -p ratewall-benches --example memory_per_identity`
//!
//! Prints, per side: the resident set before and after (from
//! `/proc/self/statm`), and the difference divided by the identities.
//! `rl_text` is the annotated fn keyed by text (`user-<n>`) instead of a
//! number. `-- rl N` (or `rl_text`, `governor`) runs one side with `N`
//! identities.

use std::num::NonZeroU32;
use std::process::Command;

use governor::{Quota, RateLimiter};
use ratewall::{Limiter, Rejection, rate_limit};

#[path = "../support/in_memory.rs"]
mod in_memory;
use in_memory::{now, rss};

/// Ten per hour: every identity's state lives six minutes after its call,
/// so none expires (and is swept) during the run.
#[rate_limit(period = 3600, threshold = 10, key = user, name = "memory")]
async fn annotated(user: u64) -> Result<(), Rejection> {
    Ok(())
}

/// The same limit keyed by text (an identity that is not a number).
#[rate_limit(period = 3600, threshold = 10, key = user, name = "memory_text")]
async fn annotated_text(user: &str) -> Result<(), Rejection> {
    Ok(())
}

/// Decides `n` identities on one side; returns the resident set before and after.
fn side(which: &str, n: u64) -> (u64, u64) {
    match which {
        "rl" => {
            Limiter::builder().memory().install().expect("install");
            // One identity first: the limiter, its shards and the resolved
            // call exist before the first measure.
            now(annotated(u64::MAX)).expect("allowed");
            let before = rss();
            for user in 0..n {
                now(annotated(user)).expect("allowed");
            }
            (before, rss())
        }
        "rl_text" => {
            Limiter::builder().memory().install().expect("install");
            now(annotated_text("warm-up")).expect("allowed");
            let mut text = String::new();
            let before = rss();
            for user in 0..n {
                text.clear();
                text.push_str("user-");
                text.push_str(itoa::Buffer::new().format(user));
                now(annotated_text(&text)).expect("allowed");
            }
            (before, rss())
        }
        "governor" => {
            let governor = RateLimiter::keyed(Quota::per_hour(NonZeroU32::new(10).unwrap()));
            governor.check_key(&u64::MAX).expect("allowed");
            let before = rss();
            for user in 0..n {
                governor.check_key(&user).expect("allowed");
            }
            let after = rss();
            std::hint::black_box(&governor);
            (before, after)
        }
        other => panic!("unknown side {other:?}: expected `rl`, `rl_text` or `governor`"),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [which, n] = args.as_slice() {
        let n: u64 = n.parse().expect("N is an integer");
        let (before, after) = side(which, n);
        println!("{before} {after}");
        return;
    }
    let n = 1_000_000u64;
    let exe = std::env::current_exe().expect("this binary");
    for which in ["rl", "rl_text", "governor"] {
        let out = Command::new(&exe)
            .args([which, &n.to_string()])
            .output()
            .expect("run one side");
        assert!(
            out.status.success(),
            "{which}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let figures: Vec<u64> = text
            .split_whitespace()
            .filter_map(|f| f.parse().ok())
            .collect();
        let [before, after] = figures[..] else {
            panic!("{which}: unexpected output {text:?}");
        };
        println!(
            "{which:>8}: {n} identities, RSS {:.1} MiB -> {:.1} MiB, {:.1} bytes per identity",
            before as f64 / 1048576.0,
            after as f64 / 1048576.0,
            after.saturating_sub(before) as f64 / n as f64
        );
    }
}
