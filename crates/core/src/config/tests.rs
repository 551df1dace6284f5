use super::*;

fn no_env(_: &str) -> Option<String> {
    None
}

const EXAMPLE: &str = r#"
[openflow]
listen = "127.0.0.1:6653"

[api]
listen = "127.0.0.1:8080"

[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "round-robin"

[[service.backend]]
address = "10.0.0.2"

[[service.backend]]
address = "10.0.0.3"
"#;

#[test]
fn the_documented_example_is_valid() {
    let cfg = Config::from_toml(EXAMPLE, &no_env).expect("valid");
    assert_eq!(cfg.openflow.listen, "127.0.0.1:6653".parse().unwrap());
    assert_eq!(cfg.services.len(), 1);
    let s = &cfg.services[0];
    assert_eq!(s.vip, Some("10.0.0.100".parse().unwrap()));
    assert_eq!(s.port, 80);
    assert_eq!(s.algorithm, AlgorithmKind::RoundRobin);
    assert_eq!(s.backends.len(), 2);
    assert_eq!(s.idle_timeout_secs, 30);
    assert!(cfg.api.token.is_none());
}

#[test]
fn every_error_is_reported_with_its_path() {
    let text = r#"
[openflow]
listen = "nowhere"
colour = "blue"

[[service]]
name = "web"
vip = "10.0.0.300"
port = 70000
algorithm = "fastest"

[[service.backend]]
address = "10.0.0.2"
wieght = 3

[[service.backend]]
address = "10.0.0.2"
"#;
    let errs = Config::from_toml(text, &no_env).expect_err("invalid").0;
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "openflow.listen",
        "openflow.colour",
        "service[0].vip",
        "service[0].port",
        "service[0].algorithm",
        "service[0].backend[0].wieght",
        "service[0].backend[1].address",
    ] {
        assert!(paths.contains(&want), "missing {want} in {paths:?}");
    }
}

#[test]
fn a_syntax_error_names_its_line() {
    let errs = Config::from_toml("[openflow]\nlisten = \n", &no_env)
        .expect_err("invalid")
        .0;
    assert_eq!(errs.len(), 1);
    assert!(errs[0].path.starts_with("line "), "{errs:?}");
}

#[test]
fn a_vip_must_be_its_own_address() {
    let text = r#"
[[service]]
name = "a"
vip = "10.0.0.2"
port = 80
[[service.backend]]
address = "10.0.0.3"

[[service]]
name = "b"
vip = "10.0.0.9"
port = 80
[[service.backend]]
address = "10.0.0.2"
"#;
    let errs = Config::from_toml(text, &no_env).expect_err("invalid").0;
    assert!(
        errs.iter()
            .any(|e| e.path == "service[0].vip" && e.message.contains("backend")),
        "{errs:?}"
    );
}

#[test]
fn isslm_needs_a_threshold_and_none_target_must_be_a_backend() {
    let text = r#"
[[service]]
name = "a"
vip = "10.0.0.100"
port = 80
algorithm = "isslm"
none_target = "10.0.0.7"
[[service.backend]]
address = "10.0.0.3"
"#;
    let errs = Config::from_toml(text, &no_env).expect_err("invalid").0;
    assert!(
        errs.iter().any(|e| e.path == "service[0].algorithm"),
        "{errs:?}"
    );
    assert!(
        errs.iter().any(|e| e.path == "service[0].none_target"),
        "{errs:?}"
    );
}

#[test]
fn the_token_comes_from_the_environment_when_the_file_has_none() {
    let env = |k: &str| (k == DEFAULT_TOKEN_ENV).then(|| "0123456789abcdef0123".to_string());
    let cfg = Config::from_toml(EXAMPLE, &env).expect("valid");
    assert_eq!(cfg.api.token.as_deref(), Some("0123456789abcdef0123"));
    let short = Config::from_toml("[api]\ntoken = \"abc\"\n", &no_env)
        .expect_err("too short")
        .0;
    assert_eq!(short[0].path, "api.token");
}

#[test]
fn services_without_a_vip_intercept_their_backends() {
    let text = r#"
[[service]]
name = "direct"
port = 80
algorithm = "isslm"
threshold_rps = 50
[[service.backend]]
address = "100.0.0.1"
[[service.backend]]
address = "100.0.0.2"
"#;
    let cfg = Config::from_toml(text, &no_env).expect("valid");
    assert_eq!(cfg.services[0].vip, None);
    assert_eq!(cfg.services[0].params.threshold_rps, Some(50.0));
}

#[test]
fn a_choice_key_takes_its_names_and_a_wrong_one_is_told_every_name() {
    let config = |unknown_flow: &str, mode: &str, kind: &str, preset: &str| {
        // The service's own keys go before its backends.
        let service = EXAMPLE.replacen("port = 80\n", &format!("port = 80\nmode = {mode:?}\n"), 1);
        format!(
            "[controller]\nunknown_flow = {unknown_flow:?}\n{service}\
             [service.health]\nkind = {kind:?}\n[service.metrics]\npreset = {preset:?}\n"
        )
    };
    let good = config("drop", "proactive", "http", "nginx");
    let c = Config::from_toml(&good, &no_env).expect("valid");
    assert_eq!(c.controller.unknown_flow, UnknownFlowPolicy::Drop);
    assert_eq!(c.services[0].mode, ServiceMode::Proactive);
    assert_eq!(c.services[0].health.kind, HealthKind::Http);
    assert_eq!(
        c.services[0].metrics.names,
        crate::metrics_text::MetricNames::nginx()
    );

    let bad = format!("[cluster]\nrole = \"x\"\n{}", config("x", "x", "x", "x"));
    let errs = Config::from_toml(&bad, &no_env).expect_err("invalid").0;
    for (path, names) in [
        ("controller.unknown_flow", r#""reset", "drop""#),
        ("cluster.role", r#""single", "domain", "global""#),
        (
            "service[0].mode",
            r#""reactive", "proactive", "partitioned""#,
        ),
        ("service[0].health.kind", r#""tcp", "http", "none""#),
        ("service[0].metrics.preset", r#""flowgate", "nginx""#),
    ] {
        let want = format!("\"x\" is not one of {names}");
        assert!(
            errs.iter().any(|e| e.path == path && e.message == want),
            "{path}: {want} in {errs:?}"
        );
    }
}

/// `Obj::boolean`: TOML's `true` and `false`, nothing else. A string that reads as one
/// (`"on"`, `"true"`) or a number is refused against the key's full path, saying that a
/// boolean is expected; an absent key is no error.
#[test]
fn a_boolean_key_is_true_or_false_and_nothing_else() {
    let doc: toml::Table = "yes = true\nno = false\non = \"on\"\nquoted = \"true\"\none = 1\n"
        .parse()
        .expect("toml");
    let mut errs = Vec::new();
    let mut o = reader::Obj::new("service[0].overload", &doc);
    assert_eq!(o.boolean("yes", &mut errs), Some(true));
    assert_eq!(o.boolean("no", &mut errs), Some(false));
    assert_eq!(o.boolean("absent", &mut errs), None);
    assert!(errs.is_empty(), "{errs:?}");
    for (key, found) in [
        ("on", "found string \"on\""),
        ("quoted", "found string \"true\""),
        ("one", "found integer"),
    ] {
        errs.clear();
        assert_eq!(o.boolean(key, &mut errs), None, "{key}");
        assert_eq!(
            errs,
            [ConfigError::new(
                format!("service[0].overload.{key}"),
                format!("expected a boolean (true or false), {found}"),
            )],
            "{key}"
        );
    }
    // Each key read, right or wrong, is known: none is reported unknown on top.
    errs.clear();
    o.finish(&mut errs);
    assert!(errs.is_empty(), "{errs:?}");
}

#[test]
fn runtime_threads_are_bounded_and_optional() {
    let base = "[[service]]\nname = \"a\"\nvip = \"10.0.0.9\"\nport = 80\n[[service.backend]]\naddress = \"10.0.0.3\"\n";
    let cfg = Config::from_toml(base, &no_env).expect("valid");
    assert_eq!(
        cfg.runtime.worker_threads, None,
        "default: the runtime's own"
    );
    let cfg = Config::from_toml(&format!("[runtime]\nworker_threads = 1\n{base}"), &no_env)
        .expect("valid");
    assert_eq!(cfg.runtime.worker_threads, Some(1));
    let errs = Config::from_toml(
        &format!("[runtime]\nworker_threads = 0\nthreads = 2\n{base}"),
        &no_env,
    )
    .expect_err("invalid")
    .0;
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    assert!(paths.contains(&"runtime.worker_threads"), "{errs:?}");
    assert!(paths.contains(&"runtime.threads"), "{errs:?}");
}

/// One service, nothing else: the defaults of every other key.
const ONE_SERVICE: &str = "[[service]]\nname = \"a\"\nvip = \"10.0.0.9\"\nport = 80\n[[service.backend]]\naddress = \"10.0.0.3\"\n";

/// [`ONE_SERVICE`] under `section` (e.g. "[controller]\nkey = 1\n").
fn with(section: &str) -> Result<Config, ConfigErrors> {
    Config::from_toml(&format!("{section}{ONE_SERVICE}"), &no_env)
}

/// The path of the one error `section` makes.
fn the_error(section: &str) -> String {
    let errs = with(section).expect_err("invalid").0;
    assert_eq!(errs.len(), 1, "{errs:?}");
    errs[0].path.clone()
}

#[test]
fn spinning_before_parking_is_off_by_default_and_bounded() {
    let cfg = with("").expect("valid");
    assert_eq!(cfg.runtime.spin_before_park, Duration::ZERO);
    let cfg = with("[runtime]\nspin_before_park_us = 150\n").expect("valid");
    assert_eq!(cfg.runtime.spin_before_park, Duration::from_micros(150));
    assert_eq!(
        the_error("[runtime]\nspin_before_park_us = 10001\n"),
        "runtime.spin_before_park_us"
    );
}

#[test]
fn the_reconnect_grace_defaults_to_three_seconds_and_is_bounded() {
    let cfg = with("").expect("valid");
    assert_eq!(cfg.controller.reconnect_grace, Duration::from_secs(3));
    let cfg = with("[controller]\nreconnect_grace_ms = 0\n").expect("valid");
    assert_eq!(cfg.controller.reconnect_grace, Duration::ZERO);
    assert_eq!(
        the_error("[controller]\nreconnect_grace_ms = 600001\n"),
        "controller.reconnect_grace_ms"
    );
}

#[test]
fn the_host_table_is_bounded_by_default() {
    assert_eq!(with("").expect("valid").controller.max_hosts, 65_536);
    assert_eq!(
        the_error("[controller]\nmax_hosts = 0\n"),
        "controller.max_hosts"
    );
    assert_eq!(with("").expect("valid").controller.max_hosts_per_port, 4096);
    assert_eq!(
        with("[controller]\nmax_hosts_per_port = 8\n")
            .expect("valid")
            .controller
            .max_hosts_per_port,
        8
    );
    assert_eq!(
        the_error("[controller]\nmax_hosts_per_port = 0\n"),
        "controller.max_hosts_per_port"
    );
}

#[test]
fn the_connection_table_is_preallocated_only_when_asked() {
    assert_eq!(
        with("").expect("valid").controller.preallocate_connections,
        0
    );
    assert_eq!(
        with("[controller]\npreallocate_connections = 2000000\n")
            .expect("valid")
            .controller
            .preallocate_connections,
        2_000_000
    );
    for bad in ["-1", "100000001", "\"many\""] {
        assert_eq!(
            the_error(&format!("[controller]\npreallocate_connections = {bad}\n")),
            "controller.preallocate_connections",
            "{bad}"
        );
    }
}

#[test]
fn hosts_age_after_five_minutes_by_default_and_zero_turns_it_off() {
    let timeout = |toml: &str| with(toml).expect("valid").controller.host_timeout;
    assert_eq!(timeout(""), Some(Duration::from_secs(300)));
    assert_eq!(
        timeout("[controller]\nhost_timeout_secs = 30\n"),
        Some(Duration::from_secs(30))
    );
    assert_eq!(timeout("[controller]\nhost_timeout_secs = 0\n"), None);
    assert_eq!(
        the_error("[controller]\nhost_timeout_secs = -1\n"),
        "controller.host_timeout_secs"
    );
    assert_eq!(
        the_error("[controller]\nhost_timeout_secs = 604801\n"),
        "controller.host_timeout_secs"
    );
}

#[test]
fn three_hundred_services_each_get_a_virtual_mac_of_their_own() {
    // Found by the `config` fuzz target: the 256th service's default virtual MAC
    // overflowed a `u8` (a panic in debug builds, a wrapped byte in release).
    let mut text = String::new();
    for i in 0..300u32 {
        text += &format!(
            "[[service]]\nname = \"s{i}\"\nvip = \"10.1.{}.{}\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.2.{}.{}\"\n",
            i / 250,
            1 + i % 250,
            i / 250,
            1 + i % 250
        );
    }
    let c = Config::from_toml(&text, &no_env).unwrap_or_else(|e| panic!("{e}"));
    let macs: std::collections::BTreeSet<MacAddr> =
        c.services.iter().map(|s| s.virtual_mac).collect();
    assert_eq!(macs.len(), 300);
    // The first services' are what they always were.
    assert_eq!(c.services[0].virtual_mac, MacAddr([2, 0x66, 0x67, 0, 0, 1]));
    assert_eq!(
        c.services[255].virtual_mac,
        MacAddr([2, 0x66, 0x67, 0, 1, 0])
    );
}

/// The API adds backends one at a time (`Controller::add_backend`), judged by
/// [`backend_conflict`]; a configuration file is judged whole. Both must refuse the same
/// pools: over random sets of services (with and without VIPs, on two ports, over a
/// handful of addresses so that they collide), every candidate address is accepted by
/// one exactly when the configuration with it added is valid.
#[test]
fn a_backend_the_api_may_add_is_one_a_configuration_may_list() {
    let addr = |i: usize| Ipv4Addr::new(10, 0, 0, 1 + i as u8);
    let mut rng = crate::testkit::fuzzing::Rng(0x9e37_79b9_7f4a_7c15);
    let (mut valid_sets, mut accepted, mut refused) = (0, 0, 0);
    for _ in 0..1000 {
        // (vip, port, backends) per service, over addresses 10.0.0.1..=6.
        let services: Vec<(Option<usize>, u16, Vec<usize>)> = (0..1 + rng.below(3))
            .map(|_| {
                let vip = (rng.below(3) > 0).then(|| rng.below(6));
                let port = [80, 8080][rng.below(2)];
                let backends = (0..rng.below(3)).map(|_| rng.below(6)).collect();
                (vip, port, backends)
            })
            .collect();
        let text = |set: &[(Option<usize>, u16, Vec<usize>)]| {
            let mut t = String::new();
            for (i, (vip, port, backends)) in set.iter().enumerate() {
                t += &format!("[[service]]\nname = \"s{i}\"\nport = {port}\n");
                if let Some(v) = vip {
                    t += &format!("vip = \"{}\"\n", addr(*v));
                }
                for b in backends {
                    t += &format!("[[service.backend]]\naddress = \"{}\"\n", addr(*b));
                }
            }
            t
        };
        let Ok(cfg) = Config::from_toml(&text(&services), &no_env) else {
            continue;
        };
        valid_sets += 1;
        let cfgs: Vec<&ServiceConfig> = cfg.services.iter().collect();
        for si in 0..services.len() {
            for a in 0..6 {
                let verdict = backend_conflict(&cfgs, si, addr(a));
                let mut with = services.clone();
                with[si].2.push(a);
                let file = Config::from_toml(&text(&with), &no_env);
                assert_eq!(
                    verdict.is_none(),
                    file.is_ok(),
                    "adding {} to s{si}: the API says {verdict:?}, a file {:?}\n{}",
                    addr(a),
                    file.err().map(|e| e.to_string()),
                    text(&with)
                );
                if verdict.is_none() {
                    accepted += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    eprintln!("{valid_sets} sets, {accepted} accepted, {refused} refused");
    assert!(
        valid_sets > 300 && accepted > 500 && refused > 500,
        "the sets exercise both answers: {valid_sets} sets, {accepted} accepted, {refused} refused"
    );
}

/// The paths of every error `text` makes, with their messages.
fn errors_of(text: &str) -> Vec<ConfigError> {
    Config::from_toml(text, &no_env).expect_err("invalid").0
}

fn has(errs: &[ConfigError], path: &str, message: &str) -> bool {
    errs.iter()
        .any(|e| e.path == path && e.message.contains(message))
}

#[test]
fn checks_across_services_keep_each_services_index_and_see_services_with_errors() {
    // service[0] and service[1] have errors of their own; service[2] clashes with
    // service[0], which is still held against it.
    let errs = errors_of(
        r#"
[[service]]
name = "a"
vip = "10.0.0.100"
port = 80
algorithm = "fastest"
[[service]]
name = "b"
port = 0
[[service]]
name = "a"
vip = "10.0.0.100"
port = 80
"#,
    );
    assert!(has(&errs, "service[2].name", "service[0]"), "{errs:?}");
    assert!(
        has(
            &errs,
            "service[2].vip",
            "10.0.0.100:80 is used by service[0]"
        ),
        "{errs:?}"
    );
    assert_eq!(errs.len(), 4, "{errs:?}");
}

#[test]
fn an_intercepted_backend_is_told_at_its_address_with_the_other_service() {
    let errs = errors_of(
        r#"
[[service]]
name = "a"
port = 80
[[service.backend]]
address = "10.0.0.2"
[[service]]
name = "b"
port = 80
[[service.backend]]
address = "10.0.0.3"
[[service.backend]]
address = "10.0.0.2"
"#,
    );
    assert_eq!(
        errs,
        vec![ConfigError::new(
            "service[1].backend[1].address",
            "10.0.0.2:80 is intercepted by service[0] (\"a\")"
        )]
    );
}

#[test]
fn a_token_the_api_could_never_match_is_refused() {
    for (token, why) in [
        ("", "must not be empty"),
        (" 0123456789abcdef", "whitespace"),
        ("0123456789abcdef\t", "whitespace"),
        // 18 bytes, 9 characters.
        ("ééééééééé", "printable ASCII"),
    ] {
        let errs = errors_of(&format!("[api]\ntoken = {token:?}\n"));
        assert_eq!(errs.len(), 1, "{token:?}: {errs:?}");
        assert!(has(&errs, "api.token", why), "{token:?}: {errs:?}");
    }
    let env = |k: &str| (k == "AUDIT_TOK").then(|| "short".to_string());
    let errs = Config::from_toml("[api]\ntoken_env = \"AUDIT_TOK\"\n", &env)
        .expect_err("too short")
        .0;
    assert_eq!(
        errs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        vec!["api.token_env: $AUDIT_TOK: a token must have at least 16 characters"]
    );
    // An empty variable is an unset one.
    let env = |_: &str| Some(String::new());
    let cfg = Config::from_toml("", &env).expect("valid");
    assert_eq!(cfg.api.token, None);
}

#[test]
fn a_key_checked_against_another_is_not_when_either_is_invalid() {
    assert_eq!(
        the_error("[openflow]\necho_interval_ms = 700000\necho_timeout_ms = 4000\n"),
        "openflow.echo_interval_ms"
    );
    assert_eq!(
        the_error("[openflow]\necho_timeout_ms = 100\n"),
        "openflow.echo_timeout_ms"
    );
    assert_eq!(
        the_error("[cluster]\nspill_threshold = -1.0\nspill_exit_threshold = 0.5\n"),
        "cluster.spill_threshold"
    );
    assert_eq!(
        the_error("[cluster]\nlease_ttl_ms = 10\nstore_timeout_ms = 5000\n"),
        "cluster.lease_ttl_ms"
    );
    let service = |keys: &str| {
        let errs = errors_of(&format!(
            "[[service]]\nname = \"a\"\nport = 80\n{keys}[[service.backend]]\naddress = \"10.0.0.3\"\n"
        ));
        assert_eq!(errs.len(), 1, "{errs:?}");
        errs[0].path.clone()
    };
    assert_eq!(
        service("mode = \"partitionned\"\nvip = \"10.0.0.9\"\npartition_bits = 4\n"),
        "service[0].mode"
    );
    assert_eq!(
        service("mode = \"proactive\"\nvip = \"10.0.0.300\"\n"),
        "service[0].vip"
    );
}

#[test]
fn a_health_path_must_be_a_request_target() {
    let path = |p: &str| {
        let base = ONE_SERVICE.replacen(
            "port = 80\n",
            &format!("port = 80\n[service.health]\nkind = \"http\"\npath = {p:?}\n"),
            1,
        );
        Config::from_toml(&base, &no_env).map(|c| c.services[0].health.path.clone())
    };
    for good in ["/", "/health", "/a/b-c_d.e~f?x=1&y=%2F", "/@:!$'()*+,;="] {
        assert_eq!(path(good).as_deref(), Ok(good));
    }
    for bad in [
        "health",
        "/a b",
        "/x\r\nHost: evil",
        "/%zz",
        "/%4",
        "/é",
        "/a#frag",
        "/\"q\"",
    ] {
        let errs = path(bad).expect_err(bad).0;
        assert_eq!(errs.len(), 1, "{bad:?}: {errs:?}");
        assert_eq!(errs[0].path, "service[0].health.path", "{bad:?}");
    }
}

#[test]
fn the_panic_threshold_is_a_percentage() {
    let threshold = |line: &str| {
        let base = ONE_SERVICE.replacen(
            "port = 80\n",
            &format!("port = 80\n[service.health]\n{line}\n"),
            1,
        );
        Config::from_toml(&base, &no_env).map(|c| c.services[0].health.panic_threshold_percent)
    };
    assert_eq!(threshold(""), Ok(50), "Envoy's default");
    assert_eq!(threshold("panic_threshold_percent = 0"), Ok(0));
    assert_eq!(threshold("panic_threshold_percent = 100"), Ok(100));
    for bad in ["101", "-1", "50.5", "\"50%\""] {
        let errs = threshold(&format!("panic_threshold_percent = {bad}"))
            .expect_err(bad)
            .0;
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert_eq!(
            errs[0].path, "service[0].health.panic_threshold_percent",
            "{bad}"
        );
    }
}

#[test]
fn the_lag_that_excuses_a_silence_is_in_milliseconds() {
    let limit = |line: &str| {
        with(&format!("[controller]\n{line}\n")).map(|c| c.controller.outlier_max_channel_rtt)
    };
    assert_eq!(limit(""), Ok(Duration::from_millis(250)));
    assert_eq!(limit("outlier_max_channel_rtt_ms = 0"), Ok(Duration::ZERO));
    assert_eq!(
        limit("outlier_max_channel_rtt_ms = 1500"),
        Ok(Duration::from_millis(1500))
    );
    for bad in ["-1", "600001", "0.5", "\"250ms\""] {
        assert_eq!(
            the_error(&format!(
                "[controller]\noutlier_max_channel_rtt_ms = {bad}\n"
            )),
            "controller.outlier_max_channel_rtt_ms",
            "{bad}"
        );
    }
}

#[test]
fn a_metrics_url_must_be_one_the_scraper_fetches() {
    let url = |u: &str| {
        let text = format!("{ONE_SERVICE}metrics = {u:?}\n");
        Config::from_toml(&text, &no_env).map(|c| c.services[0].backends[0].metrics.clone())
    };
    for good in [
        "http://10.0.0.3:9100/metrics",
        "http://10.0.0.3",
        "http://10.0.0.3/m?x=1",
    ] {
        assert_eq!(url(good), Ok(Some(good.to_string())));
    }
    for bad in [
        "https://10.0.0.3/metrics",
        "http://backend.example/metrics",
        "http://10.0.0.3:0/metrics",
        "http://10.0.0.3:99999/",
        "http://10.0.0.3:/",
        "http://[::1]:9100/metrics",
        "http://10.0.0.3:9100/me trics",
        "http://10.0.0.3:9100/m\r\nX: y",
    ] {
        let errs = url(bad).expect_err(bad).0;
        assert_eq!(errs.len(), 1, "{bad:?}: {errs:?}");
        assert_eq!(errs[0].path, "service[0].backend[0].metrics", "{bad:?}");
    }
    let u = parse_metrics_url("http://10.0.0.3:9100/metrics").expect("valid");
    assert_eq!(u.addr, "10.0.0.3:9100".parse().unwrap());
    assert_eq!(
        (u.host.as_str(), u.path.as_str()),
        ("10.0.0.3:9100", "/metrics")
    );
    assert_eq!(
        parse_metrics_url("http://10.0.0.3")
            .map(|u| u.path)
            .as_deref(),
        Ok("/")
    );
}

#[test]
fn virtual_macs_are_hosts_and_each_vip_services_own() {
    let two = |a: &str, b: &str, vip_b: bool| {
        let mut t = format!("[[service]]\nname = \"a\"\nvip = \"10.0.0.100\"\nport = 80\n{a}");
        t += &format!("[[service]]\nname = \"b\"\nport = 80\n{b}");
        if vip_b {
            t += "vip = \"10.0.0.101\"\n";
        }
        Config::from_toml(&t, &no_env)
            .err()
            .map(|e| e.0)
            .unwrap_or_default()
    };
    let mac = |m: &str| format!("virtual_mac = \"{m}\"\n");
    let same = mac("02:00:00:00:00:07");
    let errs = two(&same, &same, true);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        has(
            &errs,
            "service[1].virtual_mac",
            "02:00:00:00:00:07 is the virtual MAC of service[0] (\"a\")"
        ),
        "{errs:?}"
    );
    // service[0]'s automatic MAC, written for service[1]; and the other way round.
    let errs = two("", &mac("02:66:67:00:00:01"), true);
    assert!(
        has(&errs, "service[1].virtual_mac", "automatic"),
        "{errs:?}"
    );
    let errs = two(&mac("02:66:67:00:00:02"), "", true);
    assert!(
        has(&errs, "service[0].virtual_mac", "automatic"),
        "{errs:?}"
    );
    // A service without a VIP answers for no address: its MAC is never used.
    assert_eq!(two(&same, &same, false), vec![]);
    for bad in [
        "00:00:00:00:00:00",
        "ff:ff:ff:ff:ff:ff",
        "01:00:5e:00:00:01",
        "02:66:67:ff:00:01",
    ] {
        let errs = two(&mac(bad), "", true);
        assert_eq!(errs.len(), 1, "{bad}: {errs:?}");
        assert_eq!(errs[0].path, "service[0].virtual_mac", "{bad}");
    }
}

#[test]
fn a_clusters_keys_agree_with_each_other() {
    let domain = |keys: &str| {
        Config::from_toml(
            &format!("[cluster]\nrole = \"domain\"\ndomain = \"d1\"\ninstance = \"d1a\"\n{keys}"),
            &no_env,
        )
        .err()
        .map(|e| e.0)
        .unwrap_or_default()
    };
    let ok = "dpids = [\"1\", \"2\"]\nuplink = \"2:3\"\netcd = [\"http://127.0.0.1:2379\", \"https://10.0.0.1:2379\"]\n";
    assert_eq!(domain(ok), vec![]);
    assert_eq!(domain("dpids = [\"1\"]\netcd = \"memory:\"\n"), vec![]);
    for (keys, path) in [
        (
            "dpids = [\"1\"]\nuplink = \"2:3\"\netcd = \"memory:\"\n",
            "cluster.uplink",
        ),
        (
            "dpids = [\"1\"]\nuplink = \"1:0\"\netcd = \"memory:\"\n",
            "cluster.uplink",
        ),
        (
            "dpids = [\"1\", \"0x01\"]\netcd = \"memory:\"\n",
            "cluster.dpids[1]",
        ),
        (
            "dpids = [\"1\"]\netcd = [\"http://a:1\", \"127.0.0.1:2379\"]\n",
            "cluster.etcd[1]",
        ),
        ("dpids = [\"1\"]\netcd = \"http://\"\n", "cluster.etcd[0]"),
        (
            "dpids = [\"1\"]\netcd = \"memory:\"\nlease_ttl_ms = 2000\nstore_timeout_ms = 2000\n",
            "cluster.store_timeout_ms",
        ),
    ] {
        let errs = domain(keys);
        assert_eq!(errs.len(), 1, "{keys}: {errs:?}");
        assert_eq!(errs[0].path, path, "{keys}: {errs:?}");
    }
    // A dpid that did not parse may be the uplink's: only its own error.
    let errs = domain("dpids = [\"zz\"]\nuplink = \"2:3\"\netcd = \"memory:\"\n");
    assert_eq!(errs.len(), 1, "{errs:?}");
}

#[test]
fn a_backend_capacity_is_read_and_checked() {
    let text = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "dwrs"
[[service.backend]]
address = "10.0.0.2"
capacity_rps = 800
[[service.backend]]
address = "10.0.0.3"
capacity_rps = 400.5
[[service.backend]]
address = "10.0.0.4"
"#;
    let cfg = Config::from_toml(text, &no_env).expect("valid");
    let caps: Vec<_> = cfg.services[0]
        .backends
        .iter()
        .map(|b| b.capacity_rps)
        .collect();
    assert_eq!(caps, [Some(800.0), Some(400.5), None]);

    let bad = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
[[service.backend]]
address = "10.0.0.2"
capacity_rps = 0
[[service.backend]]
address = "10.0.0.3"
capacity_rps = -5.0
[[service.backend]]
address = "10.0.0.4"
capacity_rps = nan
[[service.backend]]
address = "10.0.0.5"
capacity_rps = inf
[[service.backend]]
address = "10.0.0.6"
capacity_rps = "fast"
"#;
    let errs = Config::from_toml(bad, &no_env).expect_err("invalid").0;
    for i in 0..5 {
        let want = format!("service[0].backend[{i}].capacity_rps");
        assert!(
            errs.iter().any(|e| e.path == want),
            "missing {want} in {errs:?}"
        );
    }
}

/// A configured capacity reaches the balancer's view of the backend, and a reload that
/// changes it takes effect.
#[test]
fn a_backend_capacity_reaches_the_balancer() {
    let text = |cap: &str| {
        format!(
            r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "dwrs"
[[service.backend]]
address = "10.0.0.2"
{cap}
[[service.backend]]
address = "10.0.0.3"
"#
        )
    };
    let cfg = Config::from_toml(&text("capacity_rps = 800"), &no_env).expect("valid");
    let mut s = crate::service::ServiceState::new(cfg.services[0].clone(), 0, 1);
    let now = std::time::Instant::now();
    s.refresh(now, Duration::from_secs(1));
    let caps: Vec<_> = s.loads.iter().map(|l| l.capacity_rps).collect();
    assert_eq!(caps, [Some(800.0), None]);

    let cfg = Config::from_toml(&text("capacity_rps = 200"), &no_env).expect("valid");
    let fresh = crate::service::ServiceState::new(cfg.services[0].clone(), 0, 1);
    let kept = s.backends[0].reconfigured(&fresh.backends[0], &fresh.cfg.health, now);
    assert_eq!(kept.capacity_rps, Some(200.0));
}

/// A backend's capacity is its own configuration's, as its weight is: one added at run
/// time (the API's) has the capacity it is added with, none unless given, even at an
/// address the file gave a capacity before the API removed it.
#[test]
fn a_backend_joins_with_the_capacity_it_is_added_with() {
    let text = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "dwrs"
[[service.backend]]
address = "10.0.0.2"
capacity_rps = 800
[[service.backend]]
address = "10.0.0.3"
"#;
    let cfg = Config::from_toml(text, &no_env).expect("valid");
    let mut s = crate::service::ServiceState::new(cfg.services[0].clone(), 0, 1);
    let now = std::time::Instant::now();
    let added = |address: &str, capacity_rps| BackendConfig {
        address: address.parse().unwrap(),
        weight: 1,
        metrics: None,
        mac: None,
        capacity_rps,
    };
    let join = |s: &mut crate::service::ServiceState, cfg: BackendConfig| {
        let at = s
            .join(crate::service::BackendState::new(&cfg), cfg)
            .expect("joined");
        s.refresh(now, Duration::from_secs(1));
        (s.backends[at].capacity_rps, s.loads[at].capacity_rps)
    };
    assert_eq!(
        join(&mut s, added("10.0.0.4", Some(300.0))),
        (Some(300.0), Some(300.0)),
        "given: the balancer sees it"
    );
    assert_eq!(join(&mut s, added("10.0.0.5", None)), (None, None));
    assert!(s.remove_backend(now, 0), "10.0.0.2 leaves");
    assert!(
        s.cfg
            .backends
            .iter()
            .all(|b| b.address != Ipv4Addr::new(10, 0, 0, 2))
    );
    assert_eq!(
        join(&mut s, added("10.0.0.2", None)),
        (None, None),
        "back without the capacity it left with"
    );
    let caps: Vec<_> = s.cfg.backends.iter().map(|b| b.capacity_rps).collect();
    assert_eq!(
        caps,
        [None, Some(300.0), None, None],
        "as the pool holds them"
    );
}

/// `slow_start_secs` reaches the balancer as a ramp fraction, which every algorithm but
/// `none` applies (a weight of 1 ramps too: the fraction is not rounded into the weight).
#[test]
fn slow_start_reaches_the_balancer_as_a_fraction() {
    let text = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
algorithm = "srt"
slow_start_secs = 10
[[service.backend]]
address = "10.0.0.2"
[[service.backend]]
address = "10.0.0.3"
"#;
    let cfg = Config::from_toml(text, &no_env).expect("valid");
    let mut s = crate::service::ServiceState::new(cfg.services[0].clone(), 0, 1);
    let now = std::time::Instant::now() + Duration::from_secs(60);
    s.backends[0].since = now.checked_sub(Duration::from_secs(5));
    s.refresh(now, Duration::from_secs(1));
    assert!(
        (s.balancer.ramp(0) - 0.5).abs() < 1e-9,
        "{}",
        s.balancer.ramp(0)
    );
    assert_eq!(s.balancer.ramp(1), 1.0);
    assert_eq!(s.loads[0].weight, 1);
    s.refresh(now + Duration::from_secs(5), Duration::from_secs(1));
    assert_eq!(s.balancer.ramp(0), 1.0);
}

/// A backend's `mac` pins its address to one host: read as a host's MAC, refused when it
/// is no host's, when it is a service's virtual MAC, and when two services pin one
/// address to two MACs; every error at its own path.
#[test]
fn a_pinned_backend_mac_is_read_and_checked() {
    let text = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
[[service.backend]]
address = "10.0.0.2"
mac = "02:00:00:00:00:02"
[[service.backend]]
address = "10.0.0.3"
[[service]]
name = "api"
vip = "10.0.0.101"
port = 80
[[service.backend]]
address = "10.0.0.2"
mac = "02:00:00:00:00:02"
"#;
    let cfg = Config::from_toml(text, &no_env).expect("valid");
    let pinned: MacAddr = "02:00:00:00:00:02".parse().unwrap();
    assert_eq!(cfg.services[0].backends[0].mac, Some(pinned));
    assert_eq!(cfg.services[0].backends[1].mac, None);
    assert_eq!(cfg.services[1].backends[0].mac, Some(pinned));

    let bad = r#"
[[service]]
name = "web"
vip = "10.0.0.100"
port = 80
virtual_mac = "02:66:67:00:00:09"
[[service.backend]]
address = "10.0.0.2"
mac = "not a mac"
[[service.backend]]
address = "10.0.0.3"
mac = "01:00:5e:00:00:01"
[[service.backend]]
address = "10.0.0.4"
mac = "00:00:00:00:00:00"
[[service.backend]]
address = "10.0.0.5"
mac = "02:66:67:00:00:09"
[[service.backend]]
address = "10.0.0.6"
mac = "02:00:00:00:00:06"
[[service]]
name = "api"
vip = "10.0.0.101"
port = 80
[[service.backend]]
address = "10.0.0.6"
mac = "02:00:00:00:00:07"
"#;
    let errs = Config::from_toml(bad, &no_env).expect_err("invalid").0;
    let at = |path: &str| {
        errs.iter()
            .find(|e| e.path == path)
            .map(|e| e.message.clone())
            .unwrap_or_else(|| panic!("no error at {path} in {errs:?}"))
    };
    assert!(at("service[0].backend[0].mac").contains("is not a MAC address"));
    assert!(at("service[0].backend[1].mac").contains("unicast"));
    assert!(at("service[0].backend[2].mac").contains("no host's MAC"));
    assert!(at("service[0].backend[3].mac").contains("virtual MAC of service[0]"));
    assert!(at("service[1].backend[0].mac").contains("pinned to 02:00:00:00:00:06"));
    assert_eq!(errs.len(), 5, "{errs:?}");
}

#[test]
fn outlier_detection_is_envoys_by_default_and_each_detector_is_set_apart() {
    use crate::health::{FailurePercentageConfig, OutlierConfig, SuccessRateConfig};
    let outlier = |section: &str| {
        Config::from_toml(&format!("{ONE_SERVICE}{section}"), &no_env)
            .map(|c| c.services[0].outlier)
    };
    assert_eq!(outlier(""), Ok(OutlierConfig::default()));
    let d = OutlierConfig::default();
    assert_eq!(d.consecutive_failures, 5);
    assert_eq!(d.base_ejection, Duration::from_secs(30));
    assert_eq!(d.max_ejection, Duration::from_secs(300));
    assert_eq!(d.max_ejection_percent, 10);
    assert_eq!(d.interval, Duration::from_secs(10));
    assert_eq!(d.success_rate, Some(SuccessRateConfig::default()));
    assert_eq!(d.failure_percentage, None);
    let set = outlier(
        "[service.outlier]\nconsecutive_failures = 0\nbase_ejection_ms = 5000\n\
         max_ejection_ms = 60000\nmax_ejection_percent = 50\ninterval_ms = 2000\n\
         success_rate_minimum_hosts = 3\nsuccess_rate_request_volume = 20\n\
         success_rate_stdev_factor = 1.0\nfailure_percentage_threshold = 40\n\
         failure_percentage_minimum_hosts = 2\nfailure_percentage_request_volume = 10\n",
    );
    assert_eq!(
        set,
        Ok(OutlierConfig {
            consecutive_failures: 0,
            base_ejection: Duration::from_secs(5),
            max_ejection: Duration::from_secs(60),
            max_ejection_percent: 50,
            interval: Duration::from_secs(2),
            success_rate: Some(SuccessRateConfig {
                minimum_hosts: 3,
                request_volume: 20,
                stdev_factor_milli: 1_000,
            }),
            failure_percentage: Some(FailurePercentageConfig {
                threshold: 40,
                minimum_hosts: 2,
                request_volume: 10,
            }),
        })
    );
    assert_eq!(
        outlier("[service.outlier]\nsuccess_rate = false\n").map(|o| o.success_rate),
        Ok(None)
    );
    // Every bad key is reported with its path, all at once.
    let errs = Config::from_toml(
        &format!(
            "{ONE_SERVICE}[service.outlier]\nconsecutive_failures = -1\n\
             base_ejection_ms = 60000\nmax_ejection_ms = 1000\nmax_ejection_percent = 101\n\
             interval_ms = 50\nsuccess_rate = \"yes\"\nsuccess_rate_minimum_hosts = 0\n\
             success_rate_stdev_factor = -1\nfailure_percentage_threshold = 0\n\
             failure_percentage_request_volume = 0\nenforcing = 100\n"
        ),
        &no_env,
    )
    .expect_err("invalid")
    .0;
    let paths: Vec<&str> = errs.iter().map(|e| e.path.as_str()).collect();
    let want: Vec<String> = [
        "consecutive_failures",
        "max_ejection_ms",
        "max_ejection_percent",
        "interval_ms",
        "success_rate",
        "success_rate_minimum_hosts",
        "success_rate_stdev_factor",
        "failure_percentage_threshold",
        "failure_percentage_request_volume",
        "enforcing",
    ]
    .iter()
    .map(|k| format!("service[0].outlier.{k}"))
    .collect();
    let mut got = paths.clone();
    got.sort_unstable();
    let mut want_sorted: Vec<&str> = want.iter().map(String::as_str).collect();
    want_sorted.sort_unstable();
    assert_eq!(got, want_sorted, "{errs:?}");
    let under = errs
        .iter()
        .find(|e| e.path.ends_with("max_ejection_ms"))
        .map(|e| e.message.as_str());
    assert_eq!(
        under,
        Some("1000 is under base_ejection_ms (60000): no ejection could last its base")
    );
}

/// `redispatch` is on for a reactive service unless turned off; a proactive or
/// partitioned service's SYNs stay in the switch, so it is off there, and asking for it
/// is an error at its path.
#[test]
fn redispatch_is_on_for_reactive_services_and_refused_for_the_others() {
    let redispatch = |keys: &str| {
        Config::from_toml(
            &ONE_SERVICE.replacen("port = 80\n", &format!("port = 80\n{keys}"), 1),
            &no_env,
        )
        .map(|c| c.services[0].redispatch)
        .map_err(|e| e.0)
    };
    assert_eq!(redispatch(""), Ok(true));
    assert_eq!(redispatch("redispatch = false\n"), Ok(false));
    assert_eq!(redispatch("mode = \"proactive\"\n"), Ok(false));
    assert_eq!(
        redispatch("mode = \"proactive\"\nredispatch = false\n"),
        Ok(false)
    );
    for mode in ["proactive", "partitioned"] {
        let errs =
            redispatch(&format!("mode = \"{mode}\"\nredispatch = true\n")).expect_err("refused");
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert!(
            has(&errs, "service[0].redispatch", "only a reactive one's"),
            "{errs:?}"
        );
    }
    let errs = redispatch("redispatch = \"yes\"\n").expect_err("not a boolean");
    assert_eq!(errs[0].path, "service[0].redispatch", "{errs:?}");
}
