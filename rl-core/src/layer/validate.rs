//! The validation layer: a batch that could never be decided (a cost above
//! a limit's capacity, one state named twice, no limit at all) is refused
//! here, once, whatever the store.

use super::{Answer, Call, Layer};
use crate::model::error::Error;
use crate::store::target::validate;

/// Refuses invalid batches before any store sees them.
#[derive(Debug, Default)]
pub(crate) struct Validate;

impl Layer for Validate {
    fn before(&self, call: &mut Call<'_>) -> Option<Answer> {
        validate(call.op, call.targets)
            .err()
            .map(|error| Answer::Unavailable(Error::Limit(error)))
    }
}
