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
//!   time itself).
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
        let (op, amount, interval, floor) = match adjust {
            Adjust::Raise { step, every } => ("raise", step.min(SCALE_ONE), micros(every), 0),
            Adjust::Lower {
                keep,
                cooldown,
                floor,
            } => ("lower", keep.min(SCALE_ONE), micros(cooldown), floor),
            Adjust::Set { scale } => ("set", scale.clamp(SCALE_FLOOR, SCALE_CEILING), 0, 0),
            _ => ("read", 0, 0, 0),
        };
        let now = self
            .parts()
            .1
            .clock
            .as_ref()
            .map_or_else(String::new, |clock| clock.now_micros().to_string());
        let args = vec![
            op.to_owned(),
            amount.to_string(),
            interval.to_string(),
            Self::LEARNED_TTL.as_millis().to_string(),
            SCALE_ONE.to_string(),
            floor.clamp(SCALE_FLOOR, SCALE_ONE).to_string(),
            now,
        ];
        let scale: u64 = self
            .registry_query(
                "adjusting a learned limit",
                Query::Script(&ADJUST, vec![Self::learned_key(prefix, name)], args),
            )
            .await?;
        Ok(scale)
    }
}
