//! Configuration: TOML read strictly and validated into domain types.
//!
//! Every problem is reported, each with its path (`service[1].backend[0].address`), and a
//! config with any problem yields no [`Config`] at all, so nothing starts half-configured.
//! Defaults are named `DEFAULT_*`, each with the reason for its value.

pub(crate) mod reader;

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use flowgate_packet::MacAddr;

use crate::balance::{AlgorithmKind, AlgorithmParams};
use reader::Obj;

/// The OpenFlow port IANA assigned (6653); OVS's `tcp:IP` controllers default to it.
pub const DEFAULT_OPENFLOW_LISTEN: &str = "127.0.0.1:6653";
/// Loopback: the API can change the network, so it is not exposed unless asked.
pub const DEFAULT_API_LISTEN: &str = "127.0.0.1:8080";
/// Environment variable holding the API token when the file names none.
pub const DEFAULT_TOKEN_ENV: &str = "FLOWGATE_API_TOKEN";
/// OVS's own inactivity probe is 5 s; echo at that pace.
pub const DEFAULT_ECHO_INTERVAL_MS: u64 = 5_000;
/// Three missed echoes: a switch that says nothing for 15 s is dead.
pub const DEFAULT_ECHO_TIMEOUT_MS: u64 = 15_000;
/// Per-switch PACKET_IN budget (per second): far above what OVS's userspace datapath
/// sends, well below what would let one switch monopolise the core.
pub const DEFAULT_PACKET_IN_RATE: u32 = 100_000;
/// The seed balancer's idle timeout for per-connection rules (seconds).
pub const DEFAULT_IDLE_TIMEOUT_SECS: u64 = 30;
/// A closed connection's rules linger this long after its FIN/RST, then the switch removes
/// them and reports it: active connections are counted from the switch within about a
/// second of a connection's end, not 30 s of idle timeout later.
pub const DEFAULT_FIN_TIMEOUT_SECS: u64 = 1;
/// The source paper refreshes server load about every 10 ms.
pub const DEFAULT_REFRESH_INTERVAL_MS: u64 = 10;
/// Link discovery probe period; links unseen for three periods are dropped.
pub const DEFAULT_LLDP_INTERVAL_MS: u64 = 1_000;
/// After a switch connects, how long its earlier L2, proactive and partition rules are kept
/// beside the new ones: a restarted controller relearns hosts and locates backends (ARP
/// probes each second) in about one second on the lab's networks.
pub const DEFAULT_RECONNECT_GRACE_MS: u64 = 3_000;
/// The most hosts learned: each costs an L2 rule on every switch.
pub const DEFAULT_MAX_HOSTS: usize = 65_536;
/// Hosts learned at one switch port at most, by default: a sixteenth of the table, far
/// more than a server, a router or a hypervisor's trunk has behind one port.
pub const DEFAULT_MAX_HOSTS_PER_PORT: u32 = 4096;
/// A host silent this long is asked by ARP whether it is still there: Linux bridges and
/// Faucet age MAC entries after 300 s too.
pub const DEFAULT_HOST_TIMEOUT_SECS: u64 = 300;
/// HAProxy's default check interval is 2 s; we check a little faster.
pub const DEFAULT_HEALTH_INTERVAL_MS: u64 = 1_000;
pub const DEFAULT_HEALTH_TIMEOUT_MS: u64 = 500;
/// Backends' own metrics are scraped once a second: a Prometheus endpoint is not built to
/// be polled at the 10 ms load refresh, and request-rate counters need a window anyway.
pub const DEFAULT_METRICS_INTERVAL_MS: u64 = 1_000;
/// `[controller] seed` when unset: "flowgate" in ASCII.
pub const DEFAULT_SEED: u64 = 0x666c_6f77_6761_7465;
/// HAProxy's defaults: two successes to rise, three failures to fall.
pub const DEFAULT_HEALTH_RISE: u32 = 2;
pub const DEFAULT_HEALTH_FALL: u32 = 3;
/// Envoy's default panic threshold, in percent of a pool (anchors §2.1).
pub const DEFAULT_PANIC_THRESHOLD_PERCENT: u32 = 50;
/// A switch whose control channel's round trip passed this is not trusted to say that a
/// backend did not answer: far above a healthy channel's (under a millisecond on the lab's
/// Open vSwitch), a quarter of the second after which a client sends its SYN again.
pub const DEFAULT_OUTLIER_MAX_CHANNEL_RTT_MS: u64 = 250;

/// One configuration problem, with the path of the key it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

impl ConfigError {
    pub(crate) fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError {
            path: path.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in one config, in document order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} configuration error(s):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub openflow: OpenflowConfig,
    pub api: ApiConfig,
    pub controller: ControllerConfig,
    pub services: Vec<ServiceConfig>,
    /// `[cluster]`: single controller (the default), or one instance of a domain or
    /// global controller group (docs/distributed.md).
    pub cluster: ClusterConfig,
    /// `[runtime]`: the process's threads.
    pub runtime: RuntimeConfig,
}

/// `[runtime]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RuntimeConfig {
    /// Threads that run the switch sessions, the API and the probes (`worker_threads`;
    /// default: one per CPU the process may use). The controller's decisions run under
    /// one lock whatever the count, so more threads parallelise only reading, framing,
    /// writing and the API; on cores shared with other busy work (Open vSwitch, a
    /// benchmark's switches) fewer threads leave that work more of them.
    pub worker_threads: Option<usize>,
    /// How long a worker that has run out of tasks polls the switches' sockets before it
    /// sleeps (`spin_before_park_us`, at most 10,000; default 0, off). Polling spares the
    /// next PACKET_IN the wake-up of a sleeping CPU, most of a setup's latency under a
    /// steady load, on a virtual machine above all; it costs up to that much CPU each time
    /// the worker runs out of work. For a controller with CPUs of its own.
    pub spin_before_park: Duration,
}

/// A controller's place in a cluster.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClusterRole {
    /// One controller, no coordination store: the default.
    Single,
    /// One instance of a domain's controllers: the elected one is master of the domain's
    /// switches, the others hold SLAVE sessions.
    Domain,
    /// One instance of the global controllers (one active, the others standby): it sets
    /// where overloaded domains spill.
    Global,
}

/// The lease TTL of a cluster member: a dead master is replaced within about this.
pub const DEFAULT_CLUSTER_LEASE_TTL_MS: u64 = 2_000;
/// How long a call to the coordination store may take before it counts as unreachable.
pub const DEFAULT_CLUSTER_STORE_TIMEOUT_MS: u64 = 1_000;
/// How often a domain master publishes its summary and a global controller decides.
pub const DEFAULT_CLUSTER_SUMMARY_INTERVAL_MS: u64 = 500;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ClusterConfig {
    pub role: ClusterRole,
    /// The cluster's name: the root of its keys in the store.
    pub name: String,
    /// This instance's name, unique in the cluster.
    pub instance: String,
    /// For `role = "domain"`: the domain's id and its switches' datapath ids.
    pub domain: Option<String>,
    pub dpids: Vec<u64>,
    /// For `role = "domain"`: the switch port (`dpid`, `port`) that leads to the other
    /// domains. Backends of other domains are reached through it when the domain spills.
    pub uplink: Option<(u64, u32)>,
    /// etcd endpoints (`http://127.0.0.1:2379`).
    pub etcd: Vec<String>,
    pub lease_ttl: Duration,
    pub store_timeout: Duration,
    pub summary_interval: Duration,
    /// A domain's services spill when every local backend's load is at or above this
    /// fraction of its capacity (`threshold_rps`), or none is healthy.
    pub spill_threshold: f64,
    /// A spilling service stops spilling once its load stayed below this fraction of its
    /// capacity for `spill_hold` (hysteresis: default 0.8 × `spill_threshold`).
    pub spill_exit_threshold: f64,
    /// How long the load must stay below the exit threshold before a spill ends, and how
    /// long a small change of a spill (under `spill_step`) waits.
    pub spill_hold: Duration,
    /// A spill's fraction or weights change at once only by at least this much.
    pub spill_step: f64,
}

/// The spill hysteresis' default hold time (docs/distributed.md).
pub const DEFAULT_CLUSTER_SPILL_HOLD_MS: u64 = 2_000;
/// Default exit threshold, as a share of the entry one.
pub const DEFAULT_CLUSTER_SPILL_EXIT_RATIO: f64 = 0.8;

impl ClusterConfig {
    pub fn single() -> ClusterConfig {
        ClusterConfig {
            role: ClusterRole::Single,
            name: "flowgate".into(),
            instance: String::new(),
            domain: None,
            dpids: Vec::new(),
            uplink: None,
            etcd: Vec::new(),
            lease_ttl: Duration::from_millis(DEFAULT_CLUSTER_LEASE_TTL_MS),
            store_timeout: Duration::from_millis(DEFAULT_CLUSTER_STORE_TIMEOUT_MS),
            summary_interval: Duration::from_millis(DEFAULT_CLUSTER_SUMMARY_INTERVAL_MS),
            spill_threshold: 1.0,
            spill_exit_threshold: DEFAULT_CLUSTER_SPILL_EXIT_RATIO,
            spill_hold: Duration::from_millis(DEFAULT_CLUSTER_SPILL_HOLD_MS),
            spill_step: 0.05,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct OpenflowConfig {
    pub listen: SocketAddr,
    /// A silent switch is sent an ECHO_REQUEST after this long.
    pub echo_interval: Duration,
    /// A switch silent this long, or that leaves an ECHO_REQUEST (the keep-alive's, or a
    /// round-trip probe's) unanswered this long, is closed as dead.
    pub echo_timeout: Duration,
    /// TLS on the OpenFlow channel, as OVS's `ssl:` controller targets use.
    pub tls: Option<TlsConfig>,
    /// PACKET_INs handled per second from one switch; beyond it they are dropped and
    /// counted, so one switch cannot starve the others.
    pub packet_in_rate: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, switches must present a certificate signed by this CA (OVS does).
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiConfig {
    pub listen: SocketAddr,
    /// Bearer token for every mutating call; with none, mutations are refused.
    pub token: Option<String>,
}

/// What to do with a non-SYN packet of a connection the controller does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum UnknownFlowPolicy {
    /// Answer with a TCP RST so the client learns at once.
    Reset,
    /// Drop silently.
    Drop,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    pub idle_timeout_secs: u16,
    pub refresh_interval: Duration,
    pub lldp_interval: Duration,
    /// After a switch connects, how long the L2, proactive and partition rules it already
    /// holds (from this controller's earlier run, or its peer's before a failover) stay in
    /// place beside the new ones; then the ones not re-added are deleted. Meanwhile the
    /// switch keeps carrying what it carried while the controller relearns hosts and
    /// backends. 0 deletes them at once.
    pub reconnect_grace: Duration,
    /// The most hosts (source MACs) learned. Past it a new MAC is not learned (counted in
    /// `hosts_refused`): frames to it are flooded by the controller, as to any unknown
    /// MAC. A flood of forged source MACs fills the table, not the switches' flow tables.
    pub max_hosts: usize,
    /// The most hosts learned at one switch port, and the most addresses those hosts
    /// claim; past it a new MAC seen there is not learned (counted in
    /// `hosts_refused_port_full`), nor a new address (`addresses_refused_port_full`), so
    /// that one port sending forged source MACs, or ARP with forged sender addresses,
    /// cannot fill the tables for every other. Not at a domain's uplink (`[cluster]
    /// uplink`), where the other domains' hosts are seen.
    pub max_hosts_per_port: u32,
    /// Connections the connection table is built for at start, its memory mapped then
    /// (about 65 bytes each): up to that many, a new connection's PACKET_IN neither grows
    /// the table nor waits for the kernel to map a page for it. 0 (the default): the
    /// table grows as connections come. Past it, it grows too.
    pub preallocate_connections: usize,
    /// A host with a known address that has sent nothing up for this long is asked by ARP
    /// whether it is still there, and forgotten (its L2 rules deleted, its place in the
    /// tables freed) if it does not answer (see `Controller::age_hosts`). `None`: hosts
    /// are forgotten only with their port or switch.
    pub host_timeout: Option<Duration>,
    pub unknown_flow: UnknownFlowPolicy,
    /// Idle timeout a connection's rules drop to once the switch sees its FIN or RST
    /// (Open vSwitch's `fin_timeout` extension action); 0 leaves the rules to the plain
    /// idle timeout, as a switch without the extension needs.
    pub fin_timeout_secs: u16,
    /// Passive outlier detection takes no failure from a connection decided while, or
    /// after, the switch that reports it (or its backend's switch) had a control channel
    /// round trip (ECHO) over this: that switch, busy or behind, is the likelier cause of
    /// the silence (`Controller::note_channel_rtt`). Zero: every silence is judged.
    pub outlier_max_channel_rtt: Duration,
    pub seed: u64,
    /// `[controller.overload]`: the controller's own gap (see [`crate::overload`]).
    pub overload: crate::overload::ControllerOverloadConfig,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthKind {
    None,
    Tcp,
    Http,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    pub kind: HealthKind,
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub rise: u32,
    pub fall: u32,
    /// Below this share of its backends available (percent), a pool ignores its outlier
    /// ejections ([`crate::service::ServiceState::in_panic`]); 0 never does.
    pub panic_threshold_percent: u32,
}

/// How to read backends' own Prometheus metrics (`metrics = URL` on a backend).
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub interval: Duration,
    pub timeout: Duration,
    pub names: crate::metrics_text::MetricNames,
}

/// How a service's new connections are placed (`mode` under `[[service]]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ServiceMode {
    /// Each new connection's first packet goes to the controller, which decides and
    /// installs the connection's rules (the default; every algorithm).
    #[default]
    Reactive,
    /// New connections stay in the switch: a select group whose bucket weights the
    /// controller sets from live load, conntrack DNAT, established traffic pinned by
    /// conntrack (Open vSwitch only; see `controller::proactive`).
    Proactive,
    /// New connections stay in the switch, stateless: wildcard rules over partitions of
    /// the client-port space, each owned by one backend, the counts per backend set from
    /// live load; a partition changing owner goes through the controller for a while, so
    /// no live connection moves. Backends return directly (they hold the VIP), see
    /// `controller::partition`.
    Partitioned,
}

impl ServiceMode {
    /// The mode's name in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceMode::Reactive => "reactive",
            ServiceMode::Proactive => "proactive",
            ServiceMode::Partitioned => "partitioned",
        }
    }
}

/// `partition_bits` and `transition_secs` of a `mode = "partitioned"` service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionConfig {
    /// The client-port space is split into `2^bits` partitions.
    pub bits: u8,
    /// How long a partition that changed owner goes through the controller.
    pub transition: Duration,
}

impl Default for PartitionConfig {
    fn default() -> Self {
        PartitionConfig {
            bits: DEFAULT_PARTITION_BITS,
            transition: Duration::from_secs(DEFAULT_TRANSITION_SECS),
        }
    }
}

/// 64 partitions: a backend's share in steps of 1/64, at most 64 rules per switch.
pub const DEFAULT_PARTITION_BITS: u8 = 6;
/// Gone Wild's soft deadline: a connection idle for longer than this while its partition
/// moves is moved with it.
pub const DEFAULT_TRANSITION_SECS: u64 = 60;

#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    pub name: String,
    /// `mode = "reactive" | "proactive" | "partitioned"`.
    pub mode: ServiceMode,
    /// The partitioned mode's settings (defaults for the other modes).
    pub partitions: PartitionConfig,
    /// The service's own address; `None` means clients address backends directly and the
    /// controller intercepts new connections to them (the paper's Cases A and B).
    pub vip: Option<Ipv4Addr>,
    pub virtual_mac: MacAddr,
    pub port: u16,
    pub algorithm: AlgorithmKind,
    pub params: AlgorithmParams,
    pub idle_timeout_secs: u16,
    /// `slow_start_secs`: how long a (re)joining backend ramps up. Every algorithm but
    /// `none` honours it, so that a backend coming back is not flooded whichever runs: the
    /// weighted ones through the ramped weight (HAProxy, Envoy), the ones that read
    /// weight only as "> 0" through the ramp fraction (`Balancer::set_ramp`).
    pub slow_start: Duration,
    /// `redispatch`: a connection whose backend stayed silent (its client sent the SYN
    /// again [`crate::controller::SILENT_AFTER_MS`] or more after the decision, and no
    /// answer of the backend is known) goes to another backend at that SYN, as HAProxy's
    /// `option redispatch` and nginx's `proxy_next_upstream timeout` retry a connect that
    /// timed out elsewhere. On by default; only a reactive service's SYNs reach the
    /// controller.
    pub redispatch: bool,
    pub health: HealthConfig,
    /// `[service.outlier]`: passive outlier detection (see [`crate::health::outlier`]).
    pub outlier: crate::health::OutlierConfig,
    pub metrics: MetricsConfig,
    pub backends: Vec<BackendConfig>,
    /// `[service.overload]`: gapping of new connections (see [`crate::overload`]).
    pub overload: crate::overload::OverloadConfig,
}

#[derive(Debug, Clone, PartialEq)]
pub struct BackendConfig {
    pub address: Ipv4Addr,
    pub weight: u32,
    /// A Prometheus endpoint of the backend's own, scraped for load figures.
    pub metrics: Option<String>,
    /// `mac`: the backend's MAC, pinned. The controller then binds the backend's address
    /// only to this MAC: another host that claims the address (by ARP, or as an IPv4
    /// source) is refused and counted, where without a pin it would take the backend's
    /// connections as a backend that moved. The price: a backend whose NIC changes needs a
    /// config change.
    pub mac: Option<MacAddr>,
    /// `capacity_rps`: the new connections (requests) per second the backend can serve,
    /// finite and positive. DWRS's load is `rate / capacity_rps` and MRBS's utilisation
    /// feature is the same ratio when the backend reports no CPU; without it DWRS falls
    /// back to the load relative to the pool's mean. A backend added at run time has the
    /// one its API call gives, if any.
    pub capacity_rps: Option<f64>,
}

impl Config {
    /// Parse and validate a config file's text. `env` looks up environment variables
    /// (passed in so tests need no process environment).
    pub fn from_toml(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigErrors> {
        let doc: toml::Table = match text.parse() {
            Ok(t) => t,
            Err(e) => {
                let msg = e.message().to_string();
                let path = match e.span() {
                    Some(span) => {
                        let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                        format!("line {line}")
                    }
                    None => String::new(),
                };
                return Err(ConfigErrors(vec![ConfigError::new(
                    path,
                    format!("TOML syntax: {msg}"),
                )]));
            }
        };
        let mut errs = Vec::new();
        let cfg = validate(&doc, env, &mut errs);
        match cfg {
            Some(cfg) if errs.is_empty() => Ok(cfg),
            _ => Err(ConfigErrors(errs)),
        }
    }

    /// A minimal config with defaults everywhere and no services.
    pub fn empty() -> Config {
        Config::from_toml("", &|_| None)
            .unwrap_or_else(|_| unreachable!("the empty config is valid"))
    }
}

fn socket_addr(
    o: &mut Obj<'_>,
    key: &str,
    default: &str,
    errs: &mut Vec<ConfigError>,
) -> Option<SocketAddr> {
    let s = o.string(key, errs).unwrap_or(default);
    match s.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(ConfigError::new(
                o.key_path(key),
                format!("{s:?} is not an IP:port address"),
            ));
            None
        }
    }
}

fn validate(
    doc: &toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
    errs: &mut Vec<ConfigError>,
) -> Option<Config> {
    let mut root = Obj::new("", doc);

    // [openflow]
    let empty = toml::Table::new();
    let mut of = root
        .table("openflow", errs)
        .unwrap_or_else(|| Obj::new("openflow", &empty));
    let of_listen = socket_addr(&mut of, "listen", DEFAULT_OPENFLOW_LISTEN, errs);
    let echo_interval = of.millis_checked(
        "echo_interval_ms",
        DEFAULT_ECHO_INTERVAL_MS,
        100,
        600_000,
        errs,
    );
    let echo_timeout = of.millis_checked(
        "echo_timeout_ms",
        DEFAULT_ECHO_TIMEOUT_MS,
        200,
        3_600_000,
        errs,
    );
    if let (Some(interval), Some(timeout)) = (echo_interval, echo_timeout)
        && timeout <= interval
    {
        errs.push(ConfigError::new(
            of.key_path("echo_timeout_ms"),
            "must be longer than echo_interval_ms",
        ));
    }
    let packet_in_rate = of.count(
        "packet_in_rate",
        DEFAULT_PACKET_IN_RATE,
        1,
        100_000_000,
        errs,
    );
    let tls = of.table("tls", errs).map(|mut t| {
        let cert = t.string("cert", errs).map(PathBuf::from);
        let key = t.string("key", errs).map(PathBuf::from);
        let ca = t.string("ca", errs).map(PathBuf::from);
        if cert.is_none() {
            errs.push(ConfigError::new(
                t.key_path("cert"),
                "required when [openflow.tls] is present",
            ));
        }
        if key.is_none() {
            errs.push(ConfigError::new(
                t.key_path("key"),
                "required when [openflow.tls] is present",
            ));
        }
        t.finish(errs);
        TlsConfig {
            cert: cert.unwrap_or_default(),
            key: key.unwrap_or_default(),
            ca,
        }
    });
    of.finish(errs);

    // [api]
    let mut api = root
        .table("api", errs)
        .unwrap_or_else(|| Obj::new("api", &empty));
    let api_listen = socket_addr(&mut api, "listen", DEFAULT_API_LISTEN, errs);
    let file_token = api.string("token", errs).map(str::to_string);
    let token_env = api
        .string("token_env", errs)
        .unwrap_or(DEFAULT_TOKEN_ENV)
        .to_string();
    let token = match file_token {
        Some(t) => {
            if let Some(why) = token_error(&t) {
                errs.push(ConfigError::new(api.key_path("token"), why));
            }
            Some(t)
        }
        // An empty variable is an unset one, as `VAR=` in a shell means.
        None => env(&token_env).filter(|t| !t.is_empty()).inspect(|t| {
            if let Some(why) = token_error(t) {
                errs.push(ConfigError::new(
                    api.key_path("token_env"),
                    format!("${token_env}: {why}"),
                ));
            }
        }),
    };
    api.finish(errs);

    // [controller]
    let mut ctl = root
        .table("controller", errs)
        .unwrap_or_else(|| Obj::new("controller", &empty));
    let idle_timeout_secs = ctl
        .int_in("idle_timeout_secs", 1, 65_535, errs)
        .map(|v| v as u16)
        .unwrap_or(DEFAULT_IDLE_TIMEOUT_SECS as u16);
    let refresh_interval = ctl.millis(
        "refresh_interval_ms",
        DEFAULT_REFRESH_INTERVAL_MS,
        1,
        60_000,
        errs,
    );
    let lldp_interval = ctl.millis(
        "lldp_interval_ms",
        DEFAULT_LLDP_INTERVAL_MS,
        50,
        60_000,
        errs,
    );
    let reconnect_grace = ctl.millis(
        "reconnect_grace_ms",
        DEFAULT_RECONNECT_GRACE_MS,
        0,
        600_000,
        errs,
    );
    let max_hosts = ctl
        .int_in("max_hosts", 1, 10_000_000, errs)
        .map_or(DEFAULT_MAX_HOSTS, |v| v as usize);
    let max_hosts_per_port = ctl
        .int_in("max_hosts_per_port", 1, 10_000_000, errs)
        .map_or(DEFAULT_MAX_HOSTS_PER_PORT, |v| v as u32);
    // A hundred million is 6.5 GB.
    let preallocate_connections = ctl
        .int_in("preallocate_connections", 0, 100_000_000, errs)
        .map_or(0, |v| v as usize);
    // 0 turns ageing off; at most a week.
    let host_timeout = match ctl.int_in("host_timeout_secs", 0, 604_800, errs) {
        Some(0) => None,
        Some(secs) => Some(Duration::from_secs(secs as u64)),
        None => Some(Duration::from_secs(DEFAULT_HOST_TIMEOUT_SECS)),
    };
    let unknown_flow = choice(
        &mut ctl,
        "unknown_flow",
        ("reset", UnknownFlowPolicy::Reset),
        &[("drop", UnknownFlowPolicy::Drop)],
        errs,
    );
    let fin_timeout_secs = ctl
        .int_in("fin_timeout_secs", 0, 65_535, errs)
        .map(|v| v as u16)
        .unwrap_or(DEFAULT_FIN_TIMEOUT_SECS as u16);
    let outlier_max_channel_rtt = ctl.millis(
        "outlier_max_channel_rtt_ms",
        DEFAULT_OUTLIER_MAX_CHANNEL_RTT_MS,
        0,
        600_000,
        errs,
    );
    let seed = ctl
        .integer("seed", errs)
        .map(|v| v as u64)
        .unwrap_or(DEFAULT_SEED);
    let ctl_overload = ctl
        .table("overload", errs)
        .map(|t| crate::overload::ControllerOverloadConfig::read(t, errs))
        .unwrap_or_default();
    ctl.finish(errs);

    // [[service]]
    let read: Vec<ReadService> = root
        .tables("service", errs)
        .into_iter()
        .map(|(i, s)| validate_service(s, i, idle_timeout_secs, errs))
        .collect();
    let cluster = root
        .table("cluster", errs)
        .map(|t| validate_cluster(t, errs))
        .unwrap_or_else(ClusterConfig::single);
    let runtime = root
        .table("runtime", errs)
        .map(|mut t| {
            let worker_threads = t
                .int_in("worker_threads", 1, 1024, errs)
                .map(|v| v as usize);
            let spin_before_park = t
                .int_in("spin_before_park_us", 0, 10_000, errs)
                .map_or(Duration::ZERO, |us| Duration::from_micros(us as u64));
            t.finish(errs);
            RuntimeConfig {
                worker_threads,
                spin_before_park,
            }
        })
        .unwrap_or_default();
    root.finish(errs);
    check_services(&read, errs);
    check_pinned_macs(&read, errs);
    let services = read.into_iter().filter_map(|r| r.cfg).collect();

    Some(Config {
        runtime,
        openflow: OpenflowConfig {
            listen: of_listen?,
            // An invalid one was reported: the config is refused.
            echo_interval: echo_interval.unwrap_or_default(),
            echo_timeout: echo_timeout.unwrap_or_default(),
            tls,
            packet_in_rate,
        },
        api: ApiConfig {
            listen: api_listen?,
            token,
        },
        controller: ControllerConfig {
            idle_timeout_secs,
            refresh_interval,
            lldp_interval,
            reconnect_grace,
            max_hosts,
            max_hosts_per_port,
            preallocate_connections,
            host_timeout,
            unknown_flow,
            fin_timeout_secs,
            outlier_max_channel_rtt,
            seed,
            overload: ctl_overload,
        },
        services,
        cluster,
    })
}

/// Why `token` can never authorise a call, if so: the API reads the `Authorization`
/// header as printable ASCII and trims what follows `Bearer`.
fn token_error(token: &str) -> Option<&'static str> {
    if token.is_empty() {
        Some("must not be empty (leave it out to take the token from api.token_env)")
    } else if token.trim() != token {
        Some("must not begin or end with whitespace: the API trims the token it is sent")
    } else if !token.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        Some("printable ASCII only: an HTTP header carries nothing else")
    } else if token.chars().count() < 16 {
        Some("a token must have at least 16 characters")
    } else {
        None
    }
}

fn validate_cluster(mut c: Obj<'_>, errs: &mut Vec<ConfigError>) -> ClusterConfig {
    let mut cfg = ClusterConfig::single();
    cfg.role = choice(
        &mut c,
        "role",
        ("single", ClusterRole::Single),
        &[
            ("domain", ClusterRole::Domain),
            ("global", ClusterRole::Global),
        ],
        errs,
    );
    let name_ok = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    };
    if let Some(n) = c.string("name", errs) {
        if !name_ok(n) {
            errs.push(ConfigError::new(
                c.key_path("name"),
                format!("{n:?}: use letters, digits, '-' and '_'"),
            ));
        }
        cfg.name = n.to_string();
    }
    cfg.instance = c.string("instance", errs).unwrap_or_default().to_string();
    cfg.domain = c.string("domain", errs).map(str::to_string);
    if let Some(list) = c.strings("etcd", errs) {
        for (i, e) in list.iter().enumerate() {
            // `memory:` is the in-process store the tests use.
            let url = e
                .strip_prefix("http://")
                .or_else(|| e.strip_prefix("https://"));
            if e != "memory:" && url.is_none_or(|rest| rest.is_empty() || rest.starts_with('/')) {
                errs.push(ConfigError::new(
                    format!("{}[{i}]", c.key_path("etcd")),
                    format!("{e:?} is not an http:// or https:// URL"),
                ));
            }
        }
        cfg.etcd = list;
    }
    let mut dpids_read = true;
    for (i, d) in c
        .strings("dpids", errs)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let t = d.trim_start_matches("0x").replace(':', "");
        match u64::from_str_radix(&t, 16) {
            Ok(v) if cfg.dpids.contains(&v) => errs.push(ConfigError::new(
                format!("{}[{i}]", c.key_path("dpids")),
                format!("{d:?} is listed twice"),
            )),
            Ok(v) => cfg.dpids.push(v),
            Err(_) => {
                dpids_read = false;
                errs.push(ConfigError::new(
                    format!("{}[{i}]", c.key_path("dpids")),
                    format!("{d:?} is not a datapath id (hex, e.g. \"0000000000000001\")"),
                ));
            }
        }
    }
    if let Some(u) = c.string("uplink", errs) {
        let parsed = u.split_once(':').and_then(|(d, p)| {
            Some((
                u64::from_str_radix(d.trim_start_matches("0x"), 16).ok()?,
                p.parse::<u32>().ok()?,
            ))
        });
        match parsed {
            // OpenFlow's physical ports are 1..=0xffffff00 (OFPP_MAX).
            Some((_, port)) if !(1..=0xffff_ff00).contains(&port) => errs.push(ConfigError::new(
                c.key_path("uplink"),
                format!("{u:?}: port {port} is not a switch port (1 to 4294967040)"),
            )),
            // A dpid that did not parse may be the one.
            Some((dpid, _)) if dpids_read && !cfg.dpids.contains(&dpid) => {
                errs.push(ConfigError::new(
                    c.key_path("uplink"),
                    format!("{u:?}: switch {dpid:016x} is not one of dpids"),
                ))
            }
            Some(x) => cfg.uplink = Some(x),
            None => errs.push(ConfigError::new(
                c.key_path("uplink"),
                format!("{u:?} is not \"DPID:PORT\" (DPID in hex)"),
            )),
        }
    }
    let lease_ttl = c.millis_checked(
        "lease_ttl_ms",
        DEFAULT_CLUSTER_LEASE_TTL_MS,
        1_000,
        600_000,
        errs,
    );
    let store_timeout = c.millis_checked(
        "store_timeout_ms",
        DEFAULT_CLUSTER_STORE_TIMEOUT_MS,
        50,
        60_000,
        errs,
    );
    if let (Some(ttl), Some(timeout)) = (lease_ttl, store_timeout) {
        // A store call may take that long: the lease must outlast one to be renewed.
        if timeout >= ttl {
            errs.push(ConfigError::new(
                c.key_path("store_timeout_ms"),
                "must be shorter than lease_ttl_ms",
            ));
        }
    }
    // An invalid one was reported: the config is refused.
    cfg.lease_ttl = lease_ttl.unwrap_or_default();
    cfg.store_timeout = store_timeout.unwrap_or_default();
    cfg.summary_interval = c.millis(
        "summary_interval_ms",
        DEFAULT_CLUSTER_SUMMARY_INTERVAL_MS,
        50,
        60_000,
        errs,
    );
    let entry_ok = |t: f64| t > 0.0 && t <= 10.0;
    if let Some(t) = c.float_where("spill_threshold", entry_ok, "must be in (0, 10]", errs) {
        cfg.spill_threshold = t;
    }
    cfg.spill_exit_threshold = cfg.spill_threshold * DEFAULT_CLUSTER_SPILL_EXIT_RATIO;
    // Held against the entry threshold only when that one is valid.
    let entry = cfg.spill_threshold;
    let (why, exit_ok): (&str, &dyn Fn(f64) -> bool) = if entry_ok(entry) {
        ("must be in (0, spill_threshold]", &|t| {
            t > 0.0 && t <= entry
        })
    } else {
        ("must be positive", &|t| t > 0.0)
    };
    if let Some(t) = c.float_where("spill_exit_threshold", exit_ok, why, errs) {
        cfg.spill_exit_threshold = t;
    }
    cfg.spill_hold = c.millis(
        "spill_hold_ms",
        DEFAULT_CLUSTER_SPILL_HOLD_MS,
        0,
        600_000,
        errs,
    );
    if let Some(t) = c.float_where(
        "spill_step",
        |t| (0.0..=1.0).contains(&t),
        "must be in [0, 1]",
        errs,
    ) {
        cfg.spill_step = t;
    }
    if cfg.role != ClusterRole::Single {
        if cfg.etcd.is_empty() {
            errs.push(ConfigError::new(
                c.key_path("etcd"),
                "required unless role = \"single\"",
            ));
        }
        if !name_ok(&cfg.instance) {
            errs.push(ConfigError::new(
                c.key_path("instance"),
                "required unless role = \"single\" (letters, digits, '-' and '_')",
            ));
        }
    }
    if cfg.role == ClusterRole::Domain {
        match &cfg.domain {
            Some(d) if name_ok(d) => {}
            Some(d) => errs.push(ConfigError::new(
                c.key_path("domain"),
                format!("{d:?}: use letters, digits, '-' and '_'"),
            )),
            None => errs.push(ConfigError::new(
                c.key_path("domain"),
                "required when role = \"domain\"",
            )),
        }
        if cfg.dpids.is_empty() && dpids_read {
            errs.push(ConfigError::new(
                c.key_path("dpids"),
                "a domain needs at least one switch",
            ));
        }
    }
    c.finish(errs);
    cfg
}

/// The value named by `key`: `default` or one of `others`. The default also stands in
/// (beside an error naming every choice) for a name that is none of them: the config is
/// refused then, and reading goes on to report its other problems too.
pub(crate) fn choice<T: Clone>(
    o: &mut Obj<'_>,
    key: &str,
    default: (&str, T),
    others: &[(&str, T)],
    errs: &mut Vec<ConfigError>,
) -> T {
    let Some(given) = o.string(key, errs) else {
        return default.1;
    };
    if given == default.0 {
        return default.1;
    }
    if let Some((_, v)) = others.iter().find(|(name, _)| *name == given) {
        return v.clone();
    }
    let names: Vec<String> = std::iter::once(default.0)
        .chain(others.iter().map(|(n, _)| *n))
        .map(|n| format!("{n:?}"))
        .collect();
    errs.push(ConfigError::new(
        o.key_path(key),
        format!("{given:?} is not one of {}", names.join(", ")),
    ));
    default.1
}

fn ipv4(o: &mut Obj<'_>, key: &str, errs: &mut Vec<ConfigError>) -> Option<Ipv4Addr> {
    let s = o.string(key, errs)?;
    match s.parse::<Ipv4Addr>() {
        Ok(a) if a.is_unspecified() || a.is_broadcast() || a.is_multicast() => {
            errs.push(ConfigError::new(
                o.key_path(key),
                format!("{a} cannot be a host address"),
            ));
            None
        }
        Ok(a) => Some(a),
        Err(_) => {
            errs.push(ConfigError::new(
                o.key_path(key),
                format!("{s:?} is not an IPv4 address"),
            ));
            None
        }
    }
}

/// A `[[service]]` table as read: what the checks across services need, kept with its
/// place in the file even when the service has errors of its own (the config is refused
/// then anyway), so that each problem across services is told, and at its own path.
struct ReadService {
    index: usize,
    name: Option<String>,
    vip: Option<Ipv4Addr>,
    port: Option<u16>,
    /// The virtual MAC and whether the file wrote it (not the automatic one).
    virtual_mac: Option<(MacAddr, bool)>,
    /// Each backend address (first listing only, not the VIP) with its index in the file
    /// and its pinned MAC.
    backends: Vec<(usize, Ipv4Addr, Option<MacAddr>)>,
    /// The service, when it has no error of its own.
    cfg: Option<ServiceConfig>,
}

fn validate_service(
    s: Obj<'_>,
    index: usize,
    idle_default: u16,
    errs: &mut Vec<ConfigError>,
) -> ReadService {
    let before = errs.len();
    let mut read = ReadService {
        index,
        name: None,
        vip: None,
        port: None,
        virtual_mac: None,
        backends: Vec::new(),
        cfg: None,
    };
    let cfg = read_service(s, &mut read, idle_default, errs);
    if errs.len() == before {
        read.cfg = cfg;
    }
    read
}

fn read_service(
    mut s: Obj<'_>,
    read: &mut ReadService,
    idle_default: u16,
    errs: &mut Vec<ConfigError>,
) -> Option<ServiceConfig> {
    let index = read.index;
    let name = s.string("name", errs).map(str::to_string);
    if name.is_none() {
        errs.push(ConfigError::new(s.key_path("name"), "required"));
    }
    if let Some(n) = &name
        && (n.is_empty()
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
    {
        errs.push(ConfigError::new(
            s.key_path("name"),
            format!("{n:?}: use letters, digits, '-' and '_'"),
        ));
    }
    read.name.clone_from(&name);
    let vip = ipv4(&mut s, "vip", errs);
    read.vip = vip;
    let virtual_mac = match s.string("virtual_mac", errs) {
        None => {
            // 02:66:67 and the service's number from 1, in 24 bits: unique per service
            // (the fuzzer's 256th service overflowed a `u8` here).
            let n = (index + 1) as u32;
            let mac = MacAddr([0x02, 0x66, 0x67, (n >> 16) as u8, (n >> 8) as u8, n as u8]);
            read.virtual_mac = Some((mac, false));
            mac
        }
        Some(m) => match m.parse::<MacAddr>() {
            Ok(mac) => {
                match virtual_mac_error(mac) {
                    Some(why) => errs.push(ConfigError::new(s.key_path("virtual_mac"), why)),
                    None => read.virtual_mac = Some((mac, true)),
                }
                mac
            }
            Err(_) => {
                errs.push(ConfigError::new(
                    s.key_path("virtual_mac"),
                    format!("{m:?} is not a MAC address"),
                ));
                MacAddr([0; 6])
            }
        },
    };
    let port = s.int_in("port", 1, 65_535, errs).map(|p| p as u16);
    if port.is_none() && !s.has("port") {
        errs.push(ConfigError::new(s.key_path("port"), "required"));
    }
    read.port = port;
    let algorithm = match s.string("algorithm", errs) {
        None => AlgorithmKind::RoundRobin,
        Some(a) => match a.parse::<AlgorithmKind>() {
            Ok(k) => k,
            Err(_) => {
                let known: Vec<String> = AlgorithmKind::ALL.iter().map(|k| k.to_string()).collect();
                errs.push(ConfigError::new(
                    s.key_path("algorithm"),
                    format!("{a:?} is not one of {}", known.join(", ")),
                ));
                AlgorithmKind::RoundRobin
            }
        },
    };
    let mut params = AlgorithmParams::default();
    if let Some(t) = s.float("threshold_rps", errs) {
        if t <= 0.0 {
            errs.push(ConfigError::new(
                s.key_path("threshold_rps"),
                "must be positive",
            ));
        }
        params.threshold_rps = Some(t);
    }
    if let Some(h) = s.float_where(
        "hysteresis",
        |h| (0.0..1.0).contains(&h),
        "must be in [0, 1)",
        errs,
    ) {
        params.hysteresis = h;
    }
    let none_target = ipv4(&mut s, "none_target", errs);
    let mode_before = errs.len();
    let mode = choice(
        &mut s,
        "mode",
        ("reactive", ServiceMode::Reactive),
        &[
            ("proactive", ServiceMode::Proactive),
            ("partitioned", ServiceMode::Partitioned),
        ],
        errs,
    );
    // A mode not understood is no mode to hold the other keys against.
    let mode_read = errs.len() == mode_before;
    let mut partitions = PartitionConfig::default();
    if let Some(b) = s.int_in("partition_bits", 1, 8, errs) {
        partitions.bits = b as u8;
    }
    if let Some(t) = s.int_in("transition_secs", 1, 3_600, errs) {
        partitions.transition = Duration::from_secs(t as u64);
    }
    if mode_read && mode != ServiceMode::Partitioned {
        for key in ["partition_bits", "transition_secs"] {
            if s.has(key) {
                errs.push(ConfigError::new(
                    s.key_path(key),
                    "only a mode = \"partitioned\" service has partitions",
                ));
            }
        }
    }
    if let Some(why) = mode_algorithm_conflict(mode, algorithm) {
        errs.push(ConfigError::new(s.key_path("mode"), why));
    }
    if mode != ServiceMode::Reactive {
        let name = mode.as_str();
        // One written but invalid was reported already.
        if vip.is_none() && !s.has("vip") {
            errs.push(ConfigError::new(
                s.key_path("mode"),
                format!("\"{name}\" needs a vip (the switch answers for one address)"),
            ));
        }
    }
    if let Err(msg) = params.validate(algorithm) {
        errs.push(ConfigError::new(s.key_path("algorithm"), msg));
    }
    let idle_timeout_secs = s
        .int_in("idle_timeout_secs", 1, 65_535, errs)
        .map(|v| v as u16)
        .unwrap_or(idle_default);
    let slow_start =
        Duration::from_secs(s.int_in("slow_start_secs", 0, 3_600, errs).unwrap_or(0) as u64);
    let redispatch = match s.boolean("redispatch", errs) {
        Some(true) if mode != ServiceMode::Reactive => {
            errs.push(ConfigError::new(
                s.key_path("redispatch"),
                format!(
                    "a \"{}\" service's SYNs stay in the switch: only a reactive one's can go \
                     to another backend",
                    mode.as_str()
                ),
            ));
            false
        }
        Some(on) => on,
        None => mode == ServiceMode::Reactive,
    };

    let empty = toml::Table::new();
    let mut h = s
        .table("health", errs)
        .unwrap_or_else(|| Obj::new(s.key_path("health"), &empty));
    let kind = choice(
        &mut h,
        "kind",
        ("tcp", HealthKind::Tcp),
        &[("http", HealthKind::Http), ("none", HealthKind::None)],
        errs,
    );
    let path = h.string("path", errs).unwrap_or("/").to_string();
    if let Some(why) = request_target_error(&path) {
        errs.push(ConfigError::new(h.key_path("path"), why));
    }
    let interval = h.millis(
        "interval_ms",
        DEFAULT_HEALTH_INTERVAL_MS,
        10,
        3_600_000,
        errs,
    );
    let timeout = h.millis("timeout_ms", DEFAULT_HEALTH_TIMEOUT_MS, 1, 600_000, errs);
    let rise = h.count("rise", DEFAULT_HEALTH_RISE, 1, 100, errs);
    let fall = h.count("fall", DEFAULT_HEALTH_FALL, 1, 100, errs);
    let panic_threshold_percent = h.count(
        "panic_threshold_percent",
        DEFAULT_PANIC_THRESHOLD_PERCENT,
        0,
        100,
        errs,
    );
    h.finish(errs);
    let outlier = s
        .table("outlier", errs)
        .map(|t| crate::health::OutlierConfig::read(t, errs))
        .unwrap_or_default();
    let overload = s
        .table("overload", errs)
        .map(|t| crate::overload::OverloadConfig::read(t, errs))
        .unwrap_or_default();

    let mut m = s
        .table("metrics", errs)
        .unwrap_or_else(|| Obj::new(s.key_path("metrics"), &empty));
    let mut names = choice(
        &mut m,
        "preset",
        ("flowgate", crate::metrics_text::MetricNames::default()),
        &[("nginx", crate::metrics_text::MetricNames::nginx())],
        errs,
    );
    if let Some(list) = m.strings("active", errs) {
        names.active = list;
    }
    for (key, slot) in [
        ("requests", &mut names.requests),
        ("response_time", &mut names.response_time),
        ("cpu", &mut names.cpu),
    ] {
        if let Some(v) = m.string(key, errs) {
            *slot = (!v.is_empty()).then(|| v.to_string());
        }
    }
    let metrics_interval = m.millis(
        "interval_ms",
        DEFAULT_METRICS_INTERVAL_MS,
        10,
        3_600_000,
        errs,
    );
    let metrics_timeout = m.millis("timeout_ms", DEFAULT_HEALTH_TIMEOUT_MS, 1, 600_000, errs);
    m.finish(errs);

    let mut backends = Vec::new();
    let mut seen = HashSet::new();
    for (bi, mut b) in s.tables("backend", errs) {
        let address = ipv4(&mut b, "address", errs);
        if address.is_none() && !b.has("address") {
            errs.push(ConfigError::new(b.key_path("address"), "required"));
        }
        let weight = b
            .int_in("weight", 0, 1_000_000, errs)
            .map(|w| w as u32)
            .unwrap_or(1);
        let capacity = b.float_where(
            "capacity_rps",
            |c| c > 0.0,
            "must be a positive number of requests per second",
            errs,
        );
        let metrics = b.string("metrics", errs).map(str::to_string);
        if let Some(Err(why)) = metrics.as_deref().map(parse_metrics_url) {
            errs.push(ConfigError::new(b.key_path("metrics"), why));
        }
        let mac = b.string("mac", errs).and_then(|m| match pinned_mac(m) {
            Ok(mac) => Some(mac),
            Err(why) => {
                errs.push(ConfigError::new(b.key_path("mac"), why));
                None
            }
        });
        if let Some(a) = address {
            if !seen.insert(a) {
                errs.push(ConfigError::new(
                    b.key_path("address"),
                    format!("{a} is listed twice"),
                ));
            } else if Some(a) == vip {
                errs.push(ConfigError::new(
                    b.key_path("address"),
                    "a backend cannot have the service's VIP",
                ));
            } else {
                read.backends.push((bi, a, mac));
            }
        }
        b.finish(errs);
        if let Some(address) = address {
            backends.push(BackendConfig {
                address,
                weight,
                metrics,
                mac,
                capacity_rps: capacity.filter(|c| *c > 0.0),
            });
        }
    }
    if backends.len() > MAX_BACKENDS {
        errs.push(ConfigError::new(
            s.key_path("backend"),
            format!(
                "{} backends; at most {MAX_BACKENDS} in a service",
                backends.len()
            ),
        ));
    }
    if let Some(t) = none_target {
        match backends.iter().position(|b| b.address == t) {
            Some(i) => params.none_target = Some(i),
            None => errs.push(ConfigError::new(
                s.key_path("none_target"),
                format!("{t} is not one of this service's backends"),
            )),
        }
    }
    if mode != ServiceMode::Reactive && overload.mode != crate::overload::Mode::Off {
        errs.push(ConfigError::new(
            s.key_path("overload"),
            format!(
                "overload control gaps the controller's intercept rule; a \"{}\" service's \
                 new connections do not reach it",
                mode.as_str()
            ),
        ));
    }
    s.finish(errs);
    Some(ServiceConfig {
        name: name?,
        mode,
        partitions,
        vip,
        virtual_mac,
        port: port?,
        algorithm,
        params,
        idle_timeout_secs,
        slow_start,
        redispatch,
        health: HealthConfig {
            kind,
            path,
            interval,
            timeout,
            rise,
            fall,
            panic_threshold_percent,
        },
        outlier,
        metrics: MetricsConfig {
            interval: metrics_interval,
            timeout: metrics_timeout,
            names,
        },
        backends,
        overload,
    })
}

/// Why a service in `mode` cannot run `algorithm`, if it cannot: a file's `mode` and
/// `algorithm`, and the API's algorithm changes (`Controller::set_algorithm`).
pub fn mode_algorithm_conflict(mode: ServiceMode, algorithm: AlgorithmKind) -> Option<String> {
    if mode == ServiceMode::Reactive
        || !matches!(algorithm, AlgorithmKind::Isslm | AlgorithmKind::None)
    {
        return None;
    }
    Some(format!(
        "\"{name}\" cannot run algorithm {algorithm:?}: it decides per connection \
         (requested server, per-request thresholds), which only the reactive mode does; use \
         mode = \"reactive\" or a load-weighted algorithm (round-robin, \
         weighted-round-robin, least-connections, random, p2c, dwrs, mrbs, amlob, srt)",
        name = mode.as_str(),
        algorithm = algorithm.as_str()
    ))
}

/// Why `address` cannot join the pool of `services[si]`, if it cannot: the rules a
/// configuration's backends obey (within the service, `validate_service`; across
/// services, `check_services`), for one backend added at run time. A pool changed
/// through the API thus never holds what no configuration file could.
pub fn backend_conflict(
    services: &[&ServiceConfig],
    si: usize,
    address: Ipv4Addr,
) -> Option<String> {
    let s = services.get(si)?;
    if s.backends.len() >= MAX_BACKENDS {
        return Some(format!(
            "{} has {MAX_BACKENDS} backends, the most a service may have",
            s.name
        ));
    }
    if s.backends.iter().any(|b| b.address == address) {
        return Some(format!("{address} is already a backend of {}", s.name));
    }
    if s.vip == Some(address) {
        return Some("a backend cannot have the service's VIP".into());
    }
    if let Some(other) = services.iter().find(|o| o.vip == Some(address)) {
        return Some(format!(
            "{address} is the VIP of service {:?}; a VIP must be an address of its own",
            other.name
        ));
    }
    if s.vip.is_none() {
        // Clients address this service's backends: each address and port is one
        // service's to intercept.
        let taken = services.iter().enumerate().find(|(j, o)| {
            *j != si
                && o.vip.is_none()
                && o.port == s.port
                && o.backends.iter().any(|b| b.address == address)
        });
        if let Some((_, o)) = taken {
            return Some(format!(
                "{address}:{} is intercepted by service {:?}",
                s.port, o.name
            ));
        }
    }
    None
}

/// The most backends in one service: far more than a pool has, and few enough that the
/// numbers a service gives its backends ([`crate::service::BackendId`]) outlast many
/// pool changes before it must number them afresh.
pub const MAX_BACKENDS: usize = 4096;

/// The most services one controller runs: each has its own meter and select group on
/// every switch, and its number ([`crate::service::ServiceState::slot`]) in its rules'
/// cookies.
pub const MAX_SERVICES: usize = 4096;

fn check_services(services: &[ReadService], errs: &mut Vec<ConfigError>) {
    if services.len() > MAX_SERVICES {
        errs.push(ConfigError::new(
            "service",
            format!(
                "{} services; at most {MAX_SERVICES} (each has its own meter and group on the switches)",
                services.len()
            ),
        ));
    }
    let mut names = HashMap::new();
    // Who answers for each address and port: the service with it as VIP, or the one that
    // intercepts it as a backend.
    let mut listeners: HashMap<(Ipv4Addr, u16), &ReadService> = HashMap::new();
    let mut macs: HashMap<MacAddr, (&ReadService, bool)> = HashMap::new();
    for s in services {
        let i = s.index;
        if let Some(name) = &s.name
            && let Some(o) = names.insert(name.as_str(), s)
        {
            errs.push(ConfigError::new(
                format!("service[{i}].name"),
                format!("{name:?} is used by service[{}]", o.index),
            ));
        }
        if let Some(vip) = s.vip {
            if let Some(port) = s.port
                && let Some(o) = listeners.insert((vip, port), s)
            {
                errs.push(ConfigError::new(
                    format!("service[{i}].vip"),
                    format!("{vip}:{port} is used by {}", described(o)),
                ));
            }
            for other in services {
                if other.backends.iter().any(|&(_, a, _)| a == vip) {
                    errs.push(ConfigError::new(
                        format!("service[{i}].vip"),
                        format!(
                            "{vip} is a backend of service[{}]; a VIP must be an address of its own",
                            other.index
                        ),
                    ));
                }
            }
            // Only a service with a VIP answers ARP with its virtual MAC.
            if let Some((mac, explicit)) = s.virtual_mac
                && let Some((o, o_explicit)) = macs.insert(mac, (s, explicit))
            {
                // Told where the file wrote it: an automatic MAC has no key to change.
                let (at, other, other_explicit) = if explicit {
                    (s, o, o_explicit)
                } else {
                    (o, s, explicit)
                };
                let whose = if other_explicit { "" } else { "automatic " };
                errs.push(ConfigError::new(
                    format!("service[{}].virtual_mac", at.index),
                    format!("{mac} is the {whose}virtual MAC of {}", described(other)),
                ));
            }
        } else if let Some(port) = s.port {
            for &(bi, a, _) in &s.backends {
                if let Some(o) = listeners.insert((a, port), s) {
                    errs.push(ConfigError::new(
                        format!("service[{i}].backend[{bi}].address"),
                        format!("{a}:{port} is intercepted by {}", described(o)),
                    ));
                }
            }
        }
    }
}

/// A backend address listed by several services is one host: where two of its listings pin
/// a MAC, they pin the same. A pinned MAC is a host's, so it is no service's virtual MAC.
fn check_pinned_macs(services: &[ReadService], errs: &mut Vec<ConfigError>) {
    let mut pinned: HashMap<Ipv4Addr, (&ReadService, usize, MacAddr)> = HashMap::new();
    for s in services {
        for &(bi, a, mac) in &s.backends {
            let Some(mac) = mac else { continue };
            let at = format!("service[{}].backend[{bi}].mac", s.index);
            if let Some(o) = services
                .iter()
                .find(|o| o.vip.is_some() && o.virtual_mac.is_some_and(|(m, _)| m == mac))
            {
                errs.push(ConfigError::new(
                    at.clone(),
                    format!("{mac} is the virtual MAC of {}", described(o)),
                ));
            }
            match pinned.get(&a) {
                Some(&(o, obi, omac)) if omac != mac => errs.push(ConfigError::new(
                    at,
                    format!(
                        "{a} is pinned to {omac} at service[{}].backend[{obi}].mac; one address, one host",
                        o.index
                    ),
                )),
                Some(_) => {}
                None => {
                    pinned.insert(a, (s, bi, mac));
                }
            }
        }
    }
}

/// `service[1] ("api")`, for an error that names another service.
fn described(s: &ReadService) -> String {
    match &s.name {
        Some(name) => format!("service[{}] ({name:?})", s.index),
        None => format!("service[{}]", s.index),
    }
}

/// Why `mac` cannot be a service's virtual MAC, if it cannot: the switches' hosts must be
/// able to send to it, and it must not be the controller's own.
fn virtual_mac_error(mac: MacAddr) -> Option<&'static str> {
    if mac.is_multicast() {
        Some("must be a unicast MAC (this one is multicast or broadcast)")
    } else if mac == MacAddr([0; 6]) {
        Some("00:00:00:00:00:00 is no host's MAC")
    } else if mac == crate::controller::ageing::PROBE_MAC {
        Some("is the MAC the controller's ARP probes come from")
    } else {
        None
    }
}

/// A backend's `mac`: a host's own MAC (unicast, not zero, not the controller's probes').
pub fn pinned_mac(text: &str) -> Result<MacAddr, String> {
    let mac = text
        .parse::<MacAddr>()
        .map_err(|_| format!("{text:?} is not a MAC address"))?;
    match virtual_mac_error(mac) {
        Some(why) => Err(why.to_string()),
        None => Ok(mac),
    }
}

/// Why `target` cannot follow the method in an HTTP request line (the origin form,
/// RFC 9112 §3.2.1: an absolute path and perhaps a query), if it cannot: health checks and
/// scrapes paste it there.
pub fn request_target_error(target: &str) -> Option<String> {
    if !target.starts_with('/') {
        return Some(format!("{target:?} must start with '/'"));
    }
    let bytes = target.as_bytes();
    for (i, c) in target.char_indices() {
        let ok = match c {
            '%' => {
                bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
            }
            // RFC 3986's pchar, '/' and '?'.
            c if c.is_ascii_alphanumeric() => true,
            c => "-._~!$&'()*+,;=:@/?".contains(c),
        };
        if !ok {
            return Some(if c == '%' {
                format!("{target:?}: '%' must begin an escape (%XX)")
            } else {
                format!("{target:?}: {c:?} cannot be in a request path (escape it as %XX)")
            });
        }
    }
    None
}

/// A backend's metrics endpoint as the scraper fetches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsUrl {
    pub addr: SocketAddr,
    /// The `Host` header: the URL's authority as written.
    pub host: String,
    /// The request target (`/` when the URL has no path).
    pub path: String,
}

/// `http://IPV4[:PORT][/PATH]`, the one form the scraper fetches (backends are addressed
/// by IP, and it speaks plain HTTP/1.1): for the config, the API and the scraper alike.
pub fn parse_metrics_url(url: &str) -> Result<MetricsUrl, String> {
    let bad = || format!("{url:?} is not http://IPV4[:PORT]/PATH");
    let rest = url.strip_prefix("http://").ok_or_else(bad)?;
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    let (ip, port) = match authority.split_once(':') {
        Some((ip, port)) => (ip, port.parse::<u16>().ok().filter(|&p| p > 0)),
        None => (authority, Some(80)),
    };
    let (Ok(ip), Some(port)) = (ip.parse::<Ipv4Addr>(), port) else {
        return Err(bad());
    };
    if let Some(why) = request_target_error(path) {
        return Err(format!("{url:?}: {why}"));
    }
    Ok(MetricsUrl {
        addr: SocketAddr::from((ip, port)),
        host: authority.to_string(),
        path: path.to_string(),
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod cluster_tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigErrors> {
        Config::from_toml(text, &|_| None)
    }

    #[test]
    fn single_is_the_default_and_needs_no_store() {
        let c = parse("").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cluster.role, ClusterRole::Single);
        assert!(c.cluster.etcd.is_empty());
    }

    #[test]
    fn a_domain_instance() {
        let c = parse(
            "[cluster]\nrole = \"domain\"\ndomain = \"d1\"\ninstance = \"d1a\"\ndpids = [\"1\", \"0x00000000000000a2\"]\nuplink = \"a2:3\"\netcd = [\"http://127.0.0.1:2379\"]\nlease_ttl_ms = 2000\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cluster.role, ClusterRole::Domain);
        assert_eq!(c.cluster.domain.as_deref(), Some("d1"));
        assert_eq!(c.cluster.dpids, vec![1, 0xa2]);
        assert_eq!(c.cluster.uplink, Some((0xa2, 3)));
        assert_eq!(c.cluster.lease_ttl, Duration::from_secs(2));
    }

    #[test]
    fn every_missing_piece_is_reported() {
        let errs = parse("[cluster]\nrole = \"domain\"\ndpids = [\"zz\"]\nttl = 3\n")
            .err()
            .map(|e| e.0)
            .unwrap_or_default();
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "cluster.dpids[0]",
            "cluster.etcd",
            "cluster.instance",
            "cluster.domain",
            "cluster.ttl",
        ] {
            assert!(paths.contains(&p), "{p} not reported: {errs:?}");
        }
        assert!(parse("[cluster]\nrole = \"boss\"\n").is_err());
    }

    #[test]
    fn spill_hysteresis_knobs() {
        let c = parse("[cluster]\nspill_threshold = 0.9\n").unwrap_or_else(|e| panic!("{e}"));
        assert!((c.cluster.spill_exit_threshold - 0.72).abs() < 1e-9);
        assert_eq!(c.cluster.spill_hold, Duration::from_secs(2));
        assert_eq!(c.cluster.spill_step, 0.05);
        let c =
            parse("[cluster]\nspill_exit_threshold = 0.5\nspill_hold_ms = 500\nspill_step = 0.1\n")
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.cluster.spill_exit_threshold, 0.5);
        assert_eq!(c.cluster.spill_hold, Duration::from_millis(500));
        assert_eq!(c.cluster.spill_step, 0.1);
        let errs = parse(
            "[cluster]\nspill_threshold = 0.8\nspill_exit_threshold = 0.9\nspill_hold_ms = -1\nspill_step = 2.0\n",
        )
        .err()
        .map(|e| e.0)
        .unwrap_or_default();
        let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
        for p in [
            "cluster.spill_exit_threshold",
            "cluster.spill_hold_ms",
            "cluster.spill_step",
        ] {
            assert!(paths.contains(&p), "{p} not reported: {errs:?}");
        }
    }
}
