//! An API gateway in front of a small JSON API, limited with the tower
//! layer ([`ratewall::tower::RateLimitLayer`]) rather than per function:
//!
//! - **Every route, per client IP**: 300 requests per minute per address
//!   (an IPv6 client per /64), and 3 000 per minute per IPv6 /48 (IPv4: per
//!   address), decided together (`gateway_ip`, `gateway_site`).
//! - **`/api/*`, per API key, by plan**: the `x-api-key` header names a
//!   client and its plan; the limits are the plan's tier of `gateway_key`:
//!   `free` 10 per minute, `pro` 100 per minute and 10 per second, any
//!   other plan the `default` tier (as `free`). Tiers are live-configurable
//!   as `gateway_key@free`, `gateway_key@pro`, ... (limits file, admin CLI,
//!   [`apply_env_limits`]).
//! - **Allow and deny lists** of `gateway_key`, shared by every instance on
//!   Redis: an allow-listed client (the demo's `internal`) skips its plan's
//!   limits (never the per-IP ones); a deny-listed client (the demo's
//!   `revoked`) gets `403` without a limiter round trip.
//! - **Waiting on one route**: `POST /api/reports` is smoothed to one report
//!   per second per client (leaky bucket); a caller over it waits for its
//!   slot for up to 2 seconds instead of getting a `429` at once.
//!
//! Routes:
//! - `GET /health` → `ok` (per-IP limits only).
//! - `GET /api/whoami` → `{"client":"acme","plan":"free"}`.
//! - `GET /api/items/{id}` → `{"id":"..","client":".."}`.
//! - `POST /api/reports` → `{"report":"queued","client":"..","waited_ms":N}`.
//! - `GET /admin/lists`, `PUT /admin/lists/{allow|deny}/{client}` (optional
//!   `?for=1h`), `DELETE /admin/lists/{client}`: with `Authorization: Bearer
//!   $ADMIN_TOKEN`; absent without `ADMIN_TOKEN`.
//! - `GET /metrics`: Prometheus (not limited).
//!
//! Missing or unknown `x-api-key`: `401 {"error":"unauthorized"}`. Over a
//! limit: `429` with `Retry-After`, `RateLimit-Policy`, `RateLimit` and
//! `{"error":"rate_limited","retry_after_ms":N}`; deny-listed: `403
//! {"error":"denied"}`.
//!
//! Environment (as `sms` and `login`): `BIND` (default `127.0.0.1:3002`),
//! `REDIS_URL` (else in memory), `TRUSTED_PROXIES`, `LIMITS_FILE`,
//! `ADMIN_TOKEN`, and [`GATEWAY_KEYS`](keys_from_env) with
//! `GATEWAY_ALLOW` / `GATEWAY_DENY` (client names listed at start).

use std::fmt;
use std::sync::Arc;

use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Extension, Json, Router};
use ratewall::http::IpPrefix;
use ratewall::tower::{KeyFrom, RateLimitLayer};
use ratewall::{Algorithm, FailurePolicy, Limiter, Rejection, rate_limit};

use crate::{StartupError, json_error};

/// Name of the per-IP limit on every route.
pub const IP_LIMIT: &str = "gateway_ip";
/// Name of the per-IPv6-/48 limit on every route.
pub const SITE_LIMIT: &str = "gateway_site";
/// Name of the tiered per-API-key limit on `/api/*` (its tiers:
/// `gateway_key@free`, `gateway_key@pro`, `gateway_key@default`).
pub const KEY_LIMIT: &str = "gateway_key";
/// Name of the per-client limit of `POST /api/reports`.
pub const REPORT_LIMIT: &str = "gateway_reports";

/// The keys of the demo, when `GATEWAY_KEYS` is unset.
pub const DEMO_KEYS: &str = "acme:free:demo-free-key,globex:pro:demo-pro-key,internal:pro:demo-internal-key,revoked:free:demo-revoked-key";

/// An authenticated API client, put in the request's extensions by the
/// key check; its `Display` is its name (the rate limit identity: never the
/// secret key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiClient {
    /// The client's name, e.g. `acme`.
    pub name: String,
    /// Its plan: the tier of [`KEY_LIMIT`] it is decided by.
    pub plan: String,
}

impl fmt::Display for ApiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

/// The API keys the gateway accepts: secret → client.
#[derive(Clone)]
pub struct Keys {
    entries: Arc<[(String, ApiClient)]>,
}

impl fmt::Debug for Keys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never the secrets.
        f.debug_list()
            .entries(self.entries.iter().map(|(_, client)| client))
            .finish()
    }
}

impl Keys {
    /// Parses `client:plan:key` entries separated by commas, e.g.
    /// `acme:free:s3cret,globex:pro:t0ken`. Client and plan names are 1 to
    /// 64 ASCII letters, digits, `_`, `-` or `.`; keys are at least 8
    /// visible ASCII characters; names and keys are unique.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut entries: Vec<(String, ApiClient)> = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let mut fields = entry.splitn(3, ':');
            let (Some(name), Some(plan), Some(key)) = (fields.next(), fields.next(), fields.next())
            else {
                return Err(format!(
                    "an entry is `client:plan:key`, got one with {} field(s)",
                    entry.split(':').count()
                ));
            };
            for (what, value) in [("client", name), ("plan", plan)] {
                let valid = !value.is_empty()
                    && value.len() <= 64
                    && value
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b));
                if !valid {
                    return Err(format!(
                        "{what} name {value:?} must be 1 to 64 ASCII letters, digits, `_`, `-` or `.`"
                    ));
                }
            }
            if key.len() < 8 || !key.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "the key of {name:?} must be at least 8 visible ASCII characters"
                ));
            }
            if entries.iter().any(|(_, c)| c.name == name) {
                return Err(format!("client {name:?} is given twice"));
            }
            if entries.iter().any(|(k, _)| k == key) {
                return Err(format!("the key of {name:?} is another client's too"));
            }
            entries.push((
                key.to_owned(),
                ApiClient {
                    name: name.to_owned(),
                    plan: plan.to_owned(),
                },
            ));
        }
        if entries.is_empty() {
            return Err("no API key given".into());
        }
        Ok(Self {
            entries: entries.into(),
        })
    }

    /// The client whose key is `given`: every key is compared, each in
    /// constant time, so the time taken tells nothing about the keys.
    pub fn client(&self, given: &[u8]) -> Option<&ApiClient> {
        use subtle::ConstantTimeEq;
        let mut found = None;
        for (key, client) in self.entries.iter() {
            if bool::from(key.as_bytes().ct_eq(given)) {
                found = Some(client);
            }
        }
        found
    }

    /// Whether a client is named `name`.
    pub fn has_client(&self, name: &str) -> bool {
        self.entries.iter().any(|(_, c)| c.name == name)
    }
}

/// The keys in `GATEWAY_KEYS` (see [`Keys::parse`]), else the demo's
/// ([`DEMO_KEYS`]; `true`: the demo's).
pub fn keys_from_env() -> Result<(Keys, bool), String> {
    match std::env::var("GATEWAY_KEYS") {
        Ok(text) => Keys::parse(&text)
            .map(|keys| (keys, false))
            .map_err(|e| format!("GATEWAY_KEYS: {e}")),
        Err(_) => Keys::parse(DEMO_KEYS).map(|keys| (keys, true)),
    }
}

/// Puts the [`ApiClient`] of `x-api-key` in the request's extensions, or
/// answers `401`.
async fn authenticate(State(keys): State<Keys>, mut request: Request, next: Next) -> Response {
    let client = request
        .headers()
        .get("x-api-key")
        .and_then(|key| keys.client(key.as_bytes()))
        .cloned();
    match client {
        Some(client) => {
            request.extensions_mut().insert(client);
            next.run(request).await
        }
        None => json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid API key is required in the x-api-key header",
        ),
    }
}

async fn health() -> &'static str {
    "ok"
}

async fn whoami(Extension(client): Extension<ApiClient>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "client": client.name, "plan": client.plan }))
}

async fn item(
    Extension(client): Extension<ApiClient>,
    Path(id): Path<String>,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "id": id, "client": client.name }))
}

async fn report(Extension(client): Extension<ApiClient>) -> Result<Response, Rejection> {
    let started = tokio::time::Instant::now();
    queue_report(&client).await?;
    let waited_ms = started.elapsed().as_millis() as u64;
    Ok(Json(
        serde_json::json!({ "report": "queued", "client": client.name, "waited_ms": waited_ms }),
    )
    .into_response())
}

/// Queues a report: one per second per client, smoothed. A caller over the
/// rate waits for its slot (in line with the others) for up to 2 s; one
/// whose slot is further away gets the `429` at once.
#[rate_limit(
    name = "gateway_reports",
    key = client,
    limits = ["1/1s"],
    algorithm = leaky_bucket,
    wait = "2s"
)]
async fn queue_report(client: &ApiClient) -> Result<(), Rejection> {
    tracing::debug!(client = %client, "report queued");
    Ok(())
}

/// The admin routes' state: the limiter, the token and the known clients.
#[derive(Clone)]
struct Admin {
    limiter: &'static Limiter,
    token: Arc<str>,
    keys: Keys,
}

fn refuse_unless_admin(admin: &Admin, headers: &HeaderMap) -> Option<Response> {
    (!crate::bearer_matches(headers, &admin.token)).then(|| {
        json_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "admin routes need Authorization: Bearer $ADMIN_TOKEN",
        )
    })
}

async fn show_lists(State(admin): State<Admin>, headers: HeaderMap) -> Response {
    if let Some(refused) = refuse_unless_admin(&admin, &headers) {
        return refused;
    }
    let entries: Vec<serde_json::Value> = admin
        .limiter
        .settings()
        .list_entries()
        .iter()
        .filter(|e| e.name.as_deref() == Some(KEY_LIMIT))
        .map(|e| {
            serde_json::json!({
                "list": e.kind.name(),
                "client": e.identity,
                "expires_in_s": crate::expires_in_s(e),
            })
        })
        .collect();
    Json(serde_json::json!({ "entries": entries })).into_response()
}

async fn list_client(
    State(admin): State<Admin>,
    headers: HeaderMap,
    Path((list, client)): Path<(String, String)>,
    Query(listed_for): Query<crate::ListFor>,
) -> Response {
    if let Some(refused) = refuse_unless_admin(&admin, &headers) {
        return refused;
    }
    if !admin.keys.has_client(&client) {
        return json_error(
            StatusCode::NOT_FOUND,
            "unknown_client",
            &format!("no client named {client:?}"),
        );
    }
    if let Err(refused) =
        crate::change_list(admin.limiter, &list, KEY_LIMIT, &client, &listed_for).await
    {
        return refused;
    }
    tracing::info!(client, list, "client listed by admin");
    Json(serde_json::json!({ "listed": list, "client": client })).into_response()
}

async fn unlist_client(
    State(admin): State<Admin>,
    headers: HeaderMap,
    Path(client): Path<String>,
) -> Response {
    match refuse_unless_admin(&admin, &headers) {
        Some(refused) => refused,
        None => crate::unlist(admin.limiter, KEY_LIMIT, &client).await,
    }
}

/// The per-IP layer of every route: per address (IPv6: per /64) and per
/// IPv6 /48, all-or-nothing.
pub fn ip_layer() -> Result<RateLimitLayer, ratewall::tower::LayerError> {
    RateLimitLayer::builder(IP_LIMIT)
        .key(IP_LIMIT, ["300/1m"], KeyFrom::client_ip())
        .key(
            SITE_LIMIT,
            ["3000/1m"],
            KeyFrom::client_network(IpPrefix::V6_48),
        )
        .build()
}

/// The per-API-key layer of `/api/*`: the client's plan picks the tier.
pub fn key_layer() -> Result<RateLimitLayer, ratewall::tower::LayerError> {
    RateLimitLayer::builder(KEY_LIMIT)
        .tiered_key(KEY_LIMIT, KeyFrom::extension::<ApiClient>(), |parts| {
            parts
                .extensions
                .get::<ApiClient>()
                .map(|client| client.plan.as_str())
        })
        .tier("free", ["10/1m"])
        .tier("pro", ["100/1m", "10/1s"])
        .tier("default", ["10/1m"])
        .build()
}

/// The gateway's router on the global limiter: the API behind the key
/// check and the tiered per-key layer, the admin routes when `admin_token`
/// is given, everything but `/metrics` behind the per-IP layer.
pub fn router(
    limiter: &'static Limiter,
    keys: Keys,
    admin_token: Option<String>,
) -> Result<Router, String> {
    let api = Router::new()
        .route("/api/whoami", get(whoami))
        .route("/api/items/{id}", get(item))
        .route("/api/reports", post(report))
        // Route layers run last-added first: the key check, then the limit.
        .route_layer(key_layer().map_err(|e| e.to_string())?)
        .route_layer(middleware::from_fn_with_state(keys.clone(), authenticate));
    let mut limited = Router::new().route("/health", get(health)).merge(api);
    if let Some(token) = admin_token {
        let admin = Admin {
            limiter,
            token: token.into(),
            keys,
        };
        limited = limited.merge(
            Router::new()
                .route("/admin/lists", get(show_lists))
                .route("/admin/lists/{list}/{client}", put(list_client))
                .route("/admin/lists/{client}", delete(unlist_client))
                .with_state(admin),
        );
    }
    let limited = limited.layer(ip_layer().map_err(|e| e.to_string())?);
    Ok(limited.merge(crate::metrics_router()))
}

/// Applies `GATEWAY_IP_LIMITS`, `GATEWAY_SITE_LIMITS`, `GATEWAY_FREE_LIMITS`,
/// `GATEWAY_PRO_LIMITS` and `GATEWAY_REPORT_LIMITS` (rates such as
/// `"10/1m"`, comma-separated) over the compiled-in limits.
pub fn apply_env_limits(limiter: &Limiter) -> Result<(), String> {
    for (var, name, algorithm) in [
        ("GATEWAY_IP_LIMITS", IP_LIMIT, Algorithm::Gcra),
        ("GATEWAY_SITE_LIMITS", SITE_LIMIT, Algorithm::Gcra),
        ("GATEWAY_FREE_LIMITS", "gateway_key@free", Algorithm::Gcra),
        ("GATEWAY_PRO_LIMITS", "gateway_key@pro", Algorithm::Gcra),
        (
            "GATEWAY_REPORT_LIMITS",
            REPORT_LIMIT,
            Algorithm::LeakyBucket,
        ),
    ] {
        if let Ok(rates) = std::env::var(var) {
            let limits = crate::parse_rates(rates.split(','), algorithm)
                .map_err(|e| format!("{var}: {e}"))?;
            limiter
                .settings()
                .set_limits(name, limits)
                .map_err(|e| format!("{var}: {e}"))?;
        }
    }
    Ok(())
}

/// Lists the clients of `GATEWAY_ALLOW` and `GATEWAY_DENY` (client names,
/// comma-separated; the demo: `internal` allowed, `revoked` denied).
async fn apply_env_lists(limiter: &Limiter, keys: &Keys, demo: bool) -> Result<(), String> {
    let from_env = |var: &str, demo_value: &str| match std::env::var(var) {
        Ok(text) => text,
        Err(_) if demo => demo_value.to_owned(),
        Err(_) => String::new(),
    };
    for (var, allow, value) in [
        ("GATEWAY_ALLOW", true, from_env("GATEWAY_ALLOW", "internal")),
        ("GATEWAY_DENY", false, from_env("GATEWAY_DENY", "revoked")),
    ] {
        for client in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !keys.has_client(client) {
                return Err(format!("{var}: no client named {client:?}"));
            }
            let listed = if allow {
                limiter
                    .settings()
                    .allow(Some(KEY_LIMIT), &client, None)
                    .await
            } else {
                limiter
                    .settings()
                    .deny(Some(KEY_LIMIT), &client, None)
                    .await
            };
            listed.map_err(|e| format!("{var}: cannot list {client:?}: {e}"))?;
        }
    }
    Ok(())
}

/// The `gateway` binary. When the backend fails, each instance decides in
/// process with the full limits (`FailurePolicy::local(1)`): the API stays
/// limited (per instance) during a Redis outage instead of unlimited.
pub async fn main() -> Result<(), StartupError> {
    crate::init_tracing();
    let (keys, demo) = keys_from_env().map_err(StartupError::new)?;
    let limiter = crate::install(
        crate::builder_from_env(Limiter::builder())
            .await?
            .prefix("gateway")
            .failure_policy(FailurePolicy::local(1).expect("a share of one")),
    )?;
    apply_env_limits(limiter)
        .map_err(|e| StartupError::new(format!("invalid gateway limits: {e}")))?;
    if let Ok(path) = std::env::var("LIMITS_FILE") {
        crate::watch_limits_file(limiter, path)?;
    }
    apply_env_lists(limiter, &keys, demo)
        .await
        .map_err(StartupError::new)?;
    if demo {
        tracing::info!(
            "demo keys: demo-free-key (acme, free), demo-pro-key (globex, pro), \
             demo-internal-key (internal, allow-listed), demo-revoked-key (revoked, deny-listed)"
        );
    }
    let admin_token = std::env::var("ADMIN_TOKEN").ok().filter(|t| !t.is_empty());
    if admin_token.is_none() {
        tracing::info!("ADMIN_TOKEN unset: admin routes disabled");
    }
    let router = router(limiter, keys, admin_token)
        .map_err(|e| StartupError::new(format!("invalid gateway limits: {e}")))?;
    crate::serve(router, "127.0.0.1:3002").await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_and_bad_ones_refused_with_the_reason() {
        let keys = Keys::parse(DEMO_KEYS).unwrap();
        let acme = keys.client(b"demo-free-key").unwrap();
        assert_eq!((acme.name.as_str(), acme.plan.as_str()), ("acme", "free"));
        assert!(keys.client(b"demo-free-ke").is_none());
        assert!(keys.client(b"").is_none());
        assert!(!format!("{keys:?}").contains("demo-free-key"));
        for (text, reason) in [
            ("", "no API key"),
            ("acme:free", "`client:plan:key`"),
            ("acme:free:short", "at least 8"),
            ("ac me:free:longenough", "client name"),
            ("acme::longenough", "plan name"),
            ("acme:free:longenough,acme:pro:otherlong", "twice"),
            ("a:free:longenough,b:pro:longenough", "another client's"),
        ] {
            let error = Keys::parse(text).unwrap_err();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn the_layers_build() {
        ip_layer().unwrap();
        key_layer().unwrap();
    }
}
