//! The storage side of the limiter: anything that can decide a batch of
//! requests atomically.

use std::fmt::{self, Debug};
use std::future::Future;
use std::pin::Pin;
use std::sync::Weak;
use std::time::Duration;

use crate::model::clock::micros;
use crate::model::decision::Decisions;
use crate::model::error::{BackendError, LimitError};
use crate::model::key::Key;
use crate::model::learned::Adjust;
use crate::model::limit::Limit;
use crate::model::lists::ListEntry;
use crate::model::reservation::Reservation;
use crate::store::target::{KeyRef, Op, Target};

/// A boxed, `Send` future, as backends return them (keeps [`Backend`] usable
/// as a trait object behind the global limiter).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The allow and deny lists a backend shares, with their version
/// ([`Backend::load_lists`]).
pub type SharedLists = (u64, Vec<ListEntry>);

/// One limit to decide for one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request<'a> {
    /// The identity's key.
    pub key: &'a Key,
    /// The limit to apply.
    pub limit: &'a Limit,
    /// Units this call takes (validated by the limiter: `1 ..= capacity`).
    pub cost: u64,
    /// For an in-flight limit ([`Limit::in_flight`]): the id of the
    /// admission holding the slot (the id its lease is kept under), unique per admission (a backend stores it,
    /// renews it with [`Backend::renew`] and removes it with
    /// [`Backend::refund`]). 0 for every other limit; an acquire of an
    /// in-flight limit with 0 is refused as invalid.
    pub holder: u64,
}

impl<'a> Request<'a> {
    /// A request for `cost` units of `limit` under `key`.
    pub const fn new(key: &'a Key, limit: &'a Limit, cost: u64) -> Self {
        Self {
            key,
            limit,
            cost,
            holder: 0,
        }
    }

    /// The same request held by admission `holder` (in-flight limits; not
    /// to be confused with quota leasing, [`Limit::with_lease`]).
    pub const fn with_holder(mut self, holder: u64) -> Self {
        self.holder = holder;
        self
    }

    /// Checks a batch before a backend decides it (the check the limiter
    /// makes of every batch, whatever its store): at least one request, every
    /// cost `1 ..= capacity` ([`Limit::check_cost`]), and no two requests name one
    /// state (the same key with the same algorithm and period, see
    /// [`Limit::state_id`]). Such a pair could not be decided all-or-nothing:
    /// both would be judged against the state before either wrote.
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::Request};
    /// let key = Key::new("app", "sms", "+33600000000");
    /// let (minute, hour) = (Limit::per_minute(1).unwrap(), Limit::per_hour(5).unwrap());
    /// assert!(Request::check_batch(&[Request::new(&key, &minute, 1), Request::new(&key, &hour, 1)]).is_ok());
    /// let also_minute = Limit::per_minute(3).unwrap();
    /// assert!(Request::check_batch(&[Request::new(&key, &minute, 1), Request::new(&key, &also_minute, 1)]).is_err());
    /// ```
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for an empty batch, [`LimitError::ZeroCost`] or
    /// [`LimitError::CostExceedsCapacity`] for a cost out of
    /// `1 ..= capacity`, and [`LimitError::Overlapping`] for two requests on
    /// one state.
    pub fn check_batch(requests: &[Request<'_>]) -> Result<(), LimitError> {
        // (As for a peek: an acquire's in-flight limits also need a lease,
        // which the limiter checks and a backend that keeps leases checks.)
        Self::check_for(requests, Op::Peek(0))
    }

    /// Checks a batch before a backend reserves a slot for it
    /// ([`Backend::reserve`]): [`Request::check_batch`], and every limit is
    /// one that queues waiting calls (GCRA, token bucket, leaky bucket).
    ///
    /// ```
    /// use ratewall::{Algorithm, Key, Limit, backend::Request};
    /// let key = Key::new("app", "jobs", "tenant-1");
    /// let gcra = Limit::per_second(10).unwrap();
    /// assert!(Request::check_reservation(&[Request::new(&key, &gcra, 1)]).is_ok());
    /// let window = Limit::per_minute(10).unwrap().with_algorithm(Algorithm::FixedWindow).unwrap();
    /// assert!(Request::check_reservation(&[Request::new(&key, &window, 1)]).is_err());
    /// ```
    ///
    /// # Errors
    /// As [`Request::check_batch`], and [`LimitError::BadCall`] for a limit
    /// that cannot queue waiting calls (the window algorithms, a concurrency
    /// limit, a limit that blocks: [`Limit::with_block`]).
    pub fn check_reservation(requests: &[Request<'_>]) -> Result<(), LimitError> {
        Self::check_for(requests, Op::Reserve(0))
    }

    /// Checks a batch before a backend charges it ([`Backend::charge`]):
    /// no state named twice and no in-flight limit; the costs may be any
    /// amount (past the limit is debt).
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::Request};
    /// let key = Key::new("app", "tokens", "team-a");
    /// let minute = Limit::per_minute(100).unwrap();
    /// assert!(Request::check_charge(&[Request::new(&key, &minute, 250)]).is_ok());
    /// let slots = Limit::in_flight(4).unwrap();
    /// assert!(Request::check_charge(&[Request::new(&key, &slots, 1)]).is_err());
    /// ```
    ///
    /// # Errors
    /// [`LimitError::BadCall`] for an empty batch or a concurrency limit, and
    /// [`LimitError::Overlapping`] for two requests on one state.
    pub fn check_charge(requests: &[Request<'_>]) -> Result<(), LimitError> {
        Self::check_for(requests, Op::Charge)
    }

    /// Checks a batch before a backend leases units of it
    /// ([`Backend::acquire_lease`]): [`Request::check_batch`], and no limit
    /// that blocks ([`Limit::with_block`]: such a limit is decided in the
    /// store on every call, so that a refusal writes its block).
    ///
    /// ```
    /// use ratewall::{Key, Limit, backend::Request};
    /// use std::time::Duration;
    /// let key = Key::new("app", "login", "alice");
    /// let hot = Limit::per_second(1_000).unwrap().with_lease(10).unwrap();
    /// assert!(Request::check_lease(&[Request::new(&key, &hot, 1)]).is_ok());
    /// let blocking = Limit::per_minute(5).unwrap().with_block(Duration::from_secs(60)).unwrap();
    /// assert!(Request::check_lease(&[Request::new(&key, &blocking, 1)]).is_err());
    /// ```
    ///
    /// # Errors
    /// As [`Request::check_batch`], and [`LimitError::BadCall`] for a limit
    /// that blocks.
    pub fn check_lease(requests: &[Request<'_>]) -> Result<(), LimitError> {
        Self::check_batch(requests)?;
        match requests.iter().find(|r| r.limit.block().is_some()) {
            Some(request) => Err(LimitError::BadCall(format!(
                "{} cannot lease units: a limit that blocks is decided in the store on every call",
                request.limit
            ))),
            None => Ok(()),
        }
    }

    /// The pipeline's check of a batch for `op`, over rendered requests.
    fn check_for(requests: &[Request<'_>], op: Op<'_>) -> Result<(), LimitError> {
        let targets: smallvec::SmallVec<[Target<'_>; 4]> = requests
            .iter()
            .map(|r| Target {
                name: "",
                key: KeyRef::of(r.key),
                limit: r.limit,
                cost: r.cost,
                slot: None,
                lease: r.holder,
            })
            .collect();
        crate::store::target::validate(op, &targets)
    }
}

/// What [`Backend::acquire_lease`] answers: the call's decisions (for each
/// request's cost plus the units it leased), and the units each request
/// leased beyond its cost (0 for all of them when the call was refused).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leased {
    /// One decision per request, as [`Backend::acquire`] gives them, with
    /// the leased units counted as taken.
    pub decisions: Decisions,
    /// Units leased per request, beyond its cost.
    pub granted: Vec<u64>,
}

impl Leased {
    /// A lease answer.
    pub fn new(decisions: Decisions, granted: Vec<u64>) -> Self {
        Self { decisions, granted }
    }

    /// The stamp a return of a lease is checked against: the time its state
    /// was left to expire at (`at_micros + reset_after`, in µs), which
    /// identifies the state the lease left as long as nothing else wrote.
    pub fn stamp(decision: &crate::model::decision::Decision) -> u64 {
        decision
            .at_micros()
            .saturating_add(micros(decision.reset_after()))
    }
}

/// Unused units of a lease, given back ([`Backend::return_lease`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReturn<'a> {
    /// The leased key and limit; `cost` is the number of units given back.
    pub request: Request<'a>,
    /// The lease's decision time ([`crate::Decision::at_micros`]).
    pub at_micros: u64,
    /// The lease's [`Leased::stamp`].
    pub stamp: u64,
    /// The units the lease was granted (names the lease in a store that
    /// records leases for operators).
    pub granted: u64,
}

/// Checks a lease batch as [`Request::check_batch`] does, with one extra
/// count per request, and no limit that blocks (a leased unit would be
/// admitted past a block, see [`Limit::with_block`]).
pub(crate) fn check_lease_batch(
    requests: &[Request<'_>],
    extra: &[u64],
) -> Result<(), BackendError> {
    if extra.len() != requests.len() {
        return Err(BackendError::protocol(format_args!(
            "a lease call needs one extra count per request: {} for {} request(s)",
            extra.len(),
            requests.len()
        )));
    }
    Request::check_lease(requests).map_err(BackendError::Invalid)
}

/// A block on one identity ([`Backend::blocks`]): the limit it is on, by
/// its storage suffix, and the time left (see [`Limit::with_block`]).
///
/// ```
/// use ratewall::backend::Block;
/// use std::time::Duration;
/// let block = Block::new("gc:60000000", Duration::from_secs(900));
/// assert_eq!((block.suffix.as_str(), block.left), ("gc:60000000", Duration::from_secs(900)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub struct Block {
    /// The blocking limit's [`Limit::storage_suffix`] (`gc:60000000`): its
    /// algorithm, period and slot count.
    pub suffix: String,
    /// How long the identity stays blocked, by the store's time.
    pub left: Duration,
}

impl Block {
    /// The block of the limit with storage suffix `suffix`, `left` to go.
    pub fn new(suffix: impl Into<String>, left: Duration) -> Self {
        Self {
            suffix: suffix.into(),
            left,
        }
    }
}

/// What a limiter does with a notice of room given back: the other side of
/// [`RefundNotices`], implemented by the limiter (a trait here, so the
/// store names nothing above it).
pub(crate) trait Hear: Send + Sync {
    /// Room was given back under `key` (rendered as `text`) by another
    /// process.
    fn given_back(&self, text: &str, key: KeyRef<'_>);
    /// The store's subscription is up (`true`) or down (`false`).
    fn subscribed(&self, live: bool);
}

/// Where a backend delivers the notices of room given back in the store by
/// other processes (see [`Backend::subscribe_refunds`]): one limiter's
/// deny cache and waiting calls. Cheap to clone; it holds the limiter
/// weakly, so a backend keeping it past the limiter's life keeps nothing
/// alive ([`RefundNotices::is_closed`] then says to drop it).
#[derive(Clone)]
pub struct RefundNotices {
    hear: Weak<dyn Hear>,
}

impl RefundNotices {
    /// The notices of the limiter behind `hear`.
    pub(crate) fn new(hear: Weak<dyn Hear>) -> Self {
        Self { hear }
    }

    /// Tells the limiter that another process gave room back under `key`,
    /// a rendered [`Key`] (`prefix:{scope:identity}`, as
    /// [`Key::as_str`] writes it): it forgets the refusals it remembers
    /// for the key (its deny cache) and wakes its calls waiting for room
    /// under it, which ask the store again. Text that is no rendered key
    /// is ignored. Cheap: a parse, a hash lookup or two, no allocation.
    /// `false` once the limiter is gone (drop these notices then).
    pub fn given_back(&self, key: &str) -> bool {
        let Some(hear) = self.hear.upgrade() else {
            return false;
        };
        if let Some(parsed) = KeyRef::parse(key) {
            hear.given_back(key, parsed);
        }
        true
    }

    /// Tells the limiter whether the backend's subscription is up: while
    /// it is down, notices are lost, and the limiter sees other processes'
    /// refunds within its deny cache's maximum hold instead (the
    /// `ratewall_refund_notices_subscribed` gauge says which). `false` once
    /// the limiter is gone.
    pub fn subscribed(&self, live: bool) -> bool {
        let Some(hear) = self.hear.upgrade() else {
            return false;
        };
        hear.subscribed(live);
        true
    }

    /// Whether the limiter is gone: nothing will hear these notices again.
    pub fn is_closed(&self) -> bool {
        self.hear.strong_count() == 0
    }
}

impl fmt::Debug for RefundNotices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RefundNotices")
            .field("closed", &self.is_closed())
            .finish()
    }
}

/// A store that decides rate-limit requests.
///
/// Every method takes a batch: all requests of one call are decided together
/// and atomically, in one round trip where the store is remote.
/// [`Backend::acquire`] is all-or-nothing: if any request is refused, none
/// consumes anything, and the decisions of the others report their current
/// state (`allowed` then says whether that limit alone would have admitted
/// the call). A batch that names one state twice (one key, one algorithm
/// and period) is refused as [`BackendError::Invalid`] before anything is
/// decided ([`Request::check_batch`]).
///
/// A limit with a block ([`Limit::with_block`]) is decided with it: a
/// refusal blocks the identity under that limit (the acquire that refused
/// writes it, in the same atomic step), and until the block ends every
/// decision of the limit for the identity is refused (see
/// [`Limit::with_block`] for the figures), peeks included.
///
/// Implementations must give the semantics of the in-memory reference
/// ([`crate::backend::MemoryBackend`]); `ratewall-redis` is held to it by differential tests.
///
/// # Errors
/// Every method answers a [`BackendError`] when the store cannot do what
/// it asks:
/// - [`BackendError::Invalid`]: the batch can never be decided
///   ([`Request::check_batch`]; for [`Backend::reserve`],
///   [`Request::check_reservation`]), found before anything is decided;
/// - [`BackendError::Timeout`]: no answer within the store's timeout (the
///   operation may still have run in the store: [`Backend::acquire_once`]
///   is for calls that must not count twice);
/// - [`BackendError::Unavailable`]: the store could not be reached, or the
///   connection broke;
/// - [`BackendError::Protocol`]: an answer the backend cannot read, or an
///   operation it does not implement (the defaults of
///   [`Backend::cancel_once`], [`Backend::charge`], [`Backend::hold`] and
///   [`Backend::adjust`]).
///
/// [`BackendError::CircuitOpen`] is the limiter's own (its breaker did not
/// call the backend); a backend does not return it.
pub trait Backend: Send + Sync + Debug + 'static {
    /// Decides and, when every request is allowed, consumes.
    fn acquire<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>>;

    /// Like [`Backend::acquire`], made idempotent by `request_id`: a client
    /// that retries a call whose reply it never saw (a timeout after the
    /// store had decided) is not charged twice.
    ///
    /// The first call with a given id under the first request's key decides
    /// as [`Backend::acquire`]; when it is allowed, its [`Decisions`] are
    /// kept (for the longest period of the call's limits, at most two
    /// minutes: a retry comes within seconds) and every later
    /// call with the same id and first key returns them again, unchanged
    /// (same `remaining`, same [`crate::Decision::at_micros`]), consuming
    /// nothing. A refused call consumes nothing, so it is not kept: a retry
    /// decides again. An id names one call: use a fresh one (e.g. a UUID)
    /// per logical call. Reusing an id for a call with another number of
    /// limits is an error ([`BackendError::Protocol`]).
    ///
    /// The default implementation ignores the id and calls
    /// [`Backend::acquire`] (not idempotent); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` override it.
    fn acquire_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let _ = request_id;
        self.acquire(requests)
    }

    /// Takes back a call made with [`Backend::acquire_once`] that the
    /// client gave up on (its reply never came: a timeout, a dropped
    /// connection), whether the call ran, will run later or never does: if
    /// it ran and was allowed, what it took is given back (at its own
    /// decision time); either way a tombstone is kept under the id (for the
    /// longest period of the call's limits), and the call, should it arrive
    /// afterwards, takes nothing. `requests` are the call's own, in its
    /// order. Idempotent: cancelling twice gives back once.
    ///
    /// The default implementation answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn cancel_once<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        request_id: &'a str,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (requests, request_id);
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot cancel a call by its request id",
            ))
        })
    }

    /// Decides without consuming anything.
    fn peek<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Decisions, BackendError>>;

    /// Decides without consuming anything as of `ahead` from now: what
    /// each state will hold then if no call comes in between (a window's
    /// count once its older units have left, a bucket drained). Budgets
    /// that find an upstream's limit ([`crate::upstream::Auto`]) read with
    /// it how much of a window the upstream's `Retry-After` leaves.
    ///
    /// # Errors
    /// The default answers [`BackendError::Protocol`]: a backend that
    /// cannot peek ahead (the limiter then learns without it).
    fn peek_ahead<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        ahead: Duration,
    ) -> BoxFuture<'a, Result<Decisions, BackendError>> {
        let _ = (requests, ahead);
        Box::pin(std::future::ready(Err(BackendError::protocol(
            "this backend cannot peek ahead",
        ))))
    }

    /// Gives back what an allowed [`Backend::acquire`] made at `at_micros`
    /// (the decision's [`crate::Decision::at_micros`]) consumed.
    fn refund<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        at_micros: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>>;

    /// Renews the leases of in-flight slots: each request names one slot
    /// (an in-flight limit, its key and [`Request::holder`]) that should now
    /// live a full lease again from the store's time. Answers, per request,
    /// whether the slot was still held (`false`: it had expired, and another
    /// call may have its place; it is not taken again). The default, for
    /// stores that keep no leases, answers `true` for all.
    fn renew<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<Vec<bool>, BackendError>> {
        Box::pin(std::future::ready(Ok(vec![true; requests.len()])))
    }

    /// Takes each request's cost on top of what its state holds, whatever
    /// the limit says: a settled call's actual cost above the estimate it
    /// was admitted with ([`crate::Permit::settle_cost`]). What goes past
    /// the limit is debt later calls pay (GCRA and the buckets move their
    /// state forward, the windows count past the threshold; the sliding
    /// log adds at most `threshold` entries at once, as more could refuse
    /// nothing more). One atomic step; in-flight limits are refused.
    ///
    /// The default answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn charge<'a>(
        &'a self,
        requests: &'a [Request<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = requests;
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot charge a settled cost",
            ))
        })
    }

    /// Raises each request's state so that at most `left` units remain
    /// `after` from now, by the store's time; a state already that full is
    /// left as it is (the cost is ignored). What an upstream's own word
    /// becomes in the budget every instance shares
    /// ([`crate::Limiter::hold`]): `Retry-After: 20` is `after = 20 s,
    /// left = 0`, a `remaining: 7` header is `after = 0, left = 7`. A
    /// pause (`left = 0`) holds every algorithm: no call passes before
    /// `after` from now, however many windows or slots it spans, and the
    /// state's key lives until then; a count (`left > 0`) is held by the
    /// window algorithms in their current window or slot (the sliding log:
    /// as entries now). One atomic step; in-flight limits are refused.
    ///
    /// The default answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn hold<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        after: std::time::Duration,
        left: u64,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (requests, after, left);
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot hold a budget at an upstream's word",
            ))
        })
    }

    /// Applies `adjust` to the learned scale of limit `name` under key
    /// prefix `prefix` (what every instance sharing the budget learned of
    /// its upstream's limit, see [`crate::upstream::Auto`]) atomically, by the
    /// store's time, and answers the scale after it, in parts per million
    /// of the stated limits ([`crate::upstream::SCALE_ONE`]). A scale is forgotten a
    /// day after it last changed (back to the stated limits).
    ///
    /// The default answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn adjust<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        adjust: Adjust,
    ) -> BoxFuture<'a, Result<u64, BackendError>> {
        let _ = (prefix, name, adjust);
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot share a learned limit",
            ))
        })
    }

    /// Forgets the state of each request's key and limit, and lifts the
    /// identity's block under that limit (the cost is ignored).
    fn reset<'a>(&'a self, requests: &'a [Request<'a>]) -> BoxFuture<'a, Result<(), BackendError>>;

    /// The blocks of `key`'s identity ([`Limit::with_block`]) that have not
    /// ended, under every limit of `key`'s scope, sorted by suffix.
    ///
    /// The default answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn blocks<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Vec<Block>, BackendError>> {
        let _ = key;
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot list the blocks of an identity",
            ))
        })
    }

    /// Lifts every block of `key`'s identity, under every limit of `key`'s
    /// scope (the limits' state is kept); whether one had not ended.
    ///
    /// The default answers that the store cannot
    /// ([`BackendError::Protocol`]); [`crate::backend::MemoryBackend`] and
    /// `ratewall_redis::RedisBackend` implement it.
    fn unblock<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, BackendError>> {
        let _ = key;
        Box::pin(async {
            Err(BackendError::protocol(
                "this backend cannot lift the blocks of an identity",
            ))
        })
    }

    /// Decides like [`Backend::acquire`] and, when every request is
    /// allowed, also leases up to `extra[i]` more units of request `i` (one
    /// count per request): the most that leaves at least half of what
    /// remained after the request's own cost, so that processes asking for
    /// the last units of a limit share them. Everything is decided and
    /// taken in one atomic step; a refused call takes and grants nothing.
    /// Leased units count as taken from then on; a limit whose algorithm
    /// cannot lease ([`ratewall_grammar::can_lease`]) is granted nothing. `ttl`
    /// is how long the caller uses the units at most: a store that records
    /// leases for operators keeps the record that long at most.
    ///
    /// The default grants nothing (it is [`Backend::acquire`]): a backend
    /// that does not implement leasing decides every call itself.
    /// [`crate::backend::MemoryBackend`] and `ratewall_redis::RedisBackend` implement it.
    fn acquire_lease<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        extra: &'a [u64],
        ttl: std::time::Duration,
    ) -> BoxFuture<'a, Result<Leased, BackendError>> {
        let _ = ttl;
        Box::pin(async move {
            check_lease_batch(requests, extra)?;
            let decisions = self.acquire(requests).await?;
            Ok(Leased::new(decisions, vec![0; requests.len()]))
        })
    }

    /// Gives back unused leased units, each where that cannot let a later
    /// call pass outside its algorithm's bound (see the crate docs, "Quota
    /// leasing"): in the lease's window (fixed window) or slot (sliding
    /// window), and for GCRA and the buckets only while the state is the
    /// one the lease left ([`LeaseReturn::stamp`]). Units not given back
    /// stay taken until time passes them. The default does nothing.
    fn return_lease<'a>(
        &'a self,
        returns: &'a [LeaseReturn<'a>],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = returns;
        Box::pin(std::future::ready(Ok(())))
    }

    /// Whether the backend implements [`Backend::reserve`] and
    /// [`Backend::cancel`]. Without them, a waiting call on GCRA or a bucket
    /// retries after each refusal's `retry_after` (as it does on the window
    /// algorithms) instead of queueing. The default is `false`.
    fn reserves(&self) -> bool {
        false
    }

    /// Whether the backend implements [`Backend::acquire_once`] and
    /// [`Backend::cancel_once`]: a limiter then gives a call it may have to
    /// take back a request id (see
    /// [`LimiterBuilder::cancel_abandoned`](crate::builder::LimiterBuilder::cancel_abandoned)).
    /// The default is `false`.
    fn cancels_once(&self) -> bool {
        false
    }

    /// Reserves, in one atomic step, the earliest time (the slot) at which
    /// every request's limit admits its cost, if it is at most `max_wait`
    /// from the store's time; then commits every request as of the slot
    /// (all-or-nothing). Each limit's earliest time is the earliest a call
    /// would be allowed given the slots already reserved (or one another
    /// cancelled call gave back); the slot is the latest of them, so no limit
    /// is committed earlier than the others. A later slot refuses the call
    /// and changes nothing (see [`Reservation`]). Only GCRA, token and leaky
    /// bucket limits can be reserved (anything else is
    /// [`BackendError::Invalid`]).
    ///
    /// The default refuses: see [`Backend::reserves`].
    fn reserve<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        max_wait: std::time::Duration,
    ) -> BoxFuture<'a, Result<Reservation, BackendError>> {
        let _ = (requests, max_wait);
        Box::pin(std::future::ready(Err(BackendError::Invalid(
            LimitError::BadCall("this backend does not reserve slots for waiting calls".into()),
        ))))
    }

    /// Gives back an allowed reservation made by [`Backend::reserve`] with
    /// the same requests (a waiting call that was dropped before its slot):
    /// for each limit, if the reservation is still the last one made there,
    /// the state goes back to what it was before it; otherwise its slot is
    /// kept as given back, and the next reservation that can use that exact
    /// time takes it. A slot already past is not given back. The default
    /// does nothing.
    fn cancel<'a>(
        &'a self,
        requests: &'a [Request<'a>],
        reservation: &'a Reservation,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (requests, reservation);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Records, where operators can read it, that limit `name` under key
    /// prefix `prefix` currently has `limits` (e.g. for an admin tool listing
    /// a deployment's limits). The default does nothing.
    fn publish_limits<'a>(
        &'a self,
        prefix: &'a str,
        name: &'a str,
        limits: &'a [Limit],
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (prefix, name, limits);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Records a change of the allow and deny lists of key prefix `prefix`
    /// where every instance reads them ([`Backend::load_lists`]): `entry`
    /// set, or, with `removed`, its `(name, identity)` removed. The default
    /// shares nothing (each instance keeps its own lists).
    fn save_list_entry<'a>(
        &'a self,
        prefix: &'a str,
        entry: &'a ListEntry,
        removed: bool,
    ) -> BoxFuture<'a, Result<(), BackendError>> {
        let _ = (prefix, entry, removed);
        Box::pin(std::future::ready(Ok(())))
    }

    /// Tells `notices`, from now on, of room given back in the store under
    /// key prefix `prefix` by other processes sharing it: a refund
    /// ([`Backend::refund`], [`Backend::cancel_once`] of a call that had
    /// taken units) or a reset ([`Backend::reset`]) that gave something
    /// back, one notice per key ([`RefundNotices::given_back`]). A
    /// limiter asks once, when it is built; a backend that answers `true`
    /// delivers the notices from a task of its own until
    /// [`RefundNotices::is_closed`], says when its subscription goes down
    /// or up ([`RefundNotices::subscribed`]), and may leave out the
    /// notices of this process' own refunds when one limiter listens (it
    /// forgot and woke already).
    ///
    /// What it buys: without notices, a refusal another process
    /// remembered is answered from its deny cache until that cache's
    /// maximum hold ends
    /// ([`LimiterBuilder::deny_cache_max_hold`](crate::builder::LimiterBuilder::deny_cache_max_hold),
    /// 1 s by default), and its waiting calls sleep until their own
    /// retry; with them, room given back is usable everywhere within one
    /// delivery. The default answers `false`: this backend tells nothing
    /// (the memory store, shared by no other process, has nothing to
    /// tell). `ratewall_redis::RedisBackend` implements it with Redis
    /// pub/sub.
    fn subscribe_refunds(&self, prefix: &str, notices: RefundNotices) -> bool {
        let _ = (prefix, notices);
        false
    }

    /// The shared allow and deny lists of key prefix `prefix`, when they
    /// changed since version `known` (`None`: unchanged, or not shared),
    /// with their new version.
    fn load_lists<'a>(
        &'a self,
        prefix: &'a str,
        known: u64,
    ) -> BoxFuture<'a, Result<Option<SharedLists>, BackendError>> {
        let _ = (prefix, known);
        Box::pin(std::future::ready(Ok(None)))
    }
}
