//! What a call asks for: a [`CallSpec`] (its name and one [`GroupSpec`]
//! per key, each with its limits, cost and [`Counting`]) and a tiered
//! group's [`Tier`]s, checked when they are built. Nothing here decides:
//! `resolve.rs` resolves a spec against a limiter, `call.rs` holds what an
//! admitted call keeps.

use std::borrow::Cow;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ratewall_grammar::{TIER_NAME_MAX, TIER_SEPARATOR, check_tier_name};

use crate::model::error::LimitError;
use crate::model::key::Part;
use crate::model::limit::Limit;
use crate::model::policy::FailurePolicy;

/// Which admitted calls keep the units they took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Counting {
    /// Every admitted call (the default).
    #[default]
    Every,
    /// Decided after the call ran, with [`Permit::settle`](crate::Permit::settle): a call settled
    /// as not counted gives back what it took, or, in a group that resets on
    /// success ([`GroupSpec::reset_on_success`]), forgets its identity there.
    /// Units are still reserved before the call runs, so concurrent calls
    /// never exceed a limit (count-failures without a race).
    Settled,
}

/// One key of a call and the limits decided on it.
///
/// ```
/// use ratewall::{Algorithm, GroupSpec, Limit};
/// const PER_MINUTE: Limit = Limit::from_parts_const(3, 60_000_000, Algorithm::SlidingLog, 3, 10);
/// static USER: GroupSpec = GroupSpec::new("login_user", &[PER_MINUTE]).reset_on_success();
/// assert_eq!(USER.name(), "login_user");
/// let ip = GroupSpec::owned("login_ip", vec![Limit::per_day(100).unwrap()]).with_cost(1);
/// assert_eq!(ip.limits()[0].threshold(), 100);
/// ```
#[derive(Debug, Clone)]
pub struct GroupSpec {
    name: Cow<'static, str>,
    limits: Cow<'static, [Limit]>,
    cost: u64,
    reset_on_success: bool,
    settled: bool,
    /// `Some` for a tiered group: its declared tiers (see [`GroupSpec::tiered`]).
    tiers: Option<Cow<'static, [Tier]>>,
}

impl GroupSpec {
    /// A group named `name` (the key's scope, the name in rejections, logs
    /// and [`Settings::set_limits`](crate::settings::Settings::set_limits)) with compiled-in `limits`, one unit per
    /// call.
    pub const fn new(name: &'static str, limits: &'static [Limit]) -> Self {
        Self {
            name: Cow::Borrowed(name),
            limits: Cow::Borrowed(limits),
            cost: 1,
            reset_on_success: false,
            settled: false,
            tiers: None,
        }
    }

    /// A group built at run time.
    pub fn owned(name: impl Into<String>, limits: Vec<Limit>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            limits: Cow::Owned(limits),
            cost: 1,
            reset_on_success: false,
            settled: false,
            tiers: None,
        }
    }

    /// Units each call takes from these limits (checked against their
    /// capacity when the call is first decided).
    pub const fn with_cost(mut self, cost: u64) -> Self {
        self.cost = cost;
        self
    }

    /// With [`Counting::Settled`]: a call settled as not counted forgets
    /// this group's identity (consecutive-failure counting) instead of
    /// giving back its own units.
    pub const fn reset_on_success(mut self) -> Self {
        self.reset_on_success = true;
        self
    }

    /// This group's cost is an estimate, settled once the call knows the
    /// real one ([`Permit::settle_cost`](crate::Permit::settle_cost)): the call takes the estimate (its
    /// [`GroupSpec::with_cost`], or the call's own, [`Keys::costs`](crate::Keys::costs)),
    /// and the settlement gives back what it took beyond the real cost, or
    /// charges what the real cost took beyond it as debt later calls pay
    /// (see [`Permit::settle_cost`](crate::Permit::settle_cost) for how each algorithm takes debt). A
    /// permit dropped unsettled keeps the estimate. The tokens of a call to a
    /// language model, known only from its response, are the example.
    pub const fn settled(mut self) -> Self {
        self.settled = true;
        self
    }

    /// Whether this group's cost is settled after the call ([`GroupSpec::settled`]).
    pub const fn settles_cost(&self) -> bool {
        self.settled
    }

    /// The group's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The compiled-in limits (runtime overrides replace them by name).
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }

    /// Units each call takes.
    pub const fn cost(&self) -> u64 {
        self.cost
    }

    /// Whether an uncounted call resets this group's identity.
    pub const fn resets_on_success(&self) -> bool {
        self.reset_on_success
    }

    pub(crate) fn name_cow(&self) -> &Cow<'static, str> {
        &self.name
    }

    /// A tiered group named `name`: each call gives its tier (e.g. the
    /// caller's plan, with [`Keys::tiers`](crate::Keys::tiers)), and is decided by that
    /// tier's limits, on that tier's own state. A tier's limits are looked
    /// up at run time as `<name>@<tier>` (`api@pro`): [`Settings::set_limits`](crate::settings::Settings::set_limits),
    /// a limits file and admin overrides change a declared tier, or add one
    /// that is not declared here. A call whose tier is none of these is
    /// decided by the `default` tier if there is one; else it cannot be
    /// decided and the failure policy answers it (see [`Tier`]).
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, call::Tier};
    /// static FREE: [Limit; 1] = [Limit::from_parts_const(2, 60_000_000, ratewall::Algorithm::Gcra, 2, 10)];
    /// static TIERS: [Tier; 1] = [Tier::new("free", &FREE)];
    /// static API: [GroupSpec; 1] = [GroupSpec::tiered("api", &TIERS)];
    /// static SPEC: CallSpec = CallSpec::new("api", &API);
    ///
    /// let limiter = Limiter::builder().memory().build().unwrap();
    /// limiter.settings().set_limits("api@pro", vec!["100/1m".parse().unwrap()]).unwrap(); // a tier added at run time
    /// for _ in 0..2 {
    ///     assert!(limiter.call_with(&SPEC, ratewall::Keys::new(&[&"alice"]).tiers(&["free"])).now().unwrap().is_ok());
    /// }
    /// assert!(limiter.call_with(&SPEC, ratewall::Keys::new(&[&"alice"]).tiers(&["free"])).now().unwrap().is_err());
    /// // Upgraded: the next call is decided by `pro`, on its own state.
    /// assert!(limiter.call_with(&SPEC, ratewall::Keys::new(&[&"alice"]).tiers(&["pro"])).now().unwrap().is_ok());
    /// ```
    pub const fn tiered(name: &'static str, tiers: &'static [Tier]) -> Self {
        Self {
            name: Cow::Borrowed(name),
            limits: Cow::Borrowed(&[]),
            cost: 1,
            reset_on_success: false,
            settled: false,
            tiers: Some(Cow::Borrowed(tiers)),
        }
    }

    /// A tiered group built at run time. `tiers` may be empty: every tier
    /// then comes from the limiter's runtime limits (`<name>@<tier>`).
    pub fn owned_tiered(name: impl Into<String>, tiers: Vec<Tier>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            limits: Cow::Owned(Vec::new()),
            cost: 1,
            reset_on_success: false,
            settled: false,
            tiers: Some(Cow::Owned(tiers)),
        }
    }

    /// Adds a tier, making the group tiered (its own limits are then
    /// unused): `GroupSpec::owned_tiered("api", vec![]).with_tier(..)`.
    pub fn with_tier(mut self, tier: Tier) -> Self {
        self.tiers
            .get_or_insert_with(|| Cow::Owned(Vec::new()))
            .to_mut()
            .push(tier);
        self
    }

    /// The same group with every rate limit blocking for `block` (a penalty
    /// box, see [`Limit::with_block`]), its tiers' included; its in-flight
    /// limits are left as they are.
    ///
    /// ```
    /// use ratewall::{GroupSpec, Limit};
    /// use std::time::Duration;
    /// let user = GroupSpec::owned("login_user", vec![Limit::per_minute(5)?, Limit::in_flight(2)?])
    ///     .with_block(Duration::from_secs(900))?;
    /// assert_eq!(user.limits()[0].block(), Some(Duration::from_secs(900)));
    /// assert_eq!(user.limits()[1].block(), None);
    /// # Ok::<(), ratewall::error::LimitError>(())
    /// ```
    ///
    /// # Errors
    /// [`LimitError::Block`] when a rate limit cannot block for `block`
    /// (see [`Limit::with_block`]): out of 1 ms ..= 30 days, or leasing.
    pub fn with_block(mut self, block: Duration) -> Result<Self, LimitError> {
        let blocked = |limits: &[Limit]| -> Result<Vec<Limit>, LimitError> {
            limits
                .iter()
                .map(|l| match l.is_in_flight() {
                    true => Ok(*l),
                    false => l.with_block(block),
                })
                .collect()
        };
        self.limits = Cow::Owned(blocked(&self.limits)?);
        if let Some(tiers) = &self.tiers {
            let tiers = tiers
                .iter()
                .map(|t| Ok(Tier::owned(t.name().to_owned(), blocked(t.limits())?)))
                .collect::<Result<Vec<_>, LimitError>>()?;
            self.tiers = Some(Cow::Owned(tiers));
        }
        Ok(self)
    }

    /// The declared tiers of a tiered group (`None`: the group is not tiered).
    pub fn tiers(&self) -> Option<&[Tier]> {
        self.tiers.as_deref()
    }

    /// Whether each call chooses this group's limits by its tier.
    pub const fn is_tiered(&self) -> bool {
        self.tiers.is_some()
    }
}

/// What one kind of call asks the limiter for: its name, its groups (a key
/// each, with its limits), how it counts and its failure policy. Built once
/// (a `static` for `#[rate_limit]`) and used for every call, with
/// [`Limiter::call`](crate::Limiter::call).
///
/// Count failures without the macro (three failed logins per user per
/// minute; a success gives its unit back):
///
/// ```
/// use ratewall::{CallSpec, GroupSpec, Limit, Limiter, call::Counting};
///
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let limiter = Limiter::builder().memory().build()?;
/// let login = CallSpec::owned(
///     "login",
///     vec![GroupSpec::owned("login_user", vec![Limit::per_minute(3)?])],
/// )
/// .with_counting(Counting::Settled);
///
/// for password_ok in [false, true, false, false] {
///     let permit = limiter.call(&login, &[&"alice"]).await?; // reserves a unit
///     permit.settle(!password_ok).await; // only failures keep it
/// }
/// // Three failures (the success gave its unit back): the next attempt is refused.
/// let refused = limiter.call(&login, &[&"alice"]).await.unwrap_err();
/// assert!(refused.retry_after().is_some());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// # });
/// ```
#[derive(Debug)]
pub struct CallSpec {
    name: Cow<'static, str>,
    groups: Cow<'static, [GroupSpec]>,
    policy: Option<FailurePolicy>,
    counting: Counting,
    /// How long a call may wait for room, µs ([`CallSpec::with_wait`]; 0:
    /// it does not wait).
    wait_us: u64,
    /// A process-unique id, assigned on first use (0: not yet).
    id: AtomicU64,
}

static NEXT_SPEC: AtomicU64 = AtomicU64::new(1);

/// The most groups one call can have (keys decided together).
pub const MAX_GROUPS: usize = 63;

impl Clone for CallSpec {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            groups: self.groups.clone(),
            policy: self.policy,
            counting: self.counting,
            wait_us: self.wait_us,
            id: AtomicU64::new(0),
        }
    }
}

impl CallSpec {
    /// A call named `name` (the `limit` label of its metrics, and the name
    /// runtime policy overrides use) deciding `groups` together,
    /// all-or-nothing, in one round trip. Checked when first decided: a
    /// spec that can never be decided refuses every call as unavailable
    /// (and logs why); [`CallSpec::check`] finds that out up front.
    pub const fn new(name: &'static str, groups: &'static [GroupSpec]) -> Self {
        Self {
            name: Cow::Borrowed(name),
            groups: Cow::Borrowed(groups),
            policy: None,
            counting: Counting::Every,
            wait_us: 0,
            id: AtomicU64::new(0),
        }
    }

    /// A spec built at run time.
    pub fn owned(name: impl Into<String>, groups: Vec<GroupSpec>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            groups: Cow::Owned(groups),
            policy: None,
            counting: Counting::Every,
            wait_us: 0,
            id: AtomicU64::new(0),
        }
    }

    /// The failure policy of these calls, over the limiter's (a runtime
    /// [`Settings::set_policy`](crate::settings::Settings::set_policy) for the name wins over both).
    pub const fn with_policy(mut self, policy: FailurePolicy) -> Self {
        self.policy = Some(policy);
        self
    }

    /// How admitted calls count.
    pub const fn with_counting(mut self, counting: Counting) -> Self {
        self.counting = counting;
        self
    }

    /// Calls wait up to `max_wait` for room instead of being refused
    /// ([`Limiter::call`](crate::Limiter::call) then behaves as [`Keys::wait`](crate::Keys::wait) with
    /// this wait; `#[rate_limit(wait = "2s")]` sets it). The wait is kept
    /// in whole microseconds: a zero wait (or one under a microsecond) is no
    /// wait. See [`Keys::wait`](crate::Keys::wait) for what waiting means for each
    /// algorithm and what it cannot be combined with.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit};
    /// use std::time::Duration;
    /// let spec = CallSpec::owned("jobs", vec![GroupSpec::owned("jobs", vec![Limit::per_second(10).unwrap()])])
    ///     .with_wait(Duration::from_secs(2));
    /// assert_eq!(spec.wait(), Some(Duration::from_secs(2)));
    /// ```
    pub const fn with_wait(mut self, max_wait: Duration) -> Self {
        let micros = max_wait.as_micros();
        self.wait_us = if micros > u64::MAX as u128 {
            u64::MAX
        } else {
            micros as u64
        };
        self
    }

    /// How long calls of this spec may wait for room, if they wait.
    pub const fn wait(&self) -> Option<Duration> {
        if self.wait_us == 0 {
            None
        } else {
            Some(Duration::from_micros(self.wait_us))
        }
    }

    /// Whether calls of this spec wait for room.
    #[inline]
    pub(crate) const fn waits(&self) -> bool {
        self.wait_us != 0
    }

    /// The call's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The groups, in the order of a call's identities.
    pub fn groups(&self) -> &[GroupSpec] {
        &self.groups
    }

    /// The failure policy given to the spec.
    pub const fn policy(&self) -> Option<FailurePolicy> {
        self.policy
    }

    /// How admitted calls count.
    pub const fn counting(&self) -> Counting {
        self.counting
    }

    /// Checks that calls of this spec can be decided: one to 63 (`MAX_GROUPS`)
    /// groups, each with at least one limit, no two limits of a group sharing state,
    /// at most one in-flight limit per group, and every cost within its limits'
    /// capacity; for a tiered group, the same of each tier, valid and distinct
    /// tier names, and a group name without `@`.
    ///
    /// ```
    /// use ratewall::{CallSpec, GroupSpec, Limit};
    /// let ok = CallSpec::owned("sms", vec![GroupSpec::owned("sms", vec![Limit::per_minute(1).unwrap()])]);
    /// assert!(ok.check().is_ok());
    /// let too_costly = CallSpec::owned("sms", vec![GroupSpec::owned("sms", vec![Limit::per_minute(1).unwrap()]).with_cost(2)]);
    /// assert!(too_costly.check().is_err());
    /// ```
    ///
    /// # Errors
    /// A [`LimitError`] naming the call or group: [`LimitError::BadCall`] for
    /// no group, more than [`MAX_GROUPS`], a group without limits or with more
    /// than one in-flight limit; [`LimitError::Overlapping`] for two limits of
    /// a group sharing state; [`LimitError::ZeroCost`] or
    /// [`LimitError::CostExceedsCapacity`] for a cost that no limit of its group
    /// can take; [`LimitError::BadTier`] for a tier name that is not one, a tier
    /// named twice, or a tiered group whose name is empty or holds `@`.
    pub fn check(&self) -> Result<(), LimitError> {
        if self.groups.is_empty() {
            return Err(LimitError::BadCall(format!(
                "call `{}` has no group: give it at least one key with limits",
                self.name
            )));
        }
        if self.groups.len() > MAX_GROUPS {
            return Err(LimitError::BadCall(format!(
                "call `{}` has {} groups, more than {MAX_GROUPS}",
                self.name,
                self.groups.len()
            )));
        }
        for group in self.groups.iter() {
            match group.tiers() {
                None => check_group(group.name(), group.limits(), group.cost)?,
                Some(tiers) => check_tiers(group.name(), tiers, group.cost)?,
            }
        }
        Ok(())
    }

    /// The spec's process-unique id (what resolved calls are cached under).
    #[inline]
    pub(crate) fn id(&self) -> u64 {
        let id = self.id.load(Ordering::Relaxed);
        if id != 0 {
            return id;
        }
        self.first_id()
    }

    /// Gives the spec its id on its first call.
    #[cold]
    #[inline(never)]
    fn first_id(&self) -> u64 {
        let fresh = NEXT_SPEC.fetch_add(1, Ordering::Relaxed);
        match self
            .id
            .compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed)
        {
            Ok(_) => fresh,
            Err(set) => set,
        }
    }

    pub(crate) fn name_cow(&self) -> &Cow<'static, str> {
        &self.name
    }
}

/// Checks one group's limits (maybe replaced at run time) and cost.
pub(crate) fn check_group(name: &str, limits: &[Limit], cost: u64) -> Result<(), LimitError> {
    if limits.is_empty() {
        return Err(LimitError::BadCall(format!("group `{name}` has no limit")));
    }
    Limit::check_distinct(limits)?;
    if limits.iter().filter(|l| l.is_in_flight()).count() > 1 {
        return Err(LimitError::BadCall(format!(
            "group `{name}` has more than one in-flight limit; keep one `max_in_flight`"
        )));
    }
    // An in-flight slot is one per call, whatever the group's cost.
    limits
        .iter()
        .try_for_each(|limit| limit.check_cost(if limit.is_in_flight() { 1 } else { cost }))
}

/// One named set of limits of a tiered group ([`GroupSpec::tiered`]).
///
/// A tier name is 1 to 64 ASCII letters, digits, `_`, `-` or `.`. Each
/// tier is a limit name, `<group>@<tier>` (`api@pro`): the scope of its
/// keys (its own state), the name in rejections, `RateLimit` fields and
/// logs, and the name its limits are set under at run time
/// ([`Settings::set_limits`](crate::settings::Settings::set_limits), a limits file), where a name `<group>@<tier>`
/// also adds a tier the code does not declare. Shadow mode, the deny-cache
/// setting and allow/deny entries of the group's name apply to its tiers.
/// The `limit` label of a tiered call's metrics is `<call>@<tier>` (the
/// tier of its first tiered group).
///
/// A call whose tier is none of its group's (or that gives none) is decided
/// by the tier named `default` when the group has one. Otherwise it cannot
/// be decided: an error naming the tier is logged, and the failure policy
/// answers — [`FailurePolicy::FailOpen`] admits it
/// ([`Admission::FailedOpen`](crate::call::Admission::FailedOpen)); `FailClosed` and `Local` refuse it as
/// unavailable ([`LimitError::UnknownTier`]), counted under the call's own
/// name. Give a `default` tier when the tier comes from the client.
///
/// ```
/// use ratewall::{Limit, call::Tier};
/// let pro = Tier::owned("pro", vec![Limit::per_minute(1000)?, "20/1s".parse()?]);
/// assert_eq!((pro.name(), pro.limits().len()), ("pro", 2));
/// # Ok::<(), ratewall::error::LimitError>(())
/// ```
#[derive(Debug, Clone)]
pub struct Tier {
    name: Cow<'static, str>,
    limits: Cow<'static, [Limit]>,
}

impl Tier {
    /// A tier for a `static` group (what `#[rate_limit(tiers(..))]` emits).
    pub const fn new(name: &'static str, limits: &'static [Limit]) -> Self {
        Self {
            name: Cow::Borrowed(name),
            limits: Cow::Borrowed(limits),
        }
    }

    /// A tier built at run time.
    pub fn owned(name: impl Into<String>, limits: Vec<Limit>) -> Self {
        Self {
            name: Cow::Owned(name.into()),
            limits: Cow::Owned(limits),
        }
    }

    /// The tier's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The declared limits (runtime limits of `<group>@<tier>` replace them).
    pub fn limits(&self) -> &[Limit] {
        &self.limits
    }
}

/// Checks a tiered group: a name that can carry tiers, valid and distinct
/// tier names, and each tier's limits as a group's.
pub(crate) fn check_tiers(group: &str, tiers: &[Tier], cost: u64) -> Result<(), LimitError> {
    if group.is_empty() || group.contains(TIER_SEPARATOR) {
        return Err(LimitError::BadTier(format!(
            "tiered group {group:?}: its name must not be empty nor contain `@` (its tiers are named `<group>@<tier>`)"
        )));
    }
    for (index, tier) in tiers.iter().enumerate() {
        check_tier_name(tier.name())
            .map_err(|bad| LimitError::BadTier(format!("group `{group}`: {bad}")))?;
        if tiers[..index].iter().any(|t| t.name() == tier.name()) {
            return Err(LimitError::BadTier(format!(
                "group `{group}` declares tier `{}` twice",
                tier.name()
            )));
        }
        check_group(&tier_name(group, tier.name()), tier.limits(), cost)?;
    }
    Ok(())
}

/// `<group>@<tier>`.
pub(crate) fn tier_name(group: &str, tier: &str) -> String {
    let mut name = String::with_capacity(group.len() + tier.len() + 1);
    name.push_str(group);
    name.push(TIER_SEPARATOR);
    name.push_str(tier);
    name
}

/// Renders a tier into at most [`TIER_NAME_MAX`] bytes; a longer one (no
/// tier's) is cut, ending in `…`, which no tier name has.
struct Bounded(arrayvec::ArrayString<TIER_NAME_MAX>, bool);

impl fmt::Write for Bounded {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            if self.1 {
                break;
            }
            if self.0.len() + c.len_utf8() + '…'.len_utf8() > TIER_NAME_MAX {
                self.0.push('…');
                self.1 = true;
            } else {
                self.0.push(c);
            }
        }
        Ok(())
    }
}

/// A tier as text, rendered into at most [`TIER_NAME_MAX`] bytes (a longer
/// one, no tier's, is cut).
pub(crate) fn tier_text(part: Part<'_>) -> arrayvec::ArrayString<TIER_NAME_MAX> {
    let mut out = Bounded(arrayvec::ArrayString::new(), false);
    let _ = match part {
        Part::Text(text) => out.write_str(text),
        Part::Unsigned(n) => out.write_str(itoa::Buffer::new().format(n)),
        Part::Signed(n) => out.write_str(itoa::Buffer::new().format(n)),
        Part::Display(value) => write!(out, "{value}"),
        Part::Ip(ip) => write!(out, "{ip}"),
    };
    out.0
}

/// A tier as logs and errors show it: cut at [`TIER_NAME_MAX`] bytes.
pub(crate) fn shown(tier: &str) -> String {
    let mut out = Bounded(arrayvec::ArrayString::new(), false);
    let _ = out.write_str(tier);
    out.0.to_string()
}
