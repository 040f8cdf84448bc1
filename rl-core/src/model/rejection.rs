//! The value an annotated function returns instead of running its body.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use crate::model::decision::Decision;
use crate::model::error::Error;
use crate::model::limit::Limit;

/// Why a call was refused.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum RejectionReason {
    /// Over the limit: the binding decision and the limit that made it.
    Limited {
        /// The decision of the refusing limit with the longest wait.
        decision: Decision,
        /// That limit.
        limit: Limit,
    },
    /// The limiter could not decide and the policy says to refuse
    /// ([`crate::FailurePolicy::FailClosed`]), or no limiter is installed.
    Unavailable(Error),
    /// The identity is on the deny list of the limit (or of every limit).
    Denied {
        /// When the entry expires; `None`: until removed.
        until: Option<std::time::SystemTime>,
    },
}

/// A refused call. Convert it into your handler's error type with `From`.
///
/// ```
/// use ratewall::{Decision, Limit, Rejection, backend::Figures};
/// let limit = Limit::per_minute(1).unwrap();
/// let decision = Decision::new(Figures {
///     allowed: false,
///     limit: 1,
///     retry_after_us: 1_500_000,
///     reset_after_us: 1_500_000,
///     ..Figures::default()
/// });
/// let rejection = Rejection::limited("send_sms", decision, limit);
/// assert_eq!(rejection.retry_after(), Some(std::time::Duration::from_millis(1500)));
/// assert_eq!(rejection.to_string(), "rate limited by `send_sms`: retry after 1.5s");
/// ```
#[derive(Clone)]
pub struct Rejection(
    /// One box for the name and the reason: a `Rejection` is one pointer,
    /// so `Result<(), Rejection>` is one word and an admission moves no
    /// bytes of a refusal it did not make (`Result<T, Rejection>` returns
    /// in registers for a `T` of up to a word).
    Box<Refused>,
);

/// What a [`Rejection`] holds.
#[derive(Clone)]
struct Refused {
    name: Name,
    reason: RejectionReason,
}

impl fmt::Debug for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Rejection")
            .field("name", &self.name())
            .field("reason", &self.0.reason)
            .finish()
    }
}

/// Bytes of a name a rejection holds in place (no allocation).
const INLINE_NAME: usize = 28;

/// A rejection's name: given (`'static`, or owned), or a copy of a short
/// borrowed name held in place, so a refusal named by the caller's `&str`
/// (e.g. [`crate::Limiter::check`]) allocates no string.
#[derive(Clone)]
pub(crate) enum Name {
    Given(Cow<'static, str>),
    Inline(arrayvec::ArrayString<INLINE_NAME>),
}

impl Name {
    /// `name`, copied: in place when short, else into a `String`.
    #[inline]
    pub(crate) fn copied(name: &str) -> Self {
        match arrayvec::ArrayString::from(name) {
            Ok(inline) => Name::Inline(inline),
            Err(_) => Name::Given(Cow::Owned(name.to_owned())),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Name::Given(name) => name,
            Name::Inline(name) => name,
        }
    }
}

impl From<&Cow<'static, str>> for Name {
    /// A `'static` name as it is, an owned one copied (in place when short).
    #[inline]
    fn from(name: &Cow<'static, str>) -> Self {
        match name {
            Cow::Borrowed(name) => Name::Given(Cow::Borrowed(name)),
            Cow::Owned(name) => Name::copied(name),
        }
    }
}

impl From<Cow<'static, str>> for Name {
    #[inline]
    fn from(name: Cow<'static, str>) -> Self {
        Name::Given(name)
    }
}

impl Rejection {
    /// The name and the reason in one box, allocated first and written in
    /// place (`Box::new` of a value this size builds it on the stack and
    /// copies it over).
    #[inline(always)]
    fn new(name: Name, reason: RejectionReason) -> Self {
        Self(Box::write(Box::new_uninit(), Refused { name, reason }))
    }

    /// A rejection for being over `limit`.
    pub fn limited(name: impl Into<Cow<'static, str>>, decision: Decision, limit: Limit) -> Self {
        Self::limited_as(Name::Given(name.into()), decision, limit)
    }

    /// [`Rejection::limited`] with a crate-made [`Name`].
    #[inline]
    pub(crate) fn limited_as(name: Name, decision: Decision, limit: Limit) -> Self {
        Self::new(name, RejectionReason::Limited { decision, limit })
    }

    /// A rejection because the limiter could not decide.
    pub fn unavailable(name: impl Into<Cow<'static, str>>, error: Error) -> Self {
        Self::unavailable_as(Name::Given(name.into()), error)
    }

    /// [`Rejection::unavailable`] with a crate-made [`Name`].
    pub(crate) fn unavailable_as(name: Name, error: Error) -> Self {
        Self::new(name, RejectionReason::Unavailable(error))
    }

    /// A rejection because the identity is deny-listed (until `until`).
    pub fn denied(
        name: impl Into<Cow<'static, str>>,
        until: Option<std::time::SystemTime>,
    ) -> Self {
        Self::denied_as(Name::Given(name.into()), until)
    }

    /// [`Rejection::denied`] with a crate-made [`Name`].
    pub(crate) fn denied_as(name: Name, until: Option<std::time::SystemTime>) -> Self {
        Self::new(name, RejectionReason::Denied { until })
    }

    /// The name of the limit (by default `module::function`).
    pub fn name(&self) -> &str {
        self.0.name.as_str()
    }

    /// Why the call was refused.
    pub fn reason(&self) -> &RejectionReason {
        &self.0.reason
    }

    /// The binding decision, when the call was over its limit.
    pub fn decision(&self) -> Option<&Decision> {
        match &self.0.reason {
            RejectionReason::Limited { decision, .. } => Some(decision),
            _ => None,
        }
    }

    /// The refusing limit, when the call was over its limit.
    pub fn limit(&self) -> Option<&Limit> {
        match &self.0.reason {
            RejectionReason::Limited { limit, .. } => Some(limit),
            _ => None,
        }
    }

    /// How long to wait before a call of the same cost can pass: the
    /// binding decision's `retry_after`, or the time left on a deny-list
    /// entry that expires (`None` for one that does not).
    pub fn retry_after(&self) -> Option<Duration> {
        match &self.0.reason {
            RejectionReason::Limited { decision, .. } => Some(decision.retry_after()),
            RejectionReason::Denied { until: Some(until) } => Some(
                until
                    .duration_since(std::time::SystemTime::now())
                    .unwrap_or(Duration::ZERO),
            ),
            _ => None,
        }
    }

    /// Whether the call was refused because the identity is deny-listed.
    pub fn is_denied(&self) -> bool {
        matches!(self.0.reason, RejectionReason::Denied { .. })
    }

    /// Whether the call was refused because its identity already has as
    /// many calls in flight as its in-flight limit allows
    /// ([`crate::Limit::in_flight`]; [`Rejection::limit`] says how many).
    /// The `retry_after` of such a refusal is a hint (1 s): a slot frees
    /// whenever a running call ends. Over HTTP it is a `429` with
    /// `Retry-After: 1` and `{"error":"too_many_in_flight",...}`, without
    /// `RateLimit` fields (they describe rates).
    pub fn is_in_flight(&self) -> bool {
        matches!(&self.0.reason, RejectionReason::Limited { limit, .. } if limit.is_in_flight())
    }

    /// Whether the call was refused because the limiter could not decide.
    pub fn is_unavailable(&self) -> bool {
        matches!(self.0.reason, RejectionReason::Unavailable(_))
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0.reason {
            RejectionReason::Limited { limit, .. } if limit.is_in_flight() => {
                write!(
                    f,
                    "too many calls in flight for `{}` (at most {})",
                    self.name(),
                    limit.threshold()
                )
            }
            RejectionReason::Limited { decision, .. } => {
                write!(
                    f,
                    "rate limited by `{}`: retry after {:?}",
                    self.name(),
                    decision.retry_after()
                )
            }
            RejectionReason::Unavailable(error) => {
                write!(f, "rate limiter for `{}` unavailable: {error}", self.name())
            }
            RejectionReason::Denied { .. } => {
                write!(f, "denied by the deny list of `{}`", self.name())
            }
        }
    }
}

impl std::error::Error for Rejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.0.reason {
            RejectionReason::Unavailable(error) => Some(error),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_one_pointer_so_an_admission_moves_one_word() {
        use std::mem::size_of;
        assert_eq!(size_of::<Rejection>(), size_of::<usize>());
        assert_eq!(size_of::<Result<(), Rejection>>(), size_of::<usize>());
        assert_eq!(size_of::<Result<u64, Rejection>>(), 2 * size_of::<usize>());
    }

    #[test]
    fn a_copied_name_reads_back_whole_whether_held_in_place_or_not() {
        let long = "a::name::longer::than::what::a::rejection::holds::in::place";
        for name in ["", "sms", "é€", &"x".repeat(INLINE_NAME), long] {
            let rejection = Rejection::denied_as(Name::copied(name), None);
            assert_eq!(rejection.name(), name);
            assert_eq!(
                rejection.to_string(),
                format!("denied by the deny list of `{name}`")
            );
            assert!(format!("{rejection:?}").contains(&format!("name: {name:?}")));
        }
    }
}
