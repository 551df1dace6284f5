//! Mutating endpoints (all behind the bearer token) and the config reload.
//!
//! None of them breaks a connection: the core keeps every connection's rules and decision
//! through drains, weight and algorithm changes, pool changes and reloads; only new
//! connections see the change.
#![allow(clippy::result_large_err)] // `Err` is the ready 4xx `Response` to send.

use std::net::Ipv4Addr;
use std::time::Instant;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flowgate_core::balance::AlgorithmKind;
use flowgate_core::config::{BackendConfig, parse_metrics_url, pinned_mac};
use flowgate_core::service::AdminState;
use serde::Deserialize;

use super::views::{backend_json, find_backend, find_service, service_views};
use super::{ApiState, error};
use crate::runtime::Handle;
use crate::runtime::reload::{ReloadError, reload_from_file};

/// The body, or the 4xx for it (axum's rejection text, as JSON).
fn body<T>(b: Result<Json<T>, JsonRejection>) -> Result<T, Response> {
    b.map(|Json(v)| v)
        .map_err(|e| error(e.status(), e.body_text()))
}

pub(crate) async fn drain(
    State(st): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
) -> Response {
    set_admin(&st.handle, &service, &backend, AdminState::Draining)
}

pub(crate) async fn undrain(
    State(st): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
) -> Response {
    set_admin(&st.handle, &service, &backend, AdminState::Active)
}

fn set_admin(handle: &Handle, service: &str, backend: &str, admin: AdminState) -> Response {
    let mut core = handle.lock();
    let (si, bi) = match find_backend(&core.controller, service, backend) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let now = Instant::now();
    core.with(|c, _| c.set_admin(now, si, bi, admin));
    backend_json(&core.controller, si, bi)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WeightChange {
    weight: u32,
}

/// Same bound as the config's `weight`.
const MAX_WEIGHT: u32 = 1_000_000;

pub(crate) async fn set_weight(
    State(st): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
    b: Result<Json<WeightChange>, JsonRejection>,
) -> Response {
    let w = match body(b) {
        Ok(w) => w,
        Err(r) => return r,
    };
    if w.weight > MAX_WEIGHT {
        return error(
            StatusCode::BAD_REQUEST,
            format!("weight must be between 0 and {MAX_WEIGHT}"),
        );
    }
    let mut core = st.handle.lock();
    let (si, bi) = match find_backend(&core.controller, &service, &backend) {
        Ok(x) => x,
        Err(r) => return r,
    };
    core.with(|c, _| c.set_weight(si, bi, w.weight));
    backend_json(&core.controller, si, bi)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AlgorithmChange {
    /// Defaults to the current algorithm (to change only the threshold).
    algorithm: Option<String>,
    threshold_rps: Option<f64>,
    hysteresis: Option<f64>,
}

pub(crate) async fn set_algorithm(
    State(st): State<ApiState>,
    Path(service): Path<String>,
    b: Result<Json<AlgorithmChange>, JsonRejection>,
) -> Response {
    let ch = match body(b) {
        Ok(c) => c,
        Err(r) => return r,
    };
    let mut core = st.handle.lock();
    let si = match find_service(&core.controller, &service) {
        Ok(si) => si,
        Err(r) => return r,
    };
    let s = &core.controller.services()[si];
    let kind = match &ch.algorithm {
        None => s.algorithm(),
        Some(a) => match a.parse::<AlgorithmKind>() {
            Ok(k) => k,
            Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
        },
    };
    let mut params = s.cfg.params.clone();
    if let Some(t) = ch.threshold_rps {
        if !(t.is_finite() && t > 0.0) {
            return error(StatusCode::BAD_REQUEST, "threshold_rps must be positive");
        }
        params.threshold_rps = Some(t);
    }
    if let Some(h) = ch.hysteresis {
        if !(0.0..1.0).contains(&h) {
            return error(StatusCode::BAD_REQUEST, "hysteresis must be in [0, 1)");
        }
        params.hysteresis = h;
    }
    let now = Instant::now();
    match core.with(|c, _| c.set_algorithm(now, si, kind, params)) {
        Ok(()) => {
            let v = service_views(&core.controller);
            match v.into_iter().nth(si) {
                Some(s) => Json(s).into_response(),
                None => error(StatusCode::NOT_FOUND, "no such service"),
            }
        }
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewBackend {
    address: String,
    weight: Option<u32>,
    metrics: Option<String>,
    mac: Option<String>,
    capacity_rps: Option<f64>,
}

pub(crate) async fn add_backend(
    State(st): State<ApiState>,
    Path(service): Path<String>,
    b: Result<Json<NewBackend>, JsonRejection>,
) -> Response {
    let nb = match body(b) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let address: Ipv4Addr = match nb.address.parse() {
        Ok(a) => a,
        Err(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("address: {:?} is not an IPv4 address", nb.address),
            );
        }
    };
    if address.is_unspecified() || address.is_broadcast() || address.is_multicast() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("address: {address} cannot be a host address"),
        );
    }
    let weight = nb.weight.unwrap_or(1);
    if weight > MAX_WEIGHT {
        return error(
            StatusCode::BAD_REQUEST,
            format!("weight must be between 0 and {MAX_WEIGHT}"),
        );
    }
    if let Some(Err(why)) = nb.metrics.as_deref().map(parse_metrics_url) {
        return error(StatusCode::BAD_REQUEST, format!("metrics: {why}"));
    }
    // As a file's `capacity_rps` (JSON has no infinity or NaN).
    if nb.capacity_rps.is_some_and(|c| c <= 0.0) {
        return error(
            StatusCode::BAD_REQUEST,
            "capacity_rps: must be a positive number of requests per second",
        );
    }
    let mac = match nb.mac.as_deref().map(pinned_mac) {
        None => None,
        Some(Ok(mac)) => Some(mac),
        Some(Err(why)) => return error(StatusCode::BAD_REQUEST, format!("mac: {why}")),
    };
    let mut core = st.handle.lock();
    let si = match find_service(&core.controller, &service) {
        Ok(si) => si,
        Err(r) => return r,
    };
    let now = Instant::now();
    let cfg = BackendConfig {
        address,
        weight,
        metrics: nb.metrics,
        mac,
        capacity_rps: nb.capacity_rps,
    };
    match core.with(|c, out| c.add_backend(now, si, cfg, out)) {
        Ok(bi) => {
            let mut r = backend_json(&core.controller, si, bi);
            *r.status_mut() = StatusCode::CREATED;
            r
        }
        Err(e) => error(StatusCode::CONFLICT, e),
    }
}

pub(crate) async fn remove_backend(
    State(st): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
) -> Response {
    let mut core = st.handle.lock();
    let (si, bi) = match find_backend(&core.controller, &service, &backend) {
        Ok(x) => x,
        Err(r) => return r,
    };
    // Its open connections go on to it until they end, out of every count from now: the
    // answer says how many there were.
    let open = core
        .controller
        .services()
        .get(si)
        .and_then(|s| s.backends.get(bi))
        .map_or(0, |b| b.active_connections);
    let now = Instant::now();
    match core.with(|c, out| c.remove_backend(now, si, bi, out)) {
        Ok(()) => Json(serde_json::json!({
            "ok": true,
            "removed": backend,
            "open_connections": open,
        }))
        .into_response(),
        Err(e) => error(StatusCode::CONFLICT, e),
    }
}

pub(crate) async fn reload(State(st): State<ApiState>) -> Response {
    match reload_from_file(&st.handle) {
        Ok(r) => Json(r).into_response(),
        Err(ReloadError::NoFile) => error(StatusCode::CONFLICT, ReloadError::NoFile.to_string()),
        Err(e @ ReloadError::Read(_)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Err(ReloadError::Invalid(file, errs)) => {
            let list: Vec<serde_json::Value> = errs
                .0
                .iter()
                .map(|e| serde_json::json!({ "path": e.path, "message": e.message }))
                .collect();
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(serde_json::json!({
                    "error": format!("{file}: {} configuration error(s); nothing was changed", list.len()),
                    "errors": list,
                })),
            )
                .into_response()
        }
    }
}
