//! What the controller sends, carried out: FLOW_MODs and METER_MODs into the switches'
//! state, the answers to its multipart requests, and its PACKET_OUTs (LLDP to the far end
//! of a link, SYNs to their backends, RSTs and SYN-ACKs to their clients).

use super::*;

impl Engine<'_> {
    /// Carry out what the controller sent, as of `t`.
    pub(super) fn apply(&mut self, t: u64) {
        let msgs: Vec<(u64, Message)> = self.out.drain().collect();
        self.apply_msgs(t, msgs);
    }

    pub(super) fn apply_msgs(&mut self, t: u64, msgs: Vec<(u64, Message)>) {
        let mut touched: Vec<u64> = Vec::new();
        let mut outs = Vec::new();
        for (dpid, msg) in msgs {
            match msg {
                Message::FlowMod(fm) => self.flow_mod(t, dpid, &fm, &mut touched),
                Message::MeterMod(mm) => self.switches.entry(dpid).or_default().meter_mod(t, &mm),
                Message::MultipartRequest(r) => self.multipart(t, dpid, &r.body),
                Message::PacketOut(po) => outs.push((dpid, po)),
                _ => {}
            }
        }
        for (dpid, po) in outs {
            self.packet_out(t, dpid, &po, &mut touched);
        }
        for id in touched {
            self.progress(t, id);
        }
    }

    fn flow_mod(&mut self, t: u64, dpid: u64, fm: &FlowMod, touched: &mut Vec<u64>) {
        self.switches.entry(dpid).or_default().flow_mod(t, fm);
        if cookie::kind_of(fm.cookie) != Some(RuleKind::Conn) {
            return;
        }
        let Some(&id) =
            rule_ends(&fm.match_).and_then(|ends| ends.iter().find_map(|k| self.by_key.get(k)))
        else {
            return;
        };
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        match fm.command {
            FlowModCommand::Add => {
                let rule = Rule {
                    dpid,
                    cookie: fm.cookie,
                    priority: fm.priority,
                    match_: fm.match_.clone(),
                    idle_timeout: fm.idle_timeout,
                    flow_rem: fm.flags.contains(FlowModFlags::SEND_FLOW_REM),
                    at: t,
                };
                // §6.4: an ADD with the match and priority of a rule the switch holds
                // replaces it.
                match conn
                    .rules
                    .iter_mut()
                    .find(|r| (r.dpid, r.priority, &r.match_) == (dpid, fm.priority, &fm.match_))
                {
                    Some(old) => *old = rule,
                    None => {
                        conn.rules.push(rule);
                        self.switches.entry(dpid).or_default().conn_rule_added();
                    }
                }
                touched.push(id);
            }
            FlowModCommand::Delete | FlowModCommand::DeleteStrict => {
                let before = conn.rules.len();
                conn.rules
                    .retain(|r| !(r.dpid == dpid && r.match_ == fm.match_));
                let sw = self.switches.entry(dpid).or_default();
                for _ in conn.rules.len()..before {
                    sw.conn_rule_gone();
                }
            }
            _ => {}
        }
    }

    fn multipart(&mut self, t: u64, dpid: u64, body: &MultipartRequestBody) {
        let reply = match body {
            MultipartRequestBody::PortDesc => {
                let ports = self
                    .sc
                    .shape
                    .switches()
                    .into_iter()
                    .find(|(d, _)| *d == dpid)
                    .map_or(0, |(_, n)| n);
                MultipartReplyBody::PortDesc((1..=ports).map(|p| port_desc(dpid, p)).collect())
            }
            MultipartRequestBody::Meter { .. } => {
                let sw = self.switches.entry(dpid).or_default();
                MultipartReplyBody::Meter(
                    sw.meters
                        .iter()
                        .map(|(&id, m)| MeterStats {
                            meter_id: id,
                            flow_count: 1,
                            packet_in_count: m.packets,
                            byte_in_count: m.packets * 64,
                            duration_sec: (t / SEC) as u32,
                            duration_nsec: (t % SEC) as u32,
                            band_stats: vec![MeterBandStats {
                                packet_band_count: m.dropped,
                                byte_band_count: m.dropped * 64,
                            }],
                        })
                        .collect(),
                )
            }
            MultipartRequestBody::Flow(_) => MultipartReplyBody::Flow(Vec::new()),
            _ => return,
        };
        let msg = Message::MultipartReply(MultipartReply {
            flags: 0,
            body: reply,
        });
        let now = self.at(t);
        self.c.handle_message(now, dpid, &msg, &mut self.out);
    }

    fn packet_out(&mut self, t: u64, dpid: u64, po: &ofp::PacketOut, touched: &mut Vec<u64>) {
        let Ok(frame) = packet::parse(&po.data) else {
            return;
        };
        if let L3::Lldp(_) = &frame.l3 {
            // LLDP arrives at the far end of the link and goes up from there.
            for a in po.actions.iter() {
                if let Action::Output { port, .. } = a
                    && let Some(peer) = self.sc.shape.peer(Attach { dpid, port: *port })
                {
                    self.send_up(t, peer, po.data.clone());
                }
            }
            return;
        }
        let (L3::Ipv4(ip), Some(tcp)) = (&frame.l3, frame.tcp()) else {
            return;
        };
        let flags = tcp.flags;
        if flags.is_initial_syn() && ip.dst == VIP {
            // The SYN sent on to a backend, rewritten to its address.
            let set_dst = po.actions.iter().find_map(|a| match a {
                Action::SetField(Oxm::Ipv4Dst { value, .. }) => Some(*value),
                _ => None,
            });
            let (Some(b), Some(&id)) = (
                set_dst.and_then(|a| self.backend_by_ip.get(&a).copied()),
                self.by_key.get(&(ip.src, tcp.src_port)),
            ) else {
                return;
            };
            if let Some(conn) = self.conns.get_mut(&id) {
                if conn.silenced && conn.backend.is_some_and(|old| old != b) {
                    // Judged silent, the connection goes to another backend (the
                    // controller's `redispatch`, which replaced or deleted the old path's
                    // rules with the FLOW_MODs before this): its SYN reaches that one.
                    conn.backend = Some(b);
                    conn.silenced = false;
                    conn.state = State::Connecting;
                    self.phases[conn.phase].redispatched += 1;
                }
                conn.backend.get_or_insert(b);
                touched.push(id);
            }
        } else if flags.rst() {
            // A refusal, to the client.
            let Some(&id) = self.by_key.get(&(ip.dst, tcp.dst_port)) else {
                return;
            };
            if let Some(conn) = self.conns.get(&id)
                && conn.state == State::Connecting
                && conn.backend.is_none()
            {
                let phase = conn.phase;
                self.phases[phase].reset += 1;
                self.series_counts.2 += 1;
                self.end_conn(id);
            }
        } else if flags.syn() && flags.ack() {
            // A deferred connection's SYN-ACK, rewritten to the VIP, reaches the client,
            // which answers with its ACK (up through the controller, which then installs
            // the connection's rules).
            let Some(&id) = self.by_key.get(&(ip.dst, tcp.dst_port)) else {
                return;
            };
            let Some(conn) = self.conns.get(&id) else {
                return;
            };
            let client = self.clients[conn.client as usize];
            let ack = packet::ipv4_tcp(&packet::TcpSegment {
                eth_src: client.mac,
                eth_dst: VMAC,
                ip_src: client.ip,
                ip_dst: VIP,
                src_port: conn.port,
                dst_port: VPORT,
                seq: client_isn(id).wrapping_add(1),
                ack: tcp.seq.wrapping_add(1),
                flags: TcpFlags::ACK,
                ..packet::TcpSegment::default()
            });
            let half = self.sc.rtt.as_nanos() as u64 / 2;
            self.send_up(t + half, client.at, ack);
        }
    }

    /// After the controller answered: a connection whose SYN went to a backend with its
    /// rules in place starts its request; one without rules (deferred to the client's
    /// ACK) has its backend answer the SYN.
    fn progress(&mut self, t: u64, id: u64) {
        let half = self.sc.rtt.as_nanos() as u64 / 2;
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let (State::Connecting, Some(b)) = (conn.state, conn.backend) else {
            return;
        };
        if !conn.rules.is_empty() {
            conn.state = State::AtServer;
            // The handshake's last leg and the request.
            self.push(t + self.sc.rtt.as_nanos() as u64, Ev::AtServer(id));
            return;
        }
        if conn.synack_played {
            return;
        }
        conn.synack_played = true;
        self.deferred += 1;
        let client = self.clients[conn.client as usize];
        let server = self.server_hosts[usize::from(b)];
        let syn_ack = packet::ipv4_tcp(&packet::TcpSegment {
            eth_src: server.mac,
            eth_dst: client.mac,
            ip_src: server.ip,
            ip_dst: client.ip,
            src_port: VPORT,
            dst_port: conn.port,
            seq: (id as u32) ^ 0x5a5a_5a5a,
            ack: client_isn(id).wrapping_add(1),
            flags: TcpFlags(0x12),
            ..packet::TcpSegment::default()
        });
        self.send_up(t + half, server.at, syn_ack);
    }
}

/// Whether `data` is a new connection's SYN (to the service).
pub(super) fn is_new_syn(data: &[u8]) -> bool {
    packet::parse(data).is_ok_and(|f| {
        matches!(&f.l3, L3::Ipv4(ip) if ip.dst == VIP)
            && f.tcp().is_some_and(|t| t.flags.is_initial_syn())
    })
}

/// Whether the controller's message places a connection: a connection rule, or a
/// segment sent on rewritten to a backend.
pub(super) fn places_a_connection(m: &Message) -> bool {
    match m {
        Message::FlowMod(fm) => {
            fm.command == FlowModCommand::Add && cookie::kind_of(fm.cookie) == Some(RuleKind::Conn)
        }
        Message::PacketOut(po) => po
            .actions
            .iter()
            .any(|a| matches!(a, Action::SetField(Oxm::Ipv4Dst { .. }))),
        _ => false,
    }
}

/// Both ends of a connection rule's match: `(source address, port)` and `(destination
/// address, port)`. One of them is the client's: the forward rules match its source
/// (before or after the rewrite to the backend), the reverse rules its destination.
fn rule_ends(m: &Match) -> Option<[(Ipv4Addr, u16); 2]> {
    let (mut src, mut dst, mut sport, mut dport) = (None, None, None, None);
    for o in m.iter() {
        match o {
            Oxm::Ipv4Src { value, .. } => src = Some(*value),
            Oxm::Ipv4Dst { value, .. } => dst = Some(*value),
            Oxm::TcpSrc(p) => sport = Some(*p),
            Oxm::TcpDst(p) => dport = Some(*p),
            _ => {}
        }
    }
    Some([(src?, sport?), (dst?, dport?)])
}

fn port_desc(dpid: u64, p: u32) -> PortDesc {
    PortDesc {
        port_no: p,
        hw_addr: [
            0x0a,
            0,
            (dpid >> 8) as u8,
            dpid as u8,
            (p >> 8) as u8,
            p as u8,
        ],
        name: ofp::PortName::new(&format!("s{dpid}-p{p}")),
        config: 0,
        state: 0,
        curr: 0,
        advertised: 0,
        supported: 0,
        peer: 0,
        curr_speed: 10_000_000,
        max_speed: 10_000_000,
    }
}
