"""A reactive L2 learning switch written with os-ken, OpenFlow 1.3 (PyPI os-ken 4 ships no
sample applications, so this is ours; tests/e2e/tests/osken.rs runs it against ferrovs).

On connect it installs the table-miss rule (priority 0, everything to the controller, whole
frames). Each PACKET_IN teaches it the source MAC's port; a known destination gets a rule
(priority 1, in_port and eth_dst, output to that port) and the packet goes out there by
PACKET_OUT, an unknown one is flooded by PACKET_OUT.

Every PACKET_IN is reported on stdout, one line each, for the test to count:
`LEARNING-SWITCH packet-in dpid=HEX in_port=N src=MAC dst=MAC ethertype=0xNNNN out=PORT`.

    scripts/osken_switch_test.py app osken_learning_switch --ofp-tcp-listen-port PORT
"""
import sys

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import ethernet, packet
from os_ken.ofproto import ofproto_v1_3


class LearningSwitch(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # datapath id -> {mac: port}
        self.ports = {}

    @staticmethod
    def _rule(dp, priority, match, actions):
        p = dp.ofproto_parser
        inst = [p.OFPInstructionActions(dp.ofproto.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(p.OFPFlowMod(datapath=dp, priority=priority, match=match, instructions=inst))

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def on_features(self, ev):
        dp = ev.msg.datapath
        ofp, p = dp.ofproto, dp.ofproto_parser
        self._rule(dp, 0, p.OFPMatch(), [p.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def on_packet_in(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp, p = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        eths = packet.Packet(msg.data).get_protocols(ethernet.ethernet)
        if not eths:
            return
        eth = eths[0]
        known = self.ports.setdefault(dp.id, {})
        known[eth.src] = in_port
        out = known.get(eth.dst, ofp.OFPP_FLOOD)
        actions = [p.OFPActionOutput(out)]
        print(
            "LEARNING-SWITCH packet-in dpid=%016x in_port=%d src=%s dst=%s ethertype=0x%04x out=%s"
            % (dp.id, in_port, eth.src, eth.dst, eth.ethertype,
               "flood" if out == ofp.OFPP_FLOOD else out),
            file=sys.stdout,
            flush=True,
        )
        if out != ofp.OFPP_FLOOD:
            self._rule(dp, 1, p.OFPMatch(in_port=in_port, eth_dst=eth.dst), actions)
        dp.send_msg(
            p.OFPPacketOut(
                datapath=dp,
                buffer_id=ofp.OFP_NO_BUFFER,
                in_port=in_port,
                actions=actions,
                data=msg.data,
            )
        )
