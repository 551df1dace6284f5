//! The controller: the real `flowgate controller` process, its config, and its API.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use flowgate_testbed::ProcGuard;

use crate::net::SERVERS;
use crate::scenario::{Arm, Params};

/// The start of every lab controller's config: it binds port 0 and reports the ports it
/// got in its ready file ([`Controller::openflow`]); a port chosen here and bound later
/// could be taken by another process in between.
pub const LISTEN_ANY_PORT: &str =
    "[openflow]\nlisten = \"127.0.0.1:0\"\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n";

/// The controller config for one arm. Services have no VIP: clients address a backend
/// (server 2) and the controller intercepts each new connection to any backend (the
/// paper's Cases A and B; Case D uses the same semantics for every algorithm).
pub fn config(arm: &Arm, p: &Params, seed: u64) -> String {
    let algorithm = arm.algorithm;
    let mut c = format!(
        "{LISTEN_ANY_PORT}\
[controller]\nidle_timeout_secs = 10\nseed = {seed}\n\n\
[[service]]\nname = \"web\"\nport = 80\nalgorithm = \"{algorithm}\"\n"
    );
    if algorithm == "isslm" {
        // The paper's test as it is written, "request load >= S_Load", with no latch
        // (the controller's default hysteresis keeps a server over down to 0.9 S_Load).
        c += &format!("threshold_rps = {:.1}\nhysteresis = 0\n", p.threshold_rps());
    }
    if !arm.silences.redispatch {
        c += "redispatch = false\n";
    }
    // Probes through the controller's root leg: an ordinary GET / that waits for a
    // concurrency slot like any request, so its time is the server's response time under
    // load (SRT, MRBS, AMLOB and ISSLM's third search use it).
    c += "\n[service.health]\nkind = \"http\"\npath = \"/\"\ninterval_ms = 100\ntimeout_ms = 1000\nrise = 1\nfall = 3\n";
    if !arm.silences.eject {
        // Every detector off (the rate detectors need five backends, the lab has four:
        // off by their minimum already, and here by name too).
        c += "\n[service.outlier]\nconsecutive_failures = 0\nsuccess_rate = false\n";
    }
    // Every arm is told each server's real capacity μ (the emulated servers' concurrency
    // over their service time), the same information for every algorithm: DWRS's load is
    // `rate / capacity_rps` (and MRBS's utilisation feature, the servers reporting no
    // CPU); none, ISSLM, AMLOB, SRT and round robin do not read it.
    for s in SERVERS {
        c += &format!(
            "\n[[service.backend]]\naddress = \"{s}\"\ncapacity_rps = {:.1}\n",
            p.capacity_rps()
        );
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every arm's config gives each backend the servers' capacity, the same for all.
    #[test]
    fn every_arm_knows_the_servers_capacity() {
        for quick in [true, false] {
            let p = Params::new(quick);
            let want = format!("capacity_rps = {:.1}\n", p.capacity_rps());
            for arm in crate::scenario::all().iter().flat_map(|s| &s.arms) {
                let text = config(arm, &p, 1);
                assert_eq!(
                    text.matches("capacity_rps").count(),
                    SERVERS.len(),
                    "{text}"
                );
                assert_eq!(text.matches(&want).count(), SERVERS.len(), "{text}");
            }
        }
    }

    /// An arm that neither ejects nor redispatches says so; the defaults say nothing.
    #[test]
    fn an_arms_handling_of_silences_is_in_its_config() {
        let p = Params::for_scenario("faults", true);
        let sc = crate::scenario::find("faults").expect("faults");
        let texts: Vec<(bool, bool)> = sc
            .arms
            .iter()
            .map(|a| config(a, &p, 1))
            .map(|t| {
                (
                    t.contains("consecutive_failures = 0\nsuccess_rate = false\n"),
                    t.contains("redispatch = false\n"),
                )
            })
            .collect();
        // neither, eject, redispatch, both: (no ejection, no redispatch) in the text.
        assert_eq!(
            texts,
            [(true, true), (false, true), (true, false), (false, false)]
        );
    }
}

/// A running controller. Killed (SIGTERM, then SIGKILL) on drop.
#[derive(Debug)]
pub struct Controller {
    proc: ProcGuard,
    /// The OpenFlow listening address (from the ready file: right even for port 0).
    pub openflow: SocketAddr,
    /// The API address.
    pub api: SocketAddr,
}

impl Controller {
    /// Writes `config` to `dir/NAME.toml` and starts `flowgate controller` with it.
    pub fn start(flowgate: &Path, dir: &Path, name: &str, config: &str) -> Result<Controller> {
        std::fs::create_dir_all(dir)?;
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(&cfg, config)?;
        let ready = dir.join(format!("{name}.ready.json"));
        let _ = std::fs::remove_file(&ready);
        let mut cmd = Command::new(flowgate);
        cmd.args(["--log", "info", "controller", "--config"])
            .arg(&cfg)
            .arg("--ready-file")
            .arg(&ready)
            .stdin(Stdio::null());
        let mut proc = ProcGuard::spawn(cmd, &format!("lab-controller-{name}"))?;
        let deadline = Instant::now() + Duration::from_secs(20);
        let (openflow, api) = loop {
            if let Ok(text) = std::fs::read_to_string(&ready) {
                let v: serde_json::Value = serde_json::from_str(&text)?;
                let addr = |key: &str| -> Result<SocketAddr> {
                    Ok(v[key]
                        .as_str()
                        .ok_or_else(|| anyhow!("ready file without {key}"))?
                        .parse()?)
                };
                break (addr("openflow")?, addr("api")?);
            }
            if let Some(st) = proc.try_wait()? {
                bail!("controller exited ({st}):\n{}", proc.output());
            }
            if Instant::now() > deadline {
                bail!("controller not ready in 20 s:\n{}", proc.output());
            }
            crate::signal::sleep(Duration::from_millis(50))?;
        };
        Ok(Controller {
            proc,
            openflow,
            api,
        })
    }

    /// Writes everything it logged so far to `logs/controller-NAME.log`, the run's own
    /// folder (its log under the temporary folder goes when it stops), and returns that
    /// file's path.
    pub fn save_log(&self, logs: &Path, name: &str) -> PathBuf {
        let path = logs.join(format!("controller-{name}.log"));
        if let Err(e) = std::fs::write(&path, self.output()) {
            eprintln!("lab: cannot write {}: {e}", path.display());
        }
        path
    }

    /// `tcp:IP:PORT`, the controller target to give OVS.
    pub fn target(&self) -> String {
        format!("tcp:{}", self.openflow)
    }

    /// Everything the controller logged.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Its process id (also its process group's: it is spawned as a group leader).
    pub fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Stops it (SIGTERM, then SIGKILL).
    pub fn stop(&mut self) {
        self.proc.kill();
    }

    /// `GET /api/v1/services` as JSON.
    pub fn services(&self) -> Result<serde_json::Value> {
        let body = http_get(self.api, "/api/v1/services")?;
        Ok(serde_json::from_str(&body)?)
    }

    /// Waits until every backend is located and healthy.
    pub fn wait_backends_ready(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.services();
            if let Ok(v) = &v {
                let ready = v
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|s| s["backends"].as_array().cloned().unwrap_or_default())
                    .all(|b| b["located"] == true && b["healthy"] == true);
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "backends not located and healthy within {timeout:?}: {v:?}\n{}",
                    self.output()
                );
            }
            crate::signal::sleep(Duration::from_millis(100))?;
        }
    }

    /// Per-backend `connections_total` (in server order) and the service counters.
    pub fn snapshot(&self) -> Result<Snapshot> {
        let v = self.services()?;
        let s = &v[0];
        let mut conns = [0u64; 4];
        let mut rt = [None; 4];
        let mut outcomes = [0u64; 2];
        for b in s["backends"].as_array().into_iter().flatten() {
            outcomes[0] += b["connections_answered_total"].as_u64().unwrap_or(0);
            outcomes[1] += b["connections_unanswered_total"].as_u64().unwrap_or(0);
            let addr: std::net::Ipv4Addr = b["address"].as_str().unwrap_or("").parse()?;
            if let Some(i) = SERVERS.iter().position(|s| *s == addr) {
                conns[i] = b["connections_total"].as_u64().unwrap_or(0);
                rt[i] = b["response_time_ms"].as_f64();
            }
        }
        let (silences_excused, unjudged) = self.outlier_metrics()?;
        Ok(Snapshot {
            conns,
            response_time_ms: rt,
            no_optimal_server: s["counters"]["no_optimal_server"].as_u64().unwrap_or(0),
            isslm_moves: ["request_load", "connections", "response_time"]
                .map(|k| s["counters"]["isslm_moves"][k].as_u64().unwrap_or(0)),
            refused: s["counters"]["refused_no_backend"].as_u64().unwrap_or(0),
            ejections: s["counters"]["ejections"].as_u64().unwrap_or(0),
            panics: s["counters"]["panics"].as_u64().unwrap_or(0),
            redispatched: s["counters"]["redispatched"].as_u64().unwrap_or(0),
            silences_excused,
            outcomes: [outcomes[0], outcomes[1], unjudged],
        })
    }

    /// Silences passive outlier detection excused, by reason (answered later, switch
    /// behind), and the outcome rules that ended without a verdict (both reasons
    /// together), from one read of the controller's `/metrics`.
    fn outlier_metrics(&self) -> Result<([u64; 2], u64)> {
        let body = http_get(self.api, "/metrics")?;
        let counter = |family: &str, reason: &str| {
            let name = format!("{family}{{reason=\"{reason}\"}}");
            body.lines()
                .find_map(|l| {
                    l.strip_prefix(name.as_str())?
                        .strip_prefix(' ')?
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .ok_or_else(|| anyhow!("no {name} in /metrics"))
        };
        let excused = "flowgate_outlier_silences_excused_total";
        let unjudged = "flowgate_outlier_outcomes_unjudged_total";
        Ok((
            [
                counter(excused, "answered_later")?,
                counter(excused, "switch_behind")?,
            ],
            counter(unjudged, "connection_unknown")?
                + counter(unjudged, "too_short")?
                + counter(unjudged, "before_ejection")?,
        ))
    }
}

/// The controller's counters at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Snapshot {
    /// New connections assigned to each server so far.
    pub conns: [u64; 4],
    /// Each server's response-time average (ms) from the probes.
    pub response_time_ms: [Option<f64>; 4],
    /// ISSLM searches that found no optimal server.
    pub no_optimal_server: u64,
    /// ISSLM's moves, by the search that found the target: request load, connections,
    /// response time.
    pub isslm_moves: [u64; 3],
    /// Connections refused for want of a backend.
    pub refused: u64,
    /// Backends ejected by passive outlier detection.
    pub ejections: u64,
    /// Times the pool went into panic (its ejections waived).
    pub panics: u64,
    /// Connections given another backend at their client's SYN, their own having stayed
    /// silent (`redispatch`).
    pub redispatched: u64,
    /// Silences of backends not judged: the backend answered a later connection, or a
    /// switch on their way was behind.
    pub silences_excused: [u64; 2],
    /// Connections passive outlier detection judged, the pool's backends together:
    /// answered, and not; and the outcome rules that ended without a verdict (the
    /// controller's, every service's: the lab runs one).
    pub outcomes: [u64; 3],
}

/// A minimal HTTP/1.1 GET over loopback.
pub fn http_get(addr: SocketAddr, path: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(3)).context("API")?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut resp = Vec::new();
    s.read_to_end(&mut resp)?;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("bad HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("GET {path}: {head}");
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        let mut out = String::new();
        let mut rest = body;
        while let Some((len, after)) = rest.split_once("\r\n") {
            let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
            if n == 0 || after.len() < n {
                break;
            }
            out += &after[..n];
            rest = after[n..].trim_start_matches("\r\n");
        }
        return Ok(out);
    }
    Ok(body.to_owned())
}
