//! [`CallMode`]: how a backend calls its Lua code.

/// How a backend calls its Lua code (see [`RedisBackendBuilder::call_mode`](crate::RedisBackendBuilder::call_mode)).
///
/// ```
/// use ratewall_redis::CallMode;
/// assert_eq!(CallMode::default(), CallMode::Auto);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CallMode {
    /// [`CallMode::Functions`] when the server takes `FUNCTION LOAD`
    /// (Redis ≥ 7, and allowed to this user), else [`CallMode::Scripts`];
    /// decided when connecting.
    #[default]
    Auto,
    /// A Redis Functions library, loaded once per server with `FUNCTION
    /// LOAD` (on a cluster: on every master); calls are `FCALL` (`FCALL_RO`
    /// for peeks), each running only its own entry point. Connecting fails
    /// when the library cannot be loaded.
    Functions,
    /// Lua scripts sent with `EVALSHA` (`EVAL` with the source when the
    /// server lacks one): Redis < 7, or servers that refuse functions. Each
    /// script holds only what its entry point runs (a single-limit call's,
    /// one algorithm; a coalesced call's, every algorithm), and runs it all
    /// on every call.
    Scripts,
}
