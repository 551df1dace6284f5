//! `flowgate bench floor`: the bench's floor, a VIP responder that decides nothing.
//!
//! For each SYN to a switch's VIP it sends the three messages a VIP balancer must (the
//! forward rule, the reverse rule, the PACKET_OUT), copied from answers built once per
//! backend when the switch connects, with the client's address, port and ingress port
//! written in. The backend is the client port modulo the pool. It keeps no connection
//! table, no topology and no load, and counts nothing. So what it costs per setup is what
//! any controller on this machine and runtime pays for the messages alone: the reads, the
//! framing, the writes and the wake-ups (it runs on the runtime flowgate runs on, tokio
//! with one worker, and answers a whole read in one write, as flowgate does).
//!
//! Measured beside flowgate at the same rates (`bench controller --peers flowgate,floor
//! --fractions-of-first`), it tells the machine's part of a latency from the controller's:
//! a target the floor misses at a rate, no controller on this runtime meets there on that
//! machine.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use bytes::{Buf, BytesMut};
use flowgate_packet::{self as packet, ETH_TYPE_IPV4, IP_PROTO_TCP, L3, MacAddr};
use ofp::{Action, Actions, FlowMod, FlowModFixed, Instruction, Instructions, Match, Message, Oxm};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::runtime::spin::{self, ParkSpin};

#[derive(Debug, Clone, clap::Args)]
pub struct FloorArgs {
    /// Where switches connect.
    #[arg(long, default_value = "127.0.0.1:6653")]
    pub listen: SocketAddr,
    /// Each datapath id's service, as JSON: `{"<dpid>": {"vip", "vmac", "port",
    /// "backends": [[ip, mac, port], ...]}}` (the plan `bench controller` writes for its
    /// os-ken peer, and for this one).
    #[arg(long)]
    pub plan: PathBuf,
    /// Poll the switches' sockets this long before the worker sleeps, as flowgate's
    /// `[runtime] spin_before_park_us` does (0: off).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub spin_before_park_us: u64,
}

/// One switch's service, as the plan gives it.
#[derive(Debug, Clone)]
struct Service {
    vip: Ipv4Addr,
    vmac: MacAddr,
    port: u16,
    backends: Vec<(Ipv4Addr, MacAddr, u32)>,
}

/// A [`Service`] as the plan's JSON spells it (MACs as text).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PlannedService {
    vip: Ipv4Addr,
    vmac: String,
    port: u16,
    backends: Vec<(Ipv4Addr, String, u32)>,
}

impl PlannedService {
    fn parse(self) -> anyhow::Result<Service> {
        let mac = |s: &str| {
            s.parse::<MacAddr>()
                .map_err(|e| anyhow::anyhow!("MAC {s:?}: {e}"))
        };
        Ok(Service {
            vip: self.vip,
            vmac: mac(&self.vmac)?,
            port: self.port,
            backends: self
                .backends
                .iter()
                .map(|(ip, m, port)| Ok((*ip, mac(m)?, *port)))
                .collect::<anyhow::Result<_>>()?,
        })
    }
}

/// The per-probe fields an answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Client {
    ip: Ipv4Addr,
    port: u16,
    /// The SYN's ingress port: where the reverse rule and nothing else sends.
    in_port: u32,
}

impl Client {
    const ZERO: Client = Client {
        ip: Ipv4Addr::UNSPECIFIED,
        port: 0,
        in_port: 0,
    };
}

/// One answer message, built once: its bytes for [`Client::ZERO`], and where each of the
/// client's fields goes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Template {
    bytes: Vec<u8>,
    /// For each field (address, port, ingress port): its byte positions, every occurrence's
    /// bytes in order.
    at: [Vec<usize>; 3],
}

impl Template {
    /// Build with `build`, finding each field by building again with that field's bytes all
    /// ones: the bytes that change are its occurrences (every byte of each differs from
    /// the zero it replaces).
    fn locate(build: impl Fn(Client) -> Vec<u8>) -> anyhow::Result<Template> {
        let bytes = build(Client::ZERO);
        let ones = [
            Client {
                ip: Ipv4Addr::BROADCAST,
                ..Client::ZERO
            },
            Client {
                port: u16::MAX,
                ..Client::ZERO
            },
            Client {
                in_port: u32::MAX,
                ..Client::ZERO
            },
        ];
        let widths = [4, 2, 4];
        let mut at: [Vec<usize>; 3] = Default::default();
        for ((c, w), positions) in ones.iter().zip(widths).zip(&mut at) {
            let other = build(*c);
            anyhow::ensure!(other.len() == bytes.len(), "a field changed the length");
            *positions = (0..bytes.len()).filter(|&i| bytes[i] != other[i]).collect();
            // Whole occurrences, each of consecutive bytes.
            anyhow::ensure!(
                positions.len() % w == 0 && positions.chunks(w).all(|o| o[w - 1] - o[0] == w - 1),
                "a field is not whole in the answer"
            );
        }
        Ok(Template { bytes, at })
    }

    /// Append the answer for `c`.
    #[inline]
    fn put(&self, c: Client, out: &mut BytesMut) {
        let start = out.len();
        out.extend_from_slice(&self.bytes);
        let msg = &mut out[start..];
        let fields: [&[u8]; 3] = [
            &c.ip.octets(),
            &c.port.to_be_bytes(),
            &c.in_port.to_be_bytes(),
        ];
        for (value, positions) in fields.iter().zip(&self.at) {
            for (i, &p) in positions.iter().enumerate() {
                msg[p] = value[i % value.len()];
            }
        }
    }
}

/// A switch's answers, one set per backend.
#[derive(Debug)]
struct Answers {
    service: Service,
    forward: Vec<Template>,
    reverse: Vec<Template>,
    /// The PACKET_OUT without its packet (its length is written when the packet is
    /// appended).
    packet_out: Vec<Template>,
}

/// The idle timeout of a connection's rules, as the os-ken peer sets it.
const IDLE_TIMEOUT: u16 = 30;

fn conn_match(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> Match {
    let mut m = Match::new();
    m.push(Oxm::EthType(ETH_TYPE_IPV4));
    m.push(Oxm::IpProto(IP_PROTO_TCP));
    m.push(Oxm::Ipv4Src {
        value: src,
        mask: None,
    });
    m.push(Oxm::Ipv4Dst {
        value: dst,
        mask: None,
    });
    m.push(Oxm::TcpSrc(sport));
    m.push(Oxm::TcpDst(dport));
    m
}

fn rule(m: Match, actions: Actions) -> Message {
    let mut fixed = FlowModFixed::add();
    fixed.idle_timeout = IDLE_TIMEOUT;
    let mut ins = Instructions::new();
    ins.push(Instruction::ApplyActions(actions));
    Message::FlowMod(FlowMod::from_fixed(fixed, m, ins))
}

fn encoded(msg: &Message) -> Vec<u8> {
    let mut b = BytesMut::new();
    // The messages are built here, of fields that fit: encoding cannot fail.
    let _ = ofp::encode(0, msg, &mut b);
    b.to_vec()
}

/// The actions that send a client's packet on to backend `(ip, mac, port)`.
fn to_backend(ip: Ipv4Addr, mac: MacAddr, port: u32) -> Actions {
    let mut a = Actions::new();
    a.push(Action::set_field(Oxm::EthDst {
        value: mac.0,
        mask: None,
    }));
    a.push(Action::set_field(Oxm::Ipv4Dst {
        value: ip,
        mask: None,
    }));
    a.push(Action::output(port));
    a
}

impl Answers {
    fn new(service: Service) -> anyhow::Result<Answers> {
        let s = &service;
        let (mut forward, mut reverse, mut packet_out) = (Vec::new(), Vec::new(), Vec::new());
        for &(bip, bmac, bport) in &s.backends {
            forward.push(Template::locate(|c| {
                let m = conn_match(c.ip, s.vip, c.port, s.port);
                encoded(&rule(m, to_backend(bip, bmac, bport)))
            })?);
            reverse.push(Template::locate(|c| {
                let m = conn_match(bip, c.ip, s.port, c.port);
                let mut a = Actions::new();
                a.push(Action::set_field(Oxm::EthSrc {
                    value: s.vmac.0,
                    mask: None,
                }));
                a.push(Action::set_field(Oxm::Ipv4Src {
                    value: s.vip,
                    mask: None,
                }));
                a.push(Action::output(c.in_port));
                encoded(&rule(m, a))
            })?);
            packet_out.push(Template::locate(|c| {
                encoded(&Message::PacketOut(ofp::PacketOut {
                    buffer_id: ofp::NO_BUFFER,
                    in_port: c.in_port,
                    actions: to_backend(bip, bmac, bport),
                    data: ofp::Bytes::new(),
                }))
            })?);
        }
        anyhow::ensure!(!s.backends.is_empty(), "a service without backends");
        Ok(Answers {
            service,
            forward,
            reverse,
            packet_out,
        })
    }

    /// Answer one PACKET_IN: a SYN to the VIP gets its three messages, an ARP request for
    /// the VIP its reply; anything else nothing.
    fn answer(&self, pi: &ofp::PacketInView<'_>, out: &mut BytesMut) {
        let (Some(in_port), Ok(frame)) = (pi.in_port(), packet::parse(pi.data())) else {
            return;
        };
        let s = &self.service;
        match &frame.l3 {
            L3::Ipv4(ip) if ip.dst == s.vip => {
                let Some(tcp) = frame
                    .tcp()
                    .filter(|t| t.dst_port == s.port && t.flags.syn())
                else {
                    return;
                };
                let c = Client {
                    ip: ip.src,
                    port: tcp.src_port,
                    in_port,
                };
                let b = usize::from(tcp.src_port) % self.forward.len();
                let answer = out.len();
                self.forward[b].put(c, out);
                self.reverse[b].put(c, out);
                let start = out.len();
                self.packet_out[b].put(c, out);
                out.extend_from_slice(pi.data());
                // A packet too long to send on in one message (§7.1: 16-bit length) gets
                // no answer at all, rather than rules without its PACKET_OUT.
                let Ok(len) = u16::try_from(out.len() - start) else {
                    out.truncate(answer);
                    return;
                };
                out[start + 2..start + 4].copy_from_slice(&len.to_be_bytes());
            }
            L3::Arp(arp) if arp.op == packet::ARP_OP_REQUEST && arp.tpa == s.vip => {
                let mut a = Actions::new();
                a.push(Action::output(in_port));
                let reply = Message::PacketOut(ofp::PacketOut {
                    buffer_id: ofp::NO_BUFFER,
                    in_port: ofp::port::CONTROLLER,
                    actions: a,
                    data: packet::arp_reply(arp, s.vmac),
                });
                out.extend_from_slice(&encoded(&reply));
            }
            _ => {}
        }
    }
}

fn load_plan(path: &std::path::Path) -> anyhow::Result<HashMap<u64, Answers>> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let plan: HashMap<String, PlannedService> =
        serde_json::from_str(&text).with_context(|| format!("{}", path.display()))?;
    plan.into_iter()
        .map(|(dpid, s)| {
            let what = || format!("{}: datapath {dpid}", path.display());
            let d: u64 = dpid.parse().with_context(what)?;
            let answers = s.parse().and_then(Answers::new).with_context(what)?;
            Ok((d, answers))
        })
        .collect()
}

/// Serve switches on `listener` until the process ends.
async fn serve(
    listener: TcpListener,
    plan: Arc<HashMap<u64, Answers>>,
    park_spin: Option<Arc<ParkSpin>>,
) {
    loop {
        let (sock, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, say: wait rather than spin on the error.
                tracing::warn!("accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        if let Some(spin) = &park_spin
            && let Err(e) = spin.watch(&sock)
        {
            tracing::warn!(%peer, "cannot watch the switch's socket before parking: {e}");
        }
        let plan = plan.clone();
        tokio::spawn(async move {
            if let Err(e) = session(sock, &plan).await {
                tracing::info!(%peer, "switch session ended: {e}");
            }
        });
    }
}

async fn session(mut sock: TcpStream, plan: &HashMap<u64, Answers>) -> anyhow::Result<()> {
    sock.set_nodelay(true)?;
    let mut out = BytesMut::with_capacity(64 << 10);
    for m in [
        Message::Hello(ofp::Hello::default()),
        Message::FeaturesRequest,
    ] {
        out.extend_from_slice(&encoded(&m));
    }
    let mut buf = BytesMut::with_capacity(64 << 10);
    let mut answers: Option<&Answers> = None;
    let framer = ofp::Framer::new();
    loop {
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out.clear();
        }
        if sock.read_buf(&mut buf).await? == 0 {
            return Ok(());
        }
        let mut at = 0;
        while let Some(len) = framer
            .frame_len(&buf[at..])
            .map_err(|e| anyhow::anyhow!("{e}"))?
        {
            let frame = &buf[at..at + len];
            at += len;
            // The framer checked the header: byte 1 is the type (§7.1).
            if frame.get(1).copied() == Some(ofp::MsgType::PacketIn as u8) {
                let pi = ofp::PacketInView::new(frame).map_err(|e| anyhow::anyhow!("{e}"))?;
                if let Some(a) = answers {
                    a.answer(&pi, &mut out);
                }
                continue;
            }
            match ofp::decode(ofp::Bytes::copy_from_slice(frame)) {
                Ok((_, Message::FeaturesReply(f))) => {
                    answers = Some(plan.get(&f.datapath_id).with_context(|| {
                        format!("datapath {:016x} is not in the plan", f.datapath_id)
                    })?);
                }
                Ok((xid, Message::EchoRequest(d))) => {
                    let _ = ofp::encode(xid, &Message::EchoReply(d), &mut out);
                }
                Ok(_) => {}
                Err(e) => anyhow::bail!("undecodable message: {e}"),
            }
        }
        buf.advance(at);
    }
}

/// `flowgate bench floor`: serve the plan's switches on one worker thread, as flowgate's
/// bench controller runs.
pub fn run(args: &FloorArgs) -> anyhow::Result<()> {
    let plan = Arc::new(load_plan(&args.plan)?);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    rt.worker_threads(1).enable_all();
    let park_spin = spin::hook(
        &mut rt,
        std::time::Duration::from_micros(args.spin_before_park_us),
    )?;
    rt.build()?.block_on(async {
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("listen on {}", args.listen))?;
        serve(listener, plan, park_spin).await;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service() -> Service {
        Service {
            vip: Ipv4Addr::new(10, 0, 0, 100),
            vmac: MacAddr([2, 0x66, 0x67, 0, 0, 1]),
            port: 80,
            backends: vec![
                (Ipv4Addr::new(10, 0, 0, 2), MacAddr([0, 0, 0, 0, 0, 2]), 2),
                (Ipv4Addr::new(10, 0, 0, 3), MacAddr([0, 0, 0, 0, 0, 3]), 3),
            ],
        }
    }

    /// A prebuilt answer, its client's fields written in, is byte for byte the message
    /// built for that client.
    #[test]
    fn a_template_with_a_client_written_in_is_the_message_built_for_it() {
        let s = service();
        let a = Answers::new(s.clone()).expect("answers");
        for c in [
            Client {
                ip: Ipv4Addr::new(192, 168, 7, 9),
                port: 40_001,
                in_port: 1,
            },
            Client {
                ip: Ipv4Addr::new(1, 2, 3, 4),
                port: 0x0102,
                in_port: 0xfffe_0001,
            },
        ] {
            for (b, &(bip, bmac, bport)) in s.backends.iter().enumerate() {
                let mut out = BytesMut::new();
                a.forward[b].put(c, &mut out);
                let want = encoded(&rule(
                    conn_match(c.ip, s.vip, c.port, s.port),
                    to_backend(bip, bmac, bport),
                ));
                assert_eq!(&out[..], &want[..]);
                let mut out = BytesMut::new();
                a.packet_out[b].put(c, &mut out);
                let want = encoded(&Message::PacketOut(ofp::PacketOut {
                    buffer_id: ofp::NO_BUFFER,
                    in_port: c.in_port,
                    actions: to_backend(bip, bmac, bport),
                    data: ofp::Bytes::new(),
                }));
                assert_eq!(&out[..], &want[..]);
            }
        }
    }

    /// A SYN to the VIP gets a forward rule, a reverse rule and a PACKET_OUT carrying it,
    /// all for the same backend; a SYN elsewhere nothing.
    #[test]
    fn a_syn_to_the_vip_gets_three_consistent_messages() {
        let s = service();
        let a = Answers::new(s.clone()).expect("answers");
        let client = MacAddr([2, 0, 0, 0, 0, 9]);
        let syn = |dst: Ipv4Addr| {
            packet::tcp_syn(
                client,
                s.vmac,
                std::net::SocketAddrV4::new(Ipv4Addr::new(172, 16, 0, 5), 40_003),
                std::net::SocketAddrV4::new(dst, 80),
                7,
            )
        };
        let pi = |data: ofp::Bytes| encoded(&Message::PacketIn(ofp::PacketIn::table_miss(1, data)));
        let frame = pi(syn(s.vip));
        let mut out = BytesMut::new();
        a.answer(&ofp::PacketInView::new(&frame).expect("view"), &mut out);
        let msgs = ofp::decode_file_bytes(&out).expect("answers decode");
        let [
            (_, Message::FlowMod(fwd)),
            (_, Message::FlowMod(rev)),
            (_, Message::PacketOut(po)),
        ] = &msgs[..]
        else {
            panic!("three messages: {msgs:?}");
        };
        let b = 40_003 % 2;
        let (bip, bmac, bport) = s.backends[b];
        assert_eq!(
            fwd.match_,
            conn_match(Ipv4Addr::new(172, 16, 0, 5), s.vip, 40_003, 80)
        );
        assert_eq!(
            rev.match_,
            conn_match(bip, Ipv4Addr::new(172, 16, 0, 5), 80, 40_003)
        );
        assert_eq!(po.actions, to_backend(bip, bmac, bport));
        assert_eq!(po.in_port, 1);
        assert_eq!(&po.data[..], &syn(s.vip)[..]);
        let frame = pi(syn(Ipv4Addr::new(10, 0, 0, 101)));
        let mut out = BytesMut::new();
        a.answer(&ofp::PacketInView::new(&frame).expect("view"), &mut out);
        assert!(out.is_empty());
        // A SYN padded to the longest PACKET_IN: its PACKET_OUT would not fit in one
        // message, so nothing is sent for it (not the rules alone).
        let mut long = syn(s.vip).to_vec();
        long.resize(65_535 - 8 - 16 - 16 - 2, 0);
        let frame = pi(ofp::Bytes::from(long));
        assert_eq!(frame.len(), 65_535);
        let mut out = BytesMut::new();
        a.answer(&ofp::PacketInView::new(&frame).expect("view"), &mut out);
        assert!(out.is_empty(), "{} bytes answered", out.len());
    }
}
