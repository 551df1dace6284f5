//! A switch's session as the bytes come: the session reads the messages of a batch where
//! they lie in its buffer and drops them from it once the core has handled them, so each
//! must be handled once, in order, and a message cut between two reads when its rest comes.

mod support;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use support::fake_switch::*;
use support::*;

const SERVICE: &str = "[[service]]\nname = \"web\"\nvip = \"10.0.0.100\"\nport = 80\n[service.health]\nkind = \"none\"\n[[service.backend]]\naddress = \"10.0.0.2\"\n";

/// The xids of the next `n` ECHO_REPLYs, in the order they come (other messages, the
/// answers to the PACKET_INs among them, are read and passed over).
fn echo_replies(s: &mut TcpStream, n: usize) -> Vec<u32> {
    let mut xids = Vec::new();
    while xids.len() < n {
        let m = read_msg(s)
            .expect("read (5 s timeout)")
            .expect("the session is open");
        if m[1] == OFPT_ECHO_REPLY {
            xids.push(xid_of(&m));
        }
    }
    xids
}

#[test]
fn the_messages_of_one_write_are_handled_once_each_in_order() {
    let ctl = Ctl::start("session-batch", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e55);
    let before = ctl.packet_ins();
    let decided = || {
        let (_, body) = ctl.get("/metrics");
        metric(&body, "flowgate_decision_latency_seconds_count").expect("the histogram's count")
            as u64
    };
    let decided_before = decided();

    // One write: three echo requests, each followed by a PACKET_IN, then the first 30
    // bytes of a fourth PACKET_IN.
    let mut chunk = Vec::new();
    for i in 0..3u16 {
        chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2000 + u32::from(i)));
        chunk.extend_from_slice(&packet_in_syn(0x3000 + u32::from(i), 41_000 + i));
    }
    let last = packet_in_syn(0x3003, 41_003);
    let (head, rest) = last.split_at(30);
    chunk.extend_from_slice(head);
    s.write_all(&chunk).expect("write the batch");
    assert_eq!(echo_replies(&mut s, 3), [0x2000, 0x2001, 0x2002]);
    wait_until("the three whole PACKET_INs", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 3
    });

    // The cut PACKET_IN's rest, and an echo behind it: both handled, nothing twice.
    let mut chunk = rest.to_vec();
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2003));
    s.write_all(&chunk).expect("write the rest");
    assert_eq!(echo_replies(&mut s, 1), [0x2003]);
    wait_until("the fourth PACKET_IN", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 4
    });
    // A later read of the session finds nothing of them left in its buffer.
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x2004))
        .expect("write an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x2004]);
    assert_eq!(ctl.packet_ins(), before + 4, "a PACKET_IN handled twice");
    // Each decision's time reached the histogram (counted per batch, added at its end).
    assert_eq!(decided(), decided_before + 4);
}

// OpenFlow 1.3 message types (§7.1) the fake switch answers here.
const OFPT_ROLE_REQUEST: u8 = 24;
const OFPT_ROLE_REPLY: u8 = 25;

/// Reads until a ROLE_REQUEST, answers it with the role it asks for (§6.3.6), and returns
/// that role.
fn answer_role_request(s: &mut TcpStream) -> u32 {
    loop {
        let m = read_msg(s)
            .expect("read (5 s timeout)")
            .expect("the session is open");
        if m[1] == OFPT_ROLE_REQUEST {
            let mut reply = m.clone();
            reply[1] = OFPT_ROLE_REPLY;
            s.write_all(&reply).expect("role reply");
            return u32::from_be_bytes([m[8], m[9], m[10], m[11]]);
        }
    }
}

/// Whether the controller closes `s` (EOF or reset) within `timeout`; reads and
/// discards what comes meanwhile.
fn closed_within(s: &mut TcpStream, timeout: Duration) -> bool {
    let start = Instant::now();
    let mut buf = [0u8; 4096];
    s.set_read_timeout(Some(Duration::from_millis(100))).ok();
    while start.elapsed() < timeout {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// A switch that connects again while its old connection still looks open (half-open:
/// the controller has not seen it die): the new session is the switch's, the old one is
/// closed by the controller, and the old one's end leaves the new one's state alone. In
/// a cluster that state is the switch's role: had the old session's end wiped it, the
/// new session's PACKET_INs would be dropped as a standby's.
#[test]
fn a_switch_that_connects_again_keeps_its_new_session() {
    const DPID: u64 = 0x5e56;
    let cluster = format!(
        "[cluster]\nrole = \"domain\"\nname = \"session\"\ninstance = \"d1a\"\ndomain = \"d1\"\ndpids = [\"{DPID:016x}\"]\netcd = [\"memory:\"]\n"
    );
    let ctl = Ctl::start("session-again", &format!("{LISTEN_ANY}{SERVICE}{cluster}"));
    wait_until("mastership", Duration::from_secs(10), || {
        ctl.get_json("/api/v1/cluster")["mastership"] == "master"
    });
    let role =
        || ctl.get_json("/api/v1/cluster")["switches"][format!("{DPID:016x}")]["role"].clone();
    const MASTER: u32 = 2;

    let mut old = handshake(ctl.openflow, DPID);
    let old_port = old.local_addr().expect("addr").port();
    assert_eq!(answer_role_request(&mut old), MASTER);
    wait_until("the old session is master", Duration::from_secs(5), || {
        role() == "master"
    });

    let mut new = handshake(ctl.openflow, DPID);
    assert_eq!(answer_role_request(&mut new), MASTER);
    let old_closed = closed_within(&mut old, Duration::from_secs(3));
    // The old connection ends (if the controller has not ended it): its session's end
    // must leave the new one's role.
    drop(old);
    wait_until("the old session's end", Duration::from_secs(5), || {
        ctl.log_plain()
            .contains(&format!("peer=127.0.0.1:{old_port}"))
            && ctl.log_plain().matches("switch disconnected").count() == 1
    });
    wait_until("the new session is master", Duration::from_secs(5), || {
        role() == "master"
    });

    let before = ctl.packet_ins();
    new.write_all(&packet_in_syn(0x4000, 42_000))
        .expect("a SYN");
    new.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x4001))
        .expect("an echo");
    assert_eq!(echo_replies(&mut new, 1), [0x4001]);
    wait_until(
        "the new session's PACKET_IN reaches the core",
        Duration::from_secs(5),
        || ctl.packet_ins() == before + 1,
    );
    assert!(old_closed, "the controller left the replaced session open");
    assert_eq!(
        ctl.log_plain().matches("switch disconnected").count(),
        1,
        "only the old session ended"
    );
}

/// A peer that sends HELLO, then large ECHO_REQUESTs, and never reads: the controller's
/// replies fill the connection and its writes wait. The handshake's deadline (10 s)
/// covers those writes as well as the reads, and ends the session.
#[test]
fn a_peer_that_never_reads_is_closed_at_the_handshake_deadline() {
    let ctl = Ctl::start(
        "session-unread-handshake",
        &format!("{LISTEN_ANY}{SERVICE}"),
    );
    let sock =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    // Small before the connection, so that the window it offers stays small.
    sock.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    sock.connect(&ctl.openflow.into()).expect("connect");
    let mut s: TcpStream = sock.into();
    let port = s.local_addr().expect("addr").port();
    let start = Instant::now();
    s.set_write_timeout(Some(Duration::from_millis(500))).ok();
    s.write_all(&header(4, OFPT_HELLO, 8, 1)).expect("hello");
    let mut echo = header(4, OFPT_ECHO_REQUEST, 60_008, 2);
    echo.resize(60_008, 0);
    // Until the controller stops reading (our write times out): it waits on its own.
    for _ in 0..400 {
        if s.write_all(&echo).is_err() {
            break;
        }
    }
    ctl.wait_log(
        &format!(
            "switch session ended peer=127.0.0.1:{port} error=timed out waiting for the handshake"
        ),
        Duration::from_secs(20),
    );
    assert!(
        start.elapsed() >= Duration::from_secs(9),
        "ended after {:?}, before its deadline",
        start.elapsed()
    );
}

/// Connections that never finish a handshake hold at most `MAX_HANDSHAKES` places: one
/// more is closed at once, and once they are gone a switch connects as ever.
#[test]
fn connections_beyond_the_handshake_cap_are_closed_at_once() {
    use flowgate::runtime::MAX_HANDSHAKES;
    let ctl = Ctl::start("session-handshake-cap", &format!("{LISTEN_ANY}{SERVICE}"));
    // Silent: each waits in its handshake (for the controller's 10 s deadline).
    let mut silent: Vec<TcpStream> = (0..MAX_HANDSHAKES)
        .map(|_| TcpStream::connect(ctl.openflow).expect("connect"))
        .collect();
    let mut over = TcpStream::connect(ctl.openflow).expect("connect");
    let start = Instant::now();
    assert!(
        closed_within(&mut over, Duration::from_secs(3)),
        "the connection over the cap is still open"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    ctl.wait_log(
        &format!("{MAX_HANDSHAKES} connections in their handshake: closing new ones"),
        Duration::from_secs(2),
    );
    // Each silent one is still in its handshake: it is given the controller's HELLO.
    for s in silent.iter_mut().take(3) {
        s.set_read_timeout(Some(Duration::from_secs(5))).ok();
        let hello = read_msg(s).expect("read").expect("open");
        assert_eq!(hello[1], OFPT_HELLO);
    }
    drop(silent);
    wait_until("the silent ones' ends", Duration::from_secs(5), || {
        ctl.log_plain().matches("switch session ended").count() == MAX_HANDSHAKES
    });
    let mut s = handshake(ctl.openflow, 0x5e57);
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x7000))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x7000]);
}

// A message of a type OpenFlow 1.3 does not define (§7.1 stops at 29).
const UNKNOWN_TYPE: u8 = 99;

/// A message whose header frames it whole but which does not decode: `ty` with a 4-byte
/// body (too short for a PACKET_IN, §7.4.1, or a FLOW_REMOVED, §7.4.2; of no type at all
/// for `UNKNOWN_TYPE`).
fn undecodable(version: u8, ty: u8, xid: u32) -> Vec<u8> {
    let mut m = header(version, ty, 12, xid);
    m.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
    m
}

/// An OFPT_ERROR's type and code (§7.4.4).
fn error_type_code(m: &[u8]) -> (u16, u16) {
    (
        u16::from_be_bytes([m[8], m[9]]),
        u16::from_be_bytes([m[10], m[11]]),
    )
}
const OFPET_BAD_REQUEST: u16 = 1;
const OFPBRC_BAD_VERSION: u16 = 0;
const OFPBRC_BAD_TYPE: u16 = 1;
const OFPBRC_BAD_LEN: u16 = 6;

/// Reads until `errors` OFPT_ERRORs and `echoes` ECHO_REPLYs have come; returns the
/// errors, the echo replies' xids (each in the order they came) and the types of
/// everything else.
fn errors_and_echoes(
    s: &mut TcpStream,
    errors: usize,
    echoes: usize,
) -> (Vec<Vec<u8>>, Vec<u32>, Vec<u8>) {
    let (mut errs, mut echo, mut other) = (Vec::new(), Vec::new(), Vec::new());
    while errs.len() < errors || echo.len() < echoes {
        let m = read_msg(s)
            .expect("read (5 s timeout)")
            .expect("the session is open");
        match m[1] {
            OFPT_ERROR => errs.push(m),
            OFPT_ECHO_REPLY => echo.push(xid_of(&m)),
            t => other.push(t),
        }
    }
    (errs, echo, other)
}

/// PACKET_INs decided (the decision latency histogram's count).
fn decided(ctl: &Ctl) -> u64 {
    metric(
        &ctl.get("/metrics").1,
        "flowgate_decision_latency_seconds_count",
    )
    .expect("the histogram's count") as u64
}

fn undecodable_total(ctl: &Ctl) -> u64 {
    metric(
        &ctl.get("/metrics").1,
        "flowgate_openflow_undecodable_total",
    )
    .expect("flowgate_openflow_undecodable_total") as u64
}

/// §7.4.4: a message of an unknown type is answered with OFPET_BAD_REQUEST /
/// OFPBRC_BAD_TYPE, the offending xid and the offending message (shorter than 64 bytes:
/// all of it), and the session goes on: an echo is answered and a SYN to the VIP is
/// decided.
#[test]
fn a_message_of_an_unknown_type_is_answered_with_bad_type_and_the_session_goes_on() {
    let ctl = Ctl::start("session-bad-type", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e58);
    let before = ctl.packet_ins();
    let decided_before = decided(&ctl);
    let bad = undecodable(4, UNKNOWN_TYPE, 0x6000);
    s.write_all(&bad).expect("an unknown type");
    let (errs, _, _) = errors_and_echoes(&mut s, 1, 0);
    let e = &errs[0];
    assert_eq!(e[0], 4, "an OpenFlow 1.3 error");
    assert_eq!(xid_of(e), 0x6000, "the offending xid");
    assert_eq!(error_type_code(e), (OFPET_BAD_REQUEST, OFPBRC_BAD_TYPE));
    assert_eq!(&e[12..], &bad[..], "the offending message, whole");

    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x6001))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x6001]);
    s.write_all(&packet_in_syn(0x6002, 43_000)).expect("a SYN");
    // The SYN reaches the core and is decided (its backend is not located here: the
    // decision is to hold it, which the other tests of this file count the same way).
    wait_until("the SYN's PACKET_IN", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 1
    });
    // An echo behind it: its batch's decision times are in the histogram by its reply.
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x6003))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x6003]);
    assert_eq!(decided(&ctl), decided_before + 1);

    let (_, body) = ctl.get("/metrics");
    assert!(
        body.contains("# TYPE flowgate_openflow_undecodable_total counter\n"),
        "{body}"
    );
    assert!(body.contains("# HELP flowgate_openflow_undecodable_total "));
    assert_eq!(undecodable_total(&ctl), 1);
    ctl.wait_log(
        "a message from the switch does not decode",
        Duration::from_secs(2),
    );
    assert!(
        !ctl.log_plain().contains("switch session ended"),
        "{}",
        ctl.log_plain()
    );
}

/// Malformed messages in the middle of one write: a PACKET_IN (which the core reads in
/// place) and a FLOW_REMOVED (which the session reads before the batch reaches the core),
/// each too short for its type. Each is answered with OFPBRC_BAD_LEN and its xid; the
/// messages before and after them are handled, once each and in order.
#[test]
fn malformed_messages_in_a_batch_are_answered_and_the_rest_handled() {
    let ctl = Ctl::start("session-bad-batch", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e59);
    let before = ctl.packet_ins();
    let decided_before = decided(&ctl);

    let mut chunk = Vec::new();
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2100));
    chunk.extend_from_slice(&packet_in_syn(0x3100, 44_000));
    chunk.extend_from_slice(&undecodable(4, OFPT_PACKET_IN, 0x3101));
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2101));
    chunk.extend_from_slice(&packet_in_syn(0x3102, 44_001));
    chunk.extend_from_slice(&undecodable(4, OFPT_FLOW_REMOVED, 0x3103));
    chunk.extend_from_slice(&packet_in_syn(0x3104, 44_002));
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x2102));
    s.write_all(&chunk).expect("write the batch");

    let (errs, echoes, _) = errors_and_echoes(&mut s, 2, 3);
    assert_eq!(echoes, [0x2100, 0x2101, 0x2102], "the echoes, in order");
    let mut answered: Vec<(u32, (u16, u16))> = errs
        .iter()
        .map(|e| (xid_of(e), error_type_code(e)))
        .collect();
    answered.sort();
    assert_eq!(
        answered,
        [
            (0x3101, (OFPET_BAD_REQUEST, OFPBRC_BAD_LEN)),
            (0x3103, (OFPET_BAD_REQUEST, OFPBRC_BAD_LEN)),
        ]
    );
    wait_until("the three good PACKET_INs", Duration::from_secs(5), || {
        ctl.packet_ins() == before + 3
    });
    // Still open, and nothing of the batch handled twice.
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x2103))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x2103]);
    assert_eq!(ctl.packet_ins(), before + 3);
    assert_eq!(decided(&ctl), decided_before + 3);
    assert_eq!(undecodable_total(&ctl), 2);
}

/// A message of another version than the one negotiated (here OpenFlow 1.0's ECHO_REQUEST
/// and a PACKET_IN marked 1.2) is answered with OFPBRC_BAD_VERSION, as Open vSwitch does,
/// and the session goes on.
#[test]
fn a_message_of_another_version_is_answered_with_bad_version() {
    let ctl = Ctl::start("session-bad-version", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e5a);
    let before = ctl.packet_ins();
    let echo_1_0 = header(1, OFPT_ECHO_REQUEST, 8, 0x6100);
    let mut pi_1_2 = packet_in_syn(0x6101, 45_000);
    pi_1_2[0] = 3;
    let mut chunk = echo_1_0.clone();
    chunk.extend_from_slice(&pi_1_2);
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x6102));
    s.write_all(&chunk).expect("write");
    let (errs, echoes, other) = errors_and_echoes(&mut s, 2, 1);
    assert_eq!(echoes, [0x6102]);
    assert!(
        !other.contains(&OFPT_ECHO_REPLY),
        "the 1.0 echo was answered"
    );
    let mut errs: Vec<_> = errs.iter().map(|e| (xid_of(e), e.clone())).collect();
    errs.sort();
    assert_eq!(errs[0].0, 0x6100);
    assert_eq!(
        error_type_code(&errs[0].1),
        (OFPET_BAD_REQUEST, OFPBRC_BAD_VERSION)
    );
    assert_eq!(&errs[0].1[12..], &echo_1_0[..]);
    assert_eq!(errs[1].0, 0x6101);
    assert_eq!(
        error_type_code(&errs[1].1),
        (OFPET_BAD_REQUEST, OFPBRC_BAD_VERSION)
    );
    // A PACKET_IN of 94 bytes: its first 64.
    assert_eq!(&errs[1].1[12..], &pi_1_2[..64]);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(ctl.packet_ins(), before, "the 1.2 PACKET_IN was handled");
}

/// A peer that keeps sending what does not decode is closed: 64 at once are answered and
/// the session goes on; more than 64 (within the second or so one more takes to come back)
/// close it, with the reason in the log.
#[test]
fn more_than_64_undecodable_messages_at_once_close_the_session() {
    let ctl = Ctl::start("session-bad-bound", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = handshake(ctl.openflow, 0x5e5b);
    let port = s.local_addr().expect("addr").port();
    let mut chunk = Vec::new();
    for i in 0..64 {
        chunk.extend_from_slice(&undecodable(4, UNKNOWN_TYPE, 0x7000 + i));
    }
    chunk.extend_from_slice(&header(4, OFPT_ECHO_REQUEST, 8, 0x7100));
    s.write_all(&chunk).expect("64 of them");
    let (errs, echoes, _) = errors_and_echoes(&mut s, 64, 1);
    assert_eq!(echoes, [0x7100], "still open after 64");
    let xids: Vec<u32> = errs.iter().map(|e| xid_of(e)).collect();
    assert_eq!(xids, (0x7000..0x7040).collect::<Vec<_>>());

    // Eight more: within eight seconds of the first, the allowance cannot have come back.
    let mut chunk = Vec::new();
    for i in 0..8 {
        chunk.extend_from_slice(&undecodable(4, UNKNOWN_TYPE, 0x7200 + i));
    }
    s.write_all(&chunk).expect("more");
    assert!(
        closed_within(&mut s, Duration::from_secs(3)),
        "the session is still open"
    );
    ctl.wait_log(
        &format!("switch session ended peer=127.0.0.1:{port} error="),
        Duration::from_secs(2),
    );
    assert!(
        ctl.log_plain()
            .contains("undecodable messages from the switch, more than 64 at once"),
        "{}",
        ctl.log_plain()
    );
    assert!(undecodable_total(&ctl) >= 65);
    // The controller takes the next switch as ever.
    let mut s = handshake(ctl.openflow, 0x5e5c);
    s.write_all(&header(4, OFPT_ECHO_REQUEST, 8, 0x7300))
        .expect("an echo");
    assert_eq!(echo_replies(&mut s, 1), [0x7300]);
}

/// In the handshake, a message that does not decode is answered the same way, and the
/// connection closed: the switch has not finished becoming one.
#[test]
fn a_message_that_does_not_decode_in_the_handshake_is_answered_then_closed() {
    let ctl = Ctl::start("session-bad-handshake", &format!("{LISTEN_ANY}{SERVICE}"));
    let mut s = TcpStream::connect(ctl.openflow).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let bad = undecodable(4, UNKNOWN_TYPE, 0x7400);
    let mut chunk = header(4, OFPT_HELLO, 8, 1);
    chunk.extend_from_slice(&bad);
    s.write_all(&chunk).expect("hello and a bad message");
    let mut error = None;
    while let Ok(Some(m)) = read_msg(&mut s) {
        if m[1] == OFPT_ERROR {
            error = Some(m);
            break;
        }
    }
    let e = error.expect("an OFPT_ERROR before the close");
    assert_eq!(xid_of(&e), 0x7400);
    assert_eq!(error_type_code(&e), (OFPET_BAD_REQUEST, OFPBRC_BAD_TYPE));
    assert_eq!(&e[12..], &bad[..]);
    assert!(closed_within(&mut s, Duration::from_secs(3)));
    ctl.wait_log(
        "error=undecodable message from the switch: unknown message type 99",
        Duration::from_secs(2),
    );
}

/// A FLOW_REMOVED (§7.4.2) of a rule of no kind the controller keeps (cookie 0): its
/// idle timeout, an empty match.
fn flow_removed(xid: u32) -> Vec<u8> {
    let mut v = header(4, OFPT_FLOW_REMOVED, 56, xid);
    v.extend_from_slice(&0u64.to_be_bytes()); // cookie
    v.extend_from_slice(&100u16.to_be_bytes()); // priority
    v.extend_from_slice(&[0, 0]); // reason OFPRR_IDLE_TIMEOUT, table 0
    v.extend_from_slice(&[0; 8]); // duration_sec, duration_nsec
    v.extend_from_slice(&10u16.to_be_bytes()); // idle_timeout
    v.extend_from_slice(&0u16.to_be_bytes()); // hard_timeout
    v.extend_from_slice(&[0; 16]); // packet_count, byte_count
    v.extend_from_slice(&[0, 1, 0, 4, 0, 0, 0, 0]); // OXM match, empty, padded to 8
    v
}

/// A switch played as Open vSwitch's connection manager behaves: it takes the
/// controller's messages slowly, queues its PACKET_INs only while its queue to the
/// controller is short (dropping the rest), queues every FLOW_REMOVED and echo reply, and
/// reads nothing more while 100 of those replies wait unsent (`OFCONN_REPLY_MAX`).
struct OvsLike {
    s: TcpStream,
    /// Bytes for the controller, from `sent` on not yet taken by the socket.
    out: Vec<u8>,
    sent: usize,
    /// Where each reply not yet taken ends in `out`.
    replies: std::collections::VecDeque<usize>,
    /// The controller's bytes read, not yet a whole message.
    inbuf: Vec<u8>,
    xid: u32,
    flow_removed_sent: u64,
    packet_ins_queued: u64,
    /// PACKET_OUTs read: the controller's answers.
    packet_outs: u64,
    packet_ins_dropped: u64,
    /// Ticks in which it read nothing because of its replies.
    ticks_not_reading: u64,
}

impl OvsLike {
    /// Replies waiting unsent beyond which Open vSwitch stops reading (connmgr.c).
    const REPLY_MAX: usize = 100;
    /// PACKET_INs are queued only while fewer bytes than this wait unsent.
    const PACKET_IN_QUEUE: usize = 64 * 1024;
    /// Bytes of the controller's read per tick: about 2 MB/s, a slow switch.
    const READ_PER_TICK: usize = 2048;

    fn new(s: TcpStream) -> Self {
        // A small send buffer: what the controller does not read waits here, in view.
        let _ = socket2::SockRef::from(&s).set_send_buffer_size(32 * 1024);
        s.set_nonblocking(true).expect("nonblocking");
        OvsLike {
            s,
            out: Vec::new(),
            sent: 0,
            replies: Default::default(),
            inbuf: Vec::new(),
            xid: 0x40_0000,
            flow_removed_sent: 0,
            packet_ins_queued: 0,
            packet_outs: 0,
            packet_ins_dropped: 0,
            ticks_not_reading: 0,
        }
    }

    fn reply(&mut self, m: &[u8]) {
        self.out.extend_from_slice(m);
        self.replies.push_back(self.out.len());
    }

    /// One millisecond: `syns` PACKET_INs offered, `removed` rules expired, then as much
    /// written and read as the socket and the reply rule allow.
    fn tick(&mut self, syns: u16, removed: u16) {
        for _ in 0..syns {
            self.xid += 1;
            if self.out.len() - self.sent < Self::PACKET_IN_QUEUE {
                let m = packet_in_syn(self.xid, 1024 + (self.xid % 60_000) as u16);
                self.out.extend_from_slice(&m);
                self.packet_ins_queued += 1;
            } else {
                self.packet_ins_dropped += 1;
            }
        }
        for _ in 0..removed {
            self.xid += 1;
            self.reply(&flow_removed(self.xid));
            self.flow_removed_sent += 1;
        }
        self.write();
        if self.replies.len() >= Self::REPLY_MAX {
            self.ticks_not_reading += 1;
        } else {
            self.read();
        }
        std::thread::sleep(Duration::from_millis(1));
    }

    fn write(&mut self) {
        while self.sent < self.out.len() {
            match self.s.write(&self.out[self.sent..]) {
                Ok(0) => panic!("the controller closed the session"),
                Ok(k) => self.sent += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("write to the controller: {e}"),
            }
        }
        while self.replies.front().is_some_and(|&end| end <= self.sent) {
            self.replies.pop_front();
        }
        if self.sent == self.out.len() {
            self.out.clear();
            self.sent = 0;
            self.replies.clear();
        }
    }

    /// Up to `READ_PER_TICK` bytes; ECHO_REQUESTs answered (a reply too). Returns the bytes
    /// of whole messages read other than ECHO_REQUESTs: the controller probes its channel
    /// every 125 ms (`outlier_max_channel_rtt_ms`), and a drain that counted the probes
    /// would never see it quiet.
    fn read(&mut self) -> usize {
        let mut buf = [0u8; Self::READ_PER_TICK];
        let n = match self.s.read(&mut buf) {
            Ok(0) => panic!("the controller closed the session"),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return 0,
            Err(e) => panic!("read from the controller: {e}"),
        };
        self.inbuf.extend_from_slice(&buf[..n]);
        let mut work = 0;
        while self.inbuf.len() >= 8 {
            let len = usize::from(u16::from_be_bytes([self.inbuf[2], self.inbuf[3]])).max(8);
            if self.inbuf.len() < len {
                break;
            }
            let m: Vec<u8> = self.inbuf.drain(..len).collect();
            if m[1] == OFPT_ECHO_REQUEST {
                let mut r = m.clone();
                r[1] = OFPT_ECHO_REPLY;
                self.reply(&r);
            } else {
                work += len;
            }
            if m[1] == OFPT_PACKET_OUT {
                self.packet_outs += 1;
            }
        }
        work
    }
}

#[test]
fn a_switch_that_stops_reading_while_its_flow_removed_go_unread_keeps_its_session() {
    // Open vSwitch counts FLOW_REMOVED as a reply to the controller, and reads nothing
    // from a controller that leaves 100 replies unread. A controller that stopped reading a
    // switch behind on its answers waited for a switch that waited for it: in the lab's
    // full runs the switch timed its controller out and connected again. The session must
    // read on (dropping PACKET_INs while the switch is behind) and keep the switch.
    let ctl = Ctl::start(
        "session-behind",
        &format!(
            "[openflow]\nlisten = \"127.0.0.1:0\"\necho_interval_ms = 300\necho_timeout_ms = 900\n\
             packet_in_rate = 20000\n\n[api]\nlisten = \"127.0.0.1:0\"\n\n{SERVICE}"
        ),
    );
    let mut s = handshake(ctl.openflow, 0xbe41);
    let port = s.local_addr().expect("addr").port();
    // The backend is on port 2: each SYN is then decided, and answered with its rules
    // and a PACKET_OUT (a few hundred bytes), not refused.
    s.write_all(&packet_in_garp(
        0x3fff,
        2,
        [2, 0, 0, 0, 0, 2],
        [10, 0, 0, 2],
    ))
    .expect("the backend's ARP");
    wait_until("the backend placed", Duration::from_secs(5), || {
        ctl.get_json("/api/v1/services")[0]["backends"][0]["located"] == true
    });
    let mut sw = OvsLike::new(s);
    // 4 s of a flood (50 SYNs a ms offered) and 2,000 expiries a second: far more answers
    // than the switch takes, for three times the keep-alive's interval and timeout.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(4) {
        sw.tick(50, 2);
    }
    // The flood stops; the switch takes the backlog until the controller is quiet.
    let mut quiet_since = Instant::now();
    let drain = Instant::now();
    while quiet_since.elapsed() < Duration::from_millis(500) {
        assert!(
            drain.elapsed() < Duration::from_secs(30),
            "the controller's backlog did not drain in 30 s"
        );
        sw.write();
        if sw.replies.len() < OvsLike::REPLY_MAX && sw.read() > 0 {
            quiet_since = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!(
        "PACKET_INs queued {}, dropped by the switch {}; FLOW_REMOVED {}; ms not reading {}",
        sw.packet_ins_queued, sw.packet_ins_dropped, sw.flow_removed_sent, sw.ticks_not_reading
    );
    let log = ctl.log_plain();
    assert!(
        !log.contains(&format!("switch session ended peer=127.0.0.1:{port}")),
        "the session ended:\n{log}"
    );
    assert!(
        log.contains("dropping its PACKET_INs until it catches up"),
        "the switch was never behind, so this shows nothing:\n{log}"
    );
    let body = ctl.get("/metrics").1;
    let behind = metric(&body, "flowgate_packet_in_dropped_behind_total").unwrap_or(0.0);
    assert!(behind > 0.0, "no PACKET_IN dropped while behind");
    // Every expiry reached the core, none lost with a session.
    let removed = metric(&body, "flowgate_flow_removed_total").unwrap_or(0.0);
    assert_eq!(removed as u64, sw.flow_removed_sent, "FLOW_REMOVED handled");
    assert_eq!(ctl.switch_dpids(), [0xbe41]);
    // Caught up, it is served again: a new SYN is answered.
    let outs = sw.packet_outs;
    sw.xid += 1;
    sw.out.extend_from_slice(&packet_in_syn(sw.xid, 61_111));
    let asked = Instant::now();
    while sw.packet_outs == outs {
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "a new SYN unanswered after the backlog"
        );
        sw.write();
        sw.read();
        std::thread::sleep(Duration::from_millis(1));
    }
}
