#!/usr/bin/env python3
"""Resource counters of the local cluster's processes, for make bench-capacity.

    capacity_sample.py snap PIDS_DIR WAN_CONTROL > snap.json
    capacity_sample.py diff BEFORE.json AFTER.json SECONDS RECORDS_PER_SEC [IDLE.json] > row.json
    capacity_sample.py table ROWS.jsonl

snap reads, for every process with a pid file under PIDS_DIR (us-n1.pid,
..., wan.pid): CPU time (utime + stime of /proc/PID/stat), bytes written
to the block layer (write_bytes of /proc/PID/io), resident memory (VmRSS)
and the bytes its TCP sockets sent (bytes_sent of `ss -tinp`, summed over
the sockets the process holds now: the nodes' connections to each other
live as long as the nodes, so the difference of two samples is what
crossed between them). It also reads the WAN emulator's links, whose
delivered bytes are the traffic between regions.

diff turns two snapshots into rates per region (CPU in cores, disk and
network in MB/s, memory in MiB) and, given the idle rates, the cost of
the load alone per 1,000 records/s.
"""
import json
import os
import re
import subprocess
import sys
import urllib.request

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_counters(pid):
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    # Fields after the command name (which may hold spaces) in parentheses.
    rest = stat[stat.rindex(")") + 2:].split()
    cpu = (int(rest[11]) + int(rest[12])) / CLK_TCK
    write_bytes = 0
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith("write_bytes:"):
                write_bytes = int(line.split()[1])
    rss_kb = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss_kb = int(line.split()[1])
    return {"cpu_s": cpu, "write_bytes": write_bytes, "rss_kb": rss_kb}


def tcp_sent_by_pid():
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    sent = {}
    pids = []
    for line in out.splitlines():
        if not line.startswith((" ", "\t")):
            pids = [int(p) for p in re.findall(r"pid=(\d+)", line)]
            m = re.search(r"bytes_sent:(\d+)", line)
        else:
            m = re.search(r"bytes_sent:(\d+)", line)
        if m:
            for p in set(pids):
                sent[p] = sent.get(p, 0) + int(m.group(1))
    return sent


def snap(pids_dir, wan_control):
    sent = tcp_sent_by_pid()
    procs = {}
    for name in sorted(os.listdir(pids_dir)):
        if not name.endswith(".pid"):
            continue
        with open(os.path.join(pids_dir, name)) as f:
            pid = int(f.read().strip())
        try:
            c = proc_counters(pid)
        except FileNotFoundError:
            continue
        c["tcp_sent"] = sent.get(pid, 0)
        procs[name[:-4]] = c
    links = {}
    if wan_control:
        with urllib.request.urlopen(f"http://{wan_control}/links", timeout=5) as r:
            body = json.load(r)
        for l in body if isinstance(body, list) else body.get("links", []):
            links[l["name"]] = l.get("bytes_to_upstream", 0) + l.get("bytes_from_upstream", 0)
    return {"procs": procs, "wan_links": links}


def region_of(proc):
    return proc.split("-")[0] if "-n" in proc else proc


def rates(before, after, seconds):
    regions = {}
    for name, a in after["procs"].items():
        b = before["procs"].get(name)
        if b is None:
            continue
        r = regions.setdefault(region_of(name), {"cpu_cores": 0.0, "disk_mb_s": 0.0, "net_mb_s": 0.0, "rss_mib_max": 0.0, "procs": 0})
        r["cpu_cores"] += (a["cpu_s"] - b["cpu_s"]) / seconds
        r["disk_mb_s"] += (a["write_bytes"] - b["write_bytes"]) / seconds / 1e6
        r["net_mb_s"] += max(0, a["tcp_sent"] - b["tcp_sent"]) / seconds / 1e6
        r["rss_mib_max"] = max(r["rss_mib_max"], a["rss_kb"] / 1024)
        r["procs"] += 1
    wan = 0
    for name, a in after["wan_links"].items():
        wan += a - before["wan_links"].get(name, 0)
    return regions, wan / seconds / 1e6


def diff(before_f, after_f, seconds, rps, idle_f=None):
    with open(before_f) as f:
        before = json.load(f)
    with open(after_f) as f:
        after = json.load(f)
    seconds = float(seconds)
    regions, wan = rates(before, after, seconds)
    row = {"seconds": seconds, "records_per_sec": float(rps), "regions": regions, "wan_mb_s": wan}
    if idle_f:
        with open(idle_f) as f:
            idle = json.load(f)
        per_k = {}
        k = float(rps) / 1000
        for reg, r in regions.items():
            i = idle["regions"].get(reg, {})
            per_k[reg] = {
                "cpu_cores": (r["cpu_cores"] - i.get("cpu_cores", 0)) / k,
                "disk_mb_s": (r["disk_mb_s"] - i.get("disk_mb_s", 0)) / k,
                "net_mb_s": (r["net_mb_s"] - i.get("net_mb_s", 0)) / k,
            }
        row["per_1000_rps"] = per_k
        row["wan_mb_s_per_1000_rps"] = (wan - idle.get("wan_mb_s", 0)) / k
    json.dump(row, sys.stdout)
    print()


def table(rows_f):
    rows = [json.loads(l) for l in open(rows_f) if l.strip()]
    print("%-8s %8s %9s %8s | %-44s | %s" % ("mirrors", "rate", "achieved", "p99 ms", "per 1,000 records/s: cores / disk MB/s / net MB/s", "WAN MB/s, RSS MiB"))
    for r in rows:
        if "per_1000_rps" not in r:
            continue
        cells = []
        for reg in ("us", "eu", "ap"):
            p = r["per_1000_rps"].get(reg)
            if p and r["regions"][reg]["cpu_cores"] > 0:
                cells.append("%s %.3f/%.2f/%.2f" % (reg, p["cpu_cores"], p["disk_mb_s"], p["net_mb_s"]))
        rss = max(v["rss_mib_max"] for k, v in r["regions"].items() if k in ("us", "eu", "ap"))
        print("%-8s %8.0f %9.0f %8.1f | %-44s | %.2f, %.0f" % (r.get("mirrors", "?"), r.get("target", 0), r["records_per_sec"], r.get("p99_ms", 0),
                                                          " ".join(cells), r["wan_mb_s_per_1000_rps"], rss))


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "snap":
        json.dump(snap(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""), sys.stdout)
        print()
    elif cmd == "diff":
        diff(*sys.argv[2:])
    elif cmd == "table":
        table(sys.argv[2])
    else:
        sys.exit("usage: capacity_sample.py snap|diff|table ...")
