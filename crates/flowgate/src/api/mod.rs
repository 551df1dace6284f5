//! The HTTP API (`/api/v1/...`, JSON), the Prometheus endpoint (`/metrics`), the live
//! stream (`/api/v1/stream`, server-sent events) and the dashboard (`/`).
//!
//! Every `/api/v1` route is declared once, in [`ROUTES`]; both the router and the OpenAPI
//! document (`/api/v1/openapi.json`) are generated from that table, so they cannot drift.
//!
//! Security model:
//! * Reads need nothing (the API listens on loopback unless configured otherwise).
//! * Every mutating call needs `Authorization: Bearer TOKEN`, the token coming from
//!   `api.token` or the environment variable named by `api.token_env`
//!   (`FLOWGATE_API_TOKEN` by default). It is compared in constant time. With no token
//!   configured, mutations are refused with 403.
//! * A call with a query or a body its route does not take is refused with 400, as a
//!   query parameter or body field the route does not know is.
//! * Every error is JSON, `{"error": "..."}`, axum's own rejections included (bad JSON,
//!   wrong content type, unknown path or method), and bodies above [`BODY_LIMIT`] get 413.

mod dashboard;
pub mod metrics;
mod openapi;
mod ops;
mod stream;
#[cfg(test)]
mod tests;
mod views;

use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, get, on};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::runtime::Handle;

pub use views::{BackendView, ConnectionView, ServiceView, SwitchView};

/// Largest request body accepted (bytes); larger ones get 413.
pub const BODY_LIMIT: usize = 64 * 1024;
/// Largest page of `/api/v1/connections`.
pub const MAX_PAGE: usize = 1000;

/// What every handler gets.
#[derive(Clone)]
pub struct ApiState {
    pub handle: Handle,
    /// Flips to true on shutdown: long-lived streams end then.
    stop: watch::Receiver<bool>,
}

pub(crate) async fn serve(listener: TcpListener, handle: Handle, mut stop: watch::Receiver<bool>) {
    let app = router_with_stop(handle, stop.clone());
    let shutdown = async move {
        let _ = stop.changed().await;
    };
    if let Err(e) = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
    {
        tracing::error!(error = %e, "API server failed");
    }
}

/// HTTP methods of the route table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Post,
    Put,
    Delete,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "GET",
            Verb::Post => "POST",
            Verb::Put => "PUT",
            Verb::Delete => "DELETE",
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Post => MethodFilter::POST,
            Verb::Put => MethodFilter::PUT,
            Verb::Delete => MethodFilter::DELETE,
        }
    }
}

/// The operations of the API, one per route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    OpenApi,
    Status,
    ListServices,
    GetService,
    SetAlgorithm,
    ListBackends,
    AddBackend,
    GetBackend,
    RemoveBackend,
    Drain,
    Undrain,
    SetWeight,
    ListSwitches,
    ListConnections,
    ListEvents,
    Stream,
    Reload,
    Overload,
    Cluster,
}

/// One `/api/v1` route: what the router serves and the OpenAPI document describes.
#[derive(Debug, Clone, Copy)]
pub struct RouteSpec {
    pub verb: Verb,
    /// axum path syntax (`{param}`), which is also OpenAPI's.
    pub path: &'static str,
    pub op: Op,
    pub operation_id: &'static str,
    pub summary: &'static str,
    /// Needs the bearer token.
    pub mutating: bool,
    /// Query parameters: name, JSON schema type, description.
    pub query: &'static [(&'static str, &'static str, &'static str)],
    /// Name of the request body's schema in `components.schemas`.
    pub body: Option<&'static str>,
    /// Name of the success response's schema; `text/event-stream` for the stream.
    pub response: &'static str,
}

const fn r(
    verb: Verb,
    path: &'static str,
    op: Op,
    operation_id: &'static str,
    summary: &'static str,
) -> RouteSpec {
    RouteSpec {
        verb,
        path,
        op,
        operation_id,
        summary,
        mutating: !matches!(verb, Verb::Get),
        query: &[],
        body: None,
        response: "Ok",
    }
}

/// Every `/api/v1` route.
pub static ROUTES: &[RouteSpec] = &[
    RouteSpec {
        response: "OpenApi",
        ..r(
            Verb::Get,
            "/api/v1/openapi.json",
            Op::OpenApi,
            "getOpenApi",
            "This document.",
        )
    },
    RouteSpec {
        response: "Status",
        ..r(
            Verb::Get,
            "/api/v1/status",
            Op::Status,
            "getStatus",
            "Controller status: version, uptime, whether mutations are enabled.",
        )
    },
    RouteSpec {
        response: "ServiceList",
        ..r(
            Verb::Get,
            "/api/v1/services",
            Op::ListServices,
            "listServices",
            "Every service with its backends and their live load, health, drain and gap state.",
        )
    },
    RouteSpec {
        response: "Service",
        ..r(
            Verb::Get,
            "/api/v1/services/{service}",
            Op::GetService,
            "getService",
            "One service.",
        )
    },
    RouteSpec {
        body: Some("AlgorithmChange"),
        response: "Service",
        ..r(
            Verb::Put,
            "/api/v1/services/{service}/algorithm",
            Op::SetAlgorithm,
            "setAlgorithm",
            "Change a service's algorithm and/or its threshold. Existing connections keep their backend.",
        )
    },
    RouteSpec {
        response: "BackendList",
        ..r(
            Verb::Get,
            "/api/v1/services/{service}/backends",
            Op::ListBackends,
            "listBackends",
            "A service's backends.",
        )
    },
    RouteSpec {
        body: Some("NewBackend"),
        response: "Backend",
        ..r(
            Verb::Post,
            "/api/v1/services/{service}/backends",
            Op::AddBackend,
            "addBackend",
            "Add a backend to a service's pool.",
        )
    },
    RouteSpec {
        response: "Backend",
        ..r(
            Verb::Get,
            "/api/v1/services/{service}/backends/{backend}",
            Op::GetBackend,
            "getBackend",
            "One backend, by address.",
        )
    },
    RouteSpec {
        response: "Ok",
        ..r(
            Verb::Delete,
            "/api/v1/services/{service}/backends/{backend}",
            Op::RemoveBackend,
            "removeBackend",
            "Remove a backend. Its open connections go on to it until they end, in no count; \
             the answer's `open_connections` says how many it had.",
        )
    },
    RouteSpec {
        response: "Backend",
        ..r(
            Verb::Post,
            "/api/v1/services/{service}/backends/{backend}/drain",
            Op::Drain,
            "drainBackend",
            "Give the backend no new connections; existing ones run to their end.",
        )
    },
    RouteSpec {
        response: "Backend",
        ..r(
            Verb::Post,
            "/api/v1/services/{service}/backends/{backend}/undrain",
            Op::Undrain,
            "undrainBackend",
            "Give the backend new connections again.",
        )
    },
    RouteSpec {
        body: Some("WeightChange"),
        response: "Backend",
        ..r(
            Verb::Put,
            "/api/v1/services/{service}/backends/{backend}/weight",
            Op::SetWeight,
            "setWeight",
            "Change a backend's weight.",
        )
    },
    RouteSpec {
        response: "SwitchList",
        ..r(
            Verb::Get,
            "/api/v1/switches",
            Op::ListSwitches,
            "listSwitches",
            "Connected switches: datapath id, ports, connected since, flow count.",
        )
    },
    RouteSpec {
        query: &[
            ("limit", "integer", "Page size, 1 to 1000 (default 100)."),
            (
                "cursor",
                "string",
                "Where to go on: the `next` of the previous page. A listing lists every \
                 connection open from its first page to its last at least once; one opened \
                 meanwhile may be listed or not, and one may be listed twice.",
            ),
        ],
        response: "ConnectionPage",
        ..r(
            Verb::Get,
            "/api/v1/connections",
            Op::ListConnections,
            "listConnections",
            "Connection counts per backend and a page of the connection table, newest first; each call costs the page, not the table.",
        )
    },
    RouteSpec {
        query: &[
            (
                "since_ms",
                "integer",
                "Only events after this time (ms since start).",
            ),
            (
                "limit",
                "integer",
                "At most this many, the latest (default all, max 256).",
            ),
        ],
        response: "EventList",
        ..r(
            Verb::Get,
            "/api/v1/events",
            Op::ListEvents,
            "listEvents",
            "Recent events from the controller's event ring.",
        )
    },
    RouteSpec {
        query: &[(
            "interval_ms",
            "integer",
            "Time between snapshots, 200 to 10000 (default 1000).",
        )],
        response: "text/event-stream",
        ..r(
            Verb::Get,
            "/api/v1/stream",
            Op::Stream,
            "stream",
            "Server-sent events: a `snapshot` event (services, switches, events) every interval.",
        )
    },
    RouteSpec {
        response: "ReloadResult",
        ..r(
            Verb::Post,
            "/api/v1/reload",
            Op::Reload,
            "reload",
            "Re-read the config file; validated first: a bad file changes nothing and every error is listed.",
        )
    },
    RouteSpec {
        response: "OverloadList",
        ..r(
            Verb::Get,
            "/api/v1/overload",
            Op::Overload,
            "getOverload",
            "Overload (gap) control: each service's gap state and the controller's own.",
        )
    },
    RouteSpec {
        response: "Cluster",
        ..r(
            Verb::Get,
            "/api/v1/cluster",
            Op::Cluster,
            "getCluster",
            "The cluster: domains, their masters and standbys, the active global controller, per-domain load and spill, the store's reachability.",
        )
    },
];

fn method_router(spec: &RouteSpec) -> MethodRouter<ApiState> {
    let f = spec.verb.filter();
    match spec.op {
        Op::OpenApi => on(f, openapi::serve),
        Op::Status => on(f, views::status),
        Op::ListServices => on(f, views::services),
        Op::GetService => on(f, views::service),
        Op::SetAlgorithm => on(f, ops::set_algorithm),
        Op::ListBackends => on(f, views::backends),
        Op::AddBackend => on(f, ops::add_backend),
        Op::GetBackend => on(f, views::backend),
        Op::RemoveBackend => on(f, ops::remove_backend),
        Op::Drain => on(f, ops::drain),
        Op::Undrain => on(f, ops::undrain),
        Op::SetWeight => on(f, ops::set_weight),
        Op::ListSwitches => on(f, views::switches),
        Op::ListConnections => on(f, views::connections),
        Op::ListEvents => on(f, views::events),
        Op::Stream => on(f, stream::stream),
        Op::Reload => on(f, ops::reload),
        Op::Overload => on(f, overload),
        Op::Cluster => on(f, cluster),
    }
}

/// The whole application, for a controller that never stops (tests).
pub fn router(handle: Handle) -> Router {
    // A sender that is never dropped: the stop signal never fires.
    let (tx, rx) = watch::channel(false);
    std::mem::forget(tx);
    router_with_stop(handle, rx)
}

/// `GET /api/v1/cluster`: this instance's view of the cluster (role `single` without one).
async fn cluster(State(st): State<ApiState>) -> Response {
    axum::Json(st.handle.cluster.snapshot()).into_response()
}

/// `GET /api/v1/overload`: the gap state (mode, admitted rate or gap, refused count) of
/// every service, and the controller's own (its PACKET_IN load). The per-service part is
/// `Controller::gap_view(i)`, for views that embed it.
async fn overload(State(st): State<ApiState>) -> Response {
    let core = st.handle.lock();
    let c = &core.controller;
    let services: Vec<serde_json::Value> = c
        .services()
        .iter()
        .enumerate()
        .map(|(i, s)| serde_json::json!({ "name": s.cfg.name, "overload": c.gap_view(i) }))
        .collect();
    axum::Json(serde_json::json!({
        "controller": c.controller_gap_view(),
        "services": services,
    }))
    .into_response()
}

pub fn router_with_stop(handle: Handle, stop: watch::Receiver<bool>) -> Router {
    let state = ApiState { handle, stop };
    let mut by_path: std::collections::BTreeMap<&str, MethodRouter<ApiState>> =
        std::collections::BTreeMap::new();
    for spec in ROUTES {
        let mut mr = method_router(spec).route_layer(axum::middleware::from_fn(
            move |req: Request, next: Next| declared_only(spec, req, next),
        ));
        if spec.mutating {
            mr = mr.route_layer(axum::middleware::from_fn_with_state(
                state.clone(),
                require_token,
            ));
        }
        let merged = match by_path.remove(spec.path) {
            Some(prev) => prev.merge(mr),
            None => mr,
        };
        by_path.insert(spec.path, merged);
    }
    let mut app = Router::new();
    for (path, mr) in by_path {
        app = app.route(path, mr);
    }
    app.route("/metrics", get(metrics::metrics))
        .route("/", get(dashboard::index))
        .route("/dashboard", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::asset))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::from_fn(guard))
        .with_state(state)
}

/// A JSON error body: `{"error": "..."}`.
pub(crate) fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (
        status,
        axum::Json(serde_json::json!({ "error": msg.into() })),
    )
        .into_response()
}

async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "no such endpoint")
}

/// The outermost layer: refuse oversized bodies by their declared length before anything
/// reads them, and turn every non-JSON error response (axum's rejections, 405s) into
/// `{"error": "..."}`.
async fn guard(req: Request, next: Next) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > BODY_LIMIT as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {BODY_LIMIT} bytes"),
        );
    }
    let resp = next.run(req).await;
    let status = resp.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return resp;
    }
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let bytes = axum::body::to_bytes(body, 16 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes).trim().to_string();
    let msg = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let body = serde_json::json!({ "error": msg }).to_string();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, Body::from(body))
}

/// A call carries only what its route declares: a query only where the route names its
/// parameters (their handlers refuse unknown ones), a body only where it takes one (its
/// handler refuses unknown fields; elsewhere only an empty one, `null` or `{}`, passes).
/// A call with more is refused, not done in part.
async fn declared_only(spec: &'static RouteSpec, req: Request, next: Next) -> Response {
    let call = format!("{} {}", spec.verb.as_str(), spec.path);
    if spec.query.is_empty() && req.uri().query().is_some_and(|q| !q.is_empty()) {
        return error(
            StatusCode::BAD_REQUEST,
            format!("{call} takes no query parameters"),
        );
    }
    if spec.body.is_some() {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let nothing = |bytes: &[u8]| {
        bytes.trim_ascii().is_empty()
            || serde_json::from_slice::<serde_json::Value>(bytes)
                .is_ok_and(|v| v.is_null() || v.as_object().is_some_and(|o| o.is_empty()))
    };
    match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(bytes) if nothing(&bytes) => next.run(Request::from_parts(parts, Body::empty())).await,
        Ok(_) => error(
            StatusCode::BAD_REQUEST,
            format!("{call} takes no request body"),
        ),
        Err(_) => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {BODY_LIMIT} bytes"),
        ),
    }
}

/// Mutations need `Authorization: Bearer TOKEN` matching the configured token.
async fn require_token(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let token = st
        .handle
        .config
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .api
        .token
        .clone();
    let Some(token) = token else {
        return error(
            StatusCode::FORBIDDEN,
            "changes are disabled: no API token is configured (set api.token in the config \
             or the FLOWGATE_API_TOKEN environment variable)",
        );
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        // The scheme is case-insensitive (RFC 7235 §2.1).
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("Bearer"))
        .map(|(_, t)| t.trim());
    let unauthorized = |msg: &str| {
        let mut resp = error(StatusCode::UNAUTHORIZED, msg);
        resp.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"flowgate\""),
        );
        resp
    };
    match given {
        None => unauthorized("this call needs an Authorization: Bearer token"),
        Some(g) if token_eq(g.as_bytes(), token.as_bytes()) => next.run(req).await,
        Some(_) => unauthorized("the bearer token is not valid"),
    }
}

/// Constant-time comparison (time depends on the lengths only, never on the contents).
fn token_eq(a: &[u8], b: &[u8]) -> bool {
    use subtle::ConstantTimeEq;
    a.len() == b.len() && bool::from(a.ct_eq(b))
}
