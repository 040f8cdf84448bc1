//! An identity's blocks ([`ratewall::Limit::with_block`]) read and lifted by
//! their key, `<key>:b` (see `lua/block.lua`): one call each, at the
//! store's time (or the client's, with a client clock).

use std::time::Duration;

use ratewall::{Key, backend::Block, error::BackendError};
use redis::Value;

use crate::backend::RedisBackend;
use crate::script::{Op, Plan, block_key};

impl RedisBackend {
    /// The blocks of `key`'s identity not ended ([`ratewall::backend::Backend::blocks`]).
    pub(crate) async fn identity_blocks(&self, key: &Key) -> Result<Vec<Block>, BackendError> {
        let bk = block_key(key);
        let plan = Plan::blocks(Op::Blocks, self.time(), self.extra_ttl_ms(), &bk);
        let values: Vec<Value> = self.send_as(self.deadline(), &plan).await?;
        // Suffix and time left (µs) per block, then the time used.
        let Some((_, pairs)) = values.split_last() else {
            return Err(bad_reply("no time"));
        };
        if pairs.len() % 2 != 0 {
            return Err(bad_reply("an odd number of values"));
        }
        let mut blocks = pairs
            .chunks_exact(2)
            .map(|pair| match pair {
                [Value::BulkString(suffix), Value::Int(left)] => {
                    let suffix = String::from_utf8(suffix.clone())
                        .map_err(|_| bad_reply("a suffix that is not text"))?;
                    let left = u64::try_from(*left).map_err(|_| bad_reply("a negative time"))?;
                    Ok(Block::new(suffix, Duration::from_micros(left)))
                }
                _ => Err(bad_reply("a block that is not a suffix and a time")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        blocks.sort();
        Ok(blocks)
    }

    /// Lifts every block of `key`'s identity ([`ratewall::backend::Backend::unblock`]).
    pub(crate) async fn lift_blocks(&self, key: &Key) -> Result<bool, BackendError> {
        let bk = block_key(key);
        // Told to the other processes, whose deny caches may remember the
        // identity's refusals (see `crate::notices`).
        let origin = self.notices.as_ref().map_or("", |n| n.origin());
        let plan = Plan::blocks(Op::Unblock, self.time(), self.extra_ttl_ms(), &bk).telling(origin);
        let values: Vec<i64> = self.send(self.deadline(), &plan).await?;
        match values[..] {
            [lifted, _now] => Ok(lifted == 1),
            _ => Err(bad_reply("not two integers")),
        }
    }
}

fn bad_reply(what: &str) -> BackendError {
    BackendError::protocol(format_args!(
        "the rate-limit code answered the blocks of an identity with {what}"
    ))
}
