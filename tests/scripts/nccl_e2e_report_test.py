#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Unit tests for scripts/nccl_e2e_report.py: the verdicts scripts/nccl-e2e.sh prints on a
GPU machine come from these rules, so they are pinned here, where CI can run them."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPORT = os.path.join(HERE, "..", "..", "scripts", "nccl_e2e_report.py")

MESH_LINES = [
    "[0] h:1:1 [0] NCCL INFO NET/Mesh : nccl-mesh 0.1.0",
    "[0] h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Mesh/0",
    "[1] h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Mesh/0",
]


def row(coll="all_reduce", nbytes=8, busbw=1.0, wrong=0):
    return {"coll": coll, "bytes": nbytes, "count": nbytes // 4, "time_us": 1.0, "algbw": busbw,
            "busbw": busbw, "wrong": wrong, "iters": 5}


class Check(unittest.TestCase):
    def run_check(self, scenario, lines, rows, rc=0, expect="pass", extra=()):
        with tempfile.TemporaryDirectory() as d:
            log, js, summary = (os.path.join(d, n) for n in ("s.log", "s.jsonl", "sum.txt"))
            with open(log, "w") as f:
                f.write("\n".join(lines) + "\n")
            with open(js, "w") as f:
                f.write("".join(json.dumps(r) + "\n" for r in rows))
            p = subprocess.run([sys.executable, REPORT, "check", "--scenario", scenario, "--expect", expect,
                                "--rc", str(rc), "--log", log, "--json", js, "--summary", summary, *extra],
                               capture_output=True, text=True)
            with open(summary) as f:
                return p.returncode, f.read()

    def test_plugin_run_with_mesh_channels_passes(self):
        code, text = self.run_check("pair-plugin", MESH_LINES, [row()])
        self.assertEqual(code, 0, text)
        self.assertIn("OK", text)

    def test_a_wrong_element_fails(self):
        code, text = self.run_check("pair-plugin", MESH_LINES, [row(wrong=3)])
        self.assertEqual(code, 1)
        self.assertIn("3 wrong element(s)", text)

    def test_a_channel_on_another_network_fails_a_plugin_run(self):
        lines = MESH_LINES + ["[1] h NCCL INFO Channel 01/0 : 1[0] -> 0[0] [send] via NET/IB/0"]
        code, text = self.run_check("tri-plugin", lines, [row()])
        self.assertEqual(code, 1)
        self.assertIn("NET/IB 1", text)

    def test_an_ib_run_needs_ib_channels(self):
        code, text = self.run_check("pair-ib", MESH_LINES, [row()])
        self.assertEqual(code, 1)
        self.assertIn("no channel went via NET/IB", text)

    def test_rehearsal_needs_no_nccl_lines_but_still_rows_exit_and_data(self):
        rehearse = ("--rehearse",)
        code, text = self.run_check("tri-channels", [], [row()], extra=rehearse)
        self.assertEqual(code, 0, text)
        for rows, rc in (([], 0), ([row(wrong=1)], 0), ([row()], 1)):
            code, text = self.run_check("pair-plugin", [], rows, rc=rc, extra=rehearse)
            self.assertEqual(code, 1, text)

    def test_nonzero_exit_fails(self):
        code, _ = self.run_check("pair-plugin", MESH_LINES, [row()], rc=1)
        self.assertEqual(code, 1)

    def test_reload_needs_an_unload_and_a_second_load(self):
        lines = MESH_LINES + ["[0] NCCL INFO Successfully loaded external network plugin libnccl-net-mesh.so",
                              "[0] # second communicator: all_reduce of 4 MiB exact"]
        code, text = self.run_check("tri-reload", lines, [row()])
        self.assertEqual(code, 1)
        self.assertIn("expected an unload", text)
        lines += ["[0] NCCL INFO Unloading plugin libnccl-net-mesh.so",
                  "[0] NCCL INFO Successfully loaded external network plugin libnccl-net-mesh.so"]
        code, text = self.run_check("tri-reload", lines, [row()])
        self.assertEqual(code, 0, text)

    def test_preload_and_refcount_need_the_second_communicator_not_an_unload(self):
        # NCCL_NET_PLUGIN_REF_COUNT=1 keeps the plugin loaded (NCCL 2.27-2.29 forget its name
        # at an unload): no unload is expected, the second communicator is.
        for scenario in ("tri-preload", "tri-refcount"):
            code, text = self.run_check(scenario, MESH_LINES, [row()])
            self.assertEqual(code, 1, scenario)
            self.assertIn("the second communicator never reported", text)
            lines = MESH_LINES + ["[0] # second communicator: all_reduce of 4 MiB exact"]
            code, text = self.run_check(scenario, lines, [row()])
            self.assertEqual(code, 0, scenario + ": " + text)

    def test_eight_channels_are_required_with_min_nchannels(self):
        code, text = self.run_check("tri-channels", MESH_LINES, [row()])
        self.assertEqual(code, 1)
        self.assertIn("fewer than 8 channels", text)
        lines = [f"[{r}] NCCL INFO Channel {c:02d}/1 : 0[0] -> 1[0] [send] via NET/Mesh/0/Shared"
                 for r in (0, 1) for c in range(8)] + MESH_LINES[:1]
        code, text = self.run_check("tri-channels", lines, [row()])
        self.assertEqual(code, 0, text)

    def test_a_two_relay_scenario_needs_a_two_relay_connection(self):
        twin = ["[0] h:1:1 [0] NCCL INFO NET/Mesh : relay: connection to 198.18.1.4 goes through "
                "198.18.0.1 and 198.18.2.3 (two relays)"]
        code, text = self.run_check("ring4-relay-twin", MESH_LINES, [row()])
        self.assertEqual(code, 1)
        self.assertIn("no connection went over two relays", text)
        code, text = self.run_check("ring4-spark-twin.2", MESH_LINES + twin, [row()])
        self.assertEqual(code, 0, text)
        self.assertIn("two-relay connections: 1", text)

    def test_a_second_run_is_checked_as_its_scenario(self):
        code, text = self.run_check("pair-ib.2", MESH_LINES, [row()])
        self.assertEqual(code, 1)
        self.assertIn("no channel went via NET/IB", text)
        ib_lines = [l.replace("NET/Mesh/0", "NET/IB/0") for l in MESH_LINES[1:]]
        code, text = self.run_check("pair-ib.2", ib_lines, [row()])
        self.assertEqual(code, 0, text)

    def test_record_scenarios_keep_the_first_errors(self):
        lines = ["[0] h NCCL WARN NET/Mesh : connect: no local RoCEv2 port shares a subnet with the peer"]
        code, text = self.run_check("ring4-default", lines, [], rc=1, expect="record")
        self.assertEqual(code, 0)
        self.assertIn("RECORDED", text)
        self.assertIn("no local RoCEv2 port shares a subnet", text)


class Tables(unittest.TestCase):
    def test_ratio_of_plugin_to_ib_per_size(self):
        with tempfile.TemporaryDirectory() as d:
            for name, bw in (("pair-plugin", 9.0), ("pair-ib", 10.0)):
                with open(os.path.join(d, name + ".jsonl"), "w") as f:
                    for s in (8, 1 << 20):
                        f.write(json.dumps(row(nbytes=s, busbw=bw)) + "\n")
            out = subprocess.run([sys.executable, REPORT, "tables", "--dir", d], capture_output=True,
                                 text=True, check=True).stdout
        self.assertIn("busbw ratio pair-plugin / pair-ib", out)
        ratio_lines = [l for l in out.splitlines() if l.strip().startswith(("8 ", "1M "))]
        self.assertTrue(any(l.split()[-1] == "0.90" for l in ratio_lines), out)

    def test_second_runs_are_compared_with_each_other(self):
        with tempfile.TemporaryDirectory() as d:
            for name, bw in (("pair-plugin", 9.0), ("pair-ib", 10.0), ("pair-plugin.2", 8.0), ("pair-ib.2", 16.0)):
                with open(os.path.join(d, name + ".jsonl"), "w") as f:
                    f.write(json.dumps(row(nbytes=1 << 20, busbw=bw)) + "\n")
            out = subprocess.run([sys.executable, REPORT, "tables", "--dir", d], capture_output=True,
                                 text=True, check=True).stdout
        first, second = out.split("busbw ratio pair-plugin / pair-ib ")[1], out.split("busbw ratio pair-plugin.2 / pair-ib.2")[1]
        self.assertEqual(first.split("1M")[1].split()[0], "0.90", out)
        self.assertEqual(second.split("1M")[1].split()[0], "0.50", out)

    def test_the_switch_runs_get_their_ratio_table(self):
        with tempfile.TemporaryDirectory() as d:
            for name, bw in (("switch4-plugin", 6.0), ("switch4-ib", 8.0)):
                with open(os.path.join(d, name + ".jsonl"), "w") as f:
                    f.write(json.dumps(row(nbytes=1 << 20, busbw=bw)) + "\n")
            out = subprocess.run([sys.executable, REPORT, "tables", "--dir", d], capture_output=True,
                                 text=True, check=True).stdout
        self.assertEqual(out.split("busbw ratio switch4-plugin / switch4-ib")[1].split("1M")[1].split()[0], "0.75", out)


if __name__ == "__main__":
    unittest.main()
