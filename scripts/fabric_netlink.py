# SPDX-License-Identifier: Apache-2.0
"""rtnetlink for scripts/fabric-net where there is no iproute2 (the GPU machine): NetlinkIp
speaks the few `ip` commands fabric-net issues. Also the error fabric-net prints without a
traceback, which both raise. Standard library only; loaded by path (vmesh.load_helper)."""

import ctypes
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

NETNS_DIR = Path("/run/netns")


class FabricNetError(Exception):
    """A failure the user can act on; printed without a traceback."""


class NetlinkIp:
    """The few `ip` commands this script issues, spoken as rtnetlink, for machines without
    iproute2 (the GPU machine): netns add/del, veth pairs created with both ends in their
    namespaces, bridges, addresses, link up, master. Python standard library only."""

    RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR = 16, 18, 20
    NLM_F_REQUEST, NLM_F_ACK, NLM_F_EXCL, NLM_F_CREATE, NLM_F_DUMP = 1, 4, 0x200, 0x400, 0x300
    IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_MASTER, IFLA_LINKINFO, IFLA_NET_NS_FD = 1, 3, 4, 10, 18, 28
    seq = 0

    @staticmethod
    def attr(kind, payload):
        data = struct.pack("=HH", 4 + len(payload), kind) + payload
        return data + b"\0" * (-len(data) % 4)

    @classmethod
    def request(cls, sock, msg_type, flags, body):
        cls.seq += 1
        sock.send(struct.pack("=LHHLL", 16 + len(body), msg_type, flags | cls.NLM_F_REQUEST, cls.seq, 0) + body)
        replies = []
        while True:
            data = sock.recv(65536)
            off = 0
            while off + 16 <= len(data):
                length, kind, _, seq, _ = struct.unpack_from("=LHHLL", data, off)
                if kind == 2:  # NLMSG_ERROR: 0 is the ACK
                    err = struct.unpack_from("=i", data, off + 16)[0]
                    if err:
                        raise FabricNetError(f"rtnetlink: {os.strerror(-err)}")
                    return replies
                if kind == 3:  # NLMSG_DONE
                    return replies
                replies.append((kind, data[off + 16:off + length]))
                off += (length + 3) & ~3
            if not flags & cls.NLM_F_DUMP and not flags & cls.NLM_F_ACK:
                return replies

    @classmethod
    def links(cls, sock):
        out = {}
        for kind, body in cls.request(sock, cls.RTM_GETLINK, cls.NLM_F_DUMP, struct.pack("=BxHiII", 0, 0, 0, 0, 0)):
            if kind != cls.RTM_NEWLINK:
                continue
            _, _, index, flags, _ = struct.unpack_from("=BxHiII", body)
            off = 16
            while off + 4 <= len(body):
                alen, atype = struct.unpack_from("=HH", body, off)
                if atype == cls.IFLA_IFNAME:
                    out[body[off + 4:off + alen].rstrip(b"\0").decode()] = (index, flags)
                off += (alen + 3) & ~3
        return out

    @staticmethod
    def socket_in(ns):
        """A NETLINK_ROUTE socket living in namespace ns (None: the root namespace)."""
        if ns is None:
            return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        result = {}

        def make():  # setns changes only this thread's namespace
            libc = ctypes.CDLL(None, use_errno=True)
            fd = os.open(str(NETNS_DIR / ns), os.O_RDONLY)
            try:
                if libc.setns(fd, 0x40000000) != 0:
                    result["error"] = os.strerror(ctypes.get_errno())
                    return
                result["sock"] = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
            finally:
                os.close(fd)

        t = threading.Thread(target=make)
        t.start()
        t.join()
        if "error" in result:
            raise FabricNetError(f"setns {ns}: {result['error']}")
        return result["sock"]

    @classmethod
    def run(cls, args, batch):
        ns = None
        if args[:1] == ["-n"]:
            ns, args = args[1], args[2:]
        if args[:2] == ["netns", "add"]:
            NETNS_DIR.mkdir(parents=True, exist_ok=True)
            path = NETNS_DIR / args[2]
            path.touch()
            subprocess.run(["unshare", f"--net={path}", "true"], check=True)
            return
        if args[:2] == ["netns", "del"]:
            path = NETNS_DIR / args[2]
            subprocess.run(["umount", "-l", str(path)], stderr=subprocess.DEVNULL)
            path.unlink(missing_ok=True)
            return
        sock = cls.socket_in(ns)
        try:
            for line in batch if batch is not None else [" ".join(args)]:
                cls.command(sock, line.split())
        finally:
            sock.close()

    @classmethod
    def command(cls, sock, w):
        create = cls.NLM_F_ACK | cls.NLM_F_CREATE | cls.NLM_F_EXCL
        if w[:2] == ["link", "add"] and "veth" in w:
            def end(words):  # NAME netns NS [address MAC] [mtu N]
                opts = dict(zip(words[1::2], words[2::2]))
                body = cls.attr(cls.IFLA_IFNAME, words[0].encode() + b"\0")
                fd = os.open(str(NETNS_DIR / opts["netns"]), os.O_RDONLY)
                body += cls.attr(cls.IFLA_NET_NS_FD, struct.pack("=I", fd))
                if "address" in opts:
                    body += cls.attr(cls.IFLA_ADDRESS, bytes.fromhex(opts["address"].replace(":", "")))
                if "mtu" in opts:
                    body += cls.attr(cls.IFLA_MTU, struct.pack("=I", int(opts["mtu"])))
                return body, fd
            t = w.index("type")
            near, fd1 = end(w[2:t])
            far, fd2 = end(w[w.index("name") + 1:])
            try:
                peer = cls.attr(1, struct.pack("=BxHiII", 0, 0, 0, 0, 0) + far)  # VETH_INFO_PEER
                info = cls.attr(1, b"veth\0") + cls.attr(2, peer)  # IFLA_INFO_KIND, _DATA
                cls.request(sock, cls.RTM_NEWLINK, create,
                            struct.pack("=BxHiII", 0, 0, 0, 0, 0) + near + cls.attr(cls.IFLA_LINKINFO, info))
            finally:
                os.close(fd1)
                os.close(fd2)
        elif w[:2] == ["link", "add"] and w[-2:] == ["type", "bridge"]:
            body = cls.attr(cls.IFLA_IFNAME, w[2].encode() + b"\0")
            body += cls.attr(cls.IFLA_LINKINFO, cls.attr(1, b"bridge\0"))
            cls.request(sock, cls.RTM_NEWLINK, create, struct.pack("=BxHiII", 0, 0, 0, 0, 0) + body)
        elif w[:2] == ["link", "set"]:
            links = cls.links(sock)
            index = links[w[2]][0]
            if w[3] == "up":
                cls.request(sock, cls.RTM_NEWLINK, cls.NLM_F_ACK, struct.pack("=BxHiII", 0, 0, index, 1, 1))
            elif w[3] == "master":
                cls.request(sock, cls.RTM_NEWLINK, cls.NLM_F_ACK, struct.pack("=BxHiII", 0, 0, index, 0, 0) +
                            cls.attr(cls.IFLA_MASTER, struct.pack("=I", links[w[4]][0])))
            else:
                raise FabricNetError(f"NetlinkIp: unsupported: {' '.join(w)}")
        elif w[:2] == ["addr", "add"]:
            addr, prefix = w[2].split("/")
            index = cls.links(sock)[w[4]][0]
            packed = socket.inet_aton(addr)
            body = struct.pack("=BBBBI", socket.AF_INET, int(prefix), 0, 0, index)
            body += cls.attr(2, packed) + cls.attr(1, packed)  # IFA_LOCAL, IFA_ADDRESS
            cls.request(sock, cls.RTM_NEWADDR, create, body)
        else:
            raise FabricNetError(f"NetlinkIp: unsupported: {' '.join(w)}")
