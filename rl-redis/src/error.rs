//! How Redis failures become [`BackendError`]s.

use std::time::Duration;

use redis::{ErrorKind, RedisError, ServerErrorKind};
use rl_core::BackendError;

/// Maps a Redis error met while doing `what` to the limiter's error kinds:
/// timeouts to [`BackendError::Timeout`], anything that says the store cannot
/// answer right now (I/O, cluster down or moving, loading, busy, out of
/// memory) to [`BackendError::Unavailable`], and answers the backend cannot
/// use (script errors, wrong types, unexpected replies) to
/// [`BackendError::Protocol`].
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
        BackendError::unavailable(format_args!("{what}: {err}"))
    } else {
        BackendError::protocol(format_args!("{what}: {err}"))
    }
}

/// `url` with any password replaced by `***`, fit for error messages.
pub(crate) fn redact(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let host_start = rest.find('/').unwrap_or(rest.len());
    match rest[..host_start].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{}{user}:***{}", &url[..scheme_end], &rest[at..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_never_reach_error_messages() {
        assert_eq!(redact("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(
            redact("redis://:hunter2@host:6379/0"),
            "redis://:***@host:6379/0"
        );
        assert_eq!(
            redact("rediss://app:s3cr%40t@host/"),
            "rediss://app:***@host/"
        );
        assert_eq!(redact("not a url"), "not a url");
    }

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
}
