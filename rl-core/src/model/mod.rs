//! The limit model: what a limit is, whose key a call uses, what a decision
//! says, what can go wrong, and what a running limiter may change by name
//! (runtime settings, allow and deny lists).

pub(crate) mod clock;
pub(crate) mod decision;
pub(crate) mod error;
pub(crate) mod key;
pub(crate) mod learned;
pub(crate) mod limit;
pub(crate) mod lists;
pub(crate) mod mask;
pub(crate) mod memo;
pub(crate) mod policy;
pub(crate) mod rejection;
pub(crate) mod reservation;
pub(crate) mod settings;
// What configuration forms are read from, in any serde format.
#[cfg(feature = "serde")]
pub(crate) mod value;
