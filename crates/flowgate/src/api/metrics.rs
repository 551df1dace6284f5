//! `/metrics` in the Prometheus text exposition format (version 0.0.4), and the decision
//! latency histogram the switch sessions feed.
//!
//! Names follow Prometheus conventions: a `flowgate_` prefix, base units (seconds),
//! `_total` on counters. Every family is declared (`# HELP`, `# TYPE`) before its samples,
//! and each family's samples are written together. Families of features that do not exist
//! yet (the overload "gap" state) are omitted rather than exported as placeholders.

use std::fmt::Write;
use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};

use super::ApiState;
use crate::runtime::Handle;
use crate::runtime::latency::LATENCY_BOUNDS_NS;

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

/// A float as the exposition format writes it (`+Inf`, `NaN`).
fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        }
    } else {
        format!("{v}")
    }
}

/// A gap-state gauge: its name, help text and how to read it from a service's gap view.
type GapGauge = (
    &'static str,
    &'static str,
    fn(&flowgate_core::overload::GapView) -> Option<f64>,
);

/// A gap-state counter, the same way.
type GapCounter = (
    &'static str,
    &'static str,
    fn(&flowgate_core::overload::GapView) -> u64,
);

pub(crate) fn render(handle: &Handle) -> String {
    let flow_counts = handle
        .flow_counts
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let core = handle.lock();
    let c = &core.controller;
    let mut o = String::with_capacity(8192);

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
            "flowgate_packet_in_bad_port_total",
            "PACKET_INs ignored for an in_port no frame arrives on, and LLDP probes naming a port their switch does not have.",
            counters.packet_in_bad_port,
        ),
        (
            "flowgate_lldp_forged_total",
            "LLDP probes naming one of this controller's switches without its tag: forged (or another controller's), no link made.",
            counters.lldp_forged,
        ),
        (
            "flowgate_ports_refused_total",
            "Ports a switch reported beyond the 4096 a switch may have: not recorded.",
            counters.ports_refused,
        ),
        (
            "flowgate_openflow_handshakes_refused_total",
            "Connections to the OpenFlow listener closed at once because 256 were already in their handshake.",
            handle
                .handshakes_refused
                .load(std::sync::atomic::Ordering::Relaxed),
        ),
        (
            "flowgate_openflow_undecodable_total",
            "Messages from switches that did not decode, each answered with an OFPT_ERROR unless it was one; the session goes on, unless in its handshake or past 64 at once or one a second on average.",
            handle
                .openflow_undecodable
                .load(std::sync::atomic::Ordering::Relaxed),
        ),
        (
            "flowgate_connections_rerouted_total",
            "Open connections given rules along new paths because their backend or client moved, or a link of their path changed.",
            counters.connections_rerouted,
        ),
        (
            "flowgate_switch_lag_spells_total",
            "Spells of a switch's control channel round trip over outlier_max_channel_rtt_ms, all switches.",
            counters.lag_spells,
        ),
        (
            "flowgate_reroute_checked_total",
            "Open connections looked at by the walks that re-route them (on a host's move or a change of the links).",
            counters.reroute_checked,
        ),
        (
            "flowgate_hosts_refused_total",
            "Source MACs not learned because the host table was full (max_hosts).",
            counters.hosts_refused,
        ),
        (
            "flowgate_hosts_refused_port_full_total",
            "Source MACs not learned because their switch port had max_hosts_per_port hosts already.",
            counters.hosts_refused_port_full,
        ),
        (
            "flowgate_addresses_refused_total",
            "Addresses claimed by ARP (or a backend's packets) not learned because the address table was full (max_hosts).",
            counters.addresses_refused,
        ),
        (
            "flowgate_addresses_refused_port_full_total",
            "Addresses claimed by ARP (or a backend's packets) not learned because their host's switch port had max_hosts_per_port addresses already.",
            counters.addresses_refused_port_full,
        ),
        (
            "flowgate_address_claims_refused_total",
            "Claims of a backend address pinned to another MAC (the backend's mac), by ARP or as an IPv4 source: refused. A rising count is a host spoofing the address, or a pin that names the wrong MAC.",
            counters.address_claims_refused,
        ),
        (
            "flowgate_host_probes_total",
            "ARP probes sent to hosts with an address that had sent nothing up for host_timeout_secs.",
            counters.host_probes_sent,
        ),
        (
            "flowgate_hosts_aged_total",
            "Hosts forgotten (their L2 rules deleted) because they were silent for host_timeout_secs and did not answer three ARP probes.",
            counters.hosts_aged,
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
        (
            "flowgate_connections_reopened_total",
            "New connections on the 4-tuple of one still in the table (a SYN with a new ISN): decided and counted as new.",
            counters.connections_reopened,
        ),
        (
            "flowgate_packet_in_dropped_total",
            "PACKET_INs dropped beyond a switch session's packet_in_rate budget.",
            handle.packet_in_dropped.load(Ordering::Relaxed),
        ),
        (
            "flowgate_packet_in_dropped_behind_total",
            "PACKET_INs read and dropped unhandled while their switch was behind (more than 4 MiB of messages queued for it).",
            handle.packet_in_dropped_behind.load(Ordering::Relaxed),
        ),
    ] {
        family(&mut o, name, "counter", help);
        let _ = writeln!(o, "{name} {v}");
    }
    if let Some(spin) = &handle.park_spin {
        let name = "flowgate_worker_park_polls_total";
        family(
            &mut o,
            name,
            "counter",
            "Polls of the switches' sockets before a worker slept ([runtime] spin_before_park_us), by how they ended: bytes arrived (readable), or the budget ran out and the worker slept (spent).",
        );
        let (readable, spent) = spin.ends();
        let _ = writeln!(o, "{name}{{end=\"readable\"}} {readable}");
        let _ = writeln!(o, "{name}{{end=\"spent\"}} {spent}");
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
        "flowgate_uptime_seconds",
        "gauge",
        "Seconds since the controller started.",
    );
    let _ = writeln!(
        o,
        "flowgate_uptime_seconds {}",
        num(handle.started.elapsed().as_secs_f64())
    );

    // Decision latency: the core's handling of one PACKET_IN, measured by the sessions.
    let (cum, sum) = handle.decision_latency.snapshot();
    let name = "flowgate_decision_latency_seconds";
    family(
        &mut o,
        name,
        "histogram",
        "Time the core takes to handle one PACKET_IN (decision and rules).",
    );
    for (i, b) in LATENCY_BOUNDS_NS.iter().enumerate() {
        let _ = writeln!(
            o,
            "{name}_bucket{{le=\"{}\"}} {}",
            num(*b as f64 / 1e9),
            cum[i]
        );
    }
    let total = cum[LATENCY_BOUNDS_NS.len()];
    let _ = writeln!(o, "{name}_bucket{{le=\"+Inf\"}} {total}");
    let _ = writeln!(o, "{name}_sum {}", num(sum));
    let _ = writeln!(o, "{name}_count {total}");

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
    family(
        &mut o,
        "flowgate_switch_flows",
        "gauge",
        "Flow entries in the switch (all tables), from its last aggregate stats reply.",
    );
    for d in c.switch_ids() {
        if let Some(f) = flow_counts.get(&d) {
            let _ = writeln!(o, "flowgate_switch_flows{{dpid=\"{d:016x}\"}} {}", f.flows);
        }
    }
    family(
        &mut o,
        "flowgate_switch_channel_rtt_seconds",
        "gauge",
        "The control channel's round trip (an ECHO's wait for its reply), as last measured; only switches probed (outlier_max_channel_rtt_ms, or the adaptive overload control).",
    );
    for d in c.switch_ids() {
        if let Some(rtt) = c.switch_view(d).and_then(|s| s.channel_rtt) {
            let _ = writeln!(
                o,
                "flowgate_switch_channel_rtt_seconds{{dpid=\"{d:016x}\"}} {}",
                num(rtt.as_secs_f64())
            );
        }
    }
    family(
        &mut o,
        "flowgate_outlier_silences_excused_total",
        "counter",
        "Connections whose backend never answered, not counted against it by passive outlier detection: it answered a connection decided after them (reason answered_later), or a switch on their way was behind meanwhile, its control channel round trip over outlier_max_channel_rtt_ms (switch_behind).",
    );
    for (reason, n) in [
        ("answered_later", counters.silences_excused_answered),
        ("switch_behind", counters.silences_excused_lag),
    ] {
        let _ = writeln!(
            o,
            "flowgate_outlier_silences_excused_total{{reason=\"{reason}\"}} {n}"
        );
    }
    family(
        &mut o,
        "flowgate_outlier_silences_at_syn_retry_total",
        "counter",
        &format!(
            "Connections found unanswered when their client sent its SYN again {} ms or more after the decision (no SYN-ACK reached it), rather than when their rules idled out; then judged, or excused, as any silence.",
            flowgate_core::controller::SILENT_AFTER_MS
        ),
    );
    let _ = writeln!(
        o,
        "flowgate_outlier_silences_at_syn_retry_total {}",
        counters.silences_at_syn_retry
    );
    family(
        &mut o,
        "flowgate_outlier_outcomes_unjudged_total",
        "counter",
        "Connections whose outcome rule ended without a verdict: the connection was no longer known and its rule carried under two packets (reason connection_unknown), its rule carried nothing and lived under a second (too_short), or it was decided before its backend's last ejection started, which answered for it (before_ejection).",
    );
    for (reason, n) in [
        ("connection_unknown", counters.outcomes_unjudged_unknown),
        ("too_short", counters.outcomes_unjudged_short),
        (
            "before_ejection",
            counters.outcomes_unjudged_before_ejection,
        ),
    ] {
        let _ = writeln!(
            o,
            "flowgate_outlier_outcomes_unjudged_total{{reason=\"{reason}\"}} {n}"
        );
    }
    family(&mut o, "flowgate_switches", "gauge", "Connected switches.");
    let _ = writeln!(o, "flowgate_switches {}", c.switch_ids().count());
    family(
        &mut o,
        "flowgate_hosts",
        "gauge",
        "Hosts learned (at most max_hosts).",
    );
    let _ = writeln!(o, "flowgate_hosts {}", c.topology().host_count());
    family(
        &mut o,
        "flowgate_syns_held",
        "gauge",
        "SYNs held while a switch is in its reconnect grace, until a backend and a path can take them.",
    );
    let _ = writeln!(o, "flowgate_syns_held {}", c.syns_held());

    let per_service: [(&str, &str, &str); 13] = [
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
            "flowgate_service_held_settling_total",
            "counter",
            "SYNs no backend could take yet, held (answered once one can, or refused when the grace ends) instead of refused while a switch was in its reconnect grace.",
        ),
        (
            "flowgate_service_held_answered_total",
            "counter",
            "Held SYNs given a backend once one could take them (their clients did not have to send them again).",
        ),
        (
            "flowgate_service_redispatched_total",
            "counter",
            "Connections whose backend stayed silent, given another backend at their client's retransmitted SYN (each also counted once more in flowgate_service_connections_total).",
        ),
        (
            "flowgate_service_unknown_flow_packets_total",
            "counter",
            "Non-SYN packets of unknown connections.",
        ),
        (
            "flowgate_service_handshakes_deferred_total",
            "counter",
            "Connections admitted while the controller gapped, their rules deferred to the client's ACK.",
        ),
        (
            "flowgate_service_handshakes_completed_total",
            "counter",
            "Deferred connections whose client's ACK installed the rules.",
        ),
        (
            "flowgate_service_handshakes_abandoned_total",
            "counter",
            "Deferred connections whose client never completed (timed out or reset).",
        ),
        (
            "flowgate_service_ejections_total",
            "counter",
            "Backends ejected by passive outlier detection, by any detector (flowgate_service_ejections_by_detector_total has each).",
        ),
        (
            "flowgate_service_panics_total",
            "counter",
            "Times too few backends were available and the service's ejections were waived (panic threshold).",
        ),
        (
            "flowgate_service_panic",
            "gauge",
            "1 while the service is in panic: its outlier ejections are waived.",
        ),
    ];
    for (i, (name, kind, help)) in per_service.iter().enumerate() {
        family(&mut o, name, kind, help);
        for s in c.services() {
            let v = match i {
                0 => s.counters.connections_total,
                1 => s.counters.no_optimal_server,
                2 => s.counters.refused_no_backend,
                3 => s.counters.held_settling,
                4 => s.counters.held_answered,
                5 => s.counters.redispatched,
                6 => s.counters.unknown_flow_packets,
                7 => s.handshakes.deferred,
                8 => s.handshakes.completed,
                9 => s.handshakes.abandoned,
                10 => s.counters.ejections,
                11 => s.counters.panics,
                _ => u64::from(s.in_panic()),
            };
            let _ = writeln!(o, "{name}{{service=\"{}\"}} {v}", esc(&s.cfg.name));
        }
    }

    family(
        &mut o,
        "flowgate_service_ejections_by_detector_total",
        "counter",
        "Backends ejected by passive outlier detection, by detector: consecutive (connections in a row it never answered), success_rate (its share of answered connections under the pool's mean by success_rate_stdev_factor deviations), failure_percentage (its share of unanswered ones at failure_percentage_threshold or over).",
    );
    for s in c.services() {
        for by in flowgate_core::health::Detector::ALL {
            let _ = writeln!(
                o,
                "flowgate_service_ejections_by_detector_total{{service=\"{}\",detector=\"{}\"}} {}",
                esc(&s.cfg.name),
                by.as_str(),
                s.counters.ejections_by.get(by)
            );
        }
    }

    family(
        &mut o,
        "flowgate_service_isslm_moves_total",
        "counter",
        "ISSLM's moves away from an over-threshold requested server, by the search of its chain that found the target (request_load, connections, response_time).",
    );
    for s in c.services() {
        for search in flowgate_core::balance::Search::ALL {
            let _ = writeln!(
                o,
                "flowgate_service_isslm_moves_total{{service=\"{}\",search=\"{}\"}} {}",
                esc(&s.cfg.name),
                search.name(),
                s.counters.isslm_moves.get(search)
            );
        }
    }

    let per_backend: [(&str, &str, &str); 8] = [
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
            "New connections per second (1 s average), or the backend's own report.",
        ),
        (
            "flowgate_backend_response_time_seconds",
            "gauge",
            "Response time (EWMA of probes or the backend's metrics).",
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
        (
            "flowgate_backend_weight",
            "gauge",
            "Configured weight (before slow start).",
        ),
        (
            "flowgate_backend_ejected",
            "gauge",
            "1 while passive outlier detection has the backend ejected (it still takes connections while its service is in panic).",
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
                    5 => f64::from(u8::from(
                        b.admin == flowgate_core::service::AdminState::Draining,
                    )),
                    6 => f64::from(b.weight),
                    _ => f64::from(u8::from(b.ejected)),
                };
                let _ = writeln!(
                    o,
                    "{name}{{service=\"{}\",backend=\"{}\"}} {}",
                    esc(&s.cfg.name),
                    b.address,
                    num(v)
                );
            }
        }
    }
    family(
        &mut o,
        "flowgate_backend_connection_outcomes_total",
        "counter",
        "Connections passive outlier detection judged, by outcome: answered (packets came back), unanswered (a silence or a RST, in a row or not; not those excused because a switch on their way was behind).",
    );
    for s in c.services() {
        for b in &s.backends {
            for (outcome, n) in [
                ("answered", b.outcomes_answered),
                ("unanswered", b.outcomes_unanswered),
            ] {
                let _ = writeln!(
                    o,
                    "flowgate_backend_connection_outcomes_total{{service=\"{}\",backend=\"{}\",outcome=\"{outcome}\"}} {n}",
                    esc(&s.cfg.name),
                    b.address,
                );
            }
        }
    }
    family(
        &mut o,
        "flowgate_left_backend_open_connections",
        "gauge",
        "Connections the controller tracks still open to a backend removed from the pool (they go on to it until they end; for a reactive service, at 0 it can be taken down).",
    );
    for s in c.services() {
        for l in s.left_backends() {
            let _ = writeln!(
                o,
                "flowgate_left_backend_open_connections{{service=\"{}\",backend=\"{}\"}} {}",
                esc(&s.cfg.name),
                l.address,
                l.open_connections
            );
        }
    }
    overload_metrics(&mut o, c);
    // The distributed mode's figures (nothing in single-controller mode).
    o.push_str(&handle.cluster.metrics_text());
    o
}

/// Overload control: each service's gap and the controller's own.
fn overload_metrics(o: &mut String, c: &flowgate_core::Controller) {
    let views: Vec<(String, flowgate_core::overload::GapView)> = c
        .services()
        .iter()
        .enumerate()
        .filter_map(|(i, s)| c.gap_view(i).map(|v| (esc(&s.cfg.name), v)))
        .collect();
    family(
        o,
        "flowgate_service_overload_mode",
        "gauge",
        "Overload control mode of the service (1 for the mode in the label).",
    );
    for (name, v) in &views {
        let _ = writeln!(
            o,
            "flowgate_service_overload_mode{{service=\"{name}\",mode=\"{}\"}} 1",
            v.mode
        );
    }
    let gauges: [GapGauge; 4] = [
        (
            "flowgate_service_overload_admitted_rate_limit",
            "Admitted new-connection rate the gap amounts to (per second); absent when no gap.",
            |v| v.admitted_rate_limit,
        ),
        (
            "flowgate_service_overload_gap_seconds",
            "Current gap between two admitted new connections; absent when no gap.",
            |v| v.gap_ms.map(|g| g / 1000.0),
        ),
        (
            "flowgate_service_overload_load",
            "Measured load of the pool against its target (1 = at target).",
            |v| Some(v.load),
        ),
        (
            "flowgate_service_overload_admitted_per_second",
            "Measured admitted new-connection rate.",
            |v| Some(v.admitted_rate),
        ),
    ];
    for (metric, help, f) in gauges {
        family(o, metric, "gauge", help);
        for (name, v) in &views {
            if let Some(x) = f(v) {
                let _ = writeln!(o, "{metric}{{service=\"{name}\"}} {x}");
            }
        }
    }
    let counters: [GapCounter; 3] = [
        (
            "flowgate_service_overload_refused_total",
            "New connections refused by the gap (RST from the controller, or dropped).",
            |v| v.refused_total,
        ),
        (
            "flowgate_service_controller_refused_total",
            "New connections of the service that the controller's own gate dropped while it gapped itself (beyond the max-min fair level of its admitted rate).",
            |v| v.controller_refused_total.unwrap_or(0),
        ),
        (
            "flowgate_service_overload_meter_dropped_total",
            "New connections the switches' meters dropped for the service (METER_STATS band counts).",
            |v| v.meter_dropped_total,
        ),
    ];
    for (metric, help, f) in counters {
        family(o, metric, "counter", help);
        for (name, v) in &views {
            let _ = writeln!(o, "{metric}{{service=\"{name}\"}} {}", f(v));
        }
    }
    let cv = c.controller_gap_view();
    for (metric, kind, help, x) in [
        (
            "flowgate_controller_overload_refused_total",
            "counter",
            "New connections the controller's own gate dropped while it gapped itself.",
            cv.gap.refused_total as f64,
        ),
        (
            "flowgate_controller_overload_meter_dropped_total",
            "counter",
            "PACKET_INs the switches' meters dropped (METER_STATS band counts, all meters).",
            cv.gap.meter_dropped_total as f64,
        ),
        (
            "flowgate_controller_overload_load",
            "gauge",
            "The controller's measured load against its targets (1 = at target).",
            cv.gap.load,
        ),
        (
            "flowgate_controller_outflow_bytes",
            "gauge",
            "Largest queue of bytes for one switch (written, not yet taken) in the last window.",
            cv.outflow_bytes as f64,
        ),
        (
            "flowgate_controller_outflow_delay_seconds",
            "gauge",
            "Standing delay of the queue toward the switches in the last window (the least age of its oldest unread bytes).",
            cv.outflow_delay_ms / 1000.0,
        ),
        (
            "flowgate_controller_channel_rtt_seconds",
            "gauge",
            "Standing round trip of the control channel in the last window (the least ECHO round trip of the slowest switch; 0 while overload control is off).",
            cv.channel_rtt_ms / 1000.0,
        ),
        (
            "flowgate_controller_overload_gapping",
            "gauge",
            "1 while the controller meters its own PACKET_INs.",
            f64::from(u8::from(cv.gap.gapping)),
        ),
        (
            "flowgate_controller_overload_admitted_rate_limit",
            "gauge",
            "Admitted PACKET_IN rate (all switches; 0 = no limit).",
            cv.gap.admitted_rate_limit.unwrap_or(0.0),
        ),
        (
            "flowgate_controller_packet_in_utilization",
            "gauge",
            "Fraction of the last window spent on PACKET_INs.",
            cv.utilization,
        ),
        (
            "flowgate_controller_packet_in_queueing_seconds",
            "gauge",
            "Longest PACKET_IN queueing delay in the last window.",
            cv.queueing_delay_ms / 1000.0,
        ),
        (
            "flowgate_controller_packet_in_standing_queue_seconds",
            "gauge",
            "Least PACKET_IN queueing delay of the last window's batches (the standing queue).",
            cv.standing_queue_ms / 1000.0,
        ),
        (
            "flowgate_controller_packet_in_rate",
            "gauge",
            "PACKET_INs handled per second (last window).",
            cv.handled_rate,
        ),
        (
            "flowgate_controller_packet_in_max_rate",
            "gauge",
            "Highest PACKET_IN rate handled while saturated.",
            cv.max_handled_rate,
        ),
    ] {
        family(o, metric, kind, help);
        let _ = writeln!(o, "{metric} {x}");
    }
}

pub(crate) async fn metrics(State(st): State<ApiState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        render(&st.handle),
    )
        .into_response()
}
