//! Learned scales ([`ratewall::backend::Backend::adjust`]): what every instance
//! sharing a budget learned of its upstream's limit, one small hash per
//! limit name, changed by `lua/learned.lua`.
//!
//! - key `<prefix>:{learned}:<name>`: the hash tag `{learned}` is fixed, so
//!   the name (chosen by the developer, never by a caller) cannot move the
//!   slot, and no identity's key has it (those have a `:` inside their hash
//!   tag); the key still starts with `<prefix>:` for key-pattern ACLs.
//! - fields: `scale` (parts per million of the stated limits), `changed`
//!   and `lowered` (µs, by the server's `TIME` unless the backend keeps
//!   time itself), `ceiling` (the upstream's limit as last found, parts per
//!   million; 0: none) and `found` (µs).
//! - TTL: [`RedisBackend::LEARNED_TTL`] (1 day), set again on every write.

use std::time::Duration;

use ratewall::{
    error::BackendError,
    upstream::{Adjust, SCALE_CEILING, SCALE_FLOOR, SCALE_ONE},
};

use crate::backend::{RedisBackend, micros};
use crate::registry::{Query, RegistryScript};

/// One change to a learned scale (`lua/learned.lua`).
static ADJUST: RegistryScript = RegistryScript::new(include_str!("lua/learned.lua"));

impl RedisBackend {
    /// How long a learned scale lives after its last change: 1 day.
    pub const LEARNED_TTL: Duration = Duration::from_secs(86_400);

    /// The key of the learned scale of `name` under `prefix`.
    ///
    /// ```
    /// assert_eq!(ratewall_redis::RedisBackend::learned_key("app", "tpm"), "app:{learned}:tpm");
    /// ```
    pub fn learned_key(prefix: &str, name: &str) -> String {
        format!("{prefix}:{{learned}}:{name}")
    }

    pub(crate) async fn adjust_learned(
        &self,
        prefix: &str,
        name: &str,
        adjust: Adjust,
    ) -> Result<u64, BackendError> {
        let (op, params): (&str, Vec<u64>) = match adjust {
            Adjust::Raise {
                step,
                approach,
                headroom,
                every,
                believe_for,
            } => (
                "raise",
                vec![step, approach, headroom, micros(every), micros(believe_for)],
            ),
            Adjust::Lower {
                keep,
                estimate,
                headroom,
                cooldown,
                floor,
            } => (
                "lower",
                vec![
                    keep,
                    estimate,
                    headroom,
                    micros(cooldown),
                    floor.clamp(SCALE_FLOOR, SCALE_ONE),
                ],
            ),
            Adjust::Found { estimate, headroom } => ("found", vec![estimate, headroom]),
            Adjust::Set { scale } => ("set", vec![scale.clamp(SCALE_FLOOR, SCALE_CEILING)]),
            _ => ("read", Vec::new()),
        };
        let now = self
            .parts()
            .1
            .clock
            .as_ref()
            .map_or_else(String::new, |clock| clock.now_micros().to_string());
        let mut args = vec![
            op.to_owned(),
            Self::LEARNED_TTL.as_millis().to_string(),
            SCALE_ONE.to_string(),
            now,
        ];
        args.extend(params.iter().map(u64::to_string));
        let scale: u64 = self
            .registry_query(
                "adjusting a learned limit",
                Query::Script(&ADJUST, vec![Self::learned_key(prefix, name)], args),
            )
            .await?;
        Ok(scale)
    }
}
