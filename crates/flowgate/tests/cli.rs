//! The binary's offline subcommands: config validation and the codec tools.

use std::path::{Path, PathBuf};
use std::process::Command;

use flowgate_testbed::ScratchDir;

const FLOWGATE: &str = env!("CARGO_BIN_EXE_flowgate");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn conformance_dir() -> PathBuf {
    std::env::var_os("FLOWGATE_CONFORMANCE_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("crates/ofp/tests/data/ryu-of13"))
}

fn run(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(FLOWGATE)
        .args(args)
        .output()
        .expect("run flowgate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_examples_are_valid_configs() {
    for f in ["examples/flowgate.toml", "examples/mininet.toml"] {
        let path = repo().join(f);
        let (ok, out, err) = run(&["controller", "--config", path.to_str().unwrap(), "--check"]);
        assert!(ok, "{f}: {out}{err}");
        assert!(out.contains("OK"), "{out}");
    }
}

/// The controller configs the lab writes are ones the controller takes: every arm of the
/// paper's cases and of the faults scenario (quick and full sizes) and of the overload
/// scenario, its ablation (`ceiling = false`) among them.
#[test]
fn the_labs_controller_configs_are_valid() {
    use flowgate_lab::{ctl, overload, scenario};
    let dir = ScratchDir::new("cli-lab").expect("temp dir");
    let mut configs = Vec::new();
    for quick in [true, false] {
        for sc in scenario::all().into_iter().filter(|s| s.name != "overload") {
            let p = scenario::Params::for_scenario(sc.name, quick);
            for arm in &sc.arms {
                configs.push((
                    format!("{}-{}-{quick}", sc.name, arm.label),
                    ctl::config(arm, &p, 1),
                ));
            }
        }
    }
    let op = overload::OverloadParams::new(false);
    let backends = ["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()];
    for arm in scenario::OVERLOAD_ARMS {
        assert!(op.modes.contains(&arm), "{arm}");
        configs.push((
            format!("overload-{arm}"),
            overload::config(&backends, arm, 19.5, &op),
        ));
    }
    for (name, text) in configs {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(&path, &text).unwrap();
        let (ok, out, err) = run(&["controller", "--config", path.to_str().unwrap(), "--check"]);
        assert!(ok, "{name}: {out}{err}\n{text}");
    }
}

#[test]
fn a_bad_config_reports_every_error_and_starts_nothing() {
    let dir = ScratchDir::new("cli").expect("temp dir");
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[openflow]\nlisten = \"x\"\nfoo = 1\n[[service]]\nname = \"a b\"\nport = 0\n",
    )
    .unwrap();
    // Without --check too: a bad config must not start the controller.
    let (ok, _, err) = run(&["controller", "--config", path.to_str().unwrap()]);
    assert!(!ok);
    for want in [
        "openflow.listen",
        "openflow.foo: unknown key",
        "service[0].name",
        "service[0].port",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

/// `--check` loads what a start would load besides the file: a TLS certificate that
/// cannot be read fails the check, as it would fail the start.
#[test]
fn check_reads_the_tls_files_a_start_reads() {
    let dir = ScratchDir::new("cli-tls").expect("temp dir");
    let path = dir.join("tls.toml");
    let cert = dir.join("missing-cert.pem");
    std::fs::write(
        &path,
        format!(
            "[openflow.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.display(),
            dir.join("missing-key.pem").display()
        ),
    )
    .unwrap();
    let (ok, out, err) = run(&["controller", "--config", path.to_str().unwrap(), "--check"]);
    assert!(!ok, "{out}");
    assert!(err.contains("openflow.tls.cert: cannot open"), "{err}");
}

#[test]
fn ofp_roundtrip_accepts_every_conformance_message() {
    let dir = conformance_dir();
    let mut files: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "packet"))
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert!(files.len() > 70, "conformance files found: {}", files.len());
    let mut args = vec!["ofp", "roundtrip"];
    args.extend(files.iter().map(String::as_str));
    let (ok, out, err) = run(&args);
    assert!(ok, "roundtrip failed:\n{out}{err}");
    let mut args = vec!["ofp", "decode"];
    args.extend(files.iter().map(String::as_str));
    let (ok, out, err) = run(&args);
    assert!(ok, "{err}");
    assert_eq!(
        out.lines().count(),
        files.len(),
        "one JSON line per message"
    );
    for line in out.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
        assert!(
            v["message"].is_object() || v["message"].is_string(),
            "{line}"
        );
    }
}

#[test]
fn ofp_tools_reject_garbage_without_panicking() {
    let dir = ScratchDir::new("cli-g").expect("temp dir");
    let cases: [(&str, &[u8]); 4] = [
        ("empty", b""),
        ("garbage", b"\xde\xad\xbe\xef not openflow at all"),
        ("short-length", &[4, 0, 0, 4, 0, 0, 0, 1]),
        ("truncated", &[4, 14, 0, 200, 0, 0, 0, 1, 0, 0]),
    ];
    for (name, bytes) in cases {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        for sub in ["decode", "roundtrip"] {
            let (ok, out, err) = run(&["ofp", sub, p.to_str().unwrap()]);
            assert!(!ok, "{sub} {name} must fail");
            assert!(!err.contains("panicked"), "{sub} {name} panicked: {err}");
            if sub == "roundtrip" {
                assert!(out.contains(name), "roundtrip names the bad file: {out}");
            }
        }
    }
}

/// `flowgate sim --quick`: every algorithm and overload control asked for is run, the
/// table printed and written with the plots; the numbers are the simulator's (its own
/// tests check what they mean).
#[test]
fn sim_quick_runs_the_matrix_and_writes_tables_and_plots() {
    let dir = ScratchDir::new("sim").expect("temp dir");
    let (ok, out, err) = run(&[
        "sim",
        "--quick",
        "--algorithms",
        "round-robin,isslm",
        "--overload",
        "off,adaptive",
        "--loads",
        "0.5,1.3",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| round-robin") || l.starts_with("| isslm"))
        .collect();
    assert_eq!(
        rows.len(),
        8,
        "2 algorithms × 2 controls × 2 phases:\n{out}"
    );
    for f in [
        "sim.md",
        "sim.csv",
        "sim.json",
        "served.svg",
        "p99.svg",
        "imbalance.svg",
    ] {
        let len = std::fs::metadata(dir.join(f)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 100, "{f}: {len} bytes");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sim.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().map(Vec::len), Some(4));
    // A bad argument is refused with its reason, and nothing is run.
    let (ok, _, err) = run(&["sim", "--quick", "--overload", "sometimes"]);
    assert!(!ok);
    assert!(err.contains("overload \"sometimes\""), "{err}");
    let (ok, _, err) = run(&[
        "sim",
        "--quick",
        "--outliers",
        "sometimes",
        "--faulty",
        "99",
        "--redispatch",
        "maybe",
    ]);
    assert!(!ok);
    assert!(err.contains("outlier \"sometimes\""), "{err}");
    assert!(err.contains("redispatch \"maybe\": on or off"), "{err}");
    assert!(err.contains("faulty: 99 servers of 16"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `flowgate sim --faulty`: a run per outlier detection and redispatch asked for, and the
/// outlier table (printed, and in `outliers.csv`) beside the main one.
#[test]
fn sim_with_a_faulty_server_tables_its_ejections() {
    let dir = ScratchDir::new("sim-faulty").expect("temp dir");
    let (ok, out, err) = run(&[
        "sim",
        "--quick",
        "--algorithms",
        "round-robin",
        "--overload",
        "off",
        "--outliers",
        "off,success-rate",
        "--redispatch",
        "on,off",
        "--faulty",
        "1",
        "--idle-timeout-secs",
        "4",
        "--loads",
        "0.5",
        "--out",
        dir.to_str().unwrap(),
    ]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("Faulty servers: 1 of 16"), "{out}");
    let rows: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("| round-robin | off | "))
        .collect();
    // Four runs' rows in the main table and four in the outlier table.
    assert_eq!(rows.len(), 8, "{out}");
    let csv = std::fs::read_to_string(dir.join("outliers.csv")).expect("outliers.csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 5, "{csv}");
    assert!(lines[0].starts_with(
        "algorithm,overload,outlier,redispatch,load,to faulty servers %,dropped by them %,\
         redispatched %"
    ));
    for (line, start) in lines[1..].iter().zip([
        "round-robin,off,off,on,0.50,",
        "round-robin,off,off,off,0.50,",
        "round-robin,off,success-rate,on,0.50,",
        "round-robin,off,success-rate,off,0.50,",
    ]) {
        assert!(line.starts_with(start), "{start}: {csv}");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sim.json")).unwrap()).unwrap();
    assert_eq!(json["runs"][0]["faulty"], serde_json::json!([8]));
    assert_eq!(json["runs"][0]["ejections"], serde_json::json!([]));
    assert_eq!(json["runs"][0]["redispatch"], true);
    assert_eq!(json["runs"][1]["redispatch"], false);
    let _ = std::fs::remove_dir_all(&dir);
}
