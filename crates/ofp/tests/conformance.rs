//! Golden vectors: every Ryu OpenFlow 1.3 `*.packet` decodes, re-encodes byte-identically,
//! and agrees with Ryu's own JSON decoding on message class, main scalar fields and OXMs.

use std::path::PathBuf;

use bytes::{Bytes, BytesMut};
use ofp::{
    DecodeError, Message, MultipartReplyBody as Rb, MultipartRequestBody as Qb, Oxm, decode, encode,
};
use serde_json::{Value, json};

fn dir() -> PathBuf {
    match std::env::var_os("FLOWGATE_CONFORMANCE_DIR") {
        Some(d) => PathBuf::from(d),
        None => PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/ryu-of13")),
    }
}

fn packets() -> Vec<PathBuf> {
    let d = dir();
    let mut v: Vec<PathBuf> = std::fs::read_dir(&d)
        .unwrap_or_else(|e| panic!("conformance dir {} unreadable: {e}", d.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "packet"))
        .collect();
    v.sort();
    v
}

/// Ryu's class name for a decoded message.
fn ryu_class(m: &Message) -> String {
    use Message as M;
    let s = match m {
        M::Hello(_) => "OFPHello",
        M::Error(_) => "OFPErrorMsg",
        M::EchoRequest(_) => "OFPEchoRequest",
        M::EchoReply(_) => "OFPEchoReply",
        M::Experimenter(_) => "OFPExperimenter",
        M::FeaturesRequest => "OFPFeaturesRequest",
        M::FeaturesReply(_) => "OFPSwitchFeatures",
        M::GetConfigRequest => "OFPGetConfigRequest",
        M::GetConfigReply(_) => "OFPGetConfigReply",
        M::SetConfig(_) => "OFPSetConfig",
        M::PacketIn(_) => "OFPPacketIn",
        M::FlowRemoved(_) => "OFPFlowRemoved",
        M::PortStatus(_) => "OFPPortStatus",
        M::PacketOut(_) => "OFPPacketOut",
        M::FlowMod(_) => "OFPFlowMod",
        M::GroupMod(_) => "OFPGroupMod",
        M::PortMod(_) => "OFPPortMod",
        M::TableMod(_) => "OFPTableMod",
        M::BarrierRequest => "OFPBarrierRequest",
        M::BarrierReply => "OFPBarrierReply",
        M::QueueGetConfigRequest(_) => "OFPQueueGetConfigRequest",
        M::QueueGetConfigReply(_) => "OFPQueueGetConfigReply",
        M::RoleRequest(_) => "OFPRoleRequest",
        M::RoleReply(_) => "OFPRoleReply",
        M::GetAsyncRequest => "OFPGetAsyncRequest",
        M::GetAsyncReply(_) => "OFPGetAsyncReply",
        M::SetAsync(_) => "OFPSetAsync",
        M::MeterMod(_) => "OFPMeterMod",
        M::MultipartRequest(r) => {
            let k = match &r.body {
                Qb::Desc => "Desc",
                Qb::Flow(_) => "Flow",
                Qb::Aggregate(_) => "Aggregate",
                Qb::Table => "Table",
                Qb::PortStats { .. } => "Port",
                Qb::Queue { .. } => "Queue",
                Qb::Group { .. } => "Group",
                Qb::GroupDesc => "GroupDesc",
                Qb::GroupFeatures => "GroupFeatures",
                Qb::Meter { .. } => "Meter",
                Qb::MeterConfig { .. } => "MeterConfig",
                Qb::MeterFeatures => "MeterFeatures",
                Qb::TableFeatures(_) => "TableFeatures",
                Qb::PortDesc => "PortDesc",
                // Ryu decodes ONF's flow monitor (an experimenter multipart) by name.
                Qb::Experimenter {
                    experimenter: 0x4f4e4600,
                    exp_type: 1870,
                    ..
                } => {
                    return "ONFFlowMonitorStatsRequest".into();
                }
                Qb::Experimenter { .. } => "Experimenter",
                Qb::Unknown { .. } => "Unknown",
            };
            return format!("OFP{k}StatsRequest");
        }
        M::MultipartReply(r) => {
            let k = match &r.body {
                Rb::Desc(_) => "Desc",
                Rb::Flow(_) => "Flow",
                Rb::Aggregate(_) => "Aggregate",
                Rb::Table(_) => "Table",
                Rb::PortStats(_) => "Port",
                Rb::PortDesc(_) => "PortDesc",
                Rb::Queue(_) => "Queue",
                Rb::Group(_) => "Group",
                Rb::GroupDesc(_) => "GroupDesc",
                Rb::GroupFeatures(_) => "GroupFeatures",
                Rb::Meter(_) => "Meter",
                Rb::MeterConfig(_) => "MeterConfig",
                Rb::MeterFeatures(_) => "MeterFeatures",
                Rb::TableFeatures(_) => "TableFeatures",
                Rb::Experimenter { .. } => "Experimenter",
                Rb::Unknown { .. } => "Unknown",
            };
            return format!("OFP{k}StatsReply");
        }
    };
    s.to_string()
}

fn mac(m: &[u8; 6]) -> Value {
    json!(
        m.iter()
            .map(|b| format!("{b:02x}"))
            .collect::<Vec<_>>()
            .join(":")
    )
}

/// Our OXM in Ryu's JSON form: (field name, value, mask); `None` for opaque TLVs.
fn ryu_oxm(o: &Oxm) -> Option<(&'static str, Value, Value)> {
    let name = o.name()?;
    fn opt<T, F: Fn(&T) -> Value>(m: &Option<T>, f: F) -> Value {
        m.as_ref().map(f).unwrap_or(Value::Null)
    }
    let (v, m) = match o {
        Oxm::InPort(v) | Oxm::InPhyPort(v) | Oxm::MplsLabel(v) => (json!(v), Value::Null),
        Oxm::Metadata { value, mask } | Oxm::TunnelId { value, mask } => {
            (json!(value), opt(mask, |m| json!(m)))
        }
        Oxm::EthDst { value, mask }
        | Oxm::EthSrc { value, mask }
        | Oxm::ArpSha { value, mask }
        | Oxm::ArpTha { value, mask } => (mac(value), opt(mask, mac)),
        Oxm::EthType(v)
        | Oxm::TcpSrc(v)
        | Oxm::TcpDst(v)
        | Oxm::UdpSrc(v)
        | Oxm::UdpDst(v)
        | Oxm::SctpSrc(v)
        | Oxm::SctpDst(v)
        | Oxm::ArpOp(v) => (json!(v), Value::Null),
        Oxm::VlanVid { value, mask } | Oxm::Ipv6Exthdr { value, mask } => {
            (json!(value), opt(mask, |m| json!(m)))
        }
        Oxm::VlanPcp(v)
        | Oxm::IpDscp(v)
        | Oxm::IpEcn(v)
        | Oxm::IpProto(v)
        | Oxm::Icmpv4Type(v)
        | Oxm::Icmpv4Code(v)
        | Oxm::Icmpv6Type(v)
        | Oxm::Icmpv6Code(v)
        | Oxm::MplsTc(v)
        | Oxm::MplsBos(v) => (json!(v), Value::Null),
        Oxm::Ipv4Src { value, mask }
        | Oxm::Ipv4Dst { value, mask }
        | Oxm::ArpSpa { value, mask }
        | Oxm::ArpTpa { value, mask } => (
            json!(value.to_string()),
            opt(mask, |m| json!(m.to_string())),
        ),
        Oxm::Ipv6Src { value, mask } | Oxm::Ipv6Dst { value, mask } => (
            json!(value.to_string()),
            opt(mask, |m| json!(m.to_string())),
        ),
        Oxm::Ipv6Flabel { value, mask } | Oxm::PbbIsid { value, mask } => {
            (json!(value), opt(mask, |m| json!(m)))
        }
        Oxm::Ipv6NdTarget(a) => (json!(a.to_string()), Value::Null),
        Oxm::Ipv6NdSll(m) | Oxm::Ipv6NdTll(m) => (mac(m), Value::Null),
        Oxm::Raw(_) => return None,
    };
    Some((name, v, m))
}

/// Ryu field names that are OpenFlow-basic (ours are the same strings).
fn is_ofb_name(n: &str) -> bool {
    (0..40u8).any(|f| ofp::oxm::ofb_name(f) == Some(n))
}

fn check_match(
    ctx: &str,
    ours: &ofp::Match,
    ryu: &Value,
    errs: &mut Vec<String>,
    oxm_checked: &mut usize,
) {
    let Some(fields) = ryu
        .pointer("/OFPMatch/oxm_fields")
        .and_then(Value::as_array)
    else {
        errs.push(format!("{ctx}: no OFPMatch in JSON"));
        return;
    };
    if fields.len() != ours.len() {
        errs.push(format!(
            "{ctx}: {} OXMs, Ryu has {}",
            ours.len(),
            fields.len()
        ));
        return;
    }
    for (o, f) in ours.iter().zip(fields) {
        let t = &f["OXMTlv"];
        let rname = t["field"].as_str().unwrap_or("");
        match ryu_oxm(o) {
            Some((name, v, m)) => {
                if name != rname || v != t["value"] || m != t["mask"] {
                    errs.push(format!(
                        "{ctx}: OXM ours {name}={v} mask {m}, Ryu {rname}={} mask {}",
                        t["value"], t["mask"]
                    ));
                }
            }
            None => {
                if is_ofb_name(rname) {
                    errs.push(format!(
                        "{ctx}: Ryu decoded {rname} but we kept it opaque: {o:?}"
                    ));
                }
            }
        }
        *oxm_checked += 1;
    }
}

fn check_scalars(ctx: &str, ours: Value, ryu: &Value, errs: &mut Vec<String>, n: &mut usize) {
    let Value::Object(map) = ours else { return };
    for (k, v) in map {
        if let Some(r) = ryu.get(&k) {
            *n += 1;
            if *r != v {
                errs.push(format!("{ctx}: field {k}: ours {v}, Ryu {r}"));
            }
        }
    }
}

struct Counts {
    files: usize,
    roundtrip: usize,
    scalars: usize,
    oxms: usize,
}

fn compare_json(ctx: &str, m: &Message, j: &Value, errs: &mut Vec<String>, c: &mut Counts) {
    let Some((class, body)) = j.as_object().and_then(|o| o.iter().next()) else {
        errs.push(format!("{ctx}: empty JSON"));
        return;
    };
    let ours = ryu_class(m);
    if *class != ours {
        errs.push(format!("{ctx}: class {ours}, Ryu {class}"));
    }
    if let Some(x) = body.get("xid") {
        errs.push(format!("{ctx}: JSON xid {x} present; compare it")); // none carry one today
    }
    match m {
        Message::FlowMod(f) => {
            let s = json!({"cookie": f.cookie, "cookie_mask": f.cookie_mask, "table_id": f.table_id,
                "command": f.command.to_raw(), "idle_timeout": f.idle_timeout, "hard_timeout": f.hard_timeout,
                "priority": f.priority, "buffer_id": f.buffer_id, "out_port": f.out_port, "out_group": f.out_group,
                "flags": f.flags.bits()});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
            check_match(ctx, &f.match_, &body["match"], errs, &mut c.oxms);
            let ni = body["instructions"].as_array().map_or(0, Vec::len);
            if ni != f.instructions.len() {
                errs.push(format!(
                    "{ctx}: {} instructions, Ryu {ni}",
                    f.instructions.len()
                ));
            }
        }
        Message::PacketIn(p) => {
            let s = json!({"buffer_id": p.buffer_id, "total_len": p.total_len, "reason": p.reason.to_raw(),
                "table_id": p.table_id, "cookie": p.cookie});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
            check_match(ctx, &p.match_, &body["match"], errs, &mut c.oxms);
        }
        Message::FlowRemoved(f) => {
            let s = json!({"cookie": f.cookie, "priority": f.priority, "reason": f.reason.to_raw(), "table_id": f.table_id,
                "duration_sec": f.duration_sec, "duration_nsec": f.duration_nsec, "idle_timeout": f.idle_timeout,
                "hard_timeout": f.hard_timeout, "packet_count": f.packet_count, "byte_count": f.byte_count});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
            check_match(ctx, &f.match_, &body["match"], errs, &mut c.oxms);
        }
        Message::FeaturesReply(f) => {
            let s = json!({"datapath_id": f.datapath_id, "n_buffers": f.n_buffers, "n_tables": f.n_tables,
                "auxiliary_id": f.auxiliary_id, "capabilities": f.capabilities});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
        }
        Message::RoleRequest(r) | Message::RoleReply(r) => {
            let s = json!({"role": r.role.to_raw(), "generation_id": r.generation_id});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
        }
        Message::MeterMod(mm) => {
            let s = json!({"command": mm.command.to_raw(), "flags": mm.flags.bits(), "meter_id": mm.meter_id});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
            let bands = body["bands"].as_array().cloned().unwrap_or_default();
            if bands.len() != mm.bands.len() {
                errs.push(format!(
                    "{ctx}: {} bands, Ryu {}",
                    mm.bands.len(),
                    bands.len()
                ));
            }
            for (b, rb) in mm.bands.iter().zip(&bands) {
                let (cls, s) = match b {
                    ofp::MeterBand::Drop { rate, burst_size } => (
                        "OFPMeterBandDrop",
                        json!({"rate": rate, "burst_size": burst_size}),
                    ),
                    ofp::MeterBand::DscpRemark {
                        rate,
                        burst_size,
                        prec_level,
                    } => (
                        "OFPMeterBandDscpRemark",
                        json!({"rate": rate, "burst_size": burst_size, "prec_level": prec_level}),
                    ),
                    ofp::MeterBand::Experimenter {
                        rate,
                        burst_size,
                        experimenter,
                        ..
                    } => (
                        "OFPMeterBandExperimenter",
                        json!({"rate": rate, "burst_size": burst_size, "experimenter": experimenter}),
                    ),
                    ofp::MeterBand::Unknown { .. } => ("?", json!({})),
                };
                match rb.get(cls) {
                    Some(rv) => check_scalars(ctx, s, rv, errs, &mut c.scalars),
                    None => errs.push(format!("{ctx}: band {cls} vs Ryu {rb}")),
                }
            }
        }
        Message::GroupMod(g) => {
            let s = json!({"command": g.command.to_raw(), "type": g.group_type.to_raw(), "group_id": g.group_id});
            check_scalars(ctx, s, body, errs, &mut c.scalars);
            let bs = body["buckets"].as_array().cloned().unwrap_or_default();
            if bs.len() != g.buckets.len() {
                errs.push(format!(
                    "{ctx}: {} buckets, Ryu {}",
                    g.buckets.len(),
                    bs.len()
                ));
            }
            for (b, rb) in g.buckets.iter().zip(&bs) {
                let s = json!({"weight": b.weight, "watch_port": b.watch_port, "watch_group": b.watch_group});
                check_scalars(ctx, s, &rb["OFPBucket"], errs, &mut c.scalars);
                let na = rb["OFPBucket"]["actions"].as_array().map_or(0, Vec::len);
                if na != b.actions.len() {
                    errs.push(format!(
                        "{ctx}: {} actions in bucket, Ryu {na}",
                        b.actions.len()
                    ));
                }
            }
        }
        Message::Error(e) => {
            let (t, code) = e.kind.type_code();
            let s = match e.kind {
                ofp::ErrorKind::Experimenter {
                    exp_type,
                    experimenter,
                } => {
                    json!({"type": t, "exp_type": exp_type, "experimenter": experimenter})
                }
                _ => json!({"type": t, "code": code}),
            };
            check_scalars(ctx, s, body, errs, &mut c.scalars);
        }
        Message::SetConfig(s) | Message::GetConfigReply(s) => {
            check_scalars(
                ctx,
                json!({"flags": s.flags, "miss_send_len": s.miss_send_len}),
                body,
                errs,
                &mut c.scalars,
            );
        }
        Message::PacketOut(p) => {
            check_scalars(
                ctx,
                json!({"buffer_id": p.buffer_id, "in_port": p.in_port}),
                body,
                errs,
                &mut c.scalars,
            );
        }
        Message::PortStatus(p) => {
            check_scalars(
                ctx,
                json!({"reason": p.reason.to_raw()}),
                body,
                errs,
                &mut c.scalars,
            );
            if let Some(d) = body.pointer("/desc/OFPPort") {
                let s = json!({"port_no": p.desc.port_no, "name": p.desc.name.as_str(), "hw_addr": mac(&p.desc.hw_addr),
                    "config": p.desc.config, "state": p.desc.state, "curr_speed": p.desc.curr_speed, "max_speed": p.desc.max_speed});
                check_scalars(ctx, s, d, errs, &mut c.scalars);
            }
        }
        Message::TableMod(t) => {
            check_scalars(
                ctx,
                json!({"table_id": t.table_id, "config": t.config}),
                body,
                errs,
                &mut c.scalars,
            );
        }
        Message::MultipartRequest(r) => {
            check_scalars(ctx, json!({"flags": r.flags}), body, errs, &mut c.scalars);
            if let Qb::Flow(f) | Qb::Aggregate(f) = &r.body {
                let s = json!({"table_id": f.table_id, "out_port": f.out_port, "out_group": f.out_group,
                    "cookie": f.cookie, "cookie_mask": f.cookie_mask});
                check_scalars(ctx, s, body, errs, &mut c.scalars);
                check_match(ctx, &f.match_, &body["match"], errs, &mut c.oxms);
            }
        }
        Message::MultipartReply(r) => {
            check_scalars(ctx, json!({"flags": r.flags}), body, errs, &mut c.scalars);
            if let Rb::Flow(v) = &r.body {
                let rb = body["body"].as_array().cloned().unwrap_or_default();
                if rb.len() != v.len() {
                    errs.push(format!("{ctx}: {} flow stats, Ryu {}", v.len(), rb.len()));
                }
                for (f, j) in v.iter().zip(&rb) {
                    let j = &j["OFPFlowStats"];
                    let s = json!({"table_id": f.table_id, "duration_sec": f.duration_sec, "priority": f.priority,
                        "cookie": f.cookie, "packet_count": f.packet_count, "byte_count": f.byte_count, "flags": f.flags.bits()});
                    check_scalars(ctx, s, j, errs, &mut c.scalars);
                    check_match(ctx, &f.match_, &j["match"], errs, &mut c.oxms);
                }
            }
        }
        _ => {}
    }
}

#[test]
fn ryu_of13_vectors() {
    let files = packets();
    assert!(
        files.len() >= 70,
        "expected the Ryu vectors in {}, found {}",
        dir().display(),
        files.len()
    );
    let mut errs = Vec::new();
    let mut c = Counts {
        files: 0,
        roundtrip: 0,
        scalars: 0,
        oxms: 0,
    };
    for path in &files {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        c.files += 1;
        let raw = std::fs::read(path).expect("read packet");
        let (xid, msg) = match decode(Bytes::from(raw.clone())) {
            Ok(x) => x,
            Err(e) => {
                errs.push(format!("{name}: decode failed: {e:?}"));
                continue;
            }
        };
        let mut out = BytesMut::new();
        match encode(xid, &msg, &mut out) {
            Ok(()) if out[..] == raw[..] => c.roundtrip += 1,
            Ok(()) => {
                let at = out
                    .iter()
                    .zip(&raw)
                    .position(|(a, b)| a != b)
                    .unwrap_or(out.len().min(raw.len()));
                errs.push(format!(
                    "{name}: re-encoding differs at byte {at} (ours {} bytes, wire {})",
                    out.len(),
                    raw.len()
                ));
            }
            Err(e) => errs.push(format!("{name}: encode failed: {e:?}")),
        }
        let mut jp = path.clone().into_os_string();
        jp.push(".json");
        match std::fs::read(&jp)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            Some(j) => compare_json(&name, &msg, &j, &mut errs, &mut c),
            None => errs.push(format!("{name}: no JSON decoding")),
        }
    }
    println!(
        "conformance: {} files, {} byte-identical round trips, {} scalar fields and {} OXMs compared with Ryu's JSON, {} problems",
        c.files,
        c.roundtrip,
        c.scalars,
        c.oxms,
        errs.len()
    );
    for e in &errs {
        println!("  FAIL {e}");
    }
    assert!(errs.is_empty(), "{} conformance problems", errs.len());
}

#[test]
fn truncated_flow_mod_is_truncated() {
    let raw = std::fs::read(dir().join("libofproto-OFP13-flow_mod.packet")).expect("read");
    assert!(raw.len() > 64);
    let cut = Bytes::copy_from_slice(&raw[..64]);
    assert_eq!(decode(cut), Err(DecodeError::Truncated));
    // And every shorter prefix too: never a panic, always an error.
    for n in 0..raw.len() {
        assert!(
            decode(Bytes::copy_from_slice(&raw[..n])).is_err(),
            "prefix {n}"
        );
    }
}

#[test]
fn decode_file_bytes_and_json_lines() {
    let mut all = Vec::new();
    for p in packets() {
        all.extend(std::fs::read(p).expect("read"));
    }
    let msgs = ofp::decode_file_bytes(&all).expect("concatenated vectors decode");
    assert_eq!(msgs.len(), packets().len());
    let lines = ofp::display::to_json_lines(&all).expect("json");
    for l in &lines {
        let v: Value = serde_json::from_str(l).expect("valid JSON");
        assert!(
            v["type"].as_str().is_some_and(|t| t.starts_with("OFPT_")),
            "{l}"
        );
    }
    let mut junk = all.clone();
    junk.extend_from_slice(&[4, 0, 0]);
    assert_eq!(
        ofp::decode_file_bytes(&junk).map(|v| v.len()),
        Err(DecodeError::TrailingBytes)
    );
}
