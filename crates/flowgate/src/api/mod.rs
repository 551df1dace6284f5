//! The HTTP API (`/api/v1/...`, JSON) and the Prometheus endpoint (`/metrics`).

mod metrics;

use std::net::Ipv4Addr;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::runtime::Handle;

pub(crate) async fn serve(listener: TcpListener, handle: Handle, mut stop: watch::Receiver<bool>) {
    let app = router(handle);
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

pub fn router(handle: Handle) -> Router {
    Router::new()
        .route("/api/v1/services", get(services))
        .route("/api/v1/switches", get(switches))
        .route("/api/v1/events", get(events))
        .route("/metrics", get(metrics::metrics))
        .fallback(not_found)
        .with_state(handle)
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

#[derive(Serialize)]
pub struct ServiceView {
    pub name: String,
    pub vip: Option<Ipv4Addr>,
    pub virtual_mac: String,
    pub port: u16,
    pub algorithm: String,
    pub counters: flowgate_core::service::ServiceCounters,
    pub backends: Vec<BackendView>,
}

#[derive(Serialize)]
pub struct BackendView {
    pub address: Ipv4Addr,
    pub weight: u32,
    pub healthy: bool,
    pub state: flowgate_core::service::AdminState,
    pub located: bool,
    pub mac: Option<String>,
    pub active_connections: u32,
    pub connections_total: u64,
    pub rps: f64,
    pub response_time_ms: Option<f64>,
    pub cpu: Option<f64>,
}

pub(crate) fn service_views(handle: &Handle) -> Vec<ServiceView> {
    let core = handle.lock();
    core.controller
        .services()
        .iter()
        .map(|s| ServiceView {
            name: s.cfg.name.clone(),
            vip: s.cfg.vip,
            virtual_mac: s.cfg.virtual_mac.to_string(),
            port: s.cfg.port,
            algorithm: s.algorithm().to_string(),
            counters: s.counters.clone(),
            backends: s
                .backends
                .iter()
                .map(|b| BackendView {
                    address: b.address,
                    weight: b.weight,
                    healthy: b.healthy,
                    state: b.admin,
                    located: b.mac.is_some(),
                    mac: b.mac.map(|m| m.to_string()),
                    active_connections: b.active_connections,
                    connections_total: b.connections_total,
                    rps: b.reported_rps.unwrap_or(b.rps),
                    response_time_ms: b.response_time_ms,
                    cpu: b.cpu,
                })
                .collect(),
        })
        .collect()
}

async fn services(State(handle): State<Handle>) -> Response {
    axum::Json(service_views(&handle)).into_response()
}

#[derive(Serialize)]
struct SwitchJson {
    dpid: String,
    n_tables: u8,
    ports: usize,
    packet_in: u64,
    connected_secs: f64,
    last_error: Option<String>,
}

async fn switches(State(handle): State<Handle>) -> Response {
    let core = handle.lock();
    let c = &core.controller;
    let v: Vec<SwitchJson> = c
        .switch_ids()
        .filter_map(|d| c.switch_view(d))
        .map(|s| SwitchJson {
            dpid: format!("{:016x}", s.dpid),
            n_tables: s.n_tables,
            ports: s.ports,
            packet_in: s.packet_in,
            connected_secs: s.connected_at.elapsed().as_secs_f64(),
            last_error: s.last_error,
        })
        .collect();
    axum::Json(v).into_response()
}

async fn events(State(handle): State<Handle>) -> Response {
    let core = handle.lock();
    let v: Vec<_> = core.controller.events().cloned().collect();
    axum::Json(v).into_response()
}
