#!/usr/bin/env python3
"""json_oracle.py — Python's json module (and jsonschema, when a schema is
given and the module is installed) as the oracle of lmserve's JSON grammars
(tests/unit/grammar/). Reads {"schema": S or null, "texts": [...]} on stdin;
writes one result per text: 1 (parses; an object when no schema is given;
valid against the schema when one is), 0 (does not), and "skip" as the whole
answer when a schema is given but jsonschema is missing."""
import json
import sys

req = json.load(sys.stdin)
schema = req.get("schema")
validator = None
if schema is not None:
    try:
        import jsonschema
    except ImportError:
        print(json.dumps("skip"))
        sys.exit(0)
    cls = jsonschema.validators.validator_for(schema)
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
out = []
for t in req["texts"]:
    try:
        v = json.loads(t)
    except ValueError:
        out.append(0)
        continue
    if validator is None:
        out.append(1 if isinstance(v, dict) else 0)
    else:
        out.append(1 if validator.is_valid(v) else 0)
print(json.dumps(out))
