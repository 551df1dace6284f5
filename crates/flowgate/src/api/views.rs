//! Read-only endpoints and the JSON views they (and the stream) return.
#![allow(clippy::result_large_err)] // `Err` is the ready 4xx `Response` to send.

use std::net::Ipv4Addr;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use flowgate_core::Controller;
use flowgate_core::conntrack::ConnKey;
use flowgate_core::service::{BackendState, ServiceState};
use flowgate_core::topology::PortRef;
use serde::{Deserialize, Serialize};

use super::{ApiState, MAX_PAGE, error};
use crate::runtime::{FLOW_STATS_INTERVAL, Handle};

#[derive(Debug, Serialize)]
pub struct ServiceView {
    pub name: String,
    pub vip: Option<Ipv4Addr>,
    pub virtual_mac: String,
    pub port: u16,
    pub algorithm: String,
    /// `reactive` (a decision per connection) or `proactive` (select group + conntrack).
    pub mode: flowgate_core::config::ServiceMode,
    pub threshold_rps: Option<f64>,
    pub hysteresis: f64,
    pub health_check: flowgate_core::config::HealthKind,
    /// Too few backends available: their outlier ejections are waived
    /// (`[service.health] panic_threshold_percent`).
    pub panic: bool,
    /// The success-rate detector's last interval, if it had backends enough to judge.
    pub outlier_success_rate: Option<SuccessRateView>,
    pub counters: flowgate_core::service::ServiceCounters,
    /// Sum of the backends' request rates (new connections per second).
    pub rps: f64,
    pub active_connections: u64,
    /// Overload (gap) control: mode, admitted rate or gap, refused count.
    pub gap: Option<flowgate_core::overload::GapView>,
    /// Partitioned mode: the partitions, who owns them, how many move.
    pub partitions: Option<flowgate_core::controller::PartitionView>,
    pub backends: Vec<BackendView>,
    /// Backends removed from the pool with connections still open to them: those go on
    /// to them until they end. They are the connections the controller tracks: all of a
    /// reactive service's (a backend gone from here can be taken down), not those a
    /// proactive or partitioned service's switch rules place without it.
    pub left_backends: Vec<flowgate_core::service::LeftBackend>,
}

/// The success-rate detector's last sweep over a pool (Envoy's
/// `success_rate_average` and `success_rate_ejection_threshold`).
#[derive(Debug, Serialize)]
pub struct SuccessRateView {
    /// The judged backends' mean share of answered connections, in percent.
    pub mean: f64,
    /// A backend under it was ejected: the mean less `success_rate_stdev_factor`
    /// standard deviations.
    pub threshold: f64,
    /// Backends judged (each with `success_rate_request_volume` outcomes or more).
    pub backends: u32,
}

#[derive(Debug, Serialize)]
pub struct BackendView {
    pub address: Ipv4Addr,
    /// The operator's weight: the file's, or the last the API set.
    pub weight: u32,
    /// Weight the balancer uses now: a domain controller's spill decision scales it, and
    /// slow start ramps it up after a (re)join (a fraction: weight 1 at a quarter of its
    /// ramp is 0.25).
    pub effective_weight: f64,
    /// Result of the active health checks.
    pub healthy: bool,
    /// `active` or `draining`.
    pub state: flowgate_core::service::AdminState,
    pub draining: bool,
    /// Healthy, active, located and not ejected (or its ejection waived: the service is
    /// in panic): can take a new connection.
    pub eligible: bool,
    /// Ejected by passive outlier detection.
    pub ejected: bool,
    /// The detector of the ejection in force: `consecutive`, `success_rate` or
    /// `failure_percentage` (`null` when not ejected).
    pub ejected_by: Option<&'static str>,
    /// Connections judged in the outlier detectors' last complete interval (answered or
    /// not), and the share answered, in percent (`null` with none).
    pub outcomes_last_interval: u32,
    pub success_rate_last_interval: Option<f64>,
    /// Connections judged since the controller started: answered, and not.
    pub connections_answered_total: u64,
    pub connections_unanswered_total: u64,
    pub located: bool,
    pub mac: Option<String>,
    pub active_connections: u32,
    pub connections_total: u64,
    /// New connections since the last load refresh.
    pub picks_since_refresh: u32,
    /// Request rate the balancer uses (the backend's own report when it has one).
    pub rps: f64,
    /// New connections per second as the controller counts them.
    pub measured_rps: f64,
    pub reported_rps: Option<f64>,
    pub response_time_ms: Option<f64>,
    pub cpu: Option<f64>,
    /// Whether the backend's metrics (if it has an endpoint) are recent.
    pub metrics_fresh: bool,
    /// Proactive mode: this backend's bucket weight in the service's select group.
    pub group_weight: Option<u16>,
    /// Partitioned mode: how many of the service's partitions this backend owns.
    pub partitions: Option<usize>,
    /// The pool's overload (gap) control state: the gap applies to the service's new
    /// connections, so every backend of the service shows the same one.
    pub gap: Option<flowgate_core::overload::GapView>,
}

fn backend_view(
    s: &ServiceState,
    i: usize,
    b: &BackendState,
    gap: Option<&flowgate_core::overload::GapView>,
    group_weights: Option<&[u16]>,
    partitions: Option<&flowgate_core::controller::PartitionView>,
) -> BackendView {
    let load = s.loads.get(i);
    let outlier = s.outliers.host(i);
    let window = outlier.map(|o| o.last_window()).unwrap_or_default();
    BackendView {
        address: b.address,
        // The operator's (a domain controller's spill scales it in `effective_weight`).
        weight: s.cfg.backends.get(i).map_or(b.weight, |c| c.weight),
        effective_weight: s.effective_weight(i).unwrap_or_else(|| f64::from(b.weight)),
        healthy: b.healthy,
        state: b.admin,
        draining: b.admin == flowgate_core::service::AdminState::Draining,
        eligible: b.eligible(),
        ejected: b.ejected,
        ejected_by: outlier
            .and_then(|o| o.ejected_by())
            .filter(|_| b.ejected)
            .map(|d| d.as_str()),
        outcomes_last_interval: window.outcomes,
        success_rate_last_interval: window.success_rate(),
        connections_answered_total: b.outcomes_answered,
        connections_unanswered_total: b.outcomes_unanswered,
        located: b.mac.is_some(),
        mac: b.mac.map(|m| m.to_string()),
        active_connections: b.active_connections,
        connections_total: b.connections_total,
        picks_since_refresh: b.picks_since_refresh,
        rps: b.reported_rps.unwrap_or(b.rps),
        measured_rps: b.rps,
        reported_rps: b.reported_rps,
        response_time_ms: b.response_time_ms,
        cpu: b.cpu,
        metrics_fresh: load.map(|l| l.metrics_fresh).unwrap_or(true),
        group_weight: group_weights.and_then(|w| w.get(i).copied()),
        partitions: partitions.and_then(|p| p.owned.get(i).copied()),
        gap: gap.cloned(),
    }
}

fn service_view(c: &Controller, si: usize, s: &ServiceState) -> ServiceView {
    let gap = c.gap_view(si);
    let group_weights = c.proactive_weights(si);
    let partitions = c.partition_view(si);
    let backends: Vec<BackendView> = s
        .backends
        .iter()
        .enumerate()
        .map(|(i, b)| backend_view(s, i, b, gap.as_ref(), group_weights, partitions.as_ref()))
        .collect();
    ServiceView {
        name: s.cfg.name.clone(),
        vip: s.cfg.vip,
        virtual_mac: s.cfg.virtual_mac.to_string(),
        port: s.cfg.port,
        algorithm: s.algorithm().to_string(),
        mode: s.cfg.mode,
        threshold_rps: s.cfg.params.threshold_rps,
        hysteresis: s.cfg.params.hysteresis,
        health_check: s.cfg.health.kind,
        panic: s.in_panic(),
        outlier_success_rate: s.outliers.success_rate_stats().map(|r| SuccessRateView {
            mean: r.mean,
            threshold: r.threshold,
            backends: r.hosts,
        }),
        counters: s.counters.clone(),
        rps: backends.iter().map(|b| b.rps).sum(),
        active_connections: backends
            .iter()
            .map(|b| u64::from(b.active_connections))
            .sum(),
        gap,
        partitions,
        backends,
        left_backends: s.left_backends(),
    }
}

pub(crate) fn service_views(c: &Controller) -> Vec<ServiceView> {
    c.services()
        .iter()
        .enumerate()
        .map(|(i, s)| service_view(c, i, s))
        .collect()
}

/// Find a service by name, or the 404 to answer with.
pub(crate) fn find_service(c: &Controller, name: &str) -> Result<usize, Response> {
    c.service_index(name)
        .ok_or_else(|| error(StatusCode::NOT_FOUND, format!("no service named {name:?}")))
}

/// Find a backend (by address) of a service, or the 4xx to answer with.
pub(crate) fn find_backend(
    c: &Controller,
    service: &str,
    backend: &str,
) -> Result<(usize, usize), Response> {
    let si = find_service(c, service)?;
    let addr: Ipv4Addr = backend.parse().map_err(|_| {
        error(
            StatusCode::BAD_REQUEST,
            format!("{backend:?} is not an IPv4 address"),
        )
    })?;
    let bi = c.services()[si].backend_index(addr).ok_or_else(|| {
        error(
            StatusCode::NOT_FOUND,
            format!("{addr} is not a backend of {service:?}"),
        )
    })?;
    Ok((si, bi))
}

pub(crate) fn backend_json(c: &Controller, si: usize, bi: usize) -> Response {
    let s = &c.services()[si];
    match s.backends.get(bi) {
        Some(b) => Json(backend_view(
            s,
            bi,
            b,
            c.gap_view(si).as_ref(),
            c.proactive_weights(si),
            c.partition_view(si).as_ref(),
        ))
        .into_response(),
        None => error(StatusCode::NOT_FOUND, "no such backend"),
    }
}

#[derive(Debug, Serialize)]
pub struct PortView {
    pub port_no: u32,
    pub name: String,
    pub hw_addr: String,
    pub up: bool,
    /// An inter-switch link (found by LLDP): no host is learned there.
    pub link: bool,
    /// Hosts (source MACs) learned at this port, and the addresses they claim.
    pub hosts: u32,
    pub addresses: u32,
    /// At `max_hosts_per_port` hosts or addresses: new ones seen here are refused
    /// (`flowgate_hosts_refused_port_full_total`, `..._addresses_...`).
    pub full: bool,
}

#[derive(Debug, Serialize)]
pub struct SwitchView {
    /// Datapath id, 16 hex digits.
    pub dpid: String,
    pub n_tables: u8,
    pub ports: Vec<PortView>,
    /// Seconds since the switch's session started.
    pub connected_secs: f64,
    /// Unix time (seconds) the session started.
    pub connected_since_unix: f64,
    pub packet_in: u64,
    /// Flow entries in all the switch's tables, from its last OFPMP_AGGREGATE reply
    /// (requested every 2 s); `null` until the first reply.
    pub flow_count: Option<u32>,
    pub flow_count_age_secs: Option<f64>,
    pub flow_count_source: &'static str,
    pub last_error: Option<String>,
    /// The control channel's round trip in ms, as last measured (an ECHO's wait);
    /// `null` while the switch is not probed.
    pub channel_rtt_ms: Option<f64>,
}

pub(crate) fn switch_views(handle: &Handle, c: &Controller) -> Vec<SwitchView> {
    let counts = handle
        .flow_counts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let now_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    c.switch_ids()
        .filter_map(|d| c.switch_view(d))
        .map(|s| {
            let ports = c
                .topology()
                .switch(s.dpid)
                .map(|sw| {
                    sw.ports
                        .iter()
                        .map(|(no, p)| {
                            let at = PortRef::new(s.dpid, *no);
                            let (share, full) = c.topology().share_of(at);
                            PortView {
                                port_no: *no,
                                name: p.name.clone(),
                                hw_addr: p.hw_addr.to_string(),
                                up: p.up,
                                link: c.topology().is_link_port(at),
                                hosts: share.hosts,
                                addresses: share.addresses,
                                full,
                            }
                        })
                        .collect()
                })
                .unwrap_or_default();
            let fc = counts.get(&s.dpid);
            let connected = s.connected_at.elapsed().as_secs_f64();
            SwitchView {
                dpid: format!("{:016x}", s.dpid),
                n_tables: s.n_tables,
                ports,
                connected_secs: connected,
                connected_since_unix: now_unix - connected,
                packet_in: s.packet_in,
                flow_count: fc.map(|f| f.flows),
                flow_count_age_secs: fc.map(|f| f.at.elapsed().as_secs_f64()),
                flow_count_source: "aggregate-stats",
                last_error: s.last_error,
                channel_rtt_ms: s.channel_rtt.map(|d| d.as_secs_f64() * 1000.0),
            }
        })
        .collect()
}

pub(crate) async fn status(State(st): State<ApiState>) -> Response {
    let token = st
        .handle
        .config
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .api
        .token
        .is_some();
    let core = st.handle.lock();
    let c = &core.controller;
    Json(serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": st.handle.started.elapsed().as_secs_f64(),
        "mutations_enabled": token,
        "config_file": st.handle.config_path.as_ref().map(|p| p.display().to_string()),
        "services": c.services().len(),
        "switches": c.switch_ids().count(),
        "connections": c.connections().len(),
        "flow_stats_interval_secs": FLOW_STATS_INTERVAL.as_secs_f64(),
    }))
    .into_response()
}

pub(crate) async fn services(State(st): State<ApiState>) -> Response {
    let core = st.handle.lock();
    Json(service_views(&core.controller)).into_response()
}

pub(crate) async fn service(State(st): State<ApiState>, Path(name): Path<String>) -> Response {
    let core = st.handle.lock();
    let c = &core.controller;
    match find_service(c, &name) {
        Ok(si) => Json(service_view(c, si, &c.services()[si])).into_response(),
        Err(r) => r,
    }
}

pub(crate) async fn backends(State(st): State<ApiState>, Path(name): Path<String>) -> Response {
    let core = st.handle.lock();
    let c = &core.controller;
    match find_service(c, &name) {
        Ok(si) => Json(service_view(c, si, &c.services()[si]).backends).into_response(),
        Err(r) => r,
    }
}

pub(crate) async fn backend(
    State(st): State<ApiState>,
    Path((service, backend)): Path<(String, String)>,
) -> Response {
    let core = st.handle.lock();
    let c = &core.controller;
    match find_backend(c, &service, &backend) {
        Ok((si, bi)) => backend_json(c, si, bi),
        Err(r) => r,
    }
}

pub(crate) async fn switches(State(st): State<ApiState>) -> Response {
    let core = st.handle.lock();
    Json(switch_views(&st.handle, &core.controller)).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageQuery {
    limit: Option<usize>,
    cursor: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ConnectionView {
    /// `client:port>service_addr:port`.
    pub key: String,
    pub client: Ipv4Addr,
    pub client_port: u16,
    pub service_addr: Ipv4Addr,
    pub service_port: u16,
    pub service: Option<String>,
    pub backend: Option<Ipv4Addr>,
    /// False once the backend has left the service's pool: the connection goes on to it
    /// until it ends, and is in no backend's count.
    pub backend_in_pool: bool,
    pub created_ms: u64,
    pub installed: bool,
}

#[derive(Debug, Serialize)]
struct BackendCount {
    service: String,
    backend: Ipv4Addr,
    connections: u64,
}

fn key_string(k: &ConnKey) -> String {
    format!(
        "{}:{}>{}:{}",
        k.client, k.client_port, k.service_addr, k.service_port
    )
}

/// One page of the connection table, and the connections per backend, in O(`limit`)
/// under the core's lock: the PACKET_IN path waits while a handler holds it, so a listing
/// must not cost in proportion to the table (one pass over 2.8 M connections took 31–37
/// ms; `docs/benchmarks.md`, stops 45 and 46).
///
/// Pages walk the table's store from its end down ([`ConnTable::at`]); the cursor is the
/// position to go on from. A connection that ends moves the last one into its place,
/// always downwards, and a new one is appended: so a listing lists every connection open
/// from its first page to its last at least once, as Redis's `SCAN` does. One that opens
/// meanwhile may be listed or not, and one may be listed twice if others end meanwhile.
/// The counts are the backends' own (`active_connections`, which the controller keeps
/// equal to their shares of the table).
///
/// [`ConnTable::at`]: flowgate_core::conntrack::ConnTable::at
pub(crate) async fn connections(
    State(st): State<ApiState>,
    Query(q): Query<PageQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return error(
            StatusCode::BAD_REQUEST,
            format!("limit must be between 1 and {MAX_PAGE}"),
        );
    }
    let cursor = match q.cursor.as_deref().filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => match s.parse::<usize>() {
            Ok(p) => Some(p),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("cursor: {s:?} is not the `next` of a page"),
                );
            }
        },
    };
    let core = st.handle.lock();
    let c = &core.controller;
    let services = c.services();
    let table = c.connections();
    let top = cursor.map_or(table.len(), |p| p.min(table.len()));
    let bottom = top.saturating_sub(limit);
    let items: Vec<ConnectionView> = (bottom..top)
        .rev()
        .filter_map(|p| {
            let (k, conn) = table.at(p)?;
            let svc = services.get(usize::from(conn.service));
            Some(ConnectionView {
                key: key_string(k),
                client: k.client,
                client_port: k.client_port,
                service_addr: k.service_addr,
                service_port: k.service_port,
                service: svc.map(|s| s.cfg.name.clone()),
                backend: svc
                    .and_then(|s| s.destination(conn.backend))
                    .map(|(address, _)| address),
                backend_in_pool: svc.is_some_and(|s| s.position(conn.backend).is_some()),
                created_ms: conn.created_ms,
                installed: conn.installed,
            })
        })
        .collect();
    let per_backend: Vec<BackendCount> = services
        .iter()
        .flat_map(|s| {
            s.backends.iter().map(move |b| BackendCount {
                service: s.cfg.name.clone(),
                backend: b.address,
                connections: u64::from(b.active_connections),
            })
        })
        .collect();
    Json(serde_json::json!({
        "total": table.len(),
        "per_backend": per_backend,
        "limit": limit,
        "items": items,
        "next": (bottom > 0).then(|| bottom.to_string()),
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EventQuery {
    since_ms: Option<u64>,
    limit: Option<usize>,
}

pub(crate) async fn events(State(st): State<ApiState>, Query(q): Query<EventQuery>) -> Response {
    let core = st.handle.lock();
    let mut v: Vec<_> = core
        .controller
        .events()
        .filter(|e| q.since_ms.is_none_or(|s| e.at_ms > s))
        .cloned()
        .collect();
    if let Some(l) = q.limit {
        let skip = v.len().saturating_sub(l);
        v.drain(..skip);
    }
    Json(v).into_response()
}
