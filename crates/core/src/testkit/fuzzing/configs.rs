//! The controller target's configurations.

/// The configurations the target picks from (its first byte): between them, every
/// balancing mode, the overload gates, ISSLM, and tight host limits. (Also seeds for the
/// `config` target's mutations.)
pub const CONFIGS: [&str; 4] = [
    // Reactive: a VIP service under ISSLM with its own gate, a VIP-less (addressed
    // backends) service under least connections, the controller's own gate, and host
    // limits small enough for a few forged MACs to reach them.
    r#"
[controller]
max_hosts = 12
max_hosts_per_port = 4
host_timeout_secs = 5
reconnect_grace_ms = 500
[controller.overload]
mode = "adaptive"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "isslm"
threshold_rps = 5
[service.health]
kind = "none"
[service.overload]
mode = "adaptive"
capacity_rps = 20
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
weight = 3
[[service.backend]]
address = "10.0.0.4"
[[service]]
name = "direct"
port = 8080
algorithm = "least-connections"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.5"
[[service.backend]]
address = "10.0.0.6"
"#,
    // Partitioned and proactive services side by side.
    r#"
[controller]
reconnect_grace_ms = 500
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "round-robin"
mode = "partitioned"
partition_bits = 3
transition_secs = 2
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service]]
name = "pro"
vip = "10.0.0.101"
port = 80
algorithm = "least-connections"
mode = "proactive"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.4"
[[service.backend]]
address = "10.0.0.5"
"#,
    // Reactive with the unknown-flow policy "drop", the response-time balancer, and the
    // seed's "none" behind a VIP.
    r#"
[controller]
unknown_flow = "drop"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "srt"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service]]
name = "one"
vip = "10.0.0.101"
port = 80
algorithm = "none"
none_target = "10.0.0.4"
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.4"
"#,
    // A domain controller of the distributed mode: its uplink toward the other domains on
    // switch 3, and backends of other domains placed behind it (as the global controller's
    // spill decisions, read from etcd, place them).
    r#"
[cluster]
role = "domain"
name = "fuzz"
instance = "d1a"
domain = "d1"
dpids = ["0000000000000001", "0000000000000002", "0000000000000003"]
uplink = "0000000000000003:4"
etcd = ["memory:"]
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "weighted-round-robin"
threshold_rps = 10
[service.health]
kind = "none"
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
[[service.backend]]
address = "10.0.0.20"
weight = 0
[[service.backend]]
address = "10.0.0.21"
weight = 0
"#,
];
