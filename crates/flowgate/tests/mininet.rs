//! Stock Mininet with flowgate as its remote controller: the equivalent of
//! `mn --switch ovs,datapath=user,protocols=OpenFlow13 --controller remote,ip=127.0.0.1,port=P
//! --topo single,4 --mac`, driven through Mininet's Python API.
//!
//! Mininet names its switch `s1` and its interfaces `s1-ethN`, globally and without a
//! prefix, so this test runs only when no bridge `s1` exists, and removes only what it made.
//! It never runs `mn -c`: that deletes every OVS bridge on the machine, other tests' included.

mod support;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use flowgate_testbed::{Ovs, Prefix, cleanup_stale, require_root_ovs};
use support::*;

const VIP: &str = "10.0.0.100";

/// The Mininet run: builds the network, pings, starts the backends, fetches the VIP 30 times
/// and prints `RESULT {json}` as its last line, whatever happened. Stops the network in a
/// `finally` block (net.stop(), never `mn -c`).
const SCRIPT: &str = r#"
import json, os, signal, sys, time, urllib.request
from functools import partial
from mininet.net import Mininet
from mininet.topo import SingleSwitchTopo
from mininet.node import OVSSwitch, RemoteController
from mininet.log import setLogLevel

port, flowgate, api, workdir = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
pidfile = os.path.join(workdir, 'pids')
VIP = '10.0.0.100'
setLogLevel('warning')
result = {'stage': 'build'}
net = None
httpd_pids = []

def note_pid(pid):
    with open(pidfile, 'a') as f:
        f.write('%d\n' % pid)

def backends_located():
    with urllib.request.urlopen('http://%s/api/v1/services' % api, timeout=5) as r:
        services = json.load(r)
    return all(b['located'] and b['healthy'] for s in services for b in s['backends'])

try:
    net = Mininet(topo=SingleSwitchTopo(4),
                  switch=partial(OVSSwitch, datapath='user', protocols='OpenFlow13'),
                  controller=None, autoSetMacs=True)
    net.addController(RemoteController('c0', ip='127.0.0.1', port=port))
    for h in net.hosts:
        note_pid(h.pid)
    result['stage'] = 'start'
    net.start()
    # The userspace datapath forwards what the veth hands it: with transmit checksum
    # offload on, the hosts' TCP segments leave with bad checksums.
    for h in net.hosts:
        h.cmd('ethtool -K %s tx off' % h.defaultIntf())
    result['connected'] = net.waitConnected(timeout=20)
    result['stage'] = 'pingall'
    result['warmup_dropped'] = net.pingAll(timeout=2)
    result['pingall_dropped'] = net.pingAll(timeout=2)

    result['stage'] = 'httpd'
    for h in net.hosts[1:]:
        out = h.cmd('%s httpd --listen %s:80 --name %s > %s/%s-httpd.log 2>&1 & echo $!'
                    % (flowgate, h.IP(), h.name, workdir, h.name))
        pid = int(out.strip().splitlines()[-1])
        httpd_pids.append(pid)
        note_pid(pid)
    for h in net.hosts[1:]:
        deadline = time.time() + 10
        while 'ok' not in h.cmd('curl -s -m 1 http://%s/health' % h.IP()) and time.time() < deadline:
            time.sleep(0.2)
    deadline = time.time() + 20
    while not backends_located():
        if time.time() > deadline:
            raise Exception('backends were never located by the controller')
        time.sleep(0.2)

    result['stage'] = 'http'
    h1 = net.get('h1')
    fetches = []
    for i in range(30):
        out = h1.cmd('curl -s -m 5 -w " %%{http_code}" http://%s/' % VIP).split()
        fetches.append({'code': int(out[-1]) if out and out[-1].isdigit() else 0,
                        'backend': out[0] if len(out) > 1 else None})
    result['fetches'] = fetches
    result['stage'] = 'done'
except Exception as e:
    result['error'] = '%s: %s' % (type(e).__name__, e)
finally:
    for pid in httpd_pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    if net is not None:
        try:
            net.stop()
        except Exception as e:
            result['stop_error'] = str(e)
    print('RESULT ' + json.dumps(result), flush=True)
"#;

/// A Python 3 that can `import mininet` (Debian's lives in /usr/bin; a pyenv `python3`
/// earlier on PATH cannot see it).
fn mininet_python() -> Option<String> {
    ["/usr/bin/python3", "python3"]
        .into_iter()
        .map(str::to_string)
        .find(|py| {
            Command::new(py)
                .args(["-c", "import mininet.net"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// Removes what the Mininet run left behind, if it was killed before `net.stop()`: the
/// processes it recorded, the `s1` bridge (which we checked did not exist before), and the
/// `s1-ethN` veths.
struct MininetLeftovers {
    pidfile: PathBuf,
}

impl Drop for MininetLeftovers {
    fn drop(&mut self) {
        for pid in std::fs::read_to_string(&self.pidfile)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok())
        {
            // Only our own: the Mininet host shells (mnexec/bash) and the flowgate httpds.
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline);
            if cmdline.contains("mininet:") || cmdline.contains("httpd") || cmdline.contains("bash")
            {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        }
        let _ = Command::new("ovs-vsctl")
            .args(["--timeout=30", "--if-exists", "del-br", "s1"])
            .status();
        for i in 1..=4 {
            let l = format!("s1-eth{i}");
            if Path::new(&format!("/sys/class/net/{l}")).exists() {
                let _ = Command::new("ip").args(["link", "del", &l]).status();
            }
        }
    }
}

#[test]
fn ovs_mininet_remote_controller() {
    let name = "ovs_mininet_remote_controller";
    if !require_root_ovs(name) {
        return;
    }
    cleanup_stale(Prefix::for_test(name).as_str()).expect("clean leftovers");
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    let Some(python) = mininet_python() else {
        assert!(
            !ci,
            "{name}: CI is set but no python3 can import mininet (install the `mininet` package)"
        );
        eprintln!(
            "SKIPPED {name}: no python3 can `import mininet` (install the `mininet` package)"
        );
        return;
    };
    let bridges = Ovs::list_bridges().expect("list bridges");
    if bridges.iter().any(|b| b == "s1") {
        assert!(
            !ci,
            "{name}: a bridge named s1 already exists (another Mininet run?); Mininet would delete it"
        );
        eprintln!(
            "SKIPPED {name}: a bridge named s1 already exists; Mininet's unprefixed names would clash with it"
        );
        return;
    }

    let backends: Vec<std::net::Ipv4Addr> = (2..=4)
        .map(|i| std::net::Ipv4Addr::new(10, 0, 0, i))
        .collect();
    let ctl = Ctl::start("mininet", &vip_config(VIP, "round-robin", &backends, ""));
    let script = ctl.dir.join("mn_run.py");
    std::fs::write(&script, SCRIPT).expect("write script");
    let pidfile = ctl.dir.join("pids");
    let _leftovers = MininetLeftovers { pidfile };

    let mut child = Command::new(&python)
        .arg(&script)
        .arg(ctl.openflow.port().to_string())
        .arg(FLOWGATE)
        .arg(ctl.api.to_string())
        .arg(&ctl.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("run python3");
    // Drain both pipes on threads so a chatty Mininet can't block on a full pipe.
    let mut so = child.stdout.take().expect("stdout");
    let mut se = child.stderr.take().expect("stderr");
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(st) = child.try_wait().expect("wait python") {
            break Some(st);
        }
        if Instant::now() > deadline {
            // The whole process group: python and the shells it ran in the foreground.
            let _ = Command::new("kill")
                .args(["-9", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    assert!(
        status.is_some(),
        "the Mininet run timed out after 180 s\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| {
            panic!("no RESULT line ({status:?})\nstdout:\n{stdout}\nstderr:\n{stderr}")
        });
    let r: serde_json::Value = serde_json::from_str(line).expect("RESULT is JSON");
    let ctx = format!("result: {r}\nstderr:\n{stderr}");

    assert!(r.get("error").is_none(), "the Mininet run failed: {ctx}");
    assert_eq!(r["stage"], "done", "{ctx}");
    assert_eq!(r["connected"], true, "s1 connected to flowgate: {ctx}");
    assert_eq!(
        r["pingall_dropped"].as_f64(),
        Some(0.0),
        "pingall: 0% dropped: {ctx}"
    );
    let fetches = r["fetches"].as_array().expect("fetches");
    assert_eq!(fetches.len(), 30, "{ctx}");
    assert!(
        fetches.iter().all(|f| f["code"] == 200),
        "every fetch of the VIP is HTTP 200: {ctx}"
    );
    let mut used: Vec<&str> = fetches
        .iter()
        .filter_map(|f| f["backend"].as_str())
        .collect();
    used.sort_unstable();
    used.dedup();
    assert_eq!(used, ["h2", "h3", "h4"], "all three backends served: {ctx}");
    assert!(r.get("stop_error").is_none(), "net.stop() failed: {ctx}");

    let services = ctl.get_json("/api/v1/services");
    let total: u64 = services[0]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| b["connections_total"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        total >= 30,
        "the controller balanced every connection: {services}"
    );
    ctl.assert_no_openflow_errors();
    // net.stop() removed the switch.
    assert!(
        !Ovs::list_bridges()
            .expect("list bridges")
            .iter()
            .any(|b| b == "s1"),
        "net.stop() removed s1"
    );
}
