#!/usr/bin/env python3
"""A gearshift placement command: the seed's "Restrict a user's apps to slow
hosts" plus "Blacklist a certain vendor's cartridges", as an external program.

    [placement]
    strategy = "command"
    [placement.command]
    program = "/etc/gearshift/placement/placer.py"
    timeout = "5s"
    [placement.command.settings]
    pinned_user = "slowpoke"
    slow_hosts = ["node-9.example.com"]
    blacklisted_vendor = "shadyvendor"

Reads the placement input (JSON) on standard input; prints one candidate's
name, {"node": null} to place normally, or {"refused": "why"}.
"""
import json
import sys


def main():
    inp = json.load(sys.stdin)
    settings = inp.get("settings", {})
    vendor = settings.get("blacklisted_vendor")
    if vendor and any(c.get("cartridge_vendor") == vendor for c in inp.get("components", [])):
        print(json.dumps({"refused": f"Applications containing cartridges from {vendor} are blacklisted"}))
        return
    if inp["user"]["login"] == settings.get("pinned_user"):
        slow = set(settings.get("slow_hosts", []))
        matched = [n["name"] for n in inp["nodes"] if n["name"] in slow]
        if not matched:
            print(json.dumps({"refused": "The gear-placement SLOW_HOSTS setting does not match any available NodeProfile names"}))
            return
        print(matched[0])
        return
    print(json.dumps({"node": None}))


if __name__ == "__main__":
    main()
