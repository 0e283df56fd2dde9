#!/usr/bin/env python3
"""The CPU each CTest entry of a built tree spends, beside its wall time: what `make test` costs on a
machine of few cores, where entries that wait (deadlines, sleeping ranks) overlap and entries that
compute do not.

    python3 scripts/test_cpu.py BUILD_DIR [--jobs N] [-R REGEX] [--json OUT]

Runs the entries CTest would run (`ctest --show-only=json-v1`), fixture set-ups first and RUN_SERIAL
entries alone, JOBS at a time (default 3, as `make test` on 2 cores), each with its ENVIRONMENT,
WORKING_DIRECTORY and TIMEOUT. An entry's CPU is the user and system time of its process and every
descendant it reaped (os.wait4): the ranks a test forks are its children (tests/distributed/
rank_zygote.h makes the test process their subreaper). Prints the entries by CPU and the totals:
the CPU over the cores is the floor of the phase's wall time however the entries are ordered.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time


def entries(build, regex):
    listing = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build, check=True,
                             capture_output=True, text=True).stdout
    tests = []
    for test in json.loads(listing)["tests"]:
        if regex and not re.search(regex, test["name"]):
            continue
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        if props.get("DISABLED"):
            continue
        tests.append({"name": test["name"], "command": test["command"], "props": props})
    return tests


def run_one(test, build):
    props = test["props"]
    env = dict(os.environ)
    for assignment in props.get("ENVIRONMENT", []):
        key, _, value = assignment.partition("=")
        env[key] = value
    start = time.monotonic()
    child = subprocess.Popen(test["command"], cwd=props.get("WORKING_DIRECTORY", build), env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    timeout = float(props.get("TIMEOUT", 1500))
    timer = threading.Timer(timeout, lambda: os.killpg(child.pid, 9))
    timer.start()
    _, status, usage = os.wait4(child.pid, 0)
    timer.cancel()
    code = os.waitstatus_to_exitcode(status)
    outcome = ("passed" if code == 0 else
               "skipped" if str(code) == str(props.get("SKIP_RETURN_CODE")) else f"failed ({code})")
    return {"name": test["name"], "wall": time.monotonic() - start,
            "cpu": usage.ru_utime + usage.ru_stime, "outcome": outcome}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("build")
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("-R", dest="regex")
    parser.add_argument("--json", dest="json_out")
    args = parser.parse_args()
    tests = entries(args.build, args.regex)
    setups = [t for t in tests if t["props"].get("FIXTURES_SETUP")]
    serial = [t for t in tests if t["props"].get("RUN_SERIAL") and t not in setups]
    parallel = [t for t in tests if t not in setups and t not in serial]
    parallel.sort(key=lambda t: -float(t["props"].get("COST", 0)))
    results = []
    lock = threading.Lock()
    begin = time.monotonic()

    def record(result):
        with lock:
            results.append(result)
            print(f"{len(results):4d}/{len(tests)} {result['name']:<60} wall {result['wall']:7.1f} s"
                  f"  cpu {result['cpu']:7.1f} s  {result['outcome']}", flush=True)

    for test in setups:
        record(run_one(test, args.build))
    queue = list(parallel)

    def worker():
        while True:
            with lock:
                if not queue:
                    return
                test = queue.pop(0)
            record(run_one(test, args.build))

    threads = [threading.Thread(target=worker) for _ in range(args.jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for test in serial:
        record(run_one(test, args.build))
    elapsed = time.monotonic() - begin

    results.sort(key=lambda r: -r["cpu"])
    cpu = sum(r["cpu"] for r in results)
    print(f"\n{len(results)} entries in {elapsed:.0f} s wall; CPU {cpu:.0f} s (over {os.cpu_count()} cores:"
          f" {cpu / os.cpu_count():.0f} s); wall summed {sum(r['wall'] for r in results):.0f} s")
    for r in results[:40]:
        print(f"  {r['cpu']:7.1f} s cpu  {r['wall']:7.1f} s wall  {r['name']}  {r['outcome']}")
    failed = [r["name"] for r in results if r["outcome"].startswith("failed")]
    if failed:
        print("failed: " + ", ".join(failed))
    if args.json_out:
        with open(args.json_out, "w") as out:
            json.dump({"elapsed": elapsed, "entries": results}, out, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
