//! The limit grammar, in one place: what the `#[rate_limit]` macro checks at
//! compile time, what `ratewall` checks at run time, and what `ratewall-redis`
//! writes into keys and scripts.
//!
//! - [`Algorithm`]: the six algorithms, their names (as written in the macro,
//!   configuration files and metrics) and short codes (in storage keys and
//!   scripts).
//! - [`parse_duration_micros`] and [`parse_rate`]: `"500ms"`, `"1m"`,
//!   `"5/1h"`, `"10/d"`.
//! - [`check_limit`]: every numeric bound of a limit, with its reason
//!   ([`Problem`]); `const`, so the macro's constants are checked by the
//!   compiler too. [`check_settings`]: `burst` and `slots` only where the
//!   algorithm uses them.
//! - [`check_lease`]: which limits can lease units, and how many
//!   ([`LeaseProblem`]).
//! - [`check_block`]: which limits can block an identity once it is
//!   refused (a penalty box), and for how long ([`BlockProblem`]).
//! - [`check_tier_name`] and [`split_tier`]: tier names (`pro`) and the
//!   registry names of tiers (`api@pro`).
//!
//! A proc-macro crate cannot depend on a crate that depends on it, so this
//! crate sits below both `ratewall-macros` and `ratewall` and depends on
//! nothing (but serde's traits under feature `serde`: [`Algorithm`] reads
//! and writes itself by name).
//! Users do not need it directly: `ratewall` re-exports what they see.
//!
//! ```
//! use ratewall_grammar::{Algorithm, Problem, check_limit, parse_rate};
//! let rate = parse_rate("5/1h").unwrap();
//! assert_eq!((rate.threshold, rate.period_us), (5, 3_600_000_000));
//! assert_eq!("sliding_log".parse::<Algorithm>(), Ok(Algorithm::SlidingLog));
//! assert!(matches!(
//!     check_limit(20_000, 60_000_000, Algorithm::SlidingLog, 20_000, 10),
//!     Err(Problem::SlidingLogTooLarge { .. })
//! ));
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod algorithm;
mod block;
mod bounds;
mod lease;
mod text;
mod tier;

pub use algorithm::{Algorithm, Capacity, Traits, UnknownAlgorithm};
pub use block::{BlockProblem, MAX_BLOCK_US, MIN_BLOCK_US, check_block};
pub use bounds::{
    DEFAULT_LEASE_TTL_US, DEFAULT_SLOTS, DOUBLE_EXACT, MAX_CAPACITY_PERIOD, MAX_IN_FLIGHT,
    MAX_LEASE_TTL_US, MIN_LEASE_TTL_US, Problem, SLIDING_LOG_CAP, capacity, check_limit,
    check_settings, problems,
};
pub use lease::{LeaseProblem, can_lease, check_lease};
pub use text::{
    BadDuration, BadRate, DURATION_UNITS, Rate, format_duration, parse_duration_micros, parse_rate,
};
pub use tier::{
    BadTierName, DEFAULT_TIER, TIER_NAME_MAX, TIER_SEPARATOR, check_tier_name, inherited,
    split_tier,
};
