//! The keys of one call: its identities, tiers and wait ([`Keys`]).

use super::*;

/// What one call gives the limiter ([`Limiter::call_with`]): an identity
/// per group of its spec (in the spec's order), the tier of each tiered
/// group (in order), and how long it may wait for room. Built where the
/// call is made and read before `call_with` returns: the call's future
/// borrows none of it.
///
/// ```
/// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter, key::Part};
/// use std::time::Duration;
/// let limiter = Limiter::builder().memory().build().unwrap();
/// let spec = CallSpec::owned("api", vec![
///     GroupSpec::owned("api_user", vec![Limit::per_minute(1).unwrap()]),
///     GroupSpec::owned("api_account", vec![Limit::per_minute(100).unwrap()]),
/// ]);
/// let user = "alice";
/// // Through `Display`...
/// assert!(limiter.call_with(&spec, Keys::new(&[&user, &42u64])).now().unwrap().is_ok());
/// // ...or typed, without `core::fmt`: the same keys.
/// let again = limiter.call_with(&spec, Keys::parts(&[Part::Text(user), Part::Unsigned(42)]));
/// assert_eq!(again.now().unwrap().unwrap_err().name(), "api_user");
/// // Waiting up to 2 s for room (for a tiered spec: `.tiers(&["pro"])`).
/// let waited = limiter.call_with(&spec, Keys::new(&[&"bob", &42u64]).wait(Duration::from_secs(2)));
/// # drop(waited);
/// ```
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    identities: Forms<'a>,
    tiers: Option<Forms<'a>>,
    wait: Option<Duration>,
    costs: &'a [u64],
}

/// Identities or tiers in one of the forms a call may give them.
#[derive(Clone, Copy)]
enum Forms<'a> {
    Display(&'a [&'a (dyn fmt::Display + Sync)]),
    Parts(&'a [Part<'a>]),
    Text(&'a [&'a str]),
}

impl Forms<'_> {
    fn len(&self) -> usize {
        match self {
            Forms::Display(d) => d.len(),
            Forms::Parts(p) => p.len(),
            Forms::Text(t) => t.len(),
        }
    }
}

impl fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keys")
            .field("identities", &self.identities.len())
            .field("tiers", &self.tiers.map(|t| t.len()))
            .field("wait", &self.wait)
            .field("costs", &self.costs)
            .finish()
    }
}

impl<'a> Keys<'a> {
    /// Identities in their `Display` form, one per group.
    #[inline]
    pub const fn new(identities: &'a [&'a (dyn fmt::Display + Sync)]) -> Self {
        Self {
            identities: Forms::Display(identities),
            tiers: None,
            wait: None,
            costs: &[],
        }
    }

    /// Typed identities (what `#[rate_limit]` and the tower layer pass):
    /// integers and text are rendered without `core::fmt`, anything else
    /// through its `Display`; each gives the key its `Display` form would.
    #[inline]
    pub const fn parts(identities: &'a [Part<'a>]) -> Self {
        Self {
            identities: Forms::Parts(identities),
            tiers: None,
            wait: None,
            costs: &[],
        }
    }

    /// The tier of each tiered group of the spec, in order: each such
    /// group is decided by that tier's limits (declared, or set at run time
    /// for `<group>@<tier>`), on its own state. Without tiers each tiered
    /// group is decided by its `default` tier; see [`GroupSpec::tiered`] and
    /// [`Tier`] for an unknown tier.
    ///
    /// ```
    /// use ratewall::{CallSpec, FailurePolicy, GroupSpec, Keys, Limiter, call::Tier};
    /// let limiter = Limiter::builder().memory().build().unwrap();
    /// let api = CallSpec::owned("api", vec![GroupSpec::owned_tiered("api", vec![
    ///     Tier::owned("free", vec!["1/1m".parse().unwrap()]),
    ///     Tier::owned("pro", vec!["1000/1m".parse().unwrap(), "20/1s".parse().unwrap()]),
    /// ])])
    /// .with_policy(FailurePolicy::FailClosed);
    /// let call = |tier: &str| limiter.call_with(&api, Keys::new(&[&7]).tiers(&[tier])).now().unwrap();
    /// assert!(call("free").is_ok());
    /// let refused = call("free").unwrap_err();
    /// assert_eq!(refused.name(), "api@free");
    /// assert!(call("pro").is_ok()); // pro's own state
    /// // No such tier and no `default`: the failure policy (here: closed) answers.
    /// let unknown = call("gold").unwrap_err();
    /// assert!(unknown.to_string().contains("tier \"gold\" of `api` is unknown"));
    /// ```
    #[inline]
    pub const fn tiers(mut self, tiers: &'a [&'a str]) -> Self {
        self.tiers = Some(Forms::Text(tiers));
        self
    }

    /// [`Keys::tiers`] in the forms identities take (a tier that is not
    /// text is rendered, at most 64 bytes).
    #[inline]
    pub const fn tier_parts(mut self, tiers: &'a [Part<'a>]) -> Self {
        self.tiers = Some(Forms::Parts(tiers));
        self
    }

    /// Waits up to `max_wait` for room instead of being refused (over the
    /// spec's own [`CallSpec::with_wait`]; see [`Limiter::call_with`]). A
    /// `max_wait` of zero makes this call one that does not wait, even
    /// when its spec does (e.g. a spec with an in-flight limit, which
    /// cannot wait, is decided at once).
    #[inline]
    pub const fn wait(mut self, max_wait: Duration) -> Self {
        self.wait = Some(max_wait);
        self
    }

    /// This call's cost in each group of the spec, in order, over the
    /// groups' own [`GroupSpec::with_cost`]: what a call whose cost varies
    /// takes (the tokens a request is estimated to use, its size). Each must
    /// be `1 ..= capacity` of its group's limits (else the call is refused
    /// as unavailable, logged); an in-flight limit always takes one slot.
    /// With [`GroupSpec::settled`], the cost is an estimate the call settles
    /// once it knows the real one ([`Permit::settle_cost`]).
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Keys, Limit, Limiter};
    /// let limiter = Limiter::builder().memory().build().unwrap();
    /// let upload = CallSpec::owned("upload", vec![GroupSpec::owned("upload_mb", vec![Limit::per_minute(100).unwrap()])]);
    /// let call = |mb: u64| limiter.call_with(&upload, Keys::new(&[&"tenant-1"]).costs(&[mb])).now().unwrap();
    /// assert!(call(60).is_ok());
    /// assert!(call(60).is_err()); // 120 MB in a minute: over
    /// assert!(call(40).is_ok());
    /// ```
    #[inline]
    pub const fn costs(mut self, costs: &'a [u64]) -> Self {
        self.costs = costs;
        self
    }

    /// The costs given ([`Keys::costs`]; empty: the groups' own).
    #[inline]
    pub(crate) const fn call_costs(&self) -> &'a [u64] {
        self.costs
    }

    /// The wait asked for.
    #[inline]
    pub(crate) const fn max_wait(&self) -> Option<Duration> {
        self.wait
    }

    /// This call's cost in each group, as given ([`Keys::costs`]; empty:
    /// the groups' own).
    pub(crate) fn given_costs(&self) -> &'a [u64] {
        self.costs
    }

    /// Whether these keys fit `spec`: one identity per group, and as many
    /// tiers as it has tiered groups when tiers are given (none given:
    /// each tiered group gets its `default` tier).
    #[inline]
    pub(crate) fn check(&self, spec: &CallSpec) -> Result<(), Rejection> {
        let groups = spec.groups().len();
        if !self.costs.is_empty() && self.costs.len() != groups {
            return Err(crate::limiter::bad_call(
                spec,
                LimitError::BadCall(format!(
                    "call `{}` has {groups} group(s) but was given {} cost(s): give one per group, or none",
                    spec.name(),
                    self.costs.len(),
                )),
            ));
        }
        if self.identities.len() == groups && self.tiers.is_none() {
            return Ok(());
        }
        let tiered = spec.groups().iter().filter(|g| g.is_tiered()).count();
        let tiers = self.tiers.map_or(0, |t| t.len());
        if self.identities.len() == groups && tiers == tiered {
            return Ok(());
        }
        Err(crate::limiter::bad_call(
            spec,
            LimitError::BadCall(format!(
                "call `{}` has {groups} group(s), {tiered} of them tiered, but was given {} identities and {tiers} tier(s)",
                spec.name(),
                self.identities.len(),
            )),
        ))
    }

    /// The one typed key of a call that may take the direct lane: one key,
    /// no tier, no wait, for a spec of one group that does not wait.
    #[inline(always)]
    pub(crate) fn direct(&self, spec: &CallSpec) -> Option<Part<'a>> {
        match (
            self.identities,
            self.tiers,
            self.wait,
            self.costs,
            spec.groups(),
        ) {
            (Forms::Parts([part]), None, None, [], [_]) if !spec.waits() => Some(*part),
            _ => None,
        }
    }

    /// Runs `f` with the identities rendered.
    #[inline(always)]
    pub(crate) fn with_identities<R>(&self, f: impl FnOnce(&[Identity]) -> R) -> R {
        match self.identities {
            // One key (the common case): no vector.
            Forms::Parts([part]) => f(&[Identity::of(*part)]),
            Forms::Parts(parts) => {
                let identities: Identities = parts.iter().map(|p| Identity::of(*p)).collect();
                f(&identities)
            }
            Forms::Display(values) => {
                let identities: Identities = values.iter().map(|v| Identity::render(*v)).collect();
                f(&identities)
            }
            Forms::Text(texts) => {
                let identities: Identities =
                    texts.iter().map(|t| Identity::of(Part::Text(t))).collect();
                f(&identities)
            }
        }
    }

    /// Runs `f` with the tiers as text.
    #[inline(always)]
    pub(crate) fn with_tiers<R>(&self, f: impl FnOnce(&[&str]) -> R) -> R {
        match self.tiers {
            None => f(&[]),
            Some(Forms::Text(texts)) => f(texts),
            Some(Forms::Parts([Part::Text(tier)])) => f(&[tier]),
            Some(tiers) => {
                let rendered: SmallVec<[_; 2]> = match tiers {
                    Forms::Parts(parts) => parts.iter().map(|p| tier_text(*p)).collect(),
                    Forms::Display(values) => values
                        .iter()
                        .map(|v| tier_text(Part::Display(*v)))
                        .collect(),
                    Forms::Text(texts) => texts.iter().map(|t| tier_text(Part::Text(t))).collect(),
                };
                let texts: SmallVec<[&str; 2]> = rendered.iter().map(|t| t.as_str()).collect();
                f(&texts)
            }
        }
    }
}

impl<'a> From<&'a [&'a (dyn fmt::Display + Sync)]> for Keys<'a> {
    fn from(identities: &'a [&'a (dyn fmt::Display + Sync)]) -> Self {
        Keys::new(identities)
    }
}

impl<'a> From<&'a [Part<'a>]> for Keys<'a> {
    fn from(identities: &'a [Part<'a>]) -> Self {
        Keys::parts(identities)
    }
}
