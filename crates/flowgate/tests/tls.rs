//! The OpenFlow channel over TLS, as Open vSwitch does it: an `ssl:` controller target,
//! certificates on both sides (OVS always presents its own), each checked against one CA.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use flowgate_testbed::ovs::vsctl;
use flowgate_testbed::topo::{self, TopoOptions};
use flowgate_testbed::{Prefix, ScratchDir, cleanup_stale, require_root_ovs};
use support::*;

const VIP: &str = "10.0.0.100";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, and a controller and a switch certificate it signed (EC P-256, X.509 v3 with the
/// extensions webpki insists on: the CA is a CA, the leaves are not and say what they are for).
fn make_pki(dir: &Path) {
    std::fs::write(
        dir.join("ext.cnf"),
        "[controller]\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n\
         [switch]\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth,serverAuth\n",
    )
    .expect("ext.cnf");
    let ec = ["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"];
    for name in ["ca", "controller", "switch"] {
        let key = format!("{name}-key.pem");
        let mut a = vec!["genpkey"];
        a.extend_from_slice(&ec);
        a.extend_from_slice(&["-out", &key]);
        openssl(dir, &a);
    }
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca-key.pem",
            "-subj",
            "/CN=flowgate test CA",
            "-days",
            "2",
            "-config",
            "/dev/null",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca-cert.pem",
        ],
    );
    for (name, cn) in [
        ("controller", "/CN=flowgate controller"),
        ("switch", "/CN=flowgate test switch"),
    ] {
        let (key, csr, cert) = (
            format!("{name}-key.pem"),
            format!("{name}.csr"),
            format!("{name}-cert.pem"),
        );
        openssl(
            dir,
            &[
                "req",
                "-new",
                "-key",
                &key,
                "-subj",
                cn,
                "-config",
                "/dev/null",
                "-out",
                &csr,
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                "ext.cnf",
                "-extensions",
                name,
                "-out",
                &cert,
            ],
        );
    }
}

/// Restores this ovs-vswitchd's SSL settings (global to the daemon) on drop.
struct SslGuard {
    previous: Option<(String, String, String)>,
}

impl SslGuard {
    fn set(key: &Path, cert: &Path, ca: &Path) -> SslGuard {
        let previous = match vsctl(&["get", "Open_vSwitch", ".", "ssl"])
            .expect("get ssl")
            .trim()
        {
            "" | "[]" => None,
            uuid => {
                let field = |f: &str| {
                    vsctl(&["get", "SSL", uuid, f])
                        .expect("get ssl field")
                        .trim()
                        .trim_matches('"')
                        .to_string()
                };
                Some((field("private_key"), field("certificate"), field("ca_cert")))
            }
        };
        let guard = SslGuard { previous };
        let s = |p: &Path| p.to_str().expect("utf-8 path").to_string();
        vsctl(&["set-ssl", &s(key), &s(cert), &s(ca)]).expect("ovs-vsctl set-ssl");
        guard
    }
}

impl Drop for SslGuard {
    fn drop(&mut self) {
        let r = match &self.previous {
            None => vsctl(&["del-ssl"]),
            Some((k, c, ca)) => vsctl(&["set-ssl", k, c, ca]),
        };
        if let Err(e) = r {
            eprintln!("could not restore the OVS SSL settings: {e}");
        }
    }
}

#[test]
fn ovs_tls_openflow_channel() {
    let name = "ovs_tls_openflow_channel";
    if !require_root_ovs(name) {
        return;
    }
    let p = Prefix::for_test(name);
    cleanup_stale(p.as_str()).expect("clean leftovers");
    let pki = ScratchDir::new("it-tls-pki").expect("pki dir");
    make_pki(&pki);
    let f = |n: &str| pki.join(n).display().to_string();

    let t = topo::single(&TopoOptions::new(p.as_str()), 3).expect("topology");
    let backends: Vec<_> = t.hosts[1..].iter().map(|h| h.ip()).collect();
    let tls = format!(
        "[openflow.tls]\ncert = \"{}\"\nkey = \"{}\"\nca = \"{}\"\n\n[api]\n",
        f("controller-cert.pem"),
        f("controller-key.pem"),
        f("ca-cert.pem")
    );
    let cfg = vip_config(VIP, "round-robin", &backends, "").replacen("[api]\n", &tls, 1);
    let ctl = Ctl::start("tls", &cfg);
    // The listener is TLS.
    ctl.wait_log("tls=true", Duration::from_secs(5));

    let _ssl = SslGuard::set(
        &pki.join("switch-key.pem"),
        &pki.join("switch-cert.pem"),
        &pki.join("ca-cert.pem"),
    );
    let bridge = &t.bridges[0];
    bridge
        .set_controller(&[format!("ssl:{}", ctl.openflow)])
        .expect("set controller");
    if let Err(e) = bridge.wait_connected(Duration::from_secs(20)) {
        let status = vsctl(&["list", "controller"]).unwrap_or_default();
        let vlog =
            std::fs::read_to_string("/var/log/openvswitch/ovs-vswitchd.log").unwrap_or_default();
        let tail: Vec<&str> = vlog.lines().rev().take(30).collect();
        panic!(
            "{e}\ncontroller rows:\n{status}\novs-vswitchd.log (last lines, newest first):\n{}\ncontroller log:\n{}",
            tail.join("\n"),
            ctl.log_plain()
        );
    }
    let _servers: Vec<_> = t.hosts[1..]
        .iter()
        .enumerate()
        .map(|(i, h)| httpd(h, &format!("b{}", i + 2), &[]))
        .collect();
    ctl.wait_backends_ready(Duration::from_secs(15));
    let report = load(
        &t.hosts[0],
        &format!("http://{VIP}/"),
        &["--requests", "60", "--concurrency", "2"],
    );
    assert_eq!(
        report["ok"], 60,
        "every request through the VIP, rules installed over TLS: {report}"
    );
    assert_eq!(shares(&report).len(), 2, "both backends served: {report}");

    // The switch's session really is the TLS one, and the switch's certificate was checked.
    let log = ctl.log_plain();
    assert!(
        log.contains("dpid=0000000000000001"),
        "the switch connected over TLS:\n{log}"
    );
    let flows = bridge.dump_flows().expect("dump-flows");
    assert!(
        flows.contains("set_field:10.0.0.2->ip_dst")
            || flows.contains("set_field:10.0.0.3->ip_dst"),
        "rewrite rules arrived over TLS:\n{flows}"
    );
    ctl.assert_no_openflow_errors();
    drop(_ssl);
}
