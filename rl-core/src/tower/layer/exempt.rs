//! Requests a layer lets through untouched: by method, by path, or by a
//! predicate over the request's head.

use super::*;

/// A predicate over a request's head.
pub(crate) type Predicate = Arc<dyn Fn(&Parts) -> bool + Send + Sync>;

/// What a layer exempts. Held only when something is exempted, so a layer
/// without exemptions checks one pointer per request.
#[derive(Default)]
pub(crate) struct Exempt {
    /// Methods, by name (`OPTIONS`).
    pub(super) methods: SmallVec<[http::Method; 2]>,
    /// Whole paths.
    pub(super) paths: Vec<Box<str>>,
    /// Path prefixes, each ending a segment (`/health` covers `/health`
    /// and `/health/live`, not `/healthz`).
    pub(super) prefixes: Vec<Box<str>>,
    /// Predicates over the head.
    pub(super) predicates: Vec<Predicate>,
}

impl fmt::Debug for Exempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exempt")
            .field("methods", &self.methods)
            .field("paths", &self.paths)
            .field("prefixes", &self.prefixes)
            .field("predicates", &self.predicates.len())
            .finish()
    }
}

impl Exempt {
    /// Whether nothing is exempted.
    pub(super) fn is_empty(&self) -> bool {
        self.methods.is_empty()
            && self.paths.is_empty()
            && self.prefixes.is_empty()
            && self.predicates.is_empty()
    }

    /// Whether a request with this method and path (as received: not
    /// decoded, not normalised) is exempted by method or path.
    pub(crate) fn by_line(&self, method: &str, path: &str) -> bool {
        self.methods.iter().any(|m| m.as_str() == method)
            || self.paths.iter().any(|p| **p == *path)
            || self.prefixes.iter().any(|prefix| under(path, prefix))
    }

    /// Whether a predicate needs the request's head.
    pub(crate) fn reads_parts(&self) -> bool {
        !self.predicates.is_empty()
    }

    /// Whether a predicate exempts a request with this head.
    pub(crate) fn by_parts(&self, parts: &Parts) -> bool {
        self.predicates.iter().any(|exempts| exempts(parts))
    }
}

/// Whether `path` is `prefix` or below it, segment-wise (a prefix ending
/// with `/` covers what starts with it).
fn under(path: &str, prefix: &str) -> bool {
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || prefix.ends_with('/') || rest.starts_with('/'),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_cover_whole_segments_and_paths_match_exactly() {
        let exempt = Exempt {
            methods: [http::Method::OPTIONS].into_iter().collect(),
            paths: vec!["/metrics".into()],
            prefixes: vec!["/health".into(), "/static/".into()],
            predicates: Vec::new(),
        };
        for (method, path, exempted) in [
            ("OPTIONS", "/api", true),
            ("GET", "/health", true),
            ("GET", "/health/live", true),
            ("GET", "/healthz", false),
            ("GET", "/static/app.js", true),
            ("GET", "/static", false),
            ("GET", "/metrics", true),
            ("GET", "/metrics/x", false),
            ("GET", "/%68ealth", false),
            ("GET", "//health", false),
            ("GET", "", false),
        ] {
            assert_eq!(exempt.by_line(method, path), exempted, "{method} {path}");
        }
    }
}
