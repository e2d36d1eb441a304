#!/usr/bin/env python3
"""json_suite.py — the official JSON-Schema-Test-Suite (Debian's
json-schema-test-suite package, or the folder in $LMSERVE_JSON_SCHEMA_SUITE)
flattened for tests/unit/grammar/test-gr-suite.c: one JSON object per line per
test group, {"file", "group", "schema" (its text), "tests": [{"description",
"valid", "compact", "spaced"}]}, where compact and spaced are the instance
written with "," / ":" and ", " / ": " between items, and numbers (in
schemas too) exactly as the suite writes them (a float would round
972783798187987123879878123.188781371). Argument: the draft's folder name (draft7 …). Files under optional/
are included (format/*.json as "format/NAME"); remote references
(refRemote.json) are left out: they name a server the suite's runner starts.
Prints nothing and exits 3 when the suite is not installed."""
import json
import os
import sys

root = os.environ.get("LMSERVE_JSON_SCHEMA_SUITE", "/usr/share/json-schema-test-suite/tests")
draft = sys.argv[1] if len(sys.argv) > 1 else "draft7"
base = os.path.join(root, draft)
if not os.path.isdir(base):
    sys.exit(3)

class Num(str):
    """A number's text as written."""


def dump(v, comma, colon):
    if isinstance(v, Num):
        return str(v)
    if isinstance(v, dict):
        return "{" + comma.join(json.dumps(k, ensure_ascii=False) + colon + dump(x, comma, colon)
                               for k, x in v.items()) + "}"
    if isinstance(v, list):
        return "[" + comma.join(dump(x, comma, colon) for x in v) + "]"
    return json.dumps(v, ensure_ascii=False)


files = []
for dirpath, _, names in os.walk(base):
    for n in names:
        if n.endswith(".json") and n != "refRemote.json":
            files.append(os.path.relpath(os.path.join(dirpath, n), base))
for rel in sorted(files):
    with open(os.path.join(base, rel), encoding="utf-8") as f:
        groups = json.load(f, parse_float=Num, parse_int=Num)
    name = rel[:-5].replace("optional/", "", 1) if rel.startswith("optional/") else rel[:-5]
    for g in groups:
        out = {"file": name, "group": g["description"],
               "schema": dump(g["schema"], ",", ":"), "tests": []}
        for t in g["tests"]:
            d = t["data"]
            out["tests"].append({
                "description": t["description"], "valid": bool(t["valid"]),
                "compact": dump(d, ",", ":"),
                "spaced": dump(d, ", ", ": "),
            })
        print(json.dumps(out, ensure_ascii=False))
