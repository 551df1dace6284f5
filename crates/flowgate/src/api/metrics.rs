//! `/metrics` in the Prometheus text exposition format (version 0.0.4).
//! Names follow Prometheus conventions: a `flowgate_` prefix, base units, `_total` on
//! counters.

use std::fmt::Write;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use crate::runtime::Handle;

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// Escape a label value (`\`, `"` and newlines, per the exposition format).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub(crate) fn render(handle: &Handle) -> String {
    let core = handle.lock();
    let c = &core.controller;
    let mut o = String::with_capacity(4096);

    let counters = c.counters();
    for (name, help, v) in [
        (
            "flowgate_packet_in_total",
            "PACKET_IN messages handled.",
            counters.packet_in,
        ),
        (
            "flowgate_packet_in_unparsable_total",
            "PACKET_INs whose frame could not be parsed.",
            counters.packet_in_unparsable,
        ),
        (
            "flowgate_flow_removed_total",
            "FLOW_REMOVED messages received.",
            counters.flow_removed,
        ),
        (
            "flowgate_openflow_errors_total",
            "OpenFlow ERROR messages received from switches.",
            counters.of_errors,
        ),
        (
            "flowgate_resets_sent_total",
            "TCP RSTs sent to clients.",
            counters.resets_sent,
        ),
        (
            "flowgate_arp_replies_sent_total",
            "ARP replies sent for virtual IPs.",
            counters.arp_replies_sent,
        ),
        (
            "flowgate_connections_rebuilt_total",
            "Connections recovered from switch flow tables.",
            counters.connections_rebuilt,
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
    family(
        &mut o,
        "flowgate_connections",
        "gauge",
        "Connections tracked by the controller.",
    );
    let _ = writeln!(o, "flowgate_connections {}", c.connections().len());

    family(
        &mut o,
        "flowgate_switch_packet_in_total",
        "counter",
        "PACKET_IN messages per switch.",
    );
    for d in c.switch_ids() {
        if let Some(s) = c.switch_view(d) {
            let _ = writeln!(
                o,
                "flowgate_switch_packet_in_total{{dpid=\"{d:016x}\"}} {}",
                s.packet_in
            );
        }
    }
    family(&mut o, "flowgate_switches", "gauge", "Connected switches.");
    let _ = writeln!(o, "flowgate_switches {}", c.switch_ids().count());

    let per_service: [(&str, &str, &str); 4] = [
        (
            "flowgate_service_connections_total",
            "counter",
            "New connections given a backend.",
        ),
        (
            "flowgate_service_no_optimal_server_total",
            "counter",
            "ISSLM searches that found no optimal server.",
        ),
        (
            "flowgate_service_refused_total",
            "counter",
            "New connections refused: no backend could take them.",
        ),
        (
            "flowgate_service_unknown_flow_packets_total",
            "counter",
            "Non-SYN packets of unknown connections.",
        ),
    ];
    for (i, (name, kind, help)) in per_service.iter().enumerate() {
        family(&mut o, name, kind, help);
        for s in c.services() {
            let v = match i {
                0 => s.counters.connections_total,
                1 => s.counters.no_optimal_server,
                2 => s.counters.refused_no_backend,
                _ => s.counters.unknown_flow_packets,
            };
            let _ = writeln!(o, "{name}{{service=\"{}\"}} {v}", esc(&s.cfg.name));
        }
    }

    let per_backend: [(&str, &str, &str); 6] = [
        (
            "flowgate_backend_active_connections",
            "gauge",
            "Connections whose rules exist.",
        ),
        (
            "flowgate_backend_connections_total",
            "counter",
            "Connections given to the backend.",
        ),
        (
            "flowgate_backend_requests_per_second",
            "gauge",
            "New connections per second (1 s average).",
        ),
        (
            "flowgate_backend_response_time_seconds",
            "gauge",
            "Average probe response time.",
        ),
        (
            "flowgate_backend_healthy",
            "gauge",
            "1 when active health checks pass.",
        ),
        (
            "flowgate_backend_draining",
            "gauge",
            "1 when the backend takes no new connections.",
        ),
    ];
    for (i, (name, kind, help)) in per_backend.iter().enumerate() {
        family(&mut o, name, kind, help);
        for s in c.services() {
            for b in &s.backends {
                let v: f64 = match i {
                    0 => f64::from(b.active_connections),
                    1 => b.connections_total as f64,
                    2 => b.reported_rps.unwrap_or(b.rps),
                    3 => match b.response_time_ms {
                        Some(ms) => ms / 1000.0,
                        None => continue,
                    },
                    4 => f64::from(u8::from(b.healthy)),
                    _ => f64::from(u8::from(
                        b.admin == flowgate_core::service::AdminState::Draining,
                    )),
                };
                let _ = writeln!(
                    o,
                    "{name}{{service=\"{}\",backend=\"{}\"}} {v}",
                    esc(&s.cfg.name),
                    b.address
                );
            }
        }
    }
    o
}

pub(crate) async fn metrics(State(handle): State<Handle>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        render(&handle),
    )
        .into_response()
}
