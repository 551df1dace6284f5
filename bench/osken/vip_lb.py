"""The seed's VIP balancer (dynamic-load-balancer's load_balancer.py) rebuilt on os-ken,
as the peer `flowgate bench controller --peers osken` measures.

Behaviour, as the seed describes it, plus the one gap the bench needs closed (ARP for the
VIP is answered):
  * on connect: a table-miss rule sending whole packets to the controller;
  * ARP request for a VIP: answered with the VIP's MAC (PACKET_OUT); other ARP is flooded;
  * a TCP packet to VIP:port: pick a backend round robin, install two rules with a 30 s
    idle timeout (client -> VIP rewritten to the backend's MAC and IP, out of its port;
    backend -> client rewritten back to the VIP's MAC and IP, out of the client's port),
    and send the first packet on with PACKET_OUT carrying the forward actions.

The services come from the JSON file named by FLOWGATE_BENCH_PLAN: per datapath id, its
VIP, the VIP's MAC, the service port and the backends as [ip, mac, port]. Without it, the
seed's single-switch plan (VIP 10.0.0.100, backends 10.0.0.2-4 on ports 2-4).
"""

import json
import os

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import arp, ethernet, ether_types, in_proto, ipv4, packet, tcp
from os_ken.ofproto import ofproto_v1_3

IDLE_TIMEOUT = 30

DEFAULT_PLAN = {
    "vip": "10.0.0.100",
    "vmac": "02:66:67:00:00:01",
    "port": 80,
    "backends": [
        ["10.0.0.2", "00:00:00:00:00:02", 2],
        ["10.0.0.3", "00:00:00:00:00:03", 3],
        ["10.0.0.4", "00:00:00:00:00:04", 4],
    ],
}


class VipLoadBalancer(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.plans = {}
        path = os.environ.get("FLOWGATE_BENCH_PLAN")
        if path:
            with open(path) as f:
                self.plans = {int(k): v for k, v in json.load(f).items()}
        self.next_backend = {}

    def plan(self, dpid):
        return self.plans.get(dpid, DEFAULT_PLAN)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features(self, ev):
        dp = ev.msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        actions = [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)]
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(parser.OFPFlowMod(datapath=dp, priority=0, match=parser.OFPMatch(),
                                      instructions=inst))

    def packet_out(self, dp, in_port, actions, data):
        ofp, parser = dp.ofproto, dp.ofproto_parser
        dp.send_msg(parser.OFPPacketOut(datapath=dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        in_port=in_port, actions=actions, data=data))

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        pkt = packet.Packet(msg.data)
        eth = pkt.get_protocol(ethernet.ethernet)
        if eth is None:
            return
        plan = self.plan(dp.id)
        vip, vmac, vport = plan["vip"], plan["vmac"], plan["port"]

        if eth.ethertype == ether_types.ETH_TYPE_ARP:
            a = pkt.get_protocol(arp.arp)
            if a.opcode == arp.ARP_REQUEST and a.dst_ip == vip:
                reply = packet.Packet()
                reply.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP,
                                                     dst=eth.src, src=vmac))
                reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=vmac, src_ip=vip,
                                           dst_mac=a.src_mac, dst_ip=a.src_ip))
                reply.serialize()
                self.packet_out(dp, ofp.OFPP_CONTROLLER,
                                [parser.OFPActionOutput(in_port)], reply.data)
            else:
                self.packet_out(dp, in_port, [parser.OFPActionOutput(ofp.OFPP_FLOOD)],
                                msg.data)
            return

        ip = pkt.get_protocol(ipv4.ipv4)
        t = pkt.get_protocol(tcp.tcp)
        if ip is None or t is None or ip.dst != vip or t.dst_port != vport:
            return
        backends = plan["backends"]
        i = self.next_backend.get(dp.id, 0)
        self.next_backend[dp.id] = (i + 1) % len(backends)
        b_ip, b_mac, b_port = backends[i]

        fwd_match = parser.OFPMatch(eth_type=ether_types.ETH_TYPE_IP, ip_proto=in_proto.IPPROTO_TCP,
                                    ipv4_src=ip.src, ipv4_dst=vip,
                                    tcp_src=t.src_port, tcp_dst=vport)
        fwd_actions = [parser.OFPActionSetField(eth_dst=b_mac),
                       parser.OFPActionSetField(ipv4_dst=b_ip),
                       parser.OFPActionOutput(b_port)]
        rev_match = parser.OFPMatch(eth_type=ether_types.ETH_TYPE_IP, ip_proto=in_proto.IPPROTO_TCP,
                                    ipv4_src=b_ip, ipv4_dst=ip.src,
                                    tcp_src=vport, tcp_dst=t.src_port)
        rev_actions = [parser.OFPActionSetField(eth_src=vmac),
                       parser.OFPActionSetField(ipv4_src=vip),
                       parser.OFPActionOutput(in_port)]
        for match, actions in ((fwd_match, fwd_actions), (rev_match, rev_actions)):
            inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
            dp.send_msg(parser.OFPFlowMod(datapath=dp, priority=10, match=match,
                                          instructions=inst, idle_timeout=IDLE_TIMEOUT))
        self.packet_out(dp, in_port, fwd_actions, msg.data)
