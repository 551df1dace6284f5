//! `flowgate ctl`: a command-line client of the controller's HTTP API.
//!
//! A small blocking HTTP/1.1 client over a plain TCP socket (the API listens on loopback
//! and speaks plain HTTP; no TLS stack is pulled in). Reads print a short table (or the
//! JSON with `--json`); changes print the API's answer. Any 4xx/5xx exits non-zero with
//! the API's JSON reason.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The controller's API.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    pub api: String,
    /// Bearer token for changes.
    #[arg(
        long,
        global = true,
        env = "FLOWGATE_API_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// Print the API's JSON as is.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: CtlCmd,
}

#[derive(Debug, Subcommand)]
pub enum CtlCmd {
    /// Services and their backends' live load.
    Services,
    /// Connected switches.
    Switches,
    /// Connection counts per backend and the first page of connections.
    Connections {
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// Cursor (the `next` of a previous page).
        #[arg(long)]
        cursor: Option<String>,
    },
    /// Recent events.
    Events,
    /// The controller's version, uptime and counts.
    Status,
    /// The overload gates: the controller's own and each service's (mode, state, gap,
    /// load, rates, refusals).
    Overload,
    /// Give a backend no new connections (existing ones run to their end).
    Drain { service: String, backend: String },
    /// Give a backend new connections again.
    Undrain { service: String, backend: String },
    /// Change a backend's weight.
    Weight {
        service: String,
        backend: String,
        weight: u32,
    },
    /// Change a service's algorithm (and its threshold).
    Algorithm {
        service: String,
        name: String,
        #[arg(long)]
        threshold_rps: Option<f64>,
    },
    /// Add a backend to a service.
    AddBackend {
        service: String,
        address: String,
        #[arg(long)]
        weight: Option<u32>,
    },
    /// Remove a backend from a service (its connections keep going).
    RemoveBackend { service: String, address: String },
    /// Re-read the controller's config file (validated first).
    Reload,
}

/// An HTTP response: status and body.
#[derive(Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `http://host:port[/prefix]` → (`host:port`, prefix).
fn split_url(api: &str) -> anyhow::Result<(String, String)> {
    let rest = api.strip_prefix("http://").ok_or_else(|| {
        anyhow!("--api {api:?}: only http:// URLs are supported (the API speaks plain HTTP)")
    })?;
    let (host, prefix) = match rest.find('/') {
        Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
        None => (rest, ""),
    };
    if host.is_empty() {
        bail!("--api {api:?}: no host");
    }
    let host = if host.contains(':') && !host.ends_with(']') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    Ok((host, prefix.to_string()))
}

/// One HTTP/1.1 request with `Connection: close`.
pub fn request(
    api: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&Value>,
) -> anyhow::Result<HttpResponse> {
    let (host, prefix) = split_url(api)?;
    let addr = host
        .to_socket_addrs()
        .with_context(|| format!("resolving {host}"))?
        .next()
        .ok_or_else(|| anyhow!("{host}: no address"))?;
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("cannot connect to the API at {api}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.set_write_timeout(Some(Duration::from_secs(30)))?;
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let mut req = format!(
        "{method} {prefix}{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\nAccept: application/json\r\nUser-Agent: flowgate-ctl/{}\r\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(t) = token {
        req += &format!("Authorization: Bearer {t}\r\n");
    }
    if !body.is_empty() || method != "GET" {
        req += &format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            body.len()
        );
    }
    req += "\r\n";
    req += &body;
    s.write_all(req.as_bytes())
        .with_context(|| format!("sending to {api}"))?;
    read_response(BufReader::new(s))
}

fn read_response<R: Read>(mut r: BufReader<R>) -> anyhow::Result<HttpResponse> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP response: {line:?}"))?;
    let mut length: Option<usize> = None;
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            break;
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            let k = k.trim().to_ascii_lowercase();
            let v = v.trim();
            if k == "content-length" {
                length = v.parse().ok();
            } else if k == "transfer-encoding" && v.to_ascii_lowercase().contains("chunked") {
                chunked = true;
            }
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let n = usize::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
                .map_err(|_| anyhow!("bad chunk size {line:?}"))?;
            if n == 0 {
                break;
            }
            let mut chunk = vec![0u8; n];
            r.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            line.clear();
            r.read_line(&mut line)?;
        }
    } else if let Some(n) = length {
        body.resize(n, 0);
        r.read_exact(&mut body)?;
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(HttpResponse {
        status,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}

fn seg(s: &str) -> String {
    // Service names are [A-Za-z0-9_-] and backends IPv4 addresses; escape anything else.
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

pub fn run(args: CtlArgs) -> anyhow::Result<()> {
    let token = args.token.as_deref().filter(|t| !t.is_empty());
    let svc_path = |s: &str| format!("/api/v1/services/{}", seg(s));
    let be_path = |s: &str, b: &str| format!("/api/v1/services/{}/backends/{}", seg(s), seg(b));
    let (method, path, body): (&str, String, Option<Value>) = match &args.cmd {
        CtlCmd::Services => ("GET", "/api/v1/services".into(), None),
        CtlCmd::Switches => ("GET", "/api/v1/switches".into(), None),
        CtlCmd::Connections { limit, cursor } => {
            let mut p = format!("/api/v1/connections?limit={limit}");
            if let Some(c) = cursor {
                p += &format!("&cursor={}", seg(c));
            }
            ("GET", p, None)
        }
        CtlCmd::Events => ("GET", "/api/v1/events".into(), None),
        CtlCmd::Status => ("GET", "/api/v1/status".into(), None),
        CtlCmd::Overload => ("GET", "/api/v1/overload".into(), None),
        CtlCmd::Drain { service, backend } => {
            ("POST", format!("{}/drain", be_path(service, backend)), None)
        }
        CtlCmd::Undrain { service, backend } => (
            "POST",
            format!("{}/undrain", be_path(service, backend)),
            None,
        ),
        CtlCmd::Weight {
            service,
            backend,
            weight,
        } => (
            "PUT",
            format!("{}/weight", be_path(service, backend)),
            Some(json!({ "weight": weight })),
        ),
        CtlCmd::Algorithm {
            service,
            name,
            threshold_rps,
        } => {
            let mut b = json!({ "algorithm": name });
            if let Some(t) = threshold_rps {
                b["threshold_rps"] = json!(t);
            }
            ("PUT", format!("{}/algorithm", svc_path(service)), Some(b))
        }
        CtlCmd::AddBackend {
            service,
            address,
            weight,
        } => {
            let mut b = json!({ "address": address });
            if let Some(w) = weight {
                b["weight"] = json!(w);
            }
            ("POST", format!("{}/backends", svc_path(service)), Some(b))
        }
        CtlCmd::RemoveBackend { service, address } => ("DELETE", be_path(service, address), None),
        CtlCmd::Reload => ("POST", "/api/v1/reload".into(), None),
    };
    if method != "GET" && token.is_none() {
        eprintln!(
            "flowgate ctl: warning: no token (--token or FLOWGATE_API_TOKEN); the API will refuse this change"
        );
    }
    let resp = request(&args.api, method, &path, token, body.as_ref())?;
    let value: Option<Value> = serde_json::from_str(&resp.body).ok();
    if resp.status >= 400 {
        let reason = value
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(Value::as_str)
            .unwrap_or(resp.body.trim());
        let mut msg = format!("{method} {path}: HTTP {}: {reason}", resp.status);
        if let Some(errs) = value
            .as_ref()
            .and_then(|v| v.get("errors"))
            .and_then(Value::as_array)
        {
            for e in errs {
                msg += &format!(
                    "\n  {}: {}",
                    e["path"].as_str().unwrap_or(""),
                    e["message"].as_str().unwrap_or("")
                );
            }
        }
        bail!(msg);
    }
    let Some(v) = value else {
        bail!("{method} {path}: the answer is not JSON: {}", resp.body);
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    match &args.cmd {
        CtlCmd::Services => print_services(&v),
        CtlCmd::Switches => print_switches(&v),
        CtlCmd::Connections { .. } => print_connections(&v),
        CtlCmd::Events => {
            let events = v.as_array().map(Vec::as_slice).unwrap_or_default();
            if events.is_empty() {
                println!("no events yet");
            }
            for e in events {
                println!(
                    "{:>10.3}s  {:<14} {}",
                    e["at_ms"].as_f64().unwrap_or(0.0) / 1000.0,
                    e["kind"].as_str().unwrap_or(""),
                    e["detail"].as_str().unwrap_or("")
                );
            }
        }
        CtlCmd::Status => {
            for (k, x) in v.as_object().into_iter().flatten() {
                println!("{k:<26} {}", plain(x));
            }
        }
        CtlCmd::Overload => print_overload(&v),
        _ => println!("{}", serde_json::to_string_pretty(&v)?),
    }
    Ok(())
}

/// A JSON value as a table cell: strings without their quotes (`Value`'s `Display`
/// writes JSON, and ignores a width).
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn opt(v: &Value, digits: usize) -> String {
    v.as_f64()
        .map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

fn print_services(v: &Value) {
    for s in v.as_array().into_iter().flatten() {
        // Connections whose backend stayed silent, given another (each counted twice in
        // the total), once there are any.
        let redispatched = s["counters"]["redispatched"]
            .as_u64()
            .filter(|&n| n > 0)
            .map(|n| format!(" ({n} redispatched)"))
            .unwrap_or_default();
        println!(
            "{}  vip {}:{}  mode {}  algorithm {}  connections {}{redispatched}{}",
            s["name"].as_str().unwrap_or("?"),
            s["vip"].as_str().unwrap_or("-"),
            plain(&s["port"]),
            s["mode"].as_str().unwrap_or("?"),
            s["algorithm"].as_str().unwrap_or("?"),
            plain(&s["counters"]["connections_total"]),
            if s["panic"] == true {
                "  PANIC: too few backends available, ejections waived"
            } else {
                ""
            }
        );
        println!(
            "  {:<16} {:>6} {:<9} {:<9} {:>7} {:>9} {:>8} {:>8} {:>9}  EJECTED BY",
            "BACKEND", "WEIGHT", "HEALTH", "STATE", "ACTIVE", "TOTAL", "RPS", "RT(ms)", "ANSWERED%"
        );
        for b in s["backends"].as_array().into_iter().flatten() {
            println!(
                "  {:<16} {:>6} {:<9} {:<9} {:>7} {:>9} {:>8} {:>8} {:>9}  {}",
                b["address"].as_str().unwrap_or("?"),
                plain(&b["weight"]),
                // As the dashboard: a backend not found on the network takes nothing.
                if b["located"] == false {
                    "unlocated"
                } else if b["healthy"] != true {
                    "down"
                } else if b["ejected"] == true {
                    // Passive outlier detection: out, or in use while the pool panics.
                    "ejected"
                } else {
                    "up"
                },
                b["state"].as_str().unwrap_or("?"),
                plain(&b["active_connections"]),
                plain(&b["connections_total"]),
                opt(&b["rps"], 1),
                opt(&b["response_time_ms"], 2),
                // The outlier detectors' last interval.
                opt(&b["success_rate_last_interval"], 1),
                b["ejected_by"].as_str().unwrap_or("-")
            );
        }
        // Removed from the pool, with connections still going to it until they end.
        for b in s["left_backends"].as_array().into_iter().flatten() {
            println!(
                "  {:<16} {:>6} {:<9} {:<9} {:>7}",
                b["address"].as_str().unwrap_or("?"),
                "-",
                "-",
                "removed",
                plain(&b["open_connections"])
            );
        }
    }
}

fn print_switches(v: &Value) {
    println!(
        "{:<18} {:>6} {:>6} {:>12} {:>8} {:>10} {:>8}  FULL PORTS",
        "DPID", "PORTS", "HOSTS", "CONNECTED(s)", "FLOWS", "PACKET_IN", "RTT(ms)"
    );
    for s in v.as_array().into_iter().flatten() {
        let ports = s["ports"].as_array().map(Vec::as_slice).unwrap_or_default();
        let hosts: u64 = ports.iter().filter_map(|p| p["hosts"].as_u64()).sum();
        // Ports at max_hosts_per_port: new hosts or addresses seen there are refused.
        let full: Vec<String> = ports
            .iter()
            .filter(|p| p["full"] == true)
            .map(|p| plain(&p["port_no"]))
            .collect();
        println!(
            "{:<18} {:>6} {:>6} {:>12} {:>8} {:>10} {:>8}  {}",
            s["dpid"].as_str().unwrap_or("?"),
            ports.len(),
            hosts,
            opt(&s["connected_secs"], 0),
            s["flow_count"]
                .as_u64()
                .map(|n| n.to_string())
                .unwrap_or_else(|| "-".into()),
            plain(&s["packet_in"]),
            // The control channel's round trip, where the switch is probed.
            opt(&s["channel_rtt_ms"], 1),
            if full.is_empty() {
                "-".to_string()
            } else {
                full.join(",")
            }
        );
    }
}

fn print_overload(v: &Value) {
    println!(
        "{:<16} {:<9} {:<8} {:>8} {:>6} {:>10} {:>10} {:>9}",
        "GATE", "MODE", "STATE", "GAP(ms)", "LOAD", "OFFERED/s", "ADMITTED/s", "REFUSED"
    );
    let row = |name: &str, g: &Value| {
        let state = match (g["mode"].as_str(), g["gapping"].as_bool()) {
            (Some("off"), _) => "-",
            (_, Some(true)) => "gapping",
            _ => "open",
        };
        println!(
            "{:<16} {:<9} {:<8} {:>8} {:>6} {:>10} {:>10} {:>9}",
            name,
            g["mode"].as_str().unwrap_or("?"),
            state,
            opt(&g["gap_ms"], 1),
            opt(&g["load"], 2),
            opt(&g["offered_rate"], 1),
            opt(&g["admitted_rate"], 1),
            plain(&g["refused_total"])
        );
    };
    row("controller", &v["controller"]);
    for s in v["services"].as_array().into_iter().flatten() {
        let name = format!("service {}", s["name"].as_str().unwrap_or("?"));
        if s["overload"].is_null() {
            println!("{name:<16} -");
        } else {
            row(&name, &s["overload"]);
        }
    }
}

fn print_connections(v: &Value) {
    println!("{} connection(s)", v["total"]);
    for b in v["per_backend"].as_array().into_iter().flatten() {
        println!(
            "  {}/{}: {}",
            b["service"].as_str().unwrap_or("?"),
            b["backend"].as_str().unwrap_or("?"),
            b["connections"]
        );
    }
    for c in v["items"].as_array().into_iter().flatten() {
        println!(
            "  {} -> {}{}",
            c["key"].as_str().unwrap_or("?"),
            c["backend"].as_str().unwrap_or("-"),
            if c["backend_in_pool"] == false {
                " (removed)"
            } else {
                ""
            }
        );
    }
    if let Some(n) = v["next"].as_str() {
        println!("more: --cursor {n}");
    }
}
