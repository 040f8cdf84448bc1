//! Credentials out of Redis URLs before anything prints them.

/// Query parameters that carry credentials (`redis+unix:///sock?pass=...`).
const SECRET_PARAMS: [&str; 4] = ["pass", "password", "user", "username"];

/// `url` with its credentials replaced by `***`: the user name and password
/// of the authority (`redis://user:pass@host` becomes `redis://***@host`)
/// and the values of the `user`, `username`, `pass` and `password` query
/// parameters. Fit for logs and error messages; the one helper every crate
/// of this workspace uses to print a Redis URL.
///
/// When the text is ambiguous (an `@` left unescaped in a password or a
/// query) more is masked, never less.
///
/// ```
/// use ratewall_redis::redact_url;
/// assert_eq!(redact_url("redis://:hunter2@10.0.0.1:6379/0"), "redis://***@10.0.0.1:6379/0");
/// assert_eq!(redact_url("rediss://app:s3cr%40t@host/"), "rediss://***@host/");
/// assert_eq!(redact_url("redis+unix:///run/redis.sock?db=1&pass=x"), "redis+unix:///run/redis.sock?db=1&pass=***");
/// assert_eq!(redact_url("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
/// ```
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let (scheme, rest) = url.split_at(scheme_end);
    // No authority (a Unix socket path) means no user information.
    let rest = match rest.rfind('@') {
        Some(at) if !rest.starts_with('/') => format!("***{}", &rest[at..]),
        _ => rest.to_owned(),
    };
    let Some((before, query)) = rest.split_once('?') else {
        return format!("{scheme}{rest}");
    };
    let query: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _)) if SECRET_PARAMS.contains(&name.to_ascii_lowercase().as_str()) => {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{scheme}{before}?{}", query.join("&"))
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn user_names_and_passwords_never_reach_the_output() {
        assert_eq!(
            redact_url("redis://127.0.0.1:6379/"),
            "redis://127.0.0.1:6379/"
        );
        assert_eq!(
            redact_url("redis://:hunter2@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(
            redact_url("redis://default:hunter2@host:6379/0"),
            "redis://***@host:6379/0"
        );
        assert_eq!(
            redact_url("rediss://app:s3cr%40t@host/"),
            "rediss://***@host/"
        );
        // Left unescaped, `/`, `#`, `?` and `@` in a password are still masked.
        assert_eq!(redact_url("redis://:a/b#c?d@e@host/"), "redis://***@host/");
        assert_eq!(
            redact_url("redis://host/0?protocol=resp3&Password=x&user=y"),
            "redis://host/0?protocol=resp3&Password=***&user=***"
        );
        assert_eq!(
            redact_url("redis+unix:///tmp/redis.sock?pass=x"),
            "redis+unix:///tmp/redis.sock?pass=***"
        );
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
