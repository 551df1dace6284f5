//! The OpenAPI 3.1 document, generated from [`super::ROUTES`] and the schemas below.

use axum::Json;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::{BODY_LIMIT, MAX_PAGE, ROUTES};

pub(crate) async fn serve() -> Response {
    Json(document()).into_response()
}

fn schema_ref(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn error_response(desc: &str) -> Value {
    json!({
        "description": desc,
        "content": { "application/json": { "schema": schema_ref("Error") } }
    })
}

/// The document, as served.
pub(crate) fn document() -> Value {
    let mut paths: Map<String, Value> = Map::new();
    for r in ROUTES {
        let mut params: Vec<Value> = Vec::new();
        for seg in r.path.split('/') {
            if let Some(name) = seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                let desc = match name {
                    "service" => "Service name.",
                    "backend" => "Backend IPv4 address.",
                    _ => "",
                };
                params.push(json!({
                    "name": name, "in": "path", "required": true,
                    "description": desc, "schema": { "type": "string" }
                }));
            }
        }
        for (name, ty, desc) in r.query {
            params.push(json!({
                "name": name, "in": "query", "required": false,
                "description": desc, "schema": { "type": ty }
            }));
        }
        let ok = if r.response == "text/event-stream" {
            json!({
                "description": "A stream of `snapshot` events (data: a Snapshot as JSON).",
                "content": { "text/event-stream": { "schema": { "type": "string" } } }
            })
        } else {
            json!({
                "description": "Success.",
                "content": { "application/json": { "schema": schema_ref(r.response) } }
            })
        };
        let mut responses = Map::new();
        let code = if r.op == super::Op::AddBackend {
            "201"
        } else {
            "200"
        };
        responses.insert(code.into(), ok);
        if r.path.contains('{') {
            responses.insert("404".into(), error_response("No such service or backend."));
        }
        if !r.query.is_empty() || r.body.is_some() || r.path.contains('{') {
            responses.insert("400".into(), error_response("Malformed input."));
        }
        let mut op = json!({
            "operationId": r.operation_id,
            "summary": r.summary,
            "parameters": params,
        });
        if let Some(b) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": { "application/json": { "schema": schema_ref(b) } }
            });
            responses.insert(
                "415".into(),
                error_response("The body is not application/json."),
            );
            responses.insert(
                "422".into(),
                error_response("The JSON does not have the expected shape."),
            );
        }
        if r.mutating {
            op["security"] = json!([{ "bearer": [] }]);
            responses.insert(
                "401".into(),
                error_response("Missing or invalid bearer token."),
            );
            responses.insert(
                "403".into(),
                error_response("No API token is configured: changes are disabled."),
            );
            responses.insert(
                "413".into(),
                error_response(&format!("Body larger than {BODY_LIMIT} bytes.")),
            );
        }
        if r.op == super::Op::Reload {
            responses.insert(
                "422".into(),
                json!({
                    "description": "The config file is invalid; nothing was changed.",
                    "content": { "application/json": { "schema": schema_ref("ConfigErrors") } }
                }),
            );
            responses.insert(
                "409".into(),
                error_response("The controller was not started from a config file."),
            );
        }
        if r.op == super::Op::AddBackend {
            responses.insert(
                "409".into(),
                error_response(
                    "A configuration file could not list it: already in the pool, a VIP, \
                     or an address and port another service intercepts.",
                ),
            );
        }
        if r.op == super::Op::RemoveBackend {
            responses.insert(
                "409".into(),
                error_response("Conflicts with the current pool."),
            );
        }
        op["responses"] = Value::Object(responses);
        let entry = paths
            .entry(r.path.to_string())
            .or_insert_with(|| Value::Object(Map::new()));
        entry[r.verb.as_str().to_ascii_lowercase()] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "flowgate controller API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Services, backends, switches, connections and events of a flowgate \
                OpenFlow 1.3 controller, and the changes an operator can make at run time. \
                Every change needs a bearer token; every error is {\"error\": \"...\"}."
        },
        "servers": [{ "url": "/" }],
        "paths": paths,
        "components": {
            "securitySchemes": { "bearer": { "type": "http", "scheme": "bearer" } },
            "schemas": schemas(),
        }
    })
}

fn schemas() -> Value {
    let num_or_null = json!({ "type": ["number", "null"] });
    json!({
        "Error": {
            "type": "object", "required": ["error"],
            "properties": { "error": { "type": "string" } }
        },
        "Ok": {
            "type": "object",
            "properties": { "ok": { "type": "boolean" } },
            "additionalProperties": true
        },
        "OpenApi": { "type": "object", "description": "An OpenAPI 3.1 document." },
        "Status": {
            "type": "object",
            "properties": {
                "version": { "type": "string" },
                "uptime_secs": { "type": "number" },
                "mutations_enabled": { "type": "boolean" },
                "config_file": { "type": ["string", "null"] },
                "services": { "type": "integer" },
                "switches": { "type": "integer" },
                "connections": { "type": "integer" },
                "flow_stats_interval_secs": { "type": "number" }
            }
        },
        "Backend": {
            "type": "object",
            "properties": {
                "address": { "type": "string", "format": "ipv4" },
                "weight": { "type": "integer" },
                "effective_weight": { "type": "number", "minimum": 0 },
                "healthy": { "type": "boolean" },
                "state": { "type": "string", "enum": ["active", "draining"] },
                "draining": { "type": "boolean" },
                "eligible": { "type": "boolean", "description": "Healthy, active, located and not ejected (or its ejection waived while the service is in panic): can take a new connection." },
                "ejected": { "type": "boolean", "description": "Ejected by passive outlier detection ([service.outlier])." },
                "ejected_by": { "type": ["string", "null"], "enum": ["consecutive", "success_rate", "failure_percentage", null], "description": "The detector of the ejection in force: consecutive connections it never answered, a share of answered connections far under the pool's, or a share of unanswered ones over failure_percentage_threshold." },
                "outcomes_last_interval": { "type": "integer", "description": "Connections judged (answered or not) in the outlier detectors' last complete interval (interval_ms)." },
                "success_rate_last_interval": { "type": ["number", "null"], "description": "The share of them answered, in percent; null with none." },
                "connections_answered_total": { "type": "integer", "description": "Connections passive outlier detection judged answered since the controller started." },
                "connections_unanswered_total": { "type": "integer", "description": "Connections it judged unanswered (a silence or a RST, in a row or not; not those excused because a switch on their way was behind)." },
                "located": { "type": "boolean" },
                "mac": { "type": ["string", "null"] },
                "active_connections": { "type": "integer" },
                "connections_total": { "type": "integer" },
                "picks_since_refresh": { "type": "integer" },
                "rps": { "type": "number" },
                "measured_rps": { "type": "number" },
                "reported_rps": num_or_null,
                "response_time_ms": num_or_null,
                "cpu": num_or_null,
                "metrics_fresh": { "type": "boolean" },
                "group_weight": { "type": ["integer", "null"], "description": "Proactive mode: the backend's bucket weight in the service's select group." },
                "gap": { "description": "The pool's overload (gap) control state: mode, gapping, admitted_rate_limit, gap_ms, level, load, offered/admitted rates and totals, refused_total, controller_refused_total (new connections the controller's own gate dropped while it gapped itself, beyond the max-min fair level of its admitted rate), meter_dropped_total (METER_STATS band drops), switches (per switch: dpid, offered_rate, admitted_rate_limit share, meter_rate, meter_dropped_total), handshakes (connections admitted while the controller gapped the service, their rules deferred to the client's ACK: clients_complete, deferred, completed, abandoned) (mode \"off\" when the service has no overload control)." }
            }
        },
        "BackendList": { "type": "array", "items": schema_ref("Backend") },
        "Service": {
            "type": "object",
            "properties": {
                "mode": { "type": "string", "enum": ["reactive", "proactive"] },
                "gap": { "description": "Overload (gap) control of the service's new connections; see the backend field of the same name." },
                "name": { "type": "string" },
                "vip": { "type": ["string", "null"] },
                "virtual_mac": { "type": "string" },
                "port": { "type": "integer" },
                "algorithm": { "type": "string" },
                "threshold_rps": num_or_null,
                "hysteresis": { "type": "number" },
                "health_check": { "type": "string", "enum": ["none", "tcp", "http"] },
                "panic": { "type": "boolean", "description": "Fewer than panic_threshold_percent of the backends are available: their outlier ejections are waived (Envoy's panic threshold)." },
                "outlier_success_rate": {
                    "type": ["object", "null"],
                    "description": "The success-rate detector's last interval, if it had backends enough to judge (success_rate_minimum_hosts, each with success_rate_request_volume outcomes): their mean share of answered connections and the threshold under which one was ejected, in percent, and how many were judged.",
                    "properties": {
                        "mean": { "type": "number" },
                        "threshold": { "type": "number" },
                        "backends": { "type": "integer" }
                    }
                },
                "counters": { "type": "object", "description": "The service's counters, among them ejections and ejections_by (consecutive, success_rate, failure_percentage), and redispatched (connections whose backend stayed silent, given another at their client's retransmitted SYN; each also counted once more in connections_total)." },
                "rps": { "type": "number" },
                "active_connections": { "type": "integer" },
                "backends": schema_ref("BackendList"),
                "left_backends": {
                    "type": "array",
                    "description": "Backends removed from the pool with connections still open to them, which go on to them until they end: each one's address and open_connections. These are the connections the controller tracks: every one of a reactive service (a backend gone from here can be taken down without breaking one), not those a proactive or partitioned service's switch rules place without the controller.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "address": { "type": "string" },
                            "open_connections": { "type": "integer" }
                        }
                    }
                }
            }
        },
        "ServiceList": { "type": "array", "items": schema_ref("Service") },
        "OverloadList": {
            "type": "object",
            "description": "`services`: each service's name and gap state; `controller`: the controller's own overload state (the same gap fields, refused_total = new connections its own gate dropped, plus utilization, queueing_delay_ms, backlog_bytes, outflow_bytes, outflow_delay_ms, channel_rtt_ms, decision_latency_us, handled_rate, max_handled_rate).",
        },
        "Cluster": {
            "type": "object",
            "description": "`role`, `instance`, `store_reachable`, `domains` (master, standbys, load, spill), `global` (active, standbys); a single controller reports role `single`.",
        },
        "AlgorithmChange": {
            "type": "object", "additionalProperties": false,
            "properties": {
                "algorithm": { "type": "string", "description": "Defaults to the current one." },
                "threshold_rps": { "type": "number", "exclusiveMinimum": 0 },
                "hysteresis": { "type": "number", "minimum": 0, "exclusiveMaximum": 1 }
            }
        },
        "NewBackend": {
            "type": "object", "additionalProperties": false, "required": ["address"],
            "properties": {
                "address": { "type": "string", "format": "ipv4" },
                "weight": { "type": "integer", "minimum": 0, "maximum": 1_000_000 },
                "metrics": { "type": "string" },
                "mac": { "type": "string", "description": "The backend's MAC, pinned: another host's claim of its address is refused." },
                "capacity_rps": { "type": "number", "exclusiveMinimum": 0, "description": "Requests per second the backend can serve (DWRS's and MRBS's reference), as a file's capacity_rps." }
            }
        },
        "WeightChange": {
            "type": "object", "additionalProperties": false, "required": ["weight"],
            "properties": { "weight": { "type": "integer", "minimum": 0, "maximum": 1_000_000 } }
        },
        "Switch": {
            "type": "object",
            "properties": {
                "dpid": { "type": "string" },
                "n_tables": { "type": "integer" },
                "ports": { "type": "array", "items": schema_ref("Port") },
                "connected_secs": { "type": "number" },
                "connected_since_unix": { "type": "number" },
                "packet_in": { "type": "integer" },
                "flow_count": { "type": ["integer", "null"] },
                "flow_count_age_secs": num_or_null,
                "flow_count_source": { "type": "string", "enum": ["aggregate-stats"] },
                "last_error": { "type": ["string", "null"] },
                "channel_rtt_ms": num_or_null
            }
        },
        "Port": {
            "type": "object",
            "properties": {
                "port_no": { "type": "integer" },
                "name": { "type": "string" },
                "hw_addr": { "type": "string" },
                "up": { "type": "boolean" },
                "link": { "type": "boolean", "description": "An inter-switch link (found by LLDP)." },
                "hosts": { "type": "integer", "description": "Hosts (source MACs) learned at this port." },
                "addresses": { "type": "integer", "description": "Addresses those hosts claim." },
                "full": { "type": "boolean", "description": "At max_hosts_per_port hosts or addresses: new ones seen here are refused." }
            }
        },
        "SwitchList": { "type": "array", "items": schema_ref("Switch") },
        "ConnectionPage": {
            "type": "object",
            "properties": {
                "total": { "type": "integer" },
                "per_backend": { "type": "array", "items": { "type": "object" } },
                "limit": { "type": "integer", "maximum": MAX_PAGE },
                "items": { "type": "array", "items": { "type": "object" }, "description": "Connections: key, client, client_port, service_addr, service_port, service, backend, backend_in_pool (false once the backend has left the pool: the connection goes on to it until it ends, in no backend's count), created_ms, installed." },
                "next": { "type": ["string", "null"], "description": "The cursor of the next page; null on the last." }
            }
        },
        "Event": {
            "type": "object",
            "properties": {
                "at_ms": { "type": "integer" },
                "kind": { "type": "string" },
                "detail": { "type": "string" }
            }
        },
        "EventList": { "type": "array", "items": schema_ref("Event") },
        "ReloadResult": {
            "type": "object",
            "properties": {
                "ok": { "type": "boolean" },
                "file": { "type": "string" },
                "services": { "type": "integer" },
                "restart_needed": { "type": "array", "items": { "type": "string" } },
                "discarded": {
                    "type": "array",
                    "items": { "type": "string" },
                    "description": "Changes made through the API that the file put back (drains stay)."
                }
            }
        },
        "ConfigErrors": {
            "type": "object",
            "properties": {
                "error": { "type": "string" },
                "errors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": { "path": { "type": "string" }, "message": { "type": "string" } }
                    }
                }
            }
        }
    })
}
