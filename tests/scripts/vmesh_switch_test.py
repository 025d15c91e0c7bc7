#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Unit tests for scripts/vmesh's switch (--topology switch): the learning Ethernet switch
between the guests' data NICs and the addresses and link table vmesh gives its ports. The
lab's switch tests (tests/e2e's lab_e2e_boot_switch4) rely on these rules; here they run
in a second, with plain sockets standing in for the guests' NICs."""
import importlib.machinery
import importlib.util
import os
import select
import struct
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
VMESH = os.path.join(HERE, "..", "..", "scripts", "vmesh")


def load_vmesh():
    loader = importlib.machinery.SourceFileLoader("vmesh_under_test", VMESH)
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.dont_write_bytecode = True
    loader.exec_module(module)
    return module


vmesh = load_vmesh()


def mac(n):
    return bytes([0x52, 0x54, 0x10, 0xFE, 0x00, n])


BROADCAST = b"\xff" * 6


def frame(dst, src, payload=b"x" * 50):
    body = dst + src + b"\x08\x00" + payload
    return struct.pack(">I", len(body)) + body


class Guests:
    """The guest ends of a Hub, each a socket a test writes frames to and reads frames from.
    What a port did not get is checked without waiting for quiet: the sender follows its
    frames with a broadcast marker, and the hub keeps each port's frames in order, so what a
    port read before the marker is all it got."""

    DEADLINE_S = 10

    def __init__(self, nodes, learning=True):
        self.hub = vmesh.Hub(nodes, learning=learning)
        self.ends = list(self.hub.guest_ends)
        self.hub.guest_ends = []  # the test holds them, as the QEMUs would
        self.pending = [b""] * nodes
        self.marks = 0
        self.hub.start()

    def send(self, node, data):
        self.ends[node].sendall(data)

    def mark(self, node):
        """Sends a broadcast marker from node; returns it."""
        self.marks += 1
        f = frame(BROADCAST, mac(node), b"MARK%d" % self.marks)
        self.send(node, f)
        return f

    def next_frame(self, node):
        sock = self.ends[node]
        while True:
            data = self.pending[node]
            if len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
                size = 4 + struct.unpack(">I", data[:4])[0]
                self.pending[node] = data[size:]
                return data[:size]
            if not select.select([sock], [], [], self.DEADLINE_S)[0]:
                raise AssertionError(f"node {node} got no frame in {self.DEADLINE_S} s")
            chunk = sock.recv(1 << 16)
            if not chunk:
                raise AssertionError(f"node {node}'s port was closed")
            self.pending[node] += chunk

    def before(self, node, marker):
        """The frames node gets before marker."""
        frames = []
        while (f := self.next_frame(node)) != marker:
            frames.append(f)
        return frames

    def close(self):
        self.hub.stop()
        for sock in self.ends:
            sock.close()


class LearningSwitch(unittest.TestCase):
    def setUp(self):
        self.g = Guests(4)

    def tearDown(self):
        self.g.close()

    def learn(self, node):
        """node's MAC is learned on its port (a broadcast from it, read by everyone)."""
        m = self.g.mark(node)
        for other in range(4):
            if other != node:
                self.g.before(other, m)

    def test_broadcast_goes_to_every_other_port(self):
        f = frame(BROADCAST, mac(0))
        self.g.send(0, f)
        m = self.g.mark(1)
        for node in (2, 3):
            self.assertEqual(self.g.next_frame(node), f, f"node {node}")
        self.assertEqual(self.g.before(0, m), [], "a port got its own frame back")

    def test_unicast_to_a_learned_port_goes_there_only(self):
        self.learn(2)
        f = frame(mac(2), mac(0))
        self.g.send(0, f)
        m = self.g.mark(0)
        self.assertEqual(self.g.before(2, m), [f])
        for node in (1, 3):
            self.assertEqual(self.g.before(node, m), [], f"node {node} saw another's frame")

    def test_unknown_unicast_floods(self):
        f = frame(mac(3), mac(1))  # nothing from node 3 yet
        self.g.send(1, f)
        m = self.g.mark(1)
        for node in (0, 2, 3):
            self.assertEqual(self.g.before(node, m), [f], f"node {node}")

    def test_a_frame_split_across_writes_arrives_whole(self):
        self.learn(3)
        f = frame(mac(3), mac(1), b"y" * 3000)
        self.g.send(1, f[:7])
        self.g.send(1, f[7:])
        m = self.g.mark(1)
        self.assertEqual(self.g.before(3, m), [f])

    def test_a_gone_guest_is_dropped_and_the_others_still_served(self):
        self.learn(1)
        self.g.ends[1].close()
        self.g.ends[1] = self.g.ends[0].dup()  # keeps close() simple
        self.g.send(0, frame(mac(1), mac(0)))  # to the gone port: dropped, no error
        m = self.g.mark(0)
        for node in (2, 3):
            self.assertEqual(self.g.before(node, m), [], f"node {node}")


class Hub(unittest.TestCase):
    def test_the_mgmt_hub_does_not_learn(self):
        g = Guests(3, learning=False)
        try:
            m = g.mark(1)
            g.before(0, m)
            g.before(2, m)
            f = frame(mac(1), mac(0))
            g.send(0, f)
            m = g.mark(0)
            self.assertEqual(g.before(1, m), [f])
            self.assertEqual(g.before(2, m), [f], "a hub sends every frame to every other port")
        finally:
            g.close()


class SwitchAddressing(unittest.TestCase):
    def test_ports_addresses_and_link_table(self):
        ports = [vmesh.SwitchPort(n) for n in range(3)]
        self.assertEqual([p.netdev() for p in ports], ["sw"] * 3)
        self.assertEqual([p.address() for p in ports], ["198.18.0.1", "198.18.0.2", "198.18.0.3"])
        self.assertEqual(len({p.mac() for p in ports}), 3)
        self.assertEqual(vmesh.switch_link_table(ports), [
            "0 0 1 sw sw 198.18.0.1 198.18.0.2",
            "0 0 2 sw sw 198.18.0.1 198.18.0.3",
            "0 1 2 sw sw 198.18.0.2 198.18.0.3"])

    def test_second_function_shared_and_split(self):
        shared, split = vmesh.SwitchPort(2, fn=1), vmesh.SwitchPort(2, fn=1, split=True)
        self.assertEqual((shared.netdev(), shared.address()), ("swf1", "198.18.0.131"))
        self.assertEqual((split.index, split.address()), (1, "198.18.1.3"))
        self.assertNotEqual(shared.mac(), vmesh.SwitchPort(2).mac())

    def test_vmesh_refuses_parallel_links_on_a_switch(self):
        with self.assertRaises(SystemExit):
            vmesh.parse_args(["run", "--topology", "switch", "--links", "2", "--", "true"])


if __name__ == "__main__":
    unittest.main()
