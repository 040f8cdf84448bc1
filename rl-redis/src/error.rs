//! How Redis failures become [`BackendError`]s.

use std::time::Duration;

use ratewall::error::BackendError;
use redis::{ErrorKind, RedisError, ServerErrorKind};

/// Maps a Redis error met while doing `what` to the limiter's error kinds:
/// timeouts to [`BackendError::Timeout`], anything that says the store cannot
/// answer right now (I/O, cluster down or moving, loading, busy, out of
/// memory) to [`BackendError::Unavailable`], and answers the backend cannot
/// use (script errors, wrong types, unexpected replies) to
/// [`BackendError::Protocol`]. The Redis error is kept as the
/// [`BackendError`]'s `source()`.
pub(crate) fn from_redis(
    what: &dyn std::fmt::Display,
    err: &RedisError,
    timeout: Duration,
) -> BackendError {
    if err.is_timeout() {
        return BackendError::Timeout(timeout);
    }
    let unavailable = match err.kind() {
        ErrorKind::Io
        | ErrorKind::ClusterConnectionNotFound
        | ErrorKind::AuthenticationFailed
        | ErrorKind::MasterNameNotFoundBySentinel
        | ErrorKind::NoValidReplicasFoundBySentinel => true,
        ErrorKind::Server(kind) => matches!(
            kind,
            ServerErrorKind::BusyLoading
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
        ),
        ErrorKind::Extension => {
            matches!(
                err.code(),
                Some("BUSY" | "OOM" | "MISCONF" | "NOREPLICAS" | "LOADING")
            )
        }
        _ => false,
    };
    if unavailable {
        BackendError::unavailable_with_source(format_args!("{what}: {err}"), err.clone())
    } else {
        BackendError::protocol_with_source(format_args!("{what}: {err}"), err.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_failures_are_unavailable_and_script_errors_are_protocol_errors() {
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(matches!(
            from_redis(&"x", &io, Duration::ZERO),
            BackendError::Unavailable(_)
        ));
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(matches!(
            from_redis(&"x", &timeout, Duration::from_secs(1)),
            BackendError::Timeout(_)
        ));
        let script = RedisError::from((ErrorKind::UnexpectedReturnType, "bad reply"));
        let mapped = from_redis(&"EVALSHA acquire", &script, Duration::ZERO);
        assert!(matches!(mapped, BackendError::Protocol(_)));
        assert!(mapped.to_string().contains("EVALSHA acquire"), "{mapped}");
    }

    #[test]
    fn the_redis_error_is_the_source() {
        use std::error::Error as _;
        let script = RedisError::from((ErrorKind::UnexpectedReturnType, "bad reply"));
        let mapped = from_redis(&"EVALSHA acquire", &script, Duration::ZERO);
        let source = mapped.source().and_then(|e| e.downcast_ref::<RedisError>());
        assert_eq!(
            source.map(RedisError::kind),
            Some(ErrorKind::UnexpectedReturnType)
        );
        let io = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let mapped = from_redis(&"x", &io, Duration::ZERO);
        let source = mapped.source().and_then(|e| e.downcast_ref::<RedisError>());
        assert_eq!(source.map(RedisError::kind), Some(ErrorKind::Io));
    }
}
